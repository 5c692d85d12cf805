"""Turning a list of sample indices into a decoded ragged batch: plan, then the loader's decoder (decoders.py).

Per batch, ``BatchMaker.prepare(indices, epoch, k)``: the crop plan of every sample (vectorised), the stage's
per-sample parameters and the batch ops' draws, which each producer makes ahead for its next batches while its
current one decodes (``prepare_many``: several batches in one pass); then ``make`` (or ``start``, whose result's
``finish()`` gives the batch): the decoder named by ``decoder=``
(fastload.decoders: "cpu", the cores, reads and decodes the batch in one native call without the GIL straight into
the slot's buffer, pinned when the batch goes to a GPU; "nvjpeg" the GPU's JPEG engines; "hybrid" both on different
batches). Pillow decodes the few non-JPEG samples, and with ``on_error="skip"`` broken samples get deterministic
replacements; see decoders.py.
"""
import os
import threading
import warnings
import weakref
from typing import Any, NamedTuple

import numpy as np
import torch

from . import decoders
# Re-exported: what callers and tests have imported from here.
from .decoders import (CORES, HEADER_OK, HYBRID_PERIOD, UNKNOWN, VERIFIED, RaggedBatch,  # noqa: F401
                       decoded_nbytes, engine_ready, full_resolution)
from .decoders import FORMAT_JPEG as _FORMAT_JPEG
from .decoders import read_file as _read_file  # noqa: F401


def _rounded(nbytes):
    """A power of two (1 MiB at least) over ``nbytes``: the few sizes the caching allocators (device and host) then
    see are reused epoch after epoch, by the slots of every epoch."""
    return 1 << max(20, (int(nbytes) - 1).bit_length())


class Slot:
    """A reusable decode buffer; grows (by 25% headroom) when a batch needs more, never shrinks."""

    def __init__(self, pin):
        self.pin = pin
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self.device_buffer = None  # decoder="nvjpeg": the hardware decoder's output
        self.bitstreams = None  # decoder="nvjpeg": the files the engines read (decoders.Engines._buffers)
        self.copied = None  # CUDA event: the buffer may be rewritten once the copy (or kernel) it guards is done

    def reserve(self, nbytes):
        if self.buffer.numel() < nbytes:
            self.buffer = torch.empty(int(nbytes * 1.25), dtype=torch.uint8, pin_memory=self.pin)
        return self.buffer

    def reserve_device(self, nbytes, device):
        if self.device_buffer is None or self.device_buffer.numel() < nbytes:
            self.device_buffer = None  # free first: the kernel that read it is done (wait_reusable)
            self.device_buffer = torch.empty(_rounded(nbytes), dtype=torch.uint8, device=device)
        return self.device_buffer

    def pin_bitstreams(self, nbytes):
        """A page-locked buffer of at least ``nbytes`` for the files the engines read (decoders.Engines._buffers)."""
        self.bitstreams = torch.empty(_rounded(nbytes), dtype=torch.uint8, pin_memory=True)
        return self.bitstreams

    def wait_reusable(self):
        if self.copied is not None:
            self.copied.synchronize()
            self.copied = None


class Prepared(NamedTuple):
    """BatchMaker.prepare's result."""
    indices: np.ndarray   # int64 [B]
    plan: tuple           # BatchMaker.plan: (windows, matrices, other)
    params: Any           # Pipeline.sample_params
    batch_plan: Any       # Pipeline.batch_plan (None without batch ops)


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
    """Makes a batch: ``pipeline`` (transforms.Pipeline) plans windows and matrices before decoding, ``decoder``
    (a name of decoders.KINDS, or a decoders.Kind) decodes them, then the pipeline draws the per-sample parameters
    of the stage once the batch's samples are final."""

    def __init__(self, dataset, pipeline, seed, threads, on_error, strict, max_pixels, stats, device=None,
                 decoder="cpu", ranks=(0, 1)):
        self.ds = dataset
        self.pipeline = pipeline
        self.seed = seed
        # (rank, world size): the batch ops draw per global batch (k * world_size + rank), so that under torchrun
        # each rank mixes its batch with its own lambda / box, as with torchvision in each rank's DataLoader
        self.rank, self.world_size = ranks
        self.on_error = on_error
        self.strict = strict
        self.max_pixels = max_pixels
        self.stats = stats
        self.heights = np.asarray(dataset.heights, dtype=np.int64)
        self.widths = np.asarray(dataset.widths, dtype=np.int64)
        # [N, 2] (height, width): what the decoders compare each JPEG's header with, gathered per batch
        self.sizes = np.stack([self.heights, self.widths], 1)
        # Samples whose index claims more than max_pixels: never decoded (JpegCrops.read refuses them, Pillow's read
        # finds the image over the limit or not what the index says), so never planned a window from that size:
        # the engines' device buffer is sized from the plan before any file is opened.
        self.oversized = self.heights * self.widths > max_pixels
        self.labels = targets(dataset.labels)
        self.formats = np.asarray(dataset.formats, dtype=np.uint8)
        self.device = device
        # Held by the one producer inside the hardware decoder at a time, and by a fork (_hold_decoders).
        self._hardware_lock = threading.Lock()
        self._parts = {}  # part(): the cores, the engines
        self._warned_together = False  # prepare_many's warning, once
        self.use(decoders.KINDS[decoder] if isinstance(decoder, str) else decoder, threads)
        _makers.add(self)

    def use(self, kind, threads):
        """Decodes with ``kind`` (a decoders.Kind) on ``threads`` native threads from the next batch made: at
        construction, and when decoder="auto" switches (no producer is running then)."""
        self.threads = threads
        self.decoder = kind.build(self)

    def part(self, name, build):
        """The decoder part ``name``, ``build()`` the first time: kinds built on one maker share their parts."""
        if name not in self._parts:
            self._parts[name] = build()
        return self._parts[name]

    @property
    def _decodable(self):
        """The engines' per-sample verdicts (decoders.engine_ready), where this maker has built the engines."""
        return self._parts["engines"].decodable

    def plan(self, indices, epoch):
        plan = self.pipeline.plan(self.heights[indices], self.widths[indices], self.seed, epoch, indices)
        windows, matrices = plan.windows, plan.matrices
        other = self.formats[indices] != _FORMAT_JPEG  # bool numpy [B]: samples Pillow decodes
        if other.any():
            full_w, full_m = full_resolution(windows, matrices)
            mask = torch.from_numpy(other)
            windows = torch.where(mask[:, None], full_w, windows)
            matrices = torch.where(mask[:, None, None], full_m, matrices)
        big = self.oversized[indices]
        if big.any():  # see __init__
            windows = decoders.without_windows(windows, big)
        return windows, matrices, other

    def prepare(self, indices, epoch, k=0):
        """What batch k needs before its decode, all pure functions of (seed, epoch, indices, k): the crop plan, the
        stage's per-sample parameters and the batch ops' draws. Each producer makes it ahead for its next batches
        (prepare_many, several at once) while its current batch decodes, so this Python work overlaps the decode
        instead of idling the decode threads (bench/RESULTS.md, "Loaders alone with a policy")."""
        indices = np.asarray(indices, dtype=np.int64)
        return Prepared(indices, self.plan(indices, epoch), self._params(epoch, indices),
                        self.pipeline.batch_plan(self.seed, epoch, k * self.world_size + self.rank, len(indices)))

    def prepare_many(self, batches, epoch, ks):
        """prepare() of several batches (a producer's next ones, batch ks[i] of the epoch holding batches[i]) in
        one pass over all their samples: each batch gets exactly what prepare() gives it (every draw is per sample),
        for half the Python time per batch, numpy's cost per call being paid once for the lot (bench/RESULTS.md,
        "Planning several batches at once"). Where the pipeline plans per batch (AugMix), only the first batch is
        prepared. Where the pass fails, the batches are prepared alone, in order, up to the first that fails: an
        error is raised by the batch that causes it, when that batch is asked for (it comes first then)."""
        if len(batches) == 1 or not self.pipeline.splits_params:
            return [self.prepare(batches[0], epoch, ks[0])]
        try:
            return self._prepare_together([np.asarray(b, dtype=np.int64) for b in batches], epoch, ks)
        except Exception as e:  # one batch's bad sample or setting, found again below by its own batch
            failed = e
        out = []
        for b, k in zip(batches, ks):
            try:
                out.append(self.prepare(b, epoch, k))
            except Exception:
                if not out:
                    raise
                return out
        if not self._warned_together:  # every batch planned alone: the pass itself is at fault (a bug)
            self._warned_together = True
            warnings.warn(f"fastload: planning {len(batches)} batches in one pass failed where each alone did not "
                          f"({type(failed).__name__}: {failed}); they are planned one at a time, at twice the "
                          f"cost. Please report it.", RuntimeWarning, stacklevel=2)
        return out

    def _prepare_together(self, batches, epoch, ks):
        indices = np.concatenate(batches)
        windows, matrices, other = self.plan(indices, epoch)
        params = self.pipeline.split_params(self._params(epoch, indices), [len(b) for b in batches], pin=self._pins)
        out, start = [], 0
        for b, k, p in zip(batches, ks, params):
            rows = slice(start, start + len(b))
            start += len(b)
            out.append(Prepared(b, (windows[rows], matrices[rows], other[rows]), p,
                                self.pipeline.batch_plan(self.seed, epoch, k * self.world_size + self.rank, len(b))))
        return out

    @property
    def _pins(self):
        """Whether the batches' parameter tables are pinned (they go to a GPU)."""
        return self.device is not None and self.device.type == "cuda"

    def _params(self, epoch, indices):
        return self.pipeline.sample_params(self.seed, epoch, indices, pin=self._pins)

    def make(self, indices, epoch, slot, k=0, prepared=None):
        """Batch k of the epoch (k picks the decoder with decoder="hybrid"); ``prepared``: prepare()'s result for
        it, when made ahead."""
        return self.start(indices, epoch, slot, k, prepared).finish()

    def start(self, indices, epoch, slot, k=0, prepared=None):
        """make() begun (a decoders.Pending, whose finish() gives the batch): the producer's own work overlaps the
        decode until then."""
        if prepared is None:
            prepared = self.prepare(indices, epoch, k)
        return decoders.Pending(self._finished(self.decoder.start(prepared.indices, epoch, slot, k,
                                                                  plan=prepared.plan), prepared, epoch))

    def _finished(self, pending, prepared, epoch):
        try:
            yield
        except GeneratorExit:
            pending.close()
            raise
        batch = pending.finish()
        # on_error="skip" may have replaced samples: their parameters are drawn for what was decoded
        replaced = batch.indices is not prepared.indices and not np.array_equal(batch.indices, prepared.indices)
        batch.params = self._params(epoch, batch.indices) if replaced else prepared.params
        batch.batch_plan = prepared.batch_plan
        if batch.batch_plan is not None:  # soft targets made here: the stage then only mixes the images
            batch.labels = self.pipeline.mix_targets(batch.labels, batch.batch_plan)
        return batch
