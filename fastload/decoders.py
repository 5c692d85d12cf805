"""The decoders behind BatchMaker, one interface: ``make(indices, epoch, slot, k) -> RaggedBatch``, and ``start``
with the same arguments, which returns a ``Pending`` batch whose ``finish()`` gives it: the producer's own Python
work overlaps the decode there (the cores decode on native threads of their own meanwhile).

Per-sample decoders (they fill a host buffer and report per sample):
  * ``JpegCrops``: libjpeg-turbo on the cores, one native call per batch (``_C.decode_batch``) that reads the
    samples (file paths opened by its own threads, or views of a store's mapped file), checks their packed CRC-32,
    and decodes only each crop window, DCT-downscaled, into the slot, all without the GIL; only the samples that
    failed or warned come back as Python objects.
  * ``PillowImages``: the few non-JPEG samples, at full resolution.
Batch decoders (what ``decoder=`` names; each makes whole batches):
  * ``Cores`` ("cpu"): JPEGs to JpegCrops, other formats to Pillow, then ``on_error`` for broken samples (raise a
    DecodeError naming the sample, or deterministic replacements).
  * ``Engines`` ("nvjpeg"): the GPU's JPEG engines (fastload.nvjpeg) take the batch's verified baseline YCbCr
    JPEGs, ``Cores`` the rest; a batch where nvJPEG fails is made whole by ``Cores``.
  * ``Alternating`` ("hybrid"): batch k of an epoch by its second decoder when k % period == period - 1, else by
    its first: the engines and the cores on different batches, picked by index alone, never by timing.
``KINDS`` says, per name, how to build one and the worker/thread defaults the loader gives it; ``resolve``
turns "auto" (and a name the device cannot run) into one of them, in one place, and where the GPU has JPEG
engines, "auto"'s ``Trial`` then measures every kind inside the training loop and keeps the fastest.
"""
import io
import os
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from . import nvjpeg, ops
from .datasets.source import SubsetSource
from .errors import DecodeError, is_process_limit, process_limit_error
from .rng import uniforms

FORMAT_JPEG = 0
# decoder="hybrid": the engines decode batch k of an epoch when k % HYBRID_PERIOD < HYBRID_ENGINE_BATCHES, the cores
# the rest (today: k % 5 == 4 by the cores). Four in five, with a third of the cores' threads, made 30,900 img/s at
# 160 px where two in three with all but two made 22,200 and the engines alone 23,300 (H100 host, eighteenth session,
# bench/RESULTS.md "GPU loaders alone").
HYBRID_PERIOD = 5
HYBRID_ENGINE_BATCHES = 4
_MAX_REPLACEMENTS = 16  # tries to find a decodable replacement before giving up on a batch


def wait_for(stream):
    """Blocks until ``stream``'s work so far is done, asleep: Stream.synchronize() spins its thread on a core
    (the driver's wait policy with one context on many cores), a core the decode threads could use."""
    done = torch.cuda.Event(blocking=True)
    done.record(stream)
    done.synchronize()


@dataclass
class RaggedBatch:
    """A decoded batch: sample i is data[offsets[i]:][:h*w*3] as HWC uint8, warped by matrices[i]."""
    data: torch.Tensor       # 1-D uint8, a view of the slot's buffer
    offsets: torch.Tensor    # int64 [B]
    shapes: torch.Tensor     # int64 [B, 3]
    matrices: torch.Tensor   # float32 [B, 2, 3], or [B, 2, 5] with visible intervals (warp.h)
    labels: torch.Tensor     # int64 [B], or the dataset's float / multi-dimensional targets [B, ...]
    nbytes: int              # bytes of data in use (what a GPU copy must move)
    slot: object             # producer.Slot
    # Sample counts for loader.stats() (skipped, fallback, gpu_decoded): added when the batch is handed out, so a
    # batch made ahead (the next epoch's first ones) is not counted before the training loop gets it.
    counts: dict = field(default_factory=dict)
    indices: np.ndarray = None  # the samples it holds (after on_error="skip" replacements)
    params: object = None       # transforms.pipeline.SampleParams: what the stage applies after the warp, or None
    batch_plan: object = None   # the batch ops' parameters (Pipeline.batch_plan), or None


def decoded_nbytes(windows):
    """Bytes the decoder will write for [B, 5] windows, int64 numpy [B] (same formula as ops.decoded_shape,
    vectorised; in numpy, whose small-array ops cost the producer's thread a tenth of torch's)."""
    top, left, h, w, d = (windows.numpy() if isinstance(windows, torch.Tensor) else np.asarray(windows)).T
    rows = (top + h + d - 1) // d - top // d
    cols = (left + w + d - 1) // d - left // d
    return rows * cols * 3


def full_resolution(windows, matrices):
    """Rewrites plans to downscale 1 (for samples Pillow or the engines decode): same output pixels, full-size
    crop. Matrices [B, 2, 3], or [B, 2, 5] with visible intervals (warp.h), which move with the crop."""
    d = windows[:, 4].to(torch.float32)
    left, top = windows[:, 1], windows[:, 0]
    m = matrices.clone()
    # x_orig_edge = d * (x_d + 0.5 + left // d); x_1 = x_orig_edge - 0.5 - left (pixel index); edges without the 0.5
    for row, start in ((0, left), (1, top)):
        first = (start // windows[:, 4]).to(torch.float32)
        m[:, row, :2] *= d[:, None]
        m[:, row, 2] = d * (matrices[:, row, 2] + 0.5 + first) - 0.5 - start
        if m.shape[2] == 5:
            m[:, row, 3:] = d[:, None] * (matrices[:, row, 3:] + first[:, None]) - start[:, None]
    w = windows.clone()
    w[:, 4] = 1
    return w, m


# ---- reading ------------------------------------------------------------------------------------------------

def _get(reader, i):
    """reader.get(i) of a protocol dataset, its errors as _read_error makes them."""
    try:
        return reader.get(i)
    except Exception as e:
        error = _read_error(e, f"sample {i}")
        if error is e:
            raise
        raise error from e


def _read_error(e, what):
    """What a protocol reader's get() or sources() raised (``what``: the samples read), as the loader reports it:
    whatever it is (an OSError from a network file system, a KeyError) is that sample's read error, a DecodeError
    named and subject to on_error like a failed decode; but out of descriptors or memory is the process's limit, an
    OSError to raise (errors.process_limit_error, marked as such, so it passes through here unchanged)."""
    if isinstance(e, DecodeError) or getattr(e, "process_limit", False):
        return e
    if is_process_limit(e):
        return process_limit_error(f"{what}: cannot read it: {e}")
    return DecodeError(f"cannot read it: {type(e).__name__}: {e}")


def _raise_if_process_limit(error, cause):
    """Raises ``error`` (_read_error's for ``cause``) when it is the process's limit, with its cause kept."""
    if is_process_limit(error):
        if error is cause:
            raise cause
        raise error from cause


def read_sources(reader, indices, unreadable=None):
    """(sources, crcs) of these samples for the native decoder: zero-copy views and their packed CRC-32 for a store,
    file paths (read by the native threads) and no checksums for folders. A record that cannot be read (a damaged
    store) gets an empty buffer and its reason goes to ``unreadable`` {position: message}: on_error then treats it
    like a failed decode."""
    sources = getattr(reader, "sources", None)
    if sources is None:  # a dataset of our protocol's minimum: bytes from get(), no checksums
        sources = lambda idx: ([_get(reader, i) for i in idx], None)  # noqa: E731
    try:
        buffers, crcs = sources(indices.tolist())
        return list(buffers), (None if crcs is None else list(crcs))
    except Exception as e:  # a damaged record or a failed read among them: one by one, so only that sample fails
        _raise_if_process_limit(_read_error(e, "samples"), e)
    buffers, crcs = [], []
    for k, i in enumerate(indices.tolist()):
        try:
            b, c = sources([i])
            buffers.append(b[0])
            crcs.append(-1 if c is None else c[0])
        except Exception as failure:
            e = _read_error(failure, f"sample {i}")
            _raise_if_process_limit(e, failure)
            buffers.append(b"")
            crcs.append(-1)
            if unreadable is not None:
                unreadable[k] = str(e).removeprefix(f"{e.sample}: ")
    return buffers, crcs


def read_file(path, max_bytes=ops.MAX_BYTES):
    """(bytes, "") of a file, or (None, why): the native reader's read (Engines._buffers' for a whole batch)
    with its protections: opened non-blocking (a FIFO put where an image was must not hang the producer),
    regular files only, at most ``max_bytes``."""
    data, lengths, status, failed = ops.C.read_batch([os.fspath(path)], 1, max_bytes)
    if int(status[0]) in ops.PROCESS_FAULTS:
        raise ops.process_fault(int(status[0]), f"{os.fspath(path)}: {failed[0]}")
    return (bytes(data[:int(lengths[0])].numpy()), "") if int(status[0]) == ops.OK else (None, failed[0])


# ---- per-sample decoders ------------------------------------------------------------------------------------

@dataclass
class Decoded:
    """What a per-sample decoder reports for the samples it was given (positions 0..n-1)."""
    offsets: torch.Tensor  # int64 [n], into the buffer it was given
    shapes: torch.Tensor   # int64 [n, 3]
    status: torch.Tensor   # int32 [n], ops.OK or why not
    messages: dict         # {position: message} for the failed samples and the OK ones decoded with a warning
    warned: int            # OK samples decoded with a warning let through


def sample_keys(ds, n):
    """int64 [n]: the underlying sample each of the n keys reads. A view (a Subset, or repeats: key k reads sample
    k % len) maps several keys to one sample, so per-sample verdicts are kept once per file. (Only fastload's own
    view: a user's dataset may have fields of those names.)"""
    return np.asarray(ds.indices, dtype=np.int64) if isinstance(ds, SubsetSource) else np.arange(n, dtype=np.int64)


class SizeChecks:
    """Which samples' JPEG headers have been seen to agree with the dataset's heights/widths (one bool per
    underlying sample, for the loader's life), before anything is sized from them. Crops and their buffers are
    planned from those sizes; an index of other images (a custom one of the originals beside resized files, say)
    would size rooms from sizes no file has (an index claiming 12000 x 12000 allocates gigabytes) and crop the
    wrong part. So each JPEG's header is read on its first decode and compared, unless the dataset vouches for its
    index (``sizes_checked``: FolderDataset and LMDBDataset read it from the same files). Every decode also
    compares them natively (JpegCrops), which catches a vouched-for file replaced since."""

    def __init__(self, maker):
        ds = maker.ds
        self.key = sample_keys(ds, len(maker.heights))
        self.sizes = maker.sizes
        vouched = bool(getattr(ds, "sizes_checked", False))
        self.passed = np.full(int(self.key.max(initial=-1)) + 1, vouched, dtype=bool)

    def mismatches(self, indices, sources, threads, max_pixels):
        """{position: reason} of the JPEGs among ``indices`` (their ``sources``) whose header gives another size
        than the index; those whose header agrees pass. A source that cannot be read or parsed is left to the
        decode, which reports it."""
        indices = np.asarray(indices, dtype=np.int64)
        pos = np.flatnonzero(~self.passed[self.key[indices]])
        if not len(pos):
            return {}
        sizes, status, _ = ops.read_headers([sources[k] for k in pos.tolist()], threads, strict=False,
                                            max_pixels=max_pixels)
        found, ok = sizes.numpy(), np.asarray(status) == ops.OK
        idx = indices[pos]
        said = self.sizes[idx]
        agree = ok & (found == said).all(1)
        self.passed[self.key[idx[agree]]] = True
        return {int(k): index_mismatch("JPEG", found_hw, said_hw)
                for k, found_hw, said_hw in zip(pos[ok & ~agree], found[ok & ~agree], said[ok & ~agree])}


def index_mismatch(kind, found, said):
    """The reason for a sample whose image is ``found`` (height, width) where the dataset's index says ``said``."""
    return (f"its {kind} is {found[0]}x{found[1]} (height x width) but the dataset's heights/widths say "
            f"{said[0]}x{said[1]}: the index does not describe this file")


class ScanChecks:
    """Which samples' JPEGs have passed a strict whole-scan decode (one bool per underlying sample, for the
    loader's life).

    A crop decode stops at the window's last row. Damaged entropy data mostly decodes to plausible-looking values
    and is only noticed where the scan then ends early (libjpeg's "premature end of data segment"), so a window
    above that point would reach training wrong without a word, in some epochs and not others. A sample's first
    decode therefore reads its scan to the end (the rows below the window entropy-decoded, no IDCT) and takes a
    full decode's verdict; later crops of a sample that passed stop at their window. Not needed (all marked
    passed) for a non-strict loader, or a dataset that vouches for its records (``scans_checked``: a store packed
    strictly checked every JPEG, and its CRC-32s keep them as checked)."""

    def __init__(self, ds, n, strict):
        self.key = sample_keys(ds, n)
        needed = strict and not getattr(ds, "scans_checked", False)
        self.passed = np.full(int(self.key.max(initial=-1)) + 1, not needed, dtype=bool)

    def wanted(self, indices):
        """bool tensor [len(indices)]: which to decode through the whole scan; None when none."""
        whole = ~self.passed[self.key[indices]]
        return torch.from_numpy(whole) if whole.any() else None

    def record(self, indices, whole, status):
        """After a batch decoded with ``wanted``'s flags: the samples whose whole-scan decode succeeded passed."""
        if whole is not None:
            ok = whole.numpy() & (status.numpy() == ops.OK)
            self.passed[self.key[np.asarray(indices)[ok]]] = True


class JpegCrops:
    """libjpeg-turbo crop decode on ``threads`` native threads: read, CRC check and decode in one native call per
    batch, GIL released; the Python side sees only the samples that failed or warned. Each sample's first decode
    reads its whole scan (ScanChecks). A JPEG whose header contradicts the dataset's heights/widths is that
    sample's error: on its first read unless the dataset vouches for its index (SizeChecks, before any room is
    sized), and on every decode natively (the header is read anyway), since a window planned from a stale size
    still fits a larger image and would crop the wrong part without a word: a file replaced since the dataset was
    scanned, even mid-run, is caught there (``index_mismatch``'s words)."""

    def __init__(self, maker):
        self.maker = maker  # its threads, strict and max_pixels (threads change when decoder="auto" switches)
        self.checks = maker.part("scan checks", lambda: ScanChecks(maker.ds, len(maker.heights), maker.strict))
        self.sizes = maker.part("size checks", lambda: SizeChecks(maker))

    def read(self, reader, indices):
        """(sources, crcs, unreadable {position: message}) of these JPEG samples; a header that contradicts the
        index counts as unreadable (SizeChecks)."""
        unreadable = {}
        sources, crcs = read_sources(reader, indices, unreadable)
        m = self.maker
        for k in np.flatnonzero(m.oversized[indices]).tolist():  # planned a 1x1 window (BatchMaker.plan)
            i = int(indices[k])
            unreadable.setdefault(k, f"the dataset's heights/widths say {m.heights[i]}x{m.widths[i]} (height x "
                                     f"width), over the pixel limit ({m.max_pixels}): not decoded")
        wrong = self.sizes.mismatches(indices, sources, m.threads, m.max_pixels)
        unreadable.update({k: text for k, text in wrong.items() if k not in unreadable})
        return sources, crcs, unreadable

    def start(self, indices, sources, crcs, windows, out):
        """decode() on native threads of their own, returning at once: ``finish`` waits for it and gives decode()'s
        result. ``sources`` must stay valid until then (the reader's transaction open)."""
        whole = self.checks.wanted(indices)
        return ops.C.decode_batch_start(*self._arguments(indices, sources, windows, out, crcs, whole)), whole

    def finish(self, indices, started, unreadable=None):
        job, whole = started
        return self._decoded(indices, whole, job.wait(), unreadable)

    def decode(self, indices, sources, crcs, windows, out, unreadable=None):
        """Decodes the windows [n, 5] of ``sources`` (samples ``indices``) into ``out`` (1-D uint8, laid out in
        order from 0)."""
        whole = self.checks.wanted(indices)
        return self._decoded(indices, whole,
                             ops.C.decode_batch(*self._arguments(indices, sources, windows, out, crcs, whole)),
                             unreadable)

    def _arguments(self, indices, sources, windows, out, crcs, whole):
        m = self.maker
        sizes = torch.from_numpy(m.sizes[np.asarray(indices, dtype=np.int64)])  # a gather: int64 [n, 2], contiguous
        return (sources, windows, out, m.threads, m.strict, m.max_pixels, ops.MAX_BYTES,  # checks windows: [n, 5]
                None if crcs is None else torch.from_numpy(np.asarray(crcs, dtype=np.int64)), whole, sizes)

    def _decoded(self, indices, whole, result, unreadable):
        offsets, shapes, status, messages, warned = result
        self.checks.record(indices, whole, status)
        for k, message in (unreadable or {}).items():  # decoded as empty buffers: report them as what they are
            status[k] = ops.CORRUPT
            messages[k] = message
        return Decoded(offsets, shapes, status, messages, warned)


class PillowImages:
    """Non-JPEG samples, decoded whole by Pillow and cropped (windows at downscale 1: BatchMaker.plan sees to it).
    ``read`` checks a sample's header against the index before any room is sized from the index; ``fill`` decodes
    what it read."""

    def __init__(self, dataset, max_pixels):
        self.ds, self.max_pixels = dataset, max_pixels

    def read(self, reader, index):
        """(bytes, "") of sample ``index``, or (None, why) where it cannot be decoded as indexed: it cannot be read,
        Pillow cannot identify it, its header is over max_pixels or of another size than the index says (crops
        planned from that size would be silently wrong, and a larger index would size its room)."""
        try:
            data = bytes(_get(reader, index))
            with Image.open(io.BytesIO(data)) as im:  # the header only
                size = (im.height, im.width)
            if size[0] * size[1] > self.max_pixels:
                raise ValueError(f"{size[1]}x{size[0]} is over the pixel limit ({self.max_pixels})")
            said = (int(self.ds.heights[index]), int(self.ds.widths[index]))
            if size != said:
                return None, index_mismatch("image", size, said)
            return data, ""
        except Exception as e:
            return None, self._why(e)

    def fill(self, data, window, room):
        """Decodes ``data`` (read's bytes) and writes its window, HWC, at the start of ``room`` (a uint8 view that
        must hold it: nothing is written past it). Returns (status, message)."""
        top, left, h, w, _ = (int(v) for v in window)
        try:
            if h * w * 3 > room.numel():
                raise ValueError(f"its {w}x{h} window needs {h * w * 3} bytes, the batch gave it {room.numel()}")
            with Image.open(io.BytesIO(data)) as im:
                rgb = np.array(im.convert("RGB"))  # writable: torch wants it so
            if rgb.shape[0] < top + h or rgb.shape[1] < left + w:  # read() compared the header with the index
                raise ValueError(f"it decoded to {rgb.shape[1]}x{rgb.shape[0]}, its header said otherwise")
            room[:h * w * 3].view(h, w, 3).copy_(torch.from_numpy(rgb[top:top + h, left:left + w]))
            return ops.OK, ""
        except Exception as e:
            return ops.CORRUPT, self._why(e)

    @staticmethod
    def _why(e):
        """A failure's message for the sample's DecodeError; the process's limits are raised, never a sample's."""
        if isinstance(e, DecodeError):  # a read error, or the store's CRC-32: the bytes changed since packing
            return e.detail()
        if is_process_limit(e):
            raise e
        if isinstance(e, UnidentifiedImageError):  # its message names the BytesIO object, not the file
            return "Pillow could not decode it: not an image format Pillow can identify"
        return f"Pillow could not decode it: {e}"


_NO_WINDOW = torch.tensor([0, 0, 1, 1, 1])


def without_windows(windows, mask):
    """``windows`` [B, 5] with the rows where ``mask`` (bool numpy [B]) is set replaced by a 1-pixel window at (0, 0):
    samples that will not be decoded, so that no buffer is sized from a window planned from a size they do not have."""
    return torch.where(torch.from_numpy(mask)[:, None], _NO_WINDOW.to(windows.dtype), windows)


# ---- batch decoders -----------------------------------------------------------------------------------------

class Pending:
    """A batch being made (a decoder's ``start``): ``finish()`` gives it, a RaggedBatch, raising what making it
    raised. ``work`` is a generator that yields once, where its caller may do other work (the producer plans and
    hands over its previous batch while the JPEGs decode on native threads, GIL released), and returns the batch;
    ``start`` runs it up to there. ``close()`` abandons it (the producer stopping): the generator's cleanup waits
    for the native work and closes the reader."""

    def __init__(self, work):
        self.work, self.batch, self.closed = work, None, False
        try:
            next(work)
        except StopIteration as done:  # nothing to overlap: the batch is made already
            self.work, self.batch = None, done.value

    @classmethod
    def later(cls, make, *args):
        """``make(*args)`` run by finish(), for a decoder whose work blocks its thread throughout (the engines):
        the producer hands its previous batch over first, as it would before making this one."""
        def work():
            yield
            return make(*args)
        return cls(work())

    @classmethod
    def failed(cls, error):
        """A batch that could not be begun: finish() raises ``error``, in the batch's turn."""
        def work():
            yield
            raise error
        return cls(work())

    def finish(self):
        if self.closed:
            raise RuntimeError("fastload: finish() on a batch that was abandoned (close()): it has no result")
        if self.work is None:
            return self.batch
        work, self.work = self.work, None
        try:
            next(work)
        except StopIteration as done:
            return done.value
        raise RuntimeError("fastload: a decoder's work yielded twice")  # a bug: the generator's contract

    def close(self):
        self.closed = True
        if self.work is not None:
            work, self.work = self.work, None
            work.close()


class Cores:
    """decoder="cpu": the JPEGs by JpegCrops, then the other formats by Pillow laid out behind them (the native
    layout gives no room to a window no JPEG can have, a side over 65535, and Pillow's would overwrite the samples
    after it), then ``on_error`` for the samples that failed."""
    name = "cpu"

    def __init__(self, maker):
        self.maker = maker
        self.crops = JpegCrops(maker)
        self.pillow = PillowImages(maker.ds, maker.max_pixels)

    def make(self, indices, epoch, slot, k=0, plan=None):
        """``plan``: BatchMaker.plan(indices, epoch), when the producer made it ahead."""
        return self.start(indices, epoch, slot, k, plan).finish()

    def start(self, indices, epoch, slot, k=0, plan=None):
        """make() begun (a Pending): with several decode threads, the batch's records read and its JPEGs decoding
        on threads of their own; with one, or other formats in the batch, nothing yet (finish() makes it)."""
        return Pending(self._make(indices, epoch, slot, plan))

    def _make(self, indices, epoch, slot, plan):
        """make() as a generator: yields once, while the JPEGs decode or before anything is done."""
        m = self.maker
        windows, matrices, other = plan if plan is not None else m.plan(indices, epoch)
        fallback = int(other.sum())
        # A batch of JPEGs decoded on several threads decodes on threads of its own while the caller works (the
        # yield below). One thread is the producer's own: it decodes when finish() asks (a thread of its own per
        # batch made 6% fewer images on 2 cores), and so does a batch with other formats.
        overlap = m.threads > 1 and not fallback
        if not overlap:
            yield
        t0, away = time.perf_counter(), 0.0
        n = len(indices)
        jpeg, others = np.flatnonzero(~other), np.flatnonzero(other)
        with m.ds.reader() as reader:
            sources, crcs, unreadable = self.crops.read(reader, indices[jpeg] if fallback else indices)
            read = {p: self.pillow.read(reader, int(indices[p])) for p in others.tolist()}
            t1 = time.perf_counter()
            bad_other = [p for p, (data, _) in read.items() if data is None]
            if unreadable or bad_other:  # not decoded (a header contradicts the index, say): no room for them
                gone = np.zeros(n, dtype=bool)
                gone[jpeg[list(unreadable)]] = True
                gone[bad_other] = True
                windows = without_windows(windows, gone)
            nbytes = decoded_nbytes(windows)
            used = int(nbytes.sum())
            buffer = slot.reserve(used)
            if not fallback:  # the usual batch: all JPEGs, laid out by the native call as the batch is
                if overlap:  # on threads of their own, while the caller works
                    started = self.crops.start(indices, sources, crcs, windows, buffer)
                    try:
                        away = time.perf_counter()
                        yield  # the caller's own work, while the JPEGs decode: not this batch's time
                        away = time.perf_counter() - away
                        d = self.crops.finish(indices, started, unreadable)
                    finally:  # done already, or abandoned (close()) or interrupted: the decode over before the
                        started[0].close()  # reader's records go
                else:  # on the producer's own thread
                    d = self.crops.decode(indices, sources, crcs, windows, buffer, unreadable)
                offsets, shapes, status, messages = d.offsets, d.shapes, d.status, d.messages
            else:
                offsets = torch.zeros(n, dtype=torch.int64)
                shapes = torch.zeros(n, 3, dtype=torch.int64)
                status = torch.full((n,), ops.NOT_DECODED, dtype=torch.int32)
                messages = {}
                if len(jpeg):  # the JPEGs first, laid out by the native decoder
                    j = torch.from_numpy(jpeg)
                    d = self.crops.decode(indices[jpeg], sources, crcs, windows[j], buffer, unreadable)
                    offsets[j], shapes[j], status[j] = d.offsets, d.shapes, d.status
                    messages = {int(jpeg[p]): text for p, text in d.messages.items()}
        if fallback:
            start = int(nbytes[jpeg].sum())
            for p in others.tolist():
                room = int(nbytes[p])
                offsets[p], shapes[p] = start, torch.tensor([int(windows[p, 2]), int(windows[p, 3]), 3])
                data, text = read[p]
                if data is None:
                    status[p] = ops.CORRUPT
                else:
                    status[p], text = self.pillow.fill(data, windows[p], buffer[start:start + room])
                if text:
                    messages[p] = text
                start += room
        # OK samples whose message is a harmless libjpeg warning (strict lets those through): counted, not hidden
        counts = {"fallback": fallback, "skipped": 0,
                  "warnings": sum(1 for p, text in messages.items()
                                  if int(status[p]) == ops.OK and text.startswith(ops.WARNING_PREFIX))}
        bad = np.flatnonzero(status.numpy() != ops.OK)
        if len(bad):
            indices = indices.copy()
            buffer, offsets, shapes, matrices, used = self._repair(bad, indices, matrices, slot, offsets, shapes,
                                                                   status, messages, epoch, used, counts)
        labels = torch.from_numpy(m.labels[indices])
        m.stats.add(read=t1 - t0, decode=time.perf_counter() - t1 - away)
        return RaggedBatch(buffer, offsets, shapes, matrices, labels, used, slot, counts, indices)

    def _repair(self, bad, indices, matrices, slot, offsets, shapes, status, messages, epoch, used, counts):
        """on_error="raise": raise for the first bad sample. "skip": replace each bad sample by a deterministic
        pick (a pure function of seed, epoch and the bad index) decoded into the slot's spare room. A fault of
        the process (ops.PROCESS_FAULTS: out of descriptors or memory) raises either way."""
        m = self.maker
        faults = [k for k in bad.tolist() if int(status[k]) in ops.PROCESS_FAULTS]
        if faults or m.on_error == "raise":
            k = faults[0] if faults else int(bad[0])
            name = m.ds.sample_name(int(indices[k]))
            if faults:
                raise ops.process_fault(int(status[k]), f"{name}: {messages.get(k, '')}")
            raise DecodeError(f"{name}: {messages.get(k, '')}", sample=name, reason=messages.get(k, ""))
        buffer = slot.buffer
        offsets, shapes, matrices = offsets.clone(), shapes.clone(), matrices.clone()
        n = len(m.heights)
        for k in bad.tolist():
            counts["skipped"] += 1
            original = int(indices[k])
            # A stream of its own (seed + a constant) so replacements never correlate with crop draws.
            picks = uniforms(m.seed + 0x5EED, epoch, np.array([original]), _MAX_REPLACEMENTS)[0]
            for u in picks:
                pick = np.array([min(int(u * n), n - 1)], dtype=np.int64)
                w, mat, other = m.plan(pick, epoch)
                data = None
                if bool(other[0]):  # its header checked before its room is sized from the index
                    with m.ds.reader() as reader:
                        data, _ = self.pillow.read(reader, int(pick[0]))
                    if data is None:
                        continue  # a replacement that fails too is tried again
                need = int(decoded_nbytes(w).sum())
                if used + need > buffer.numel():
                    grown = torch.empty(int((used + need) * 1.25), dtype=torch.uint8, pin_memory=slot.pin)
                    grown[:used].copy_(buffer[:used])
                    slot.buffer = buffer = grown
                if bool(other[0]):
                    st, _ = self.pillow.fill(data, w[0], buffer[used:used + need])
                    off, shp = 0, torch.tensor([int(w[0, 2]), int(w[0, 3]), 3])
                else:
                    with m.ds.reader() as reader:
                        sources, crcs, unreadable = self.crops.read(reader, pick)
                        d = self.crops.decode(pick, sources, crcs, w, buffer[used:], unreadable)
                    st, off, shp = int(d.status[0]), int(d.offsets[0]), d.shapes[0]
                if st in ops.PROCESS_FAULTS:
                    raise ops.process_fault(st, f"{m.ds.sample_name(int(pick[0]))}: {d.messages.get(0, '')}")
                if st == ops.OK:
                    offsets[k], shapes[k], matrices[k] = used + off, shp, mat[0]
                    indices[k] = pick[0]
                    used += need
                    break
                # a replacement that fails too is tried again, not counted: "skipped" counts replaced samples
            else:
                name, why = m.ds.sample_name(original), messages.get(k, "")
                raise DecodeError(f"{name}: {why} (and {_MAX_REPLACEMENTS} replacements failed too)", sample=name,
                                  reason=why)
        return buffer, offsets, shapes, matrices, used


# What Engines knows of each sample (one int8 per sample, kept for the loader's life).
UNKNOWN, CORES, HEADER_OK, VERIFIED = -1, 0, 1, 2
# read_header fields of JPEGs the hardware decoder takes: baseline Huffman YCbCr, these luma samplings with 1x1
# chroma (the named subsamplings).
_HARDWARE_SAMPLING = {(1, 1), (2, 1), (2, 2), (1, 2)}


def _hardware_decodable(header):
    return (header["status"] == ops.OK and header["components"] == 3 and header["color_space"] == 3
            and not header["progressive"] and not header["arithmetic"] and header["chroma_1x1"]
            and (header["h_samp"], header["v_samp"]) in _HARDWARE_SAMPLING)


def engine_ready(state, indices, buffers, *, threads=1, max_pixels=ops.MAX_PIXELS, max_bytes=ops.MAX_BYTES,
                 sizes=None):
    """Which of these JPEGs may go to the hardware decoder: bool [len(indices)]; updates ``state`` (per sample,
    UNKNOWN / CORES / HEADER_OK / VERIFIED) in place.

    nvJPEG's hardware backend reports success on damaged entropy data (the rows after the damage keep whatever
    the output buffer held: pixels of another sample), so a JPEG goes to the engines only once a strict CPU
    entropy check (``ops.verify_jpegs``: no IDCT, OK exactly when a strict full decode would succeed) has
    passed. One that fails, or whose header is not for the engines (progressive, CMYK, grayscale...), is marked
    CORES: the CPU path decodes it, and reports or skips it exactly as decoder="cpu" does. The verdict is cached
    per sample: later epochs pay nothing. (So a folder file rewritten after its check, during training, reaches
    the engines unchecked: the same window every reader of a mutable folder has.) A buffer that is None (a
    read that failed) is not ready, and nothing is cached for it. ``sizes`` [len(indices), 2]: the index's
    (height, width); a header that says otherwise marks the sample CORES too, whose path reports it (JpegCrops)."""
    indices = np.asarray(indices, dtype=np.int64)
    present = np.array([b is not None for b in buffers], dtype=bool)
    for k in np.flatnonzero(present & (state[indices] == UNKNOWN)).tolist():
        header = ops.C.read_header(buffers[k], max_pixels)
        fits = sizes is None or (header["height"], header["width"]) == tuple(int(v) for v in sizes[k])
        state[indices[k]] = HEADER_OK if _hardware_decodable(header) and fits else CORES
    pending = np.flatnonzero(present & (state[indices] == HEADER_OK))
    if len(pending):  # one batch call on the cores, GIL released
        status, _ = ops.verify_jpegs([buffers[k] for k in pending.tolist()], threads, strict=True,
                                     max_pixels=max_pixels, max_bytes=max_bytes)
        state[indices[pending]] = np.where(np.asarray(status) == ops.OK, VERIFIED, CORES)
    return present & (state[indices] == VERIFIED)


class Engines:
    """decoder="nvjpeg": the hardware decoder takes every verified baseline YCbCr JPEG of the batch (crops at full
    resolution, straight into the slot's device buffer), ``cores`` the rest (other JPEG kinds, other formats,
    unreadable or failed samples: reported or skipped as decoder="cpu" would), their pixels copied in behind
    ([hardware part | CPU part]). A batch with nothing for the engines, or where nvJPEG itself fails, is made
    whole by ``cores``. (Splitting baseline JPEGs between engines and cores by their measured speeds was tried:
    nvJPEG's host-side work and the crop decoders slow each other, and no split beat the engines alone,
    bench/RESULTS.md, "Tried and not kept".)"""
    name = "nvjpeg"

    def __init__(self, maker, cores):
        self.maker, self.cores = maker, cores
        # Per underlying sample: engine_ready's verdict. A view (a Subset, or repeats: key k reads sample k % n)
        # shares one verdict among the keys that read the same sample, so each file is checked once.
        self.verdict_key = sample_keys(maker.ds, len(maker.heights))
        self.decodable = np.full(int(self.verdict_key.max(initial=-1)) + 1, UNKNOWN, dtype=np.int8)
        # One (nvJPEG decoder, CUDA stream) for the loader's life, used by one producer at a time (maker's
        # hardware lock, which a fork also waits for) while the others read: more handles decode slower in total
        # (H200: 18.6k img/s with one, 14.5k with four), and producer threads are new every epoch, where a new
        # stream would strand the allocator's cached blocks.
        self.handles = None
        self.largest_read = 0  # bytes: the largest batch read into a slot so far

    # The bytes the engines read land in page-locked memory (in a slot that pins: on CUDA): files read from a
    # folder, and a store's records, copied out of its mapped file. nvJPEG's batched call blocks its thread and
    # holds the engines for the batch's host-side work, and it stages pageable bitstreams through a copy of its
    # own: 7.3 ms a batch of 256 page-locked against 10.3 (H200, bench/RESULTS.md, "The JPEG engines from
    # page-locked copies"). Each slot's buffer is a power of two over the largest batch read so far, so torch's
    # caching host allocator hands the same blocks to the next epoch's slots.
    pinned_bitstreams = True

    def make(self, indices, epoch, slot, k=0, plan=None):
        return self._make(indices, epoch, slot, plan) or self.cores.make(indices, epoch, slot, plan=plan)

    def start(self, indices, epoch, slot, k=0, plan=None):
        """make(), run by the Pending's finish(): the engines' batched call holds its thread throughout."""
        return Pending.later(self.make, indices, epoch, slot, k, plan)

    def _make(self, indices, epoch, slot, plan=None):
        m = self.maker
        t0 = time.perf_counter()
        n = len(indices)
        verdicts = self.verdict_key[indices]
        chosen = np.flatnonzero((m.formats[indices] == FORMAT_JPEG) & (self.decodable[verdicts] != CORES))
        if not len(chosen):
            return None
        with m.ds.reader() as reader:
            buffers = self._buffers(reader, indices[chosen], slot)
            keep = engine_ready(self.decodable, verdicts[chosen], buffers, threads=m.threads,
                                max_pixels=m.max_pixels,
                                sizes=m.sizes[indices[chosen]])
            # verify_jpegs is a strict whole-scan check: the cores need not read those scans again
            self.cores.crops.checks.passed[verdicts[chosen[keep]]] = True
            # Everything else (other JPEG kinds, failed checks, unreadable files or records): the cores, whose
            # path reports or skips it as decoder="cpu" would.
            chosen = chosen[keep]
            buffers = [b for b, ok in zip(buffers, keep) if ok]
            if not len(chosen):
                return None
            planned_w, planned_m, other = plan if plan is not None else m.plan(indices, epoch)
            hw = torch.from_numpy(chosen)
            windows, matrices = full_resolution(planned_w[hw], planned_m[hw])  # the hardware has no DCT downscale
            hw_bytes = int(decoded_nbytes(windows).sum())
            rest = np.setdiff1d(np.arange(n), chosen)
            t1 = time.perf_counter()
            # Plans are per sample: the rest's plan is the batch plan's rows (not planned a second time).
            cpu = torch.from_numpy(rest)
            part = self.cores.make(indices[rest], epoch, slot, plan=(planned_w[cpu], planned_m[cpu], other[rest])) \
                if len(rest) else None  # raises or repairs
            # The whole batch at full resolution, but for the samples the cores replaced (on_error="skip"): a wrong
            # index is one reason, and a window planned from it must size nothing (a CUDA out-of-memory error
            # instead of the sample's own). The engines' samples had their headers checked against the index.
            trusted = np.ones(n, dtype=bool)
            if part is not None:
                trusted[rest] = part.indices == indices[rest]
            full_bytes = int((planned_w[:, 2] * planned_w[:, 3] * 3)[torch.from_numpy(trusted)].sum())
            with m._hardware_lock:  # one batch at a time: the engines are shared, and it is the fastest
                decoder, stream, copy_stream = self._handles(n)
                with torch.cuda.stream(stream):  # sized for the whole batch at full resolution, whatever the
                    # split: buffer sizes then follow the plan alone, and memory stays flat from epoch to epoch
                    out = slot.reserve_device(max(full_bytes, hw_bytes + (part.nbytes if part else 0)), m.device)
                if part is not None:  # on the copy engine, while the JPEG engines decode
                    with torch.cuda.stream(copy_stream):
                        out[hw_bytes:hw_bytes + part.nbytes].copy_(part.data[:part.nbytes], non_blocking=True)
                try:
                    hw_offsets, hw_shapes = decoder.decode(buffers, windows, out, stream)
                except nvjpeg.NvjpegError:
                    return None
                finally:
                    # The bitstreams are host memory the reader context owns, and nvJPEG copies page-locked ones
                    # asynchronously: done with them, failed decode included, before the context ends or the slot
                    # is refilled; and the copy engine done with the slot's pinned buffer.
                    wait_for(stream)
                    wait_for(copy_stream)
        offsets = torch.empty(n, dtype=torch.int64)
        shapes = torch.empty(n, 3, dtype=torch.int64)
        all_matrices = torch.empty(n, *matrices.shape[1:], dtype=torch.float32)
        labels = torch.from_numpy(m.labels[indices])
        final = indices.copy()
        offsets[hw], shapes[hw], all_matrices[hw] = hw_offsets, hw_shapes, matrices
        if part is not None:
            offsets[cpu], shapes[cpu], all_matrices[cpu] = part.offsets + hw_bytes, part.shapes, part.matrices
            labels[cpu] = part.labels  # on_error="skip" may have replaced samples
            final[rest] = part.indices
        m.stats.add(read=t1 - t0, decode=time.perf_counter() - t1)
        counts = dict(part.counts if part is not None else {}, gpu_decoded=len(chosen))
        return RaggedBatch(out, offsets, shapes, all_matrices, labels, hw_bytes + (part.nbytes if part else 0), slot,
                           counts, final)

    def _handles(self, batch):
        if self.handles is None:
            # High priority: inside a training loop the decode's few kernels and copies must not queue behind
            # the model's, or the producer waits on them with the batch half done.
            device = self.maker.device
            self.handles = (nvjpeg.HardwareDecoder(batch), torch.cuda.Stream(device, priority=-1),
                            torch.cuda.Stream(device, priority=-1))
        return self.handles

    def _buffers(self, reader, indices, slot=None):
        """The bytes of these samples for the engines, or None where they cannot go: a record that cannot be
        read or fails its packed CRC-32, a file that cannot be read safely (read_file's rules). One native call
        reads every file (GIL released: no Python open/stat/read/close per file, each of which would give the GIL
        up and wait for it back) and checks every CRC. The CPU path then reads the failed ones again and reports
        what it finds. The files, and where the slot pins a store's records too, land in ``slot``'s host buffer
        for bitstreams (kept: no fresh memory to fault in each batch); the engines are done with them before the
        slot is reused."""
        unreadable = {}
        sources, crcs = read_sources(reader, indices, unreadable)
        pin = slot is not None and slot.pin and self.pinned_bitstreams
        if pin and slot.bitstreams is None and self.largest_read:  # a new slot: page-locked from its first batch
            slot.pin_bitstreams(self.largest_read)
        data, lengths, _, failed = ops.C.read_batch(
            sources, self.maker.threads, ops.MAX_BYTES,
            None if crcs is None else torch.from_numpy(np.asarray(crcs, dtype=np.int64)),
            None if slot is None else slot.bitstreams, copy_buffers=pin)
        if slot is not None and data is not slot.bitstreams:  # read_batch grew it (its own memory: pageable)
            slot.bitstreams = data
            if pin:  # the next batches into page-locked memory
                self.largest_read = max(self.largest_read, data.numel())
                slot.pin_bitstreams(self.largest_read)
        read = memoryview(data.numpy())  # the samples read or copied, back to back; views of it keep it alive
        ends = np.cumsum(lengths.numpy()).tolist()
        return [None if k in unreadable or k in failed else read[end - size:end] if pin or isinstance(source, str)
                else source for k, (source, end, size) in enumerate(zip(sources, ends, lengths.tolist()))]


class Alternating:
    """decoder="hybrid": batch k of an epoch by ``first`` when k % period < first_batches, else by ``second``."""
    name = "hybrid"

    def __init__(self, first, second, period=HYBRID_PERIOD, first_batches=None):
        self.first, self.second, self.period = first, second, period
        self.first_batches = period - 1 if first_batches is None else first_batches

    def make(self, indices, epoch, slot, k=0, plan=None):
        return self.start(indices, epoch, slot, k, plan).finish()

    def start(self, indices, epoch, slot, k=0, plan=None):
        chosen = self.first if k % self.period < self.first_batches else self.second
        return chosen.start(indices, epoch, slot, k, plan)


# ---- names ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kind:
    """What ``decoder=name`` builds, and the loader's defaults for it (``cores``: the CPU cores this process may
    use; ``cuda``: whether batches go to a GPU)."""
    name: str
    build: Callable          # build(maker) -> a batch decoder
    on_gpu: bool             # needs device="cuda" and the hardware decoder
    workers: Callable        # workers(cores, cuda) -> producer threads
    threads: Callable        # threads(cores, workers, cuda) -> native decode threads per producer


# The parts are built once per BatchMaker (BatchMaker.part), so the kinds decoder="auto" tries share them: one
# hardware decoder handle and one set of the engines' per-sample verdicts.
def _cores(maker):
    return maker.part("cores", lambda: Cores(maker))


def _engines(maker):
    return maker.part("engines", lambda: Engines(maker, _cores(maker)))


def _hybrid(maker):
    return Alternating(_engines(maker), _cores(maker), HYBRID_PERIOD, HYBRID_ENGINE_BATCHES)


KINDS = {
    # The producers decode at once and share the cores (one decode thread per core in all, not one per core each):
    # on CUDA the training loop's thread then keeps its core (bench/RESULTS.md, "Decode threads per producer on
    # CUDA"); on the CPU the stage's threads do (3.8-4.6% more images on 2 cores, "With a policy"). Two producers,
    # not four: fewer Python threads take the GIL from the training thread, whose eager step then ran a median
    # 0.958 of its ceiling against 0.929, and the decode-bound ResNet-18 got as many images (bench/RESULTS.md,
    # "Two producers").
    "cpu": Kind("cpu", _cores, False,
                workers=lambda cores, cuda: 2,
                threads=lambda cores, workers, cuda: max(1, cores // max(1, workers))),
    # One producer has the engines while the other reads and plans; more contend for the GIL and the engines
    # (bench/RESULTS.md, "The JPEG engines"). The cores decode only the few samples the engines cannot take.
    "nvjpeg": Kind("nvjpeg", _engines, True, workers=lambda cores, cuda: 2,
                   threads=lambda cores, workers, cuda: cores),
    # One producer per batch of the period (today 4 engines' producers, one holding the engines while the others
    # read and plan, and one cores' producer), each with a third of the cores' threads: more decode threads slow the
    # engines' host-side submit more than they add (5 threads on 16 cores: 30,900 img/s; 8: 29,400; 14 with two
    # batches in three: 22,200; bench/RESULTS.md).
    "hybrid": Kind("hybrid", _hybrid, True, workers=lambda cores, cuda: HYBRID_PERIOD,
                   threads=lambda cores, workers, cuda: max(1, cores // 3)),
}


# decoder="auto" starts with the cores where the process has at least this many (per GPU), else the JPEG engines where
# the GPU has them (then measures: Trial). Measured inside training on an H200 (bench/RESULTS.md, 'decoder="auto"'):
# ResNet-18 at 160 px fed by the cores / the engines reaches 0.87 / 0.67 of its ceiling with 16 cores, 0.69 / 0.73
# with 12, 0.37-0.42 / 0.63-0.65 with 8, 0.26 / 0.71 with 4; ResNet-50 at 160 px with 8 cores: 0.99 / 0.91.
AUTO_CORES = 12


def resolve(decoder, device, cores=None):
    """The Kind ``decoder=`` names on ``device``: "auto" is "cpu" where ``cores`` (the cores this process decodes
    on; None: unknown) >= AUTO_CORES, else "nvjpeg" where the device has a hardware decoder, else "cpu"; a GPU decoder
    on a device that cannot run it is an error saying why."""
    if decoder not in (*KINDS, "auto"):
        raise ValueError(f"decoder must be 'cpu', 'nvjpeg', 'hybrid' or 'auto', got {decoder!r}")
    if decoder == "cpu" or (decoder == "auto" and (device.type != "cuda" or (cores or 0) >= AUTO_CORES)):
        return KINDS["cpu"]
    if device.type != "cuda":
        raise ValueError(f"decoder={decoder!r} decodes on the GPU: it needs device='cuda'")
    ok, why = nvjpeg.available(device)
    if ok:
        return KINDS["nvjpeg" if decoder == "auto" else decoder]
    if decoder == "auto":
        return KINDS["cpu"]
    raise RuntimeError(f"decoder={decoder!r} cannot be used on {device}: {why}")


# decoder="auto" where the GPU has JPEG engines: every kind feeds the training loop in turn, AUTO_WARMUP batches
# untimed after each switch (the new producers fill their queues), then AUTO_MEASURE timed; the fastest stays unless
# it beats the rule's choice (tried first) by less than AUTO_MARGIN, within what two runs of one decoder differ by.
# The first AUTO_SETTLE batches of the loop are not timed either: a loop's start is slower whatever the decoder
# (pinned and device buffers allocated, first reads of the files). Without them the cores, measured first, came
# out at 11,100 img/s against 18,400 in steady state (ResNet-18 at 160 px, an H100 host, bench/RESULTS.md).
AUTO_SETTLE, AUTO_WARMUP, AUTO_MEASURE, AUTO_MARGIN = 32, 8, 32, 0.05
AUTO_OUTLIER = 10  # Trial._rate: an interval over 10x the mean of the others is a one-off stall of the loop


def trial(decoder, kind, device):
    """The Trial decoder="auto" runs on ``device``, ``kind`` (resolve's rule) first; None where there is nothing to
    choose: another decoder named, a CPU device, or a GPU without JPEG engines."""
    if decoder != "auto" or device.type != "cuda" or not nvjpeg.available(device)[0]:
        return None
    return Trial([kind.name] + [name for name in KINDS if name != kind.name])


class Trial:
    """Which decoder makes this training loop fastest, measured in it: after the loop's first ``settle`` batches,
    each candidate makes the loop's batches in turn, timed from the loop taking one batch to taking the next (the
    step and any wait for the loader; one-off stalls of the loop left out: _rate; between epochs, where the loop
    validates or saves, nothing is timed). Batch k is then exactly the batch of whichever decoder was making batches
    when the loop took it; a run's pixels depend on the measurement, so name a decoder where they must not."""

    def __init__(self, candidates, warmup=None, measure=None, margin=None, settle=None):
        self.candidates = list(candidates)
        self.settle = AUTO_SETTLE if settle is None else settle
        self.warmup = AUTO_WARMUP if warmup is None else warmup
        self.measure = AUTO_MEASURE if measure is None else measure
        self.margin = AUTO_MARGIN if margin is None else margin
        self.rates = {}  # img/s of every candidate measured so far
        self.chosen = None
        self.phase = 0
        self._reset()

    def _reset(self):
        self.taken_since_switch, self.timed = 0, []  # timed: (interval, images) of the phase's timed batches

    @property
    def current(self):
        """The decoder making batches now."""
        return self.chosen or self.candidates[self.phase]

    def check(self, name):
        """Refuses a choice (a state_dict's) this loader cannot run."""
        if name not in self.candidates:
            raise ValueError(f"state chose decoder {name!r}, which this loader cannot run (it can: "
                             f"{', '.join(self.candidates)})")

    def adopt(self, name):
        """A choice made before (a state_dict's): no trial."""
        self.check(name)
        self.chosen = name

    def taken(self, images, interval):
        """The loop took a batch of ``images``, ``interval`` seconds after the one before (None: the first of an
        epoch or of a new iteration). Returns the decoder to switch to now, or None."""
        if self.chosen is not None:
            return None
        self.taken_since_switch += 1
        untimed = self.warmup + (self.settle if self.phase == 0 else 0)
        if self.taken_since_switch > untimed and interval is not None:
            self.timed.append((interval, images))
        if len(self.timed) < self.measure:
            return None
        self.rates[self.current] = self._rate(self.timed)
        self._reset()
        if self.phase + 1 < len(self.candidates):
            self.phase += 1
            return self.current
        rule = self.candidates[0]
        best = max(self.candidates, key=self.rates.__getitem__)
        if self.rates[best] <= self.rates[rule] * (1 + self.margin):
            best = rule
        last, self.chosen = self.current, best
        return None if best == last else best

    @staticmethod
    def _rate(timed):
        """Images per second over the intervals, leaving out any over AUTO_OUTLIER times the mean of the others: a
        one-off in the loop (torch.compile recompiling for a new shape, a checkpoint save) must not decide between
        decoders. A decoder's own waits stay in: batches that arrive in bursts (several producers, hybrid's cores
        on 1 batch in 5) wait at most a few times the mean. (Leaving out a fixed share of the longest intervals
        instead counted bursty decoders up to 1.5x their rate: eighteenth session, bench/RESULTS.md.)"""
        total, n = sum(t for t, _ in timed), len(timed)
        kept = [(t, images) for t, images in timed if n < 2 or t <= AUTO_OUTLIER * (total - t) / (n - 1)]
        return sum(images for _, images in kept) / max(sum(t for t, _ in kept), 1e-9)

    def summary(self):
        """For stats(): the img/s measured per decoder and the choice (None while measuring)."""
        return {"rates": {name: round(rate, 1) for name, rate in self.rates.items()}, "chosen": self.chosen}
