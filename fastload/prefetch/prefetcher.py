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
from ..transforms.planners import _pair

_END = object()  # the wrapped loader has no more batches
_CARRIED = object()  # the labels travel with the stage (tensors), not beside it


class DataPrefetcher:
    """GPU prefetch for an existing loader of ``(images, labels)`` batches (e.g. torchvision's DataLoader): each
    batch is copied from pinned memory (pinned here where the loader's is not) on a side CUDA stream and
    resized/normalised there while the model trains on the previous one (on a CPU device, the same stage runs in
    the calling thread).

    images: uint8, or float on the 0-1 scale, ``[B, C, H, W]`` or ``[B, H, W, C]`` (``layout="NCHW"|"NHWC"``;
    default: guessed from which axis has 1, 3 or 4 values); other integer types are refused (their scale is not
    known). ``size``: the output (int or (h, w)), None keeps the input's. ``mean``/``std`` (0-1 scale; uint8 input
    is scaled by 1/255 first), ``dtype`` and ``channels_last`` as FastLoader's. A shape that fits both layouts
    ([B, 3, H, 3]) needs ``layout=``. Labels come back as they went in: tensors (and what torch.as_tensor takes,
    e.g. a list of ints) on the device, anything else (file names, dicts) untouched. If the
    wrapped loader raises, the batch it made before comes first, then the error, as the loader itself gives them."""

    def __init__(self, loader, device="cuda", *, size=None, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                 dtype=torch.float32, channels_last=False, layout=None):
        self.loader = loader
        self.device = _resolve_device(device)
        self.dtype = _check_dtype(dtype)
        self.mean, self.std, self._in_scale = _normalisation(mean, std, self.dtype)  # in_scale for uint8 input
        if not isinstance(channels_last, bool):
            raise TypeError(f"channels_last must be True or False, got {channels_last!r}")
        self.channels_last = channels_last
        self.size = None if size is None else _pair(size, "size")
        if layout is not None and (not isinstance(layout, str) or layout.upper() not in ("NCHW", "NHWC")):
            raise ValueError(f"layout must be 'NCHW', 'NHWC' or None (guessed from the shape), got {layout!r}")
        self.layout = None if layout is None else layout.upper()
        self.pipe = None
        if self.device.type == "cuda":
            from .pipe import DevicePipe
            self.pipe = DevicePipe(self.device, size, self.mean, self.std, self.dtype, channels_last)

    def __len__(self):
        return len(self.loader)

    def _stage_args(self, batch):
        """(data, offsets, shapes, matrices, labels, hwc, in_scale, out size) of one (images, labels) batch."""
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            what = f"a {type(batch).__name__} of {len(batch)}" if isinstance(batch, (tuple, list)) else \
                type(batch).__name__
            raise TypeError(f"DataPrefetcher expects (images, labels) batches of two items, got {what}")
        x, y = batch
        if isinstance(x, (list, tuple)):  # e.g. collate_fn=lambda b: tuple(zip(*b)): images of their own sizes
            raise TypeError(f"images must be one batch tensor [B, C, H, W] or [B, H, W, C], got a {type(x).__name__} "
                            f"of {len(x)} items: use a collate_fn that stacks them (the default one does)")
        try:
            x = torch.as_tensor(x)  # a numpy batch from a custom collate_fn too
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"images must be a batch tensor (or array) [B, C, H, W] or [B, H, W, C], got "
                            f"{type(x).__name__} ({e}): convert PIL images with a ToTensor/PILToTensor transform "
                            f"before batching") from None
        if x.device.type != "cpu":
            raise ValueError(f"images are on {x.device} already: DataPrefetcher copies host batches to the GPU; "
                             f"for batches on the GPU call fastload.ops.warp_affine on them")
        if x.dim() != 4 or x.shape[0] == 0:
            raise ValueError(f"images must be a batch [B, C, H, W] or [B, H, W, C] with B >= 1, got shape "
                             f"{tuple(x.shape)}")
        if x.dtype != torch.uint8 and not x.is_floating_point():
            raise TypeError(f"images must be uint8 (0-255) or float (0-1), got {x.dtype}: convert them, e.g. "
                            f"x.to(torch.uint8) for 0-255 values")
        if self.layout is None and x.shape[-1] in (1, 3, 4) and x.shape[1] in (1, 3, 4):
            raise ValueError(f"images of shape {tuple(x.shape)} fit both layouts: pass layout='NCHW' or 'NHWC'")
        hwc = self.layout == "NHWC" or (self.layout is None and x.shape[-1] in (1, 3, 4))
        b = x.shape[0]
        h, w, c = (x.shape[1], x.shape[2], x.shape[3]) if hwc else (x.shape[2], x.shape[3], x.shape[1])
        given = [len(v) for v in (self.mean, self.std) if v is not None]
        if any(n not in (1, c) for n in given):
            raise ValueError(f"images have {c} channels (read as {'NHWC' if hwc else 'NCHW'}, shape "
                             f"{tuple(x.shape)}), mean/std {max(given)}: pass layout= or a mean and std per "
                             f"channel")
        x = x if x.dtype in (torch.uint8, torch.float32) else x.float()
        data = x.contiguous().reshape(-1)
        out_h, out_w = (h, w) if self.size is None else self.size
        # Output pixel (u, v) -> input pixel: identity when sizes match, else a plain resize (pixel centres).
        sx, sy = w / out_w, h / out_h
        matrix = torch.tensor([[sx, 0.0, 0.5 * sx - 0.5], [0.0, sy, 0.5 * sy - 0.5]])
        offsets = torch.arange(b, dtype=torch.int64) * (h * w * c)
        shapes = torch.tensor([h, w, c], dtype=torch.int64).expand(b, 3).contiguous()
        # Float input is on the 0-1 scale: 255 times the uint8 input's scale.
        in_scale = self._in_scale if x.dtype == torch.uint8 else self._in_scale * 255
        return data, offsets, shapes, matrix.expand(b, 2, 3), y, hwc, in_scale, (out_h, out_w)

    def _submit(self, batch):
        """(the stage's handle or CPU result, the labels to hand back when they are not tensors, else _CARRIED)."""
        data, offsets, shapes, matrices, y, hwc, in_scale, size = self._stage_args(batch)
        labels = _as_labels(y, len(offsets))
        if self.pipe is None:  # CPU: the stage now, in this thread
            x = ops.warp_ragged(data, offsets, shapes, matrices, size, mean=self.mean, std=self.std,
                                in_scale=in_scale, out_dtype=self.dtype, channels_last=self.channels_last,
                                hwc=hwc, channels=int(shapes[0, 2]))
            return (x, y if labels is None else labels), _CARRIED
        data = data if data.is_pinned() else data.pin_memory()
        carried = torch.zeros(len(offsets), dtype=torch.int64) if labels is None else labels
        return self.pipe.submit(data, offsets, shapes, matrices, carried, data.numel(), hwc=hwc, in_scale=in_scale,
                                size=size), (y if labels is None else _CARRIED)

    def _receive(self, pending):
        handle, y = pending
        x, labels = handle if self.pipe is None else self.pipe.receive(handle)
        if y is not _CARRIED and isinstance(y, torch.Tensor):  # a tensor not [B, ...] (the stage carries those)
            y = y.to(x.device)
        return x, (labels if y is _CARRIED else y)

    def __iter__(self):
        pending = None
        batches = iter(self.loader)
        while True:
            try:
                batch = next(batches, _END)
                handle = None if batch is _END else self._submit(batch)
            except Exception:  # the loader (or its next batch) failed: the batch made before comes first
                if pending is not None:
                    yield self._receive(pending)
                raise
            if pending is not None:
                yield self._receive(pending)
            if handle is None:
                return
            pending = handle


def _as_labels(y, batch):
    """The labels as a [B, ...] tensor the stage carries to the device, or None for labels that are none (file
    names, dicts, lists of tensors), which come back as they went in."""
    try:
        labels = torch.as_tensor(y)
    except (TypeError, ValueError, RuntimeError):
        return None
    return labels if labels.dim() >= 1 and labels.shape[0] == batch else None
