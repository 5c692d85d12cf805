"""The GPU half of the data path: a ragged uint8 batch in pinned memory -> normalised [B, C, H, W] on the GPU.

All of it runs on one persistent side stream per pipe (a new stream per epoch leaks cached memory): the
host-to-device copy (non-blocking, from pinned memory), then the fused warp/normalise kernel. Two events
come back: ``copied`` (the host buffer may be rewritten) and ``ready`` (the batch may be used); the consumer's
stream waits on ``ready`` and takes ownership with ``record_stream``, so the caching allocator never hands
the batch's memory to anyone while the model still reads it.
"""
from dataclasses import dataclass

import torch

from .. import ops


@dataclass
class Handle:
    x: torch.Tensor
    y: torch.Tensor
    ready: torch.cuda.Event
    copied: torch.cuda.Event


class DevicePipe:
    def __init__(self, device, size, mean, std, dtype, channels_last):
        self.device = torch.device(device)
        self.size = size
        self.mean, self.std = mean, std
        self.dtype = dtype
        self.channels_last = channels_last
        # High priority: inside a training loop the copy and the kernel go ahead of the model's queued kernels.
        self.stream = torch.cuda.Stream(self.device, priority=-1)

    def submit(self, data, offsets, shapes, matrices, labels, nbytes, *, hwc=True, in_scale=1.0 / 255, size=None):
        """Queues copy + stage on the side stream; returns at once. data must be pinned for a real overlap."""
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            meta = torch.cat([offsets.reshape(-1), shapes.reshape(-1), labels.reshape(-1).to(torch.int64)])
            meta = meta.pin_memory().to(self.device, non_blocking=True)
            mats = matrices.to(torch.float32).contiguous().pin_memory().to(self.device, non_blocking=True)
            pixels = data[:nbytes].to(self.device, non_blocking=True)
            if data.is_cuda:  # decoded on the GPU on another stream: keep its memory ours until the kernel ran
                pixels.record_stream(self.stream)
            copied = torch.cuda.Event()
            copied.record(self.stream)
            b = offsets.numel()
            x = ops.warp_ragged(pixels, meta[:b], meta[b:4 * b].view(b, 3), mats.view(b, 2, 3), size or self.size,
                                mean=self.mean, std=self.std, in_scale=in_scale, out_dtype=self.dtype,
                                channels_last=self.channels_last, hwc=hwc, channels=int(shapes[0, 2]))
            ready = torch.cuda.Event()
            ready.record(self.stream)
            return Handle(x, meta[4 * b:], ready, copied)

    def receive(self, handle):
        """The batch, usable on the current stream."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(handle.ready)
        handle.x.record_stream(current)
        handle.y.record_stream(current)
        return handle.x, handle.y
