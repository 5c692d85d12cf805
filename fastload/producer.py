"""Turning a list of sample indices into a decoded ragged batch: read, plan, decode, repair.

One ``BatchMaker.make(indices, epoch, slot, k)`` call per batch: the crop plan for every sample (vectorised), the
bytes of every record inside one reader context (zero-copy for LMDB), one native ``decode_crops`` call on
``threads`` native threads straight into the slot's buffer (pinned when the batch goes to a GPU), then Pillow
for the few non-JPEG samples and, with ``on_error="skip"``, deterministic replacements for broken ones.

With ``decoder="nvjpeg"`` (and for two batches in three with ``"hybrid"``) the GPU's hardware decoder takes the
batch's baseline YCbCr JPEGs (full-resolution crops, straight into the slot's device buffer) and the cores decode
any other samples as above, their pixels copied in behind. The engines take a JPEG only once a strict CPU entropy
check has passed it (``engine_ready``: they report success on damaged data); a sample that fails it, or whose
record or file cannot be read or fails its checksum, goes to the cores, which report or skip it as decoder="cpu"
does. A batch where nvJPEG itself fails is decoded whole by the CPU path.
"""
import io
import os
import stat
import threading
import time
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from . import ops
from .errors import DecodeError
from .nvjpeg import HardwareDecoder, NvjpegError
from .rng import uniforms

_FORMAT_JPEG = 0
HYBRID_PERIOD = 3  # decoder="hybrid": the cores decode batch k of an epoch when k % 3 == 2, the engines the rest
_MAX_REPLACEMENTS = 16  # tries to find a decodable replacement before giving up on a batch


@dataclass
class RaggedBatch:
    """A decoded batch: sample i is data[offsets[i]:][:h*w*3] as HWC uint8, warped by matrices[i]."""
    data: torch.Tensor       # 1-D uint8, a view of the slot's buffer
    offsets: torch.Tensor    # int64 [B]
    shapes: torch.Tensor     # int64 [B, 3]
    matrices: torch.Tensor   # float32 [B, 2, 3]
    labels: torch.Tensor     # int64 [B], or the dataset's float / multi-dimensional targets [B, ...]
    nbytes: int              # bytes of data in use (what a GPU copy must move)
    slot: "Slot"
    # Sample counts for loader.stats() (skipped, fallback, gpu_decoded): added when the batch is handed out, so a
    # batch made ahead (the next epoch's first ones) is not counted before the training loop gets it.
    counts: dict = field(default_factory=dict)
    indices: np.ndarray = None  # the samples it holds (after on_error="skip" replacements)
    params: object = None       # transforms.pipeline.SampleParams: what the stage applies after the warp, or None
    batch_plan: object = None   # the batch ops' parameters (Pipeline.batch_plan), or None


class Slot:
    """A reusable decode buffer; grows (by 25% headroom) when a batch needs more, never shrinks."""

    def __init__(self, pin):
        self.pin = pin
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self.device_buffer = None  # decoder="nvjpeg": the hardware decoder's output
        self.copied = None  # CUDA event: the buffer may be rewritten once the copy (or kernel) it guards is done

    def reserve(self, nbytes):
        if self.buffer.numel() < nbytes:
            self.buffer = torch.empty(int(nbytes * 1.25), dtype=torch.uint8, pin_memory=self.pin)
        return self.buffer

    def reserve_device(self, nbytes, device):
        if self.device_buffer is None or self.device_buffer.numel() < nbytes:
            self.device_buffer = None  # free first: the kernel that read it is done (wait_reusable)
            # Powers of two: the few sizes the caching allocator then sees are reused epoch after epoch.
            self.device_buffer = torch.empty(1 << max(20, (int(nbytes) - 1).bit_length()), dtype=torch.uint8,
                                             device=device)
        return self.device_buffer

    def wait_reusable(self):
        if self.copied is not None:
            self.copied.synchronize()
            self.copied = None


def decoded_nbytes(windows):
    """Bytes the decoder will write for [B, 5] windows (same formula as ops.decoded_shape, vectorised)."""
    top, left, h, w, d = (windows[:, k] for k in range(5))
    rows = (top + h + d - 1) // d - top // d
    cols = (left + w + d - 1) // d - left // d
    return rows * cols * 3


def full_resolution(windows, matrices):
    """Rewrites plans to downscale 1 (for samples Pillow decodes): same output pixels, full-size crop."""
    d = windows[:, 4].to(torch.float32)
    left, top = windows[:, 1], windows[:, 0]
    m = matrices.clone()
    # x_orig_edge = d * (x_d + 0.5 + left // d); x_1 = x_orig_edge - 0.5 - left
    for row, start in ((0, left), (1, top)):
        m[:, row, :2] *= d[:, None]
        m[:, row, 2] = d * (matrices[:, row, 2] + 0.5 + (start // windows[:, 4]).to(torch.float32)) - 0.5 - start
    w = windows.clone()
    w[:, 4] = 1
    return w, m


def targets(labels):
    """The dataset's labels as the batches' y: integers as int64 [B]; float (regression, soft labels) and
    multi-dimensional targets (y [B, ...]) kept as they are; anything else refused."""
    array = np.asarray(labels)  # one entry per sample: datasets.source.as_source checked that
    if array.dtype.kind in "iub":  # bool stays bool: a multi-label mask is not a class index
        return array if array.dtype.kind == "b" else array.astype(np.int64, copy=False)
    if array.dtype.kind == "f":
        return array
    raise TypeError(f"labels must be numbers (int or float, one value or an array per sample), got dtype "
                    f"{array.dtype}")


# read_header fields of JPEGs the hardware decoder takes: baseline Huffman YCbCr, these samplings.
_HARDWARE_SAMPLING = {(1, 1), (2, 1), (2, 2), (1, 2)}

# What BatchMaker knows of each sample, for the engines (one int8 per sample, kept for the loader's life).
UNKNOWN, CORES, HEADER_OK, VERIFIED = -1, 0, 1, 2


def _hardware_decodable(header):
    return (header["status"] == ops.OK and header["components"] == 3 and header["color_space"] == 3
            and not header["progressive"] and not header["arithmetic"]
            and (header["h_samp"], header["v_samp"]) in _HARDWARE_SAMPLING)


def engine_ready(state, indices, buffers, *, threads=1, max_pixels=ops.MAX_PIXELS, max_bytes=ops.MAX_BYTES):
    """Which of these JPEGs may go to the hardware decoder: bool [len(indices)]; updates ``state`` (per sample,
    UNKNOWN / CORES / HEADER_OK / VERIFIED) in place.

    nvJPEG's hardware backend reports success on damaged entropy data (the rows after the damage keep whatever
    the output buffer held: pixels of another sample), so a JPEG goes to the engines only once a strict CPU
    entropy check (``ops.verify_jpegs``: no IDCT, OK exactly when a strict full decode would succeed) has
    passed. One that fails, or whose header is not for the engines (progressive, CMYK, grayscale...), is marked
    CORES: the CPU path decodes it, and reports or skips it exactly as decoder="cpu" does. The verdict is cached
    per sample: later epochs pay nothing. (So a folder file rewritten after its check, during training, reaches
    the engines unchecked: the same window every reader of a mutable folder has.) A buffer that is None (a
    read that failed) is not ready, and nothing is cached for it."""
    indices = np.asarray(indices, dtype=np.int64)
    present = np.array([b is not None for b in buffers], dtype=bool)
    for k in np.flatnonzero(present & (state[indices] == UNKNOWN)).tolist():
        header = ops.C.read_header(buffers[k], max_pixels)
        state[indices[k]] = HEADER_OK if _hardware_decodable(header) else CORES
    pending = np.flatnonzero(present & (state[indices] == HEADER_OK))
    if len(pending):  # one batch call on the cores, GIL released
        status, _ = ops.verify_jpegs([buffers[k] for k in pending.tolist()], threads, strict=True,
                                     max_pixels=max_pixels, max_bytes=max_bytes)
        state[indices[pending]] = np.where(np.asarray(status) == ops.OK, VERIFIED, CORES)
    return present & (state[indices] == VERIFIED)


# Every BatchMaker's hardware-decoder lock is held across a fork: a child forked while nvjpegDecodeBatchedEx runs in
# a producer thread (a torch DataLoader starting its workers) can hang on the libraries' state that thread held.
_makers = weakref.WeakSet()
_held = []


def _hold_decoders():
    for maker in list(_makers):
        if maker._hardware_lock.acquire(timeout=30):  # waits (GIL released) for a decode in flight, ~10 ms
            _held.append(maker._hardware_lock)


def _release_decoders():
    while _held:
        _held.pop().release()


os.register_at_fork(before=_hold_decoders, after_in_parent=_release_decoders, after_in_child=_release_decoders)


class BatchMaker:
    """Makes a batch: ``pipeline`` (transforms.Pipeline) plans windows and matrices before decoding, and the
    per-sample parameters of the stage once the batch's samples are final."""

    def __init__(self, dataset, pipeline, seed, threads, on_error, strict, max_pixels, stats, device=None,
                 decoder="cpu"):
        self.ds = dataset
        self.pipeline = pipeline
        self.seed = seed
        self.threads = threads
        self.on_error = on_error
        self.strict = strict
        self.max_pixels = max_pixels
        self.stats = stats
        self.heights = np.asarray(dataset.heights, dtype=np.int64)
        self.widths = np.asarray(dataset.widths, dtype=np.int64)
        self.labels = targets(dataset.labels)
        self.formats = np.asarray(dataset.formats, dtype=np.uint8)
        self.device = device
        self.hardware = decoder in ("nvjpeg", "hybrid")
        self.hybrid = decoder == "hybrid"
        # Per underlying sample: engine_ready's verdict. A view (a Subset, or repeats: key k reads sample k % n)
        # shares one verdict among the keys that read the same sample, so each file is checked once.
        base_of = getattr(dataset, "indices", None) if hasattr(dataset, "base") else None
        self._verdict_key = np.arange(len(self.heights)) if base_of is None else np.asarray(base_of, dtype=np.int64)
        self._decodable = np.full(int(self._verdict_key.max(initial=-1)) + 1, UNKNOWN, dtype=np.int8)
        # One (nvJPEG decoder, CUDA stream) for the loader's life, used by one producer at a time while the
        # others read: more handles decode slower in total (H200: 18.6k img/s with one, 14.5k with four), and
        # producer threads are new every epoch, where a new stream would strand the allocator's cached blocks.
        self._hardware = None
        self._hardware_lock = threading.Lock()
        _makers.add(self)

    def plan(self, indices, epoch):
        plan = self.pipeline.plan(self.heights[indices], self.widths[indices], self.seed, epoch, indices)
        windows, matrices = plan.windows, plan.matrices
        other = torch.from_numpy(self.formats[indices] != _FORMAT_JPEG)
        if bool(other.any()):
            full_w, full_m = full_resolution(windows, matrices)
            windows = torch.where(other[:, None], full_w, windows)
            matrices = torch.where(other[:, None, None], full_m, matrices)
        return windows, matrices, other

    def make(self, indices, epoch, slot, k=0):
        """Batch k of the epoch (k picks the decoder with decoder="hybrid")."""
        indices = np.asarray(indices, dtype=np.int64)
        batch = None
        if self.hardware and not (self.hybrid and k % HYBRID_PERIOD == HYBRID_PERIOD - 1):
            batch = self._make_on_gpu(indices, epoch, slot)
        if batch is None:
            batch = self._make_on_cpu(indices, epoch, slot)
        batch.params = self.pipeline.sample_params(self.seed, epoch, batch.indices,
                                                   pin=self.device is not None and self.device.type == "cuda")
        batch.batch_plan = self.pipeline.batch_plan(self.seed, epoch, k, len(batch.indices))
        if batch.batch_plan is not None:  # soft targets made here: the stage then only mixes the images
            batch.labels = self.pipeline.mix_targets(batch.labels, batch.batch_plan)
        return batch

    def _make_on_cpu(self, indices, epoch, slot):
        t0 = time.perf_counter()
        windows, matrices, other = self.plan(indices, epoch)
        nbytes = decoded_nbytes(windows)
        buffer = slot.reserve(int(nbytes.sum()))
        n = len(indices)
        other_np = other.numpy()
        jpeg, others = np.flatnonzero(~other_np), np.flatnonzero(other_np)
        offsets = torch.zeros(n, dtype=torch.int64)
        shapes = torch.zeros(n, 3, dtype=torch.int64)
        status = torch.full((n,), ops.NOT_DECODED, dtype=torch.int32)
        messages = [""] * n
        with self.ds.reader() as reader:
            unreadable = {}
            buffers, crcs = self._sources(reader, indices[jpeg], unreadable)
            t1 = time.perf_counter()
            if len(jpeg):  # the JPEGs first, laid out by the native decoder
                j = torch.from_numpy(jpeg)
                _, offsets[j], shapes[j], status[j], decoded = ops.decode_crops(
                    buffers, windows[j], buffer, threads=self.threads, strict=self.strict,
                    max_pixels=self.max_pixels, crcs=crcs)
                for k, message in zip(jpeg.tolist(), decoded):
                    messages[k] = message
        for k, message in unreadable.items():  # decoded as empty buffers: report them as what they are
            status[jpeg[k]] = ops.CORRUPT
            messages[jpeg[k]] = message
        # Then the other formats, laid out here: the native layout gives no room to a window no JPEG can have (a
        # side over 65535), and Pillow's would overwrite the samples after it.
        start = int(nbytes[jpeg].sum())
        for k in others.tolist():
            room = int(nbytes[k])
            offsets[k], shapes[k] = start, torch.tensor([int(windows[k, 2]), int(windows[k, 3]), 3])
            self._pillow_fill(int(indices[k]), windows[k], buffer[start:start + room], status, messages, k)
            start += room
        used = int(nbytes.sum())
        # OK samples whose message is a harmless libjpeg warning (strict lets those through): counted, not hidden
        warned = sum(1 for k, m in enumerate(messages)
                     if m.startswith(ops.WARNING_PREFIX) and int(status[k]) == ops.OK)
        counts = {"fallback": int(other.sum()), "skipped": 0, "warnings": warned}
        bad = np.flatnonzero(status.numpy() != ops.OK)
        if len(bad):
            indices = indices.copy()
            buffer, offsets, shapes, matrices, used = self._repair(bad, indices, matrices, slot, offsets, shapes,
                                                                   messages, epoch, used, counts)
        labels = torch.from_numpy(self.labels[indices])
        t3 = time.perf_counter()
        self.stats.add(read=t1 - t0, decode=t3 - t1)
        return RaggedBatch(buffer, offsets, shapes, matrices, labels, used, slot, counts, indices)

    def _make_on_gpu(self, indices, epoch, slot):
        """decoder="nvjpeg": the hardware decoder takes every baseline YCbCr JPEG of the batch, the cores the rest
        (other JPEG kinds, other formats), into one device buffer ([hardware part | CPU part]); or None to take
        the CPU path for all of it. (Splitting baseline JPEGs between engines and cores by their measured speeds
        was tried: nvJPEG's host-side work and the crop decoders slow each other, and no split beat the engines
        alone, bench/RESULTS.md.)"""
        t0 = time.perf_counter()
        n = len(indices)
        verdicts = self._verdict_key[indices]
        chosen = np.flatnonzero((self.formats[indices] == _FORMAT_JPEG) & (self._decodable[verdicts] != CORES))
        if not len(chosen):
            return None
        with self.ds.reader() as reader:
            buffers = self._engine_buffers(reader, indices[chosen])
            keep = engine_ready(self._decodable, verdicts[chosen], buffers, threads=self.threads,
                                max_pixels=self.max_pixels)
            # Everything else (other JPEG kinds, failed checks, unreadable files or records): the cores, whose
            # path reports or skips it as decoder="cpu" would.
            chosen = chosen[keep]
            buffers = [b for b, ok in zip(buffers, keep) if ok]
            if not len(chosen):
                return None
            windows, matrices, _ = self.plan(indices, epoch)
            full_bytes = int((windows[:, 2] * windows[:, 3] * 3).sum())  # the whole batch at full resolution
            hw = torch.from_numpy(chosen)
            windows, matrices = full_resolution(windows[hw], matrices[hw])  # the hardware has no DCT downscale
            hw_bytes = int(decoded_nbytes(windows).sum())
            rest = np.setdiff1d(np.arange(n), chosen)
            t1 = time.perf_counter()
            part = self._make_on_cpu(indices[rest], epoch, slot) if len(rest) else None  # raises or repairs
            with self._hardware_lock:  # one batch at a time: the engines are shared, and it is the fastest
                decoder, stream, copy_stream = self._hardware_handles(n)
                with torch.cuda.stream(stream):  # sized for the whole batch at full resolution, whatever the
                    # split: buffer sizes then follow the plan alone, and memory stays flat from epoch to epoch
                    out = slot.reserve_device(max(full_bytes, hw_bytes + (part.nbytes if part else 0)), self.device)
                if part is not None:  # on the copy engine, while the JPEG engines decode
                    with torch.cuda.stream(copy_stream):
                        out[hw_bytes:hw_bytes + part.nbytes].copy_(part.data[:part.nbytes], non_blocking=True)
                try:
                    hw_offsets, hw_shapes = decoder.decode(buffers, windows, out, stream)
                    # The bitstreams are host memory the reader context owns: done with them before it ends.
                    stream.synchronize()
                except NvjpegError:
                    return None
                finally:
                    copy_stream.synchronize()  # the pinned slot may be refilled after this
        offsets = torch.empty(n, dtype=torch.int64)
        shapes = torch.empty(n, 3, dtype=torch.int64)
        all_matrices = torch.empty(n, 2, 3, dtype=torch.float32)
        labels = torch.from_numpy(self.labels[indices])
        final = indices.copy()
        cpu = torch.from_numpy(rest)
        offsets[hw], shapes[hw], all_matrices[hw] = hw_offsets, hw_shapes, matrices
        if part is not None:
            offsets[cpu], shapes[cpu], all_matrices[cpu] = part.offsets + hw_bytes, part.shapes, part.matrices
            labels[cpu] = part.labels  # on_error="skip" may have replaced samples
            final[rest] = part.indices
        self.stats.add(read=t1 - t0, decode=time.perf_counter() - t1)
        counts = dict(part.counts if part is not None else {}, gpu_decoded=len(chosen))
        return RaggedBatch(out, offsets, shapes, all_matrices, labels, hw_bytes + (part.nbytes if part else 0), slot,
                           counts, final)

    def _hardware_handles(self, batch):
        if self._hardware is None:
            # High priority: inside a training loop the decode's few kernels and copies must not queue behind
            # the model's, or the producer waits on them with the batch half done.
            self._hardware = (HardwareDecoder(batch), torch.cuda.Stream(self.device, priority=-1),
                              torch.cuda.Stream(self.device, priority=-1))
        return self._hardware

    def _engine_buffers(self, reader, indices):
        """The bytes of these samples for the engines, or None where they cannot go: a record that cannot be
        read or fails its packed CRC-32, a file that cannot be read safely (_read_file). The CPU path then reads
        them again and reports what it finds."""
        unreadable = {}
        buffers, crcs = self._sources(reader, indices, unreadable)
        buffers = [None if k in unreadable else _read_file(b)[0] if isinstance(b, str) else b
                   for k, b in enumerate(buffers)]
        if crcs is not None:  # the CPU path checks these natively as it decodes; here, before
            present = [k for k, b in enumerate(buffers) if b is not None]
            got = ops.C.crc32s([buffers[k] for k in present], self.threads).numpy()
            for k, crc in zip(present, got.tolist()):
                if crcs[k] >= 0 and crc != crcs[k]:
                    buffers[k] = None
        return buffers

    @staticmethod
    def _sources(reader, indices, unreadable=None):
        """(buffers, crcs) for the native decoder: zero-copy views and their packed CRC-32 for LMDB, file paths
        and no checksums for folders. A record that cannot be read (a damaged store) gets an empty buffer and its
        reason goes to ``unreadable`` {position: message}: on_error then treats it like a failed decode."""
        sources = getattr(reader, "sources", None)
        if sources is None:  # a dataset of our protocol's minimum: bytes from get(), no checksums
            sources = lambda idx: ([reader.get(i) for i in idx], None)  # noqa: E731
        try:
            buffers, crcs = sources(indices.tolist())
            return list(buffers), (None if crcs is None else list(crcs))
        except DecodeError:  # a damaged record among them: one by one, so only that sample fails
            pass
        buffers, crcs = [], []
        for k, i in enumerate(indices.tolist()):
            try:
                b, c = sources([i])
                buffers.append(b[0])
                crcs.append(-1 if c is None else c[0])
            except DecodeError as e:
                buffers.append(b"")
                crcs.append(-1)
                if unreadable is not None:
                    unreadable[k] = str(e).removeprefix(f"{e.sample}: ")
        return buffers, crcs

    def _pillow_fill(self, index, window, room, status, messages, k):
        """Decodes a non-JPEG sample with Pillow and writes its window, HWC, at the start of ``room`` (a uint8
        view that must hold it: nothing is written past it)."""
        top, left, h, w, _ = (int(v) for v in window)
        try:
            if h * w * 3 > room.numel():
                raise ValueError(f"its {w}x{h} window needs {h * w * 3} bytes, the batch gave it {room.numel()}")
            with self.ds.reader() as reader:
                data = bytes(reader.get(index))
            with Image.open(io.BytesIO(data)) as im:
                if im.width * im.height > self.max_pixels:
                    raise ValueError(f"{im.width}x{im.height} is over the pixel limit ({self.max_pixels})")
                rgb = np.array(im.convert("RGB"))  # writable: torch wants it so
            if rgb.shape[0] < top + h or rgb.shape[1] < left + w:
                raise ValueError(f"image is {rgb.shape[1]}x{rgb.shape[0]}, the index says otherwise")
            room[:h * w * 3].view(h, w, 3).copy_(torch.from_numpy(rgb[top:top + h, left:left + w]))
            status[k] = ops.OK
        except Exception as e:  # any Pillow failure is this sample's decode error
            status[k] = ops.CORRUPT
            messages[k] = f"Pillow could not decode it: {e}"

    def _repair(self, bad, indices, matrices, slot, offsets, shapes, messages, epoch, used, counts):
        """on_error="raise": raise for the first bad sample. "skip": replace each bad sample by a
        deterministic pick (a pure function of seed, epoch and the bad index) decoded into the slot's spare room."""
        if self.on_error == "raise":
            k = int(bad[0])
            name = self.ds.sample_name(int(indices[k]))
            raise DecodeError(f"{name}: {messages[k]}", sample=name, reason=messages[k])
        buffer = slot.buffer
        offsets, shapes, matrices = offsets.clone(), shapes.clone(), matrices.clone()
        n = len(self.heights)
        for k in bad.tolist():
            counts["skipped"] += 1
            original = int(indices[k])
            # A stream of its own (seed + a constant) so replacements never correlate with crop draws.
            picks = uniforms(self.seed + 0x5EED, epoch, np.array([original]), _MAX_REPLACEMENTS)[0]
            for u in picks:
                pick = np.array([min(int(u * n), n - 1)], dtype=np.int64)
                w, m, other = self.plan(pick, epoch)
                need = int(decoded_nbytes(w).sum())
                if used + need > buffer.numel():
                    grown = torch.empty(int((used + need) * 1.25), dtype=torch.uint8, pin_memory=slot.pin)
                    grown[:used].copy_(buffer[:used])
                    slot.buffer = buffer = grown
                if bool(other[0]):
                    st, msg = torch.tensor([ops.NOT_JPEG], dtype=torch.int32), [""]
                    off, shp = torch.tensor([0]), torch.tensor([[int(w[0, 2]), int(w[0, 3]), 3]])
                    self._pillow_fill(int(pick[0]), w[0], buffer[used:used + need], st, msg, 0)
                else:
                    with self.ds.reader() as reader:
                        picked, crc = self._sources(reader, pick)
                        _, off, shp, st, msg = ops.decode_crops(picked, w, buffer[used:], strict=self.strict,
                                                                max_pixels=self.max_pixels, crcs=crc)
                if int(st[0]) == ops.OK:
                    offsets[k], shapes[k], matrices[k] = used + int(off[0]), shp[0], m[0]
                    indices[k] = pick[0]
                    used += need
                    break
                counts["skipped"] += 1
            else:
                name = self.ds.sample_name(original)
                raise DecodeError(f"{name}: {messages[k]} (and {_MAX_REPLACEMENTS} replacements failed too)",
                                  sample=name, reason=messages[k])
        return buffer, offsets, shapes, matrices, used


def _read_file(path, max_bytes=ops.MAX_BYTES):
    """(bytes, "") of a file, or (None, why) — with the native reader's protections: opened non-blocking (a FIFO
    put where an image was must not hang the producer), regular files only, at most ``max_bytes``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return None, f"cannot read: {e.strerror or e}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "cannot read: not a regular file"
        if st.st_size > max_bytes:
            return None, f"file is {st.st_size} bytes, over the per-image limit of {max_bytes}"
        chunks, left = [], st.st_size
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                return None, "cannot read: file shrank while reading"
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), ""
    except OSError as e:
        return None, f"cannot read: {e.strerror or e}"
    finally:
        os.close(fd)
