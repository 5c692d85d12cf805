"""DataPrefetcher: GPU prefetch and normalisation for any loader of CPU uint8 image batches.

    loader = DataLoader(ImageFolder(root, transform=Compose([RandomResizedCrop(224), PILToTensor()])), ...)
    for x, y in DataPrefetcher(loader, device="cuda"):   # x: normalised float [B, 3, 224, 224] on the GPU

Batch k + 1 is copied and normalised on a side stream while the model works on batch k (the first batch is
prefetched before the first is handed out). Batches may be [B, C, H, W] or [B, H, W, C], uint8 or float32;
``size`` also resizes them (antialiased) in the same kernel.
"""
import torch

from ..loader import IMAGENET_MEAN, IMAGENET_STD, _resolve_device
from .pipe import DevicePipe


class DataPrefetcher:
    def __init__(self, loader, device="cuda", *, size=None, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                 dtype=torch.float32, channels_last=False, layout=None):
        self.loader = loader
        self.device = _resolve_device(device)
        if self.device.type != "cuda":
            raise ValueError("DataPrefetcher moves batches to a CUDA device; for CPU use the loader as it is")
        self.size = size
        self.layout = layout
        self.pipe = DevicePipe(self.device, size, mean, std, dtype, channels_last)

    def __len__(self):
        return len(self.loader)

    def _submit(self, batch):
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
        data = data if data.is_pinned() else data.pin_memory()
        out_h, out_w = (h, w) if self.size is None else ((self.size, self.size) if isinstance(self.size, int) else self.size)
        # Output pixel (u, v) -> input pixel: identity when sizes match, else a plain resize (pixel centres).
        sx, sy = w / out_w, h / out_h
        matrix = torch.tensor([[sx, 0.0, 0.5 * sx - 0.5], [0.0, sy, 0.5 * sy - 0.5]])
        offsets = torch.arange(b, dtype=torch.int64) * (h * w * c)
        shapes = torch.tensor([h, w, c], dtype=torch.int64).expand(b, 3)
        labels = torch.as_tensor(y)
        in_scale = 1.0 / 255 if x.dtype == torch.uint8 else 1.0
        return self.pipe.submit(data, offsets, shapes, matrix.expand(b, 2, 3), labels, data.numel(), hwc=hwc,
                                in_scale=in_scale, size=(out_h, out_w))

    def __iter__(self):
        pending = None
        for batch in self.loader:
            handle = self._submit(batch)
            if pending is not None:
                yield self.pipe.receive(pending)
            pending = handle
        if pending is not None:
            yield self.pipe.receive(pending)
