"""Crop planners: from image sizes and per-sample random numbers to decode windows, DCT scales and warp matrices.

A plan is decided before any pixel is decoded. For each sample it gives the window of the JPEG to decode
(top, left, height, width in original pixels), the DCT downscale d the decoder applies, and the 2x3 matrix that
maps an output pixel index (u, v) to a pixel index of the decoded crop (pixel centres at integers), each row
followed by the visible interval of its input axis (the crop: [B, 2, 5] maps), which is what
``fastload.ops.warp_ragged`` / ``warp_affine`` consume. The decoded crop of a window is rows top//d ..
ceil((top+h)/d) and columns left//d .. ceil((left+w)/d) of the 1/d-scaled image (``ops.decoded_shape``).
"""
import copy
import math
import numbers
from typing import NamedTuple

import numpy as np
import torch

from .. import rng

__all__ = ["CropPlan", "RandomResizedCrop", "CenterCrop"]



class CropPlan(NamedTuple):
    windows: torch.Tensor  # int64 [B, 5]: top, left, height, width, downscale
    matrices: torch.Tensor  # float32 [B, 2, 5]: output pixel -> decoded-crop pixel, then each input axis's visible
    #                         interval (warp.h; as geometry.GeometryPlan): the crop, within the image
    flipped: np.ndarray  # bool [B]


def _whole(v):
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and float(v).is_integer()


def _pair(size, name):
    """torchvision's size argument: a number (224, or 224.0 as torchvision takes it; 224.5 is refused rather
    than truncated) or a sequence of one or two -> (height, width) ints."""
    values = (size,) if isinstance(size, numbers.Number) else size
    try:
        values = tuple(values)
    except TypeError:
        raise TypeError(f"{name} must be an int or a sequence (height, width), got {size!r}") from None
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or not all(_whole(v) and v > 0 for v in values):
        raise ValueError(f"{name} must be a positive int or (height, width) of positive ints, got {size!r}")
    return tuple(int(v) for v in values)


def _range(values, name):
    """A (min, max) pair of numbers."""
    try:
        lo, hi = (float(v) for v in values)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a (min, max) pair of numbers, got {values!r}") from None
    if lo > hi:
        raise ValueError(f"{name} must be (min, max), got {values!r}")
    return lo, hi


class _Planner:
    """What both planners share: flip draw, DCT scale choice and the matrix."""

    num_uniforms = 1  # columns of rng.uniforms a planner reads per sample; the last one is the flip draw

    def __init__(self, size, flip, dct_downscale):
        self.size = _pair(size, "size")
        if isinstance(flip, bool) or not isinstance(flip, numbers.Real) or not 0.0 <= flip <= 1.0:
            raise ValueError(f"flip must be a probability between 0 and 1, got {flip!r}")
        self.flip = float(flip)
        self.dct_downscale = bool(dct_downscale)

    def with_size(self, size):
        """A copy planning ``size`` outputs (a resolution schedule's step); the draws are the same."""
        planner = copy.copy(self)
        planner.size = _pair(size, "size")
        return planner

    def plan(self, heights, widths, seed, epoch, indices):
        """Plans a batch: image sizes (numpy int arrays [B]) and sample indices -> CropPlan."""
        heights = np.asarray(heights, dtype=np.int64).reshape(-1)
        widths = np.asarray(widths, dtype=np.int64).reshape(-1)
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if not len(heights) == len(widths) == len(indices):
            raise ValueError("heights, widths and indices must have the same length")
        if len(heights) and (heights.min() <= 0 or widths.min() <= 0):
            raise ValueError("image sizes must be positive")
        u = rng.uniforms(seed, epoch, indices, self.num_uniforms)
        flipped = u[:, -1] < self.flip
        return self._plan(heights, widths, u, flipped)

    def _downscale(self, extent_h, extent_w):
        """Largest d in (1, 2, 4, 8) whose scaled extent floor(extent / d) still covers the output (no upsampling
        introduced by the DCT scale); 1 when DCT downscaling is off."""
        out_h, out_w = self.size
        d = np.ones(len(extent_h), dtype=np.int64)
        if self.dct_downscale:
            for cand in (2, 4, 8):  # fitting is monotone in d: the last that fits is the largest
                fits = (np.floor(extent_h / cand + 1e-9) >= out_h) & (np.floor(extent_w / cand + 1e-9) >= out_w)
                d = np.where(fits, cand, d)
        return d

    def _finish(self, top, left, win_h, win_w, sy, oy, sx, ox, d, flipped, heights, widths, x_end, y_end):
        """Windows and matrices. (sx, ox): output pixel u covers original edge coordinates centred at
        sx * (u + 0.5) + ox; the decoded-crop index of that centre is that / d - 0.5 - left // d. The visible
        interval: the crop [ox, x_end) x [oy, y_end) within the image (a centre crop larger than the image is
        padded), computed as geometry.GeometryPlanner computes it, to the last bit."""
        out_h, out_w = self.size
        a = sx / d
        tx = (0.5 * sx + ox) / d - 0.5 - left // d  # left // d subtracted in float64: small values for float32
        e = sy / d
        ty = (0.5 * sy + oy) / d - 0.5 - top // d
        m = np.zeros((len(d), 2, 5), dtype=np.float64)
        m[:, 0, 0] = np.where(flipped, -a, a)  # flip: u -> out_w - 1 - u
        m[:, 0, 2] = np.where(flipped, a * (out_w - 1) + tx, tx)
        m[:, 1, 1] = e
        m[:, 1, 2] = ty
        for row, origin, lo, hi, size in ((0, left, ox, x_end, widths), (1, top, oy, y_end, heights)):
            m[:, row, 3] = np.maximum(lo, 0.0) / d - origin // d
            m[:, row, 4] = np.minimum(hi, size) / d - origin // d
        windows = np.stack([top, left, win_h, win_w, d], axis=1).astype(np.int64)
        return CropPlan(torch.from_numpy(windows), torch.from_numpy(m.astype(np.float32)), flipped)


class RandomResizedCrop(_Planner):
    """torchvision's RandomResizedCrop (+ horizontal flip with probability ``flip``), planned before decoding."""

    ATTEMPTS = 10
    # per sample: (scale, log-ratio) for each attempt, then top, left, flip
    num_uniforms = 2 * ATTEMPTS + 3

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), *, flip=0.5, dct_downscale=True):
        super().__init__(size, flip, dct_downscale)
        self.scale = _range(scale, "scale")
        self.ratio = _range(ratio, "ratio")

    def get_params(self, height, width, generator=None):
        """(top, left, h, w) for one image, drawing from torch's RNG exactly as torchvision's get_params does."""
        area = height * width
        log_ratio = torch.log(torch.tensor(self.ratio))
        for _ in range(self.ATTEMPTS):
            target_area = area * torch.empty(1).uniform_(self.scale[0], self.scale[1], generator=generator).item()
            aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=generator)).item()
            w = int(round(math.sqrt(target_area * aspect_ratio)))
            h = int(round(math.sqrt(target_area / aspect_ratio)))
            if 0 < w <= width and 0 < h <= height:
                i = torch.randint(0, height - h + 1, size=(1,), generator=generator).item()
                j = torch.randint(0, width - w + 1, size=(1,), generator=generator).item()
                return i, j, h, w
        return self._fallback(height, width)

    def _fallback(self, height, width):
        """torchvision's fallback: the largest centred crop whose aspect ratio is within ``ratio``."""
        in_ratio = float(width) / float(height)
        if in_ratio < min(self.ratio):
            w, h = width, int(round(width / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h, w = height, int(round(height * max(self.ratio)))
        else:
            h, w = height, width
        return (height - h) // 2, (width - w) // 2, h, w

    def windows(self, heights, widths, u):
        """The vectorised get_params: same 10 attempts, first valid wins, same fallback. Uniform u[:, 2k] and
        u[:, 2k+1] replace attempt k's two torch draws; randint(0, n) is floor(u * n) with u[:, 20] and u[:, 21]."""
        n = self.ATTEMPTS
        H = heights.astype(np.float64)[:, None]
        W = widths.astype(np.float64)[:, None]
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        target_area = H * W * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, 0:2 * n:2])
        aspect = np.exp(lo + (hi - lo) * u[:, 1:2 * n:2])
        w = np.round(np.sqrt(target_area * aspect))  # np.round is half-to-even, like Python's round
        h = np.round(np.sqrt(target_area / aspect))
        valid = (w > 0) & (w <= W) & (h > 0) & (h <= H)
        first = valid.argmax(axis=1)
        rows = np.arange(len(u))
        h = h[rows, first].astype(np.int64)
        w = w[rows, first].astype(np.int64)
        found = valid[rows, first]
        # torchvision's fallback for the samples where no attempt fitted
        fb = [self._fallback(int(hh), int(ww)) for hh, ww in zip(heights[~found], widths[~found])]
        fb = np.array(fb, dtype=np.int64).reshape(-1, 4)
        h[~found], w[~found] = fb[:, 2], fb[:, 3]
        span_h, span_w = heights - h + 1, widths - w + 1
        top = np.minimum(np.floor(u[:, 2 * n] * span_h), span_h - 1).astype(np.int64)
        left = np.minimum(np.floor(u[:, 2 * n + 1] * span_w), span_w - 1).astype(np.int64)
        top[~found], left[~found] = fb[:, 0], fb[:, 1]
        return top, left, h, w

    def _plan(self, heights, widths, u, flipped):
        top, left, h, w = self.windows(heights, widths, u)
        out_h, out_w = self.size
        d = self._downscale(h, w)
        return self._finish(top, left, h, w, h / out_h, top.astype(np.float64), w / out_w,
                            left.astype(np.float64), d, flipped, heights, widths, left + w, top + h)


class CenterCrop(_Planner):
    """Evaluation crop with torchvision's ``Resize(resize) + CenterCrop(size)`` meaning (antialiased bilinear).

    resize: the short side after resizing (long side int()-rounded as torchvision does), or (h, w); default
    size / 0.875 (256 for 224). The decode window is the crop's footprint in the original image plus the resize
    filter's reach, so the result matches resizing the whole image and then cropping. A crop larger than the
    resized image is zero-padded, as torchvision pads. dct_downscale: False (default) decodes at full scale, so the
    pixels are torchvision's within one level; True lets the decoder shrink by 2, 4 or 8 first where the resize
    allows (faster on large photos, but 31-41 dB PSNR against torchvision on photos twice the resize or more).
    """

    num_uniforms = 1  # just the flip draw

    def __init__(self, size, resize=None, *, flip=0.0, dct_downscale=False):
        super().__init__(size, flip, dct_downscale)
        if resize is None:
            resize = int(max(self.size) / 0.875)
        if isinstance(resize, numbers.Number) or len(resize) == 1:  # the short side (256.0, [256]: torchvision's)
            self.resize = _pair(resize, "resize")[0]
        else:
            self.resize = _pair(resize, "resize")

    def with_size(self, size):
        """A copy cropping ``size``, its resize scaled by the same factor (the crop keeps its share of the image,
        as FFCV's centre-crop ratio does): CenterCrop(224, resize=256).with_size(192) resizes to 219."""
        planner = super().with_size(size)
        fh, fw = planner.size[0] / self.size[0], planner.size[1] / self.size[1]
        planner.resize = (round(self.resize * fh) if isinstance(self.resize, int)
                          else (round(self.resize[0] * fh), round(self.resize[1] * fw)))
        return planner

    def resized_size(self, heights, widths):
        """torchvision's Resize output size (new_h, new_w) for each image."""
        if not isinstance(self.resize, int):
            return np.full_like(heights, self.resize[0]), np.full_like(widths, self.resize[1])
        short, long = np.minimum(heights, widths), np.maximum(heights, widths)
        # int(resize * long / short) in float64, as torchvision computes it
        new_long = np.floor(self.resize * long.astype(np.float64) / short).astype(np.int64)
        portrait = widths <= heights
        new_h = np.where(portrait, new_long, self.resize)
        new_w = np.where(portrait, self.resize, new_long)
        return new_h, new_w

    def _axis(self, size, new_size, out):
        """Scale, offset (original edge coordinates) and decode window [lo, hi) along one axis."""
        # torchvision's centre anchor; a crop larger than the image is padded by (out - new) // 2 before it
        crop = np.where(new_size >= out, np.round((new_size - out) / 2.0), -((out - new_size) // 2)).astype(np.int64)
        s = size / new_size
        o = crop * s
        reach = np.ceil(np.maximum(1.0, s)) + 1  # antialiased bilinear filter support, plus rounding slack
        lo = np.clip(np.floor(o - reach), 0, size - 1).astype(np.int64)
        hi = np.clip(np.ceil(o + out * s + reach), lo + 1, size).astype(np.int64)
        return s, o, lo, hi

    def _plan(self, heights, widths, u, flipped):
        out_h, out_w = self.size
        new_h, new_w = self.resized_size(heights, widths)
        sy, oy, top, bottom = self._axis(heights, new_h, out_h)
        sx, ox, left, right = self._axis(widths, new_w, out_w)
        # DCT scale from the crop's own footprint (out * s), not the padded window: it must not upsample
        d = self._downscale(out_h * sy, out_w * sx)
        return self._finish(top, left, bottom - top, right - left, sy, oy, sx, ox, d, flipped, heights, widths,
                            ox + sx * out_w, oy + sy * out_h)
