"""The GPU half of the data path: a ragged uint8 batch in pinned memory -> normalised [B, C, H, W] on the GPU.

All of it runs on one persistent side stream per pipe (a new stream per epoch leaks cached memory): the
host-to-device copy (non-blocking, from pinned memory), then the fused warp/normalise kernel. Two events
come back: ``copied`` (the host buffer may be rewritten) and ``ready`` (the batch may be used); the consumer's
stream waits on ``ready`` and takes ownership with ``record_stream``, so the caching allocator never hands
the batch's memory to anyone while the model still reads it.

A tensor with such stream uses must never be freed in a forked child (a DataLoader worker): the allocator would
record a CUDA event there, where CUDA cannot run, and abort the child. A fork drops the other threads' frames
in the child, and with them the producers' device buffers, so every tensor given stream uses here is kept alive
in forked children for good (``_keep_in_forked_children``).
"""
import ctypes
import os
import weakref
from dataclasses import dataclass

import torch

from .. import ops

# Tensors given record_stream uses, while they live, by id (not a WeakSet: that compares tensors with ==).
_stream_used = weakref.WeakValueDictionary()
_fork_held = []  # strong references across a fork: dropped in the parent, never in the child


def _record_stream(tensor, stream):
    tensor.record_stream(stream)
    _stream_used[id(tensor)] = tensor


def _hold_before_fork():
    _fork_held[:] = list(_stream_used.values())


def _release_in_parent():
    _fork_held.clear()


def _keep_in_forked_children():
    for t in _fork_held:  # one reference more than anything in the child will ever drop
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))
    _fork_held.clear()


os.register_at_fork(before=_hold_before_fork, after_in_parent=_release_in_parent,
                    after_in_child=_keep_in_forked_children)


@dataclass
class Handle:
    x: torch.Tensor
    y: torch.Tensor
    ready: torch.cuda.Event
    copied: torch.cuda.Event


class DevicePipe:
    def __init__(self, device, size, mean, std, dtype, channels_last, *, in_scale=1.0 / 255, stage=None,
                 batch_ops=None):
        """stage: what runs after the copy, ``stage(pixels, offsets, shapes, matrices, params, channels_last=,
        hwc=, channels=)`` (FastLoader's transforms.Pipeline.run); by default the fused warp + normalise.
        batch_ops: ``batch_ops(x, plan, params)`` after the stage for batches submitted with a batch_plan
        (MixUp/CutMix's images, and the erase the stage left to them: Pipeline.mix_images), on the side stream
        too; their labels come mixed (Pipeline.mix_targets, in the producer)."""
        self.stage = stage
        self.batch_ops = batch_ops
        self.device = torch.device(device)
        self.size = size
        self.mean, self.std, self.in_scale = mean, std, in_scale
        self.dtype = dtype
        self.channels_last = channels_last
        # High priority: inside a training loop the copy and the kernel go ahead of the model's queued kernels.
        self.stream = torch.cuda.Stream(self.device, priority=-1)

    def submit(self, data, offsets, shapes, matrices, labels, nbytes, *, hwc=True, in_scale=None, size=None,
               params=None, batch_plan=None):
        """Queues copy + stage on the side stream; returns at once. data must be pinned for a real overlap.
        labels: any dtype and shape [B, ...] (class indices, float or multi-dimensional targets), kept as they are.
        in_scale: the pipe's own unless given."""
        in_scale = self.in_scale if in_scale is None else in_scale
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            # One copy for offsets, shapes and labels: their bytes side by side (labels start 8-byte aligned).
            labels = labels.contiguous()
            head = torch.cat([offsets.reshape(-1).to(torch.int64), shapes.reshape(-1).to(torch.int64)])
            meta = torch.cat([head.view(torch.uint8), labels.reshape(-1).view(torch.uint8)])
            meta = meta.pin_memory().to(self.device, non_blocking=True)
            mats = matrices.to(torch.float32).contiguous().pin_memory().to(self.device, non_blocking=True)
            pixels = data[:nbytes].to(self.device, non_blocking=True)
            if data.is_cuda:  # decoded on the GPU on another stream: keep its memory ours until the kernel ran
                _record_stream(data, self.stream)
            copied = torch.cuda.Event(blocking=True)  # see below
            copied.record(self.stream)
            b = offsets.numel()
            head = meta[:head.numel() * 8].view(torch.int64)
            y = meta[head.numel() * 8:].view(labels.dtype).view(labels.shape)
            offs, shps = head[:b], head[b:4 * b].view(b, 3)
            if self.stage is not None:
                x = self.stage(pixels, offs, shps, mats, params, channels_last=self.channels_last, hwc=hwc,
                               channels=int(shapes[0, 2]))
            else:
                x = ops.warp_ragged(pixels, offs, shps, mats, size or self.size, mean=self.mean, std=self.std,
                                    in_scale=in_scale, out_dtype=self.dtype, channels_last=self.channels_last,
                                    hwc=hwc, channels=int(shapes[0, 2]))
            if batch_plan is not None:
                x = self.batch_ops(x, batch_plan, params)
            # Producers wait on these from the host (Slot.wait_reusable) before refilling a buffer. Blocking
            # events sleep there: a default one spins its thread on a core (the driver's policy with one
            # context on many cores), a core the decode threads could use (bench/RESULTS.md, "Waiting for the
            # GPU").
            ready = torch.cuda.Event(blocking=True)
            ready.record(self.stream)
            return Handle(x, y, ready, copied)

    def receive(self, handle):
        """The batch, usable on the current stream."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(handle.ready)
        _record_stream(handle.x, current)
        _record_stream(handle.y, current)
        return handle.x, handle.y
