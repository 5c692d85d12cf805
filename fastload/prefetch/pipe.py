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
from ..errors import DecodeError


def decode_on_gpu(part, device):
    """Whole-image nvJPEG decodes (torchvision), [3, H, W] uint8 each. A file nvJPEG refuses is decoded on the CPU
    instead, so a corrupt one raises the same DecodeError (naming it) as the CPU path."""
    from torchvision.io import ImageReadMode, decode_jpeg
    try:
        images = decode_jpeg(part.jpegs, device=device, mode=ImageReadMode.RGB)
    except RuntimeError:
        images = [None] * len(part.jpegs)
    out = []
    for i, (im, data) in enumerate(zip(images, part.jpegs)):
        h, w = int(part.shapes[i, 0]), int(part.shapes[i, 1])
        if im is None or tuple(im.shape) != (3, h, w):
            try:
                im = ops.decode_crop(data, 0, 0, h, w, sample=part.names[i]).permute(2, 0, 1).contiguous()
            except ValueError as e:  # window outside the image: the file changed since the index was made
                raise DecodeError(f"{part.names[i]}: {e}", sample=part.names[i]) from None
            im = im.pin_memory().to(device, non_blocking=True)
        out.append(im)
    return out


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
        self.stream = torch.cuda.Stream(self.device)

    def submit(self, data, offsets, shapes, matrices, labels, nbytes, *, hwc=True, in_scale=1.0 / 255, size=None):
        """Queues copy + stage on the side stream; returns at once. data must be pinned for a real overlap."""
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            meta = torch.cat([offsets.reshape(-1), shapes.reshape(-1), labels.reshape(-1).to(torch.int64)])
            meta = meta.pin_memory().to(self.device, non_blocking=True)
            mats = matrices.to(torch.float32).contiguous().pin_memory().to(self.device, non_blocking=True)
            pixels = data[:nbytes].to(self.device, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.stream)
            b = offsets.numel()
            x = ops.warp_ragged(pixels, meta[:b], meta[b:4 * b].view(b, 3), mats.view(b, 2, 3), size or self.size,
                                mean=self.mean, std=self.std, in_scale=in_scale, out_dtype=self.dtype,
                                channels_last=self.channels_last, hwc=hwc, channels=int(shapes[0, 2]) if len(shapes) else 3)
            ready = torch.cuda.Event()
            ready.record(self.stream)
            return Handle(x, meta[4 * b:], ready, copied)

    def submit_batch(self, batch):
        """A FastLoader RaggedBatch: its CPU-decoded part, plus the part nvJPEG decodes here (gpu_decode)."""
        if batch.gpu is None:
            return self.submit(batch.data, batch.offsets, batch.shapes, batch.matrices, batch.labels, batch.nbytes)
        part = batch.gpu
        cpu = self.submit(batch.data, batch.offsets, batch.shapes, batch.matrices, batch.labels, batch.nbytes)
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            images = decode_on_gpu(part, self.device)
            sizes = part.shapes.prod(dim=1)
            offsets = torch.cumsum(sizes, 0) - sizes
            pixels = torch.cat([im.reshape(-1) for im in images])
            mats = part.matrices.pin_memory().to(self.device, non_blocking=True)
            meta = torch.cat([offsets, part.shapes.reshape(-1), part.cpu_positions, part.positions]).pin_memory()
            meta = meta.to(self.device, non_blocking=True)
            k, n_cpu = len(part.jpegs), len(part.cpu_positions)
            x_gpu = ops.warp_ragged(pixels, meta[:k], meta[k:4 * k].view(k, 3), mats, self.size,
                                    mean=self.mean, std=self.std, out_dtype=self.dtype,
                                    channels_last=self.channels_last, hwc=False, channels=3)
            x = torch.empty((len(batch.labels),) + tuple(x_gpu.shape[1:]), dtype=x_gpu.dtype, device=self.device)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            x[meta[4 * k:4 * k + n_cpu]] = cpu.x
            x[meta[4 * k + n_cpu:]] = x_gpu
            y = batch.labels.pin_memory().to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return Handle(x, y, ready, cpu.copied)

    def receive(self, handle):
        """The batch, usable on the current stream."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(handle.ready)
        handle.x.record_stream(current)
        handle.y.record_stream(current)
        return handle.x, handle.y
