"""RandomErasing: torchvision.transforms.v2's, per sample on the finished (normalised) batch, without a sample loop.

``table`` draws every sample's box on the host from the counter RNG, reproducing torchvision's ``make_params``
(p draw, 10 attempts with the area uniform in ``scale`` and the log aspect ratio uniform, the first box that fits
wins, then uniform integer top/left); ``apply`` erases all boxes in one native pass on the batch's device
(transforms.batch_ops, which also fuses the erase with MixUp/CutMix when a pipeline has both).

``value="random"``: the noise is drawn on the host, from fastload.rng (its own stream), as float64 Box-Muller
normals rounded to float32, only for the erased pixels, in the order ``masked_scatter`` would paste them (sample,
channel, row, column), and the native op copies them into the boxes. So it is the same on CPU and CUDA bit for bit
(the device only copies numbers), and exactly N(0, 1) up to float32 rounding. A
device-side integer hash would save the host work (about 50 ns per erased value on one core: ~0.1 s for a batch of
256 at 176 px with p=0.5) and the transfer, but turning its bits into normals needs log/cos, which CUDA and the host
round differently, so CPU and CUDA batches would differ. The constant values (the default, and torchvision's
recipes) cost no host work beyond the box table.
"""
import math
import numbers
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from .. import rng
from .geometry import probability, uniform_bounds

__all__ = ["RandomErasing"]

_ATTEMPTS = 10  # torchvision's
_COLUMNS = 1 + 2 * _ATTEMPTS + 2  # the p draw, (area, log ratio) per attempt, then top and left
_NOISE_ROW = 64  # noise values per rng row (32 Box-Muller pairs)
_CHUNK_BITS = 24  # noise rows of a sample are keyed (index << 24) | row: up to 2^30 values per sample


class RandomErasing:
    """torchvision.transforms.v2.RandomErasing: erase a random rectangle of each image with ``value`` (a number,
    one number per channel, or ``"random"``: standard normal noise per pixel and channel).

    It acts on the normalised float batch (after ToDtype and Normalize), so ``value`` is on that scale, as in
    torchvision. Each sample has its own box (keyed by sample index), drawn as torchvision draws it; when no box
    fits in 10 attempts, or the p draw says no, the sample is left alone.
    """

    kind = "erasing"

    def __init__(self, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0.0, inplace=False):
        # torchvision's checks, messages and exception types, in its order
        p = probability(p)
        if not isinstance(value, (numbers.Number, str, tuple, list)):
            raise TypeError("Argument value should be either a number or str or a sequence")
        if isinstance(value, str) and value != "random":
            raise ValueError("If value is str, it should be 'random'")
        if not isinstance(scale, Sequence):
            raise TypeError("Scale should be a sequence")
        if not isinstance(ratio, Sequence):
            raise TypeError("Ratio should be a sequence")
        if (scale[0] > scale[1]) or (ratio[0] > ratio[1]):
            warnings.warn("Scale and ratio should be of kind (min, max)")
        if scale[0] < 0 or scale[1] > 1:
            raise ValueError("Scale should be between 0 and 1")
        self.p = p
        self.scale = scale
        self.ratio = ratio
        # torchvision's representation: a list of floats, or None for "random"
        self.value = None if isinstance(value, str) else [float(v) for v in
                                                          (value if isinstance(value, (tuple, list)) else [value])]
        self.inplace = inplace
        self.stream = 0  # set by Compose

    def __repr__(self):
        value = "random" if self.value is None else self.value
        return (f"RandomErasing(p={self.p}, scale={tuple(self.scale)}, ratio={tuple(self.ratio)}, value={value}, "
                f"inplace={self.inplace})")

    # --- planning (host) --------------------------------------------------------------------------------------
    def table(self, seed, epoch, indices, height, width):
        """float32 [B, 4] (top, left, h, w) of each sample's box on a height x width canvas; h = w = 0: the sample
        is not erased."""
        height, width = int(height), int(width)
        if self.p > 0:  # torchvision draws both on the first image it erases
            uniform_bounds(*self.scale[:2], self)
            with np.errstate(divide="ignore"):
                uniform_bounds(*np.log(np.asarray(self.ratio[:2], dtype=np.float64)).tolist(), self)
        u = rng.uniforms(seed, epoch, indices, _COLUMNS, stream=self.stream)
        n = len(u)
        with np.errstate(divide="ignore", invalid="ignore"):  # (p = 0 skips the bounds check: ratio may be anything)
            lo, hi = np.log(np.asarray(self.ratio[:2], dtype=np.float64))
            area = height * width * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, 1:2 * _ATTEMPTS + 1:2])
            aspect = np.exp(lo + (hi - lo) * u[:, 2:2 * _ATTEMPTS + 2:2])
            h = np.rint(np.sqrt(area * aspect))  # rint: Python's round (half to even), as torchvision's round()
            w = np.rint(np.sqrt(area / aspect))
        fits = (h < height) & (w < width)  # nan compares False
        first = fits.argmax(axis=1)  # the first attempt that fits
        rows = np.arange(n)
        h, w = h[rows, first], w[rows, first]
        erased = (u[:, 0] < self.p) & fits.any(axis=1)
        h = np.where(erased, h, 0.0)
        w = np.where(erased, w, 0.0)
        top = np.minimum(np.floor(u[:, -2] * (height - h + 1)), height - h)  # randint(0, height - h + 1)
        left = np.minimum(np.floor(u[:, -1] * (width - w + 1)), width - w)
        top = np.where(erased, top, 0.0)
        left = np.where(erased, left, 0.0)
        return torch.from_numpy(np.stack([top, left, h, w], axis=1).astype(np.float32))

    def noise(self, seed, epoch, indices, table, channels):
        """float32 [N]: standard normal noise for the erased pixels, sample by sample in (channel, row, column)
        order of its box (the order masked_scatter fills them). Row r of a sample's noise is rng row
        (index << 24) | r of this transform's noise stream, so each sample's noise depends only on its own key."""
        table = np.asarray(table, dtype=np.float64)
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        counts = (channels * table[:, 2] * table[:, 3]).astype(np.int64)
        if counts.max(initial=0) > _NOISE_ROW << _CHUNK_BITS:
            raise ValueError(f"RandomErasing(value='random'): a box of {counts.max()} values is too large")
        if len(indices) and (indices.min() < 0 or indices.max() >= 1 << (63 - _CHUNK_BITS)):
            raise ValueError(f"RandomErasing(value='random'): sample indices must be in [0, 2^39), got "
                             f"{indices.min()}..{indices.max()}")
        nrows = -(-counts // _NOISE_ROW)
        total = int(nrows.sum())
        if total == 0:
            return torch.empty(0, dtype=torch.float32)
        owner = np.repeat(np.arange(len(counts)), nrows)  # sample of each noise row
        row = np.arange(total) - np.repeat(np.cumsum(nrows) - nrows, nrows)  # row number within its sample
        keys = (indices[owner] << _CHUNK_BITS) | row
        u = rng.uniforms(seed, epoch, keys, _NOISE_ROW, stream=rng.derived_stream(self.stream, 0))
        half = _NOISE_ROW // 2
        radius = np.sqrt(-2.0 * np.log1p(-u[:, :half]))  # 1 - u in (0, 1]: finite
        cos = np.cos(2.0 * math.pi * u[:, half:])
        sin = np.sqrt(1.0 - cos * cos)  # the angle's sine without a second trig call (half the time) ...
        sin[u[:, half:] >= 0.5] *= -1.0  # ... and its sign: negative for angles in [pi, 2 pi)
        z = np.concatenate([radius * cos, radius * sin], axis=1)
        keep = row[:, None] * _NOISE_ROW + np.arange(_NOISE_ROW) < counts[owner][:, None]
        return torch.from_numpy(z[keep].astype(np.float32))

    # --- execution (the batch's device) -----------------------------------------------------------------------
    def check_channels(self, c):
        """torchvision's check of ``value`` against an image of c channels (a pipeline calls it when built)."""
        if self.value is not None and len(self.value) not in (1, c):
            raise ValueError(f"If value is a sequence, it should have either a single value or {c} (number of inpt "
                             f"channels)")

    def op_args(self, x, table, seed, epoch, indices):
        """The erase's part of transforms.batch_ops.run for float x [B, C, H, W] and this batch's table: (columns
        int32 [B, 5]: top, left, h, w and where the sample's noise starts; fill float32 [C], the value as x's dtype
        holds it, or None; noise float32 [N], value="random" only), or None when no sample is erased."""
        if not isinstance(x, torch.Tensor) or x.ndim != 4 or not x.is_floating_point():
            raise TypeError(f"RandomErasing.apply needs a float [B, C, H, W] tensor, got "
                            f"{type(x).__name__} {getattr(x, 'dtype', '')} {tuple(getattr(x, 'shape', ()))}")
        b, c, height, width = x.shape
        table = torch.as_tensor(table, dtype=torch.float32).cpu()
        if table.shape != (b, 4):
            raise ValueError(f"RandomErasing: table of shape {tuple(table.shape)} for a batch of {b}")
        self.check_channels(c)
        top, left, h, w = table.unbind(1)
        outside = (top + h > height) | (left + w > width)
        if outside.any():
            s = int(outside.nonzero()[0, 0])
            raise ValueError(f"RandomErasing: the box of sample {s} (top, left, h, w = {table[s].tolist()}) does not "
                             f"fit the {height}x{width} batch: the table was planned for another size")
        if not (h > 0).any():
            return None
        columns = np.zeros((b, 5), dtype=np.int32)
        columns[:, :4] = table.numpy()
        if self.value is None:  # the noise in masked_scatter's order: sample by sample, (channel, row, column)
            counts = c * columns[:, 2].astype(np.int64) * columns[:, 3]
            columns[:, 4] = np.cumsum(counts) - counts
            return columns, None, self.noise(seed, epoch, indices, table, c).numpy()
        # torch.tensor(value, dtype=x.dtype): the value rounded once to x's dtype, exact as float32
        fill = torch.tensor(self.value, dtype=x.dtype).float().expand(c).numpy()
        return columns, fill, np.zeros(0, np.float32)

    def apply(self, x, table, seed, epoch, indices):
        """Erase each sample's box of float x [B, C, H, W] (CPU or CUDA; contiguous or channels_last) in one
        native pass (transforms.batch_ops). Returns a new tensor unless inplace=True (x is then overwritten and
        returned); x itself when nothing is erased."""
        args = self.op_args(x, table, seed, epoch, indices)
        if args is None:
            return x
        from .batch_ops import run
        out = run(x, erase=args)
        return x.copy_(out) if self.inplace else out
