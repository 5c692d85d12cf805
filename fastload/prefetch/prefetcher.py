"""DataPrefetcher: prefetch and normalisation for any loader of uint8 image batches (a torch DataLoader).

    loader = DataLoader(ImageFolder(root, transform=Compose([RandomResizedCrop(224), PILToTensor()])), ...)
    for x, y in DataPrefetcher(loader, device="cuda"):   # x: normalised float [B, 3, 224, 224] on the GPU

On CUDA, batch k + 1 is copied and normalised on a side stream while the model works on batch k (the first batch
is prefetched before the first is handed out). With device="cpu" the same stage runs on the CPU (the same op's
CPU twin): the same normalised float batches, for a model on the CPU. Batches may be [B, C, H, W] or
[B, H, W, C], uint8 or float32 (0-1); ``size`` also resizes them (antialiased) in the same pass. Labels come
back as they went in (any dtype or shape).
"""
import torch

from .. import ops
from ..loader import IMAGENET_MEAN, IMAGENET_STD, _check_dtype, _normalisation, _resolve_device


class DataPrefetcher:
    """GPU prefetch for an existing loader of ``(images, labels)`` batches (e.g. torchvision's DataLoader): each
    batch is copied from pinned memory (pinned here where the loader's is not) on a side CUDA stream and
    resized/normalised there while the model trains on the previous one (on a CPU device, the same stage runs in
    the calling thread).

    images: uint8, or float on the 0-1 scale, ``[B, C, H, W]`` or ``[B, H, W, C]`` (``layout="NCHW"|"NHWC"``;
    default: guessed from which axis has 1, 3 or 4 values). ``size``: the output (int or (h, w)), None keeps the
    input's. ``mean``/``std`` (0-1 scale; uint8 input is scaled by 1/255 first), ``dtype`` and ``channels_last``
    as FastLoader's."""

    def __init__(self, loader, device="cuda", *, size=None, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                 dtype=torch.float32, channels_last=False, layout=None):
        self.loader = loader
        self.device = _resolve_device(device)
        self.dtype = _check_dtype(dtype)
        self.mean, self.std, self._in_scale = _normalisation(mean, std, self.dtype)  # in_scale for uint8 input
        self.channels_last = channels_last
        self.size = size
        self.layout = layout
        self.pipe = None
        if self.device.type == "cuda":
            from .pipe import DevicePipe
            self.pipe = DevicePipe(self.device, size, self.mean, self.std, self.dtype, channels_last)

    def __len__(self):
        return len(self.loader)

    def _stage_args(self, batch):
        """(data, offsets, shapes, matrices, labels, hwc, in_scale, out size) of one (images, labels) batch."""
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise TypeError(f"DataPrefetcher expects (images, labels) batches, got {type(batch).__name__}")
        x, y = batch
        if x.dim() != 4:
            raise ValueError(f"images must be [B, C, H, W] or [B, H, W, C], got shape {tuple(x.shape)}")
        hwc = self.layout == "NHWC" or (self.layout is None and x.shape[-1] in (1, 3, 4) and x.shape[1] not in (1, 3, 4))
        b = x.shape[0]
        h, w, c = (x.shape[1], x.shape[2], x.shape[3]) if hwc else (x.shape[2], x.shape[3], x.shape[1])
        x = x if x.dtype in (torch.uint8, torch.float32) else x.float()
        data = x.contiguous().reshape(-1)
        out_h, out_w = (h, w) if self.size is None else ((self.size, self.size) if isinstance(self.size, int) else self.size)
        # Output pixel (u, v) -> input pixel: identity when sizes match, else a plain resize (pixel centres).
        sx, sy = w / out_w, h / out_h
        matrix = torch.tensor([[sx, 0.0, 0.5 * sx - 0.5], [0.0, sy, 0.5 * sy - 0.5]])
        offsets = torch.arange(b, dtype=torch.int64) * (h * w * c)
        shapes = torch.tensor([h, w, c], dtype=torch.int64).expand(b, 3).contiguous()
        # Float input is on the 0-1 scale: 255 times the uint8 input's scale.
        in_scale = self._in_scale if x.dtype == torch.uint8 else self._in_scale * 255
        return data, offsets, shapes, matrix.expand(b, 2, 3), torch.as_tensor(y), hwc, in_scale, (out_h, out_w)

    def _submit(self, batch):
        data, offsets, shapes, matrices, labels, hwc, in_scale, size = self._stage_args(batch)
        if self.pipe is None:  # CPU: the stage now, in this thread
            x = ops.warp_ragged(data, offsets, shapes, matrices, size, mean=self.mean, std=self.std,
                                in_scale=in_scale, out_dtype=self.dtype, channels_last=self.channels_last,
                                hwc=hwc, channels=int(shapes[0, 2]))
            return x, labels
        data = data if data.is_pinned() else data.pin_memory()
        return self.pipe.submit(data, offsets, shapes, matrices, labels, data.numel(), hwc=hwc, in_scale=in_scale,
                                size=size)

    def _receive(self, handle):
        return handle if self.pipe is None else self.pipe.receive(handle)

    def __iter__(self):
        pending = None
        for batch in self.loader:
            handle = self._submit(batch)
            if pending is not None:
                yield self._receive(pending)
            pending = handle
        if pending is not None:
            yield self._receive(pending)
