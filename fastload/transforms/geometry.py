"""torchvision.transforms.v2's geometric transforms, folded into the one warp of the loader's stage.

Each class takes torchvision's arguments (same defaults, same validation and exception types) and draws its
per-sample parameters as torchvision's ``make_params`` does (same distributions), from ``fastload.rng.uniforms`` on
its ``stream``. ``GeometryPlanner`` composes every step's inverse map (output -> input) into one map from the output
pixel to the original image, per sample and vectorised, and turns it into what the loader needs before decoding:
the decode window, the DCT downscale and the warp's map: the 2x3 matrix with each input axis's visible interval
([B, 2, 5]; CONTRACT.md beside this file).

Coordinates. Internally every map is a 3x3 float64 matrix in *edge* coordinates (pixel i spans [i, i + 1)), output
-> input; ``planners.py`` works the same way, and composing in edge coordinates keeps axis-aligned pipelines
(RandomResizedCrop + flip, Resize + CenterCrop) bit-for-bit equal to the crop planners. torchvision's affine grid is
centred on the canvas: output index i is i - (w - 1) / 2 about the centre, input index is that mapped plus
(w - 1) / 2, which in edge coordinates is T(w/2, h/2) . M^-1 . T(-w/2, -h/2).

One resample. torchvision resamples at every step (resize, then the affine's bilinear grid_sample); fastload
samples the original image once through the composed map, with the warp's filter: bilinear, antialiased when
shrinking (support max(1, scale) along each axis). Interpolation: BILINEAR is that filter; NEAREST (the default
of RandomAffine and RandomRotation) is accepted and honoured as the same single bilinear resample -- a second,
nearest-neighbour resample only adds aliasing that the composed warp does not need. Other modes are refused.

Fill. Pixels whose source lies outside the visible part of the image get ``fill`` (one value per pipeline). The
visible part is the image, clipped by every crop whose outline is still axis-aligned in the original image, and
travels with each sample's matrix to the warp, which tests every output pixel's centre against it; the filter
itself reads the whole decode window (see ``GeometryPlanner.plan`` for where this differs from torchvision).
"""
import collections.abc
import copy
import math
import numbers
import warnings
from typing import NamedTuple

import numpy as np
import torch

from .. import rng
from . import planners

__all__ = ["GeometryPlan", "GeometryPlanner", "RandomResizedCrop", "Resize", "CenterCrop", "RandomCrop", "Pad",
           "RandomHorizontalFlip", "RandomVerticalFlip", "RandomAffine", "RandomRotation"]


class GeometryPlan(NamedTuple):
    windows: torch.Tensor  # int64 [B, 5]: top, left, height, width, downscale (as planners.CropPlan)
    matrices: torch.Tensor  # float32 [B, 2, 5]: output pixel index -> decoded-crop pixel index (columns 0-2), and
    #                         each input axis's visible interval [lo, hi] in the decoded crop's edge coordinates
    #                         (columns 3-4; warp.h): an output pixel whose centre maps outside is fill
    fill: tuple  # 3 floats, 0-255 scale
    flipped: np.ndarray  # bool [B]: an odd number of horizontal flips


# ---------------------------------------------------------------- torchvision's argument checks

def _check_int_sizes(size):
    """TypeError for a size sequence that holds anything but ints (torchvision keeps it and fails at the first
    image, with a TypeError from the resize or crop)."""
    if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in size):
        raise TypeError(f"size should be an int or a sequence of ints, got {size!r}")


def _setup_size(size, error_msg):
    """torchvision's _setup_size, plus a check that the sizes are positive ints (a zero size fails later there)."""
    if isinstance(size, numbers.Number):
        size = (int(size), int(size))
    elif isinstance(size, collections.abc.Sequence) and len(size) == 1:
        size = (size[0], size[0])
    elif len(size) != 2:
        raise ValueError(error_msg)
    _check_int_sizes(size)
    return _positive(tuple(int(s) for s in size))


def _positive(size):
    """``size`` where every side is positive, else a RuntimeError: what torchvision's Resize and RandomResizedCrop
    raise at the first image (its CenterCrop and RandomCrop return an empty image, which a batch of one size cannot
    hold)."""
    if min(size) <= 0:
        raise RuntimeError(f"size must be positive, got {size}")
    return size


def _check_sequence_input(x, name, req_sizes):
    msg = req_sizes[0] if len(req_sizes) < 2 else " or ".join([str(s) for s in req_sizes])
    if not isinstance(x, collections.abc.Sequence):
        raise TypeError(f"{name} should be a sequence of length {msg}.")
    if len(x) not in req_sizes:
        raise ValueError(f"{name} should be a sequence of length {msg}.")


def _setup_angle(x, name, req_sizes=(2,)):
    if isinstance(x, numbers.Number):
        if x < 0:
            raise ValueError(f"If {name} is a single number, it must be positive.")
        x = [-x, x]
    else:
        _check_sequence_input(x, name, req_sizes)
    return [float(d) for d in x]


def probability(p):
    """torchvision's check of a ``p`` (ValueError outside [0, 1], NaN included), as a float: a 0-d tensor, which
    torchvision keeps and compares, works too."""
    if not (0.0 <= p <= 1.0):
        raise ValueError("`p` should be a floating point value in the interval [0.0, 1.0].")
    return float(p)


def _check_fill(fill):
    if isinstance(fill, dict):
        for value in fill.values():
            _check_fill(value)
    elif fill is not None and not isinstance(fill, (numbers.Number, tuple, list)):
        raise TypeError("Got inappropriate fill arg, only Numbers, tuples, lists and dicts are allowed.")


def _check_pad_fill(fill):
    """torch's constant pad of a uint8 image, which torchvision's pad uses, refuses a fill that overflows uint8."""
    values = fill_triple(fill, RuntimeError)
    if not all(0.0 <= v < 256.0 for v in values):  # NaN too; torch takes 255.5 (rounded down) but not -0.5
        raise RuntimeError(f"fill {fill!r}: value cannot be converted to type uint8_t without overflow")


def places_fill(t):
    """Whether transform t puts its ``fill`` into images (a RandomCrop that cannot pad keeps one, unused)."""
    return hasattr(t, "fill") and getattr(t, "places_fill", True)


def fill_triple(fill, error=ValueError):
    """torchvision's ``fill`` (number, sequence of 1 or 3, None = 0, or a dict keyed by tv_tensors type or
    "others": the image's entry) as 3 floats on the image's scale (0-255 for uint8). ``error``: what torchvision
    raises for a length that does not fit the channels (fill_error of the transform)."""
    if isinstance(fill, dict):
        image = [v for k, v in fill.items() if getattr(k, "__name__", k) == "Image"]
        fill = image[0] if image else fill.get("others", 0)
    if fill is None:
        return (0.0, 0.0, 0.0)
    if isinstance(fill, numbers.Number):
        return (float(fill),) * 3
    fill = [float(v) for v in fill]
    if len(fill) == 1:
        fill = fill * 3
    if len(fill) != 3:  # torchvision raises this at the first RGB image
        raise error(f"The number of elements in 'fill' cannot broadcast to match the number of channels of "
                    f"the image ({len(fill)} != 3)")
    return tuple(fill)


_INTERPOLATIONS = ("nearest", "nearest-exact", "bilinear", "bicubic", "box", "hamming", "lanczos")
_PIL_INTERPOLATIONS = {0: "nearest", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming", 1: "lanczos"}


def interpolation_mode(interpolation):
    """torchvision's _check_interpolation (same exceptions and messages): the mode's name, from an InterpolationMode
    (torchvision's enum or fastload's copy), its string or a Pillow constant."""
    if isinstance(interpolation, str):
        if interpolation not in _INTERPOLATIONS:
            raise ValueError(f"Invalid interpolation mode: '{interpolation}'. "
                             f"Supported string values are: {list(_INTERPOLATIONS)}.")
        return interpolation
    if isinstance(interpolation, int):
        return _PIL_INTERPOLATIONS[interpolation]  # KeyError for other ints, as torchvision
    if type(interpolation).__name__ == "InterpolationMode":
        return interpolation.value
    raise ValueError(f"Argument interpolation should be an `InterpolationMode` or a corresponding Pillow integer "
                     f"constant, but got {interpolation}.")


def _interpolation(value, antialias=True):
    """'bilinear' or 'nearest' from torchvision's interpolation argument; refuses what the one bilinear resample
    cannot honour (antialias only matters to BILINEAR, as in torchvision)."""
    mode = interpolation_mode(value)
    if mode in ("nearest", "nearest-exact"):
        return "nearest"  # honoured as the single bilinear resample (module docstring)
    if mode != "bilinear":
        raise ValueError(f"fastload resamples once, with an antialiased bilinear filter: interpolation must be "
                         f"BILINEAR or NEAREST (honoured as that bilinear resample), got {value!r}")
    if antialias is not True:
        raise ValueError(f"fastload always antialiases when shrinking; antialias={antialias!r} cannot be honoured "
                         f"(use antialias=True, torchvision's default)")
    return mode


# ---------------------------------------------------------------- 3x3 maps in edge coordinates

def _affine_maps(b):
    m = np.zeros((b, 3, 3), np.float64)
    m[:, 0, 0] = m[:, 1, 1] = m[:, 2, 2] = 1.0
    return m


def _scale_shift(sx, ox, sy, oy):
    """x_in = sx * x_out + ox, y_in = sy * y_out + oy, per sample."""
    sx, ox, sy, oy = np.broadcast_arrays(*(np.asarray(v, np.float64) for v in (sx, ox, sy, oy)))
    m = _affine_maps(len(sx))
    m[:, 0, 0], m[:, 0, 2], m[:, 1, 1], m[:, 1, 2] = sx, ox, sy, oy
    return m


def _inverse_affine(angle, tx, ty, scale, shear_x, shear_y, center, heights, widths):
    """torchvision's ``_get_inverse_affine_matrix`` (inverted=True), vectorised, on its centred grid (CONTRACT:
    output -> input), returned in edge coordinates of a canvas of (heights, widths). ``center``: torchvision's
    (x, y) from the top-left corner, or None for the canvas centre."""
    h = np.asarray(heights, np.float64)
    w = np.asarray(widths, np.float64)
    cx, cy = (np.zeros_like(w), np.zeros_like(h)) if center is None else (center[0] - 0.5 * w, center[1] - 0.5 * h)
    rot = np.radians(angle)
    sx, sy = np.radians(shear_x), np.radians(shear_y)
    cos_sy, tan_sx = np.cos(sy), np.tan(sx)
    a = np.cos(rot - sy) / cos_sy
    b = -(a * tan_sx + np.sin(rot))
    c = np.sin(rot - sy) / cos_sy
    d = np.cos(rot) - c * tan_sx
    m = _affine_maps(len(h))
    m[:, 0, 0], m[:, 0, 1], m[:, 1, 0], m[:, 1, 1] = d / scale, -b / scale, -c / scale, a / scale
    cx_tx, cy_ty = cx + tx, cy + ty
    m[:, 0, 2] = cx - m[:, 0, 0] * cx_tx - m[:, 0, 1] * cy_ty
    m[:, 1, 2] = cy - m[:, 1, 0] * cx_tx - m[:, 1, 1] * cy_ty
    # centred grid -> edge coordinates: T(w/2, h/2) . M . T(-w/2, -h/2)
    return _scale_shift(1.0, 0.5 * w, 1.0, 0.5 * h) @ m @ _scale_shift(1.0, -0.5 * w, 1.0, -0.5 * h)


class _Step(NamedTuple):
    """One step on a batch: its map (new canvas -> old canvas, edge coordinates), the new canvas size, and for a
    crop, ``crop``: its box (x0, x1, y0, y1) in the old canvas, which bounds what is visible afterwards, and
    ``reach``: whether that bound includes the filter's reach (CenterCrop cuts an image resized as a whole) or
    not (RandomResizedCrop resizes the crop alone, so torchvision's filter stops at its edge)."""
    map: np.ndarray
    heights: np.ndarray
    widths: np.ndarray
    crop: tuple = None
    reach: bool = False
    canvas: bool = False  # an affine step: torchvision fills outside its input canvas, which later steps may reach


class _Geometry:
    """What every geometric transform shares: kind, stream, drawing ``columns`` uniforms per sample."""

    kind = "geometry"
    stream = 0  # set by Compose; each transform reads only its own stream
    columns = 0  # rng.uniforms columns read per sample (0: no randomness)
    sets_size = False  # whether the output canvas has the same size for every sample
    fill_error = ValueError  # torchvision's error for a fill that does not fit the channels (its affine grid's)

    def draw(self, heights, widths, seed, epoch, indices):
        """Per-sample parameters (torchvision's make_params, vectorised) for canvases of (heights, widths)."""
        u = rng.uniforms(seed, epoch, indices, self.columns, stream=self.stream) if self.columns else None
        return self._draw(np.asarray(heights, np.int64), np.asarray(widths, np.int64), u)

    def _draw(self, heights, widths, u):
        return {}

    def _step(self, params, heights, widths):
        raise NotImplementedError(f"{type(self).__name__} must define _step")

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_") and k != "stream")
        return f"{type(self).__name__}({args})"


# ---------------------------------------------------------------- the transforms

class RandomResizedCrop(_Geometry):
    """torchvision's ``RandomResizedCrop``: the window draw of ``planners.RandomResizedCrop`` (the same 10 attempts,
    fallback and uniform columns 0-21 of this transform's stream), then a resize of the crop to ``size``."""

    columns = 22
    sets_size = True

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), interpolation="bilinear",
                 antialias=True):
        self.size = _setup_size(size, error_msg="Please provide only two dimensions (h, w) for size.")
        if not isinstance(scale, collections.abc.Sequence) or len(scale) != 2:
            raise TypeError("Scale should be a sequence of two floats.")
        if not isinstance(ratio, collections.abc.Sequence) or len(ratio) != 2:
            raise TypeError("Ratio should be a sequence of two floats.")
        if scale[0] > scale[1] or ratio[0] > ratio[1]:
            warnings.warn("Scale and ratio should be of kind (min, max)")
        self.scale = scale
        self.ratio = ratio
        self.interpolation = interpolation
        self.antialias = antialias
        _interpolation(interpolation, antialias)
        # torchvision draws uniform_(*scale) and uniform_(*log(ratio)) at the first image: a reversed, infinite or
        # NaN range (a ratio <= 0 has no logarithm) fails there, so here at the first batch's planning
        self._unusable = None
        with np.errstate(divide="ignore", invalid="ignore"):
            log_ratio = np.log(np.asarray(ratio, np.float64)).tolist()
        try:
            uniform_bounds(*scale, self)
            uniform_bounds(*log_ratio, self)
        except RuntimeError as e:
            self._unusable = e
        self._windows = None if self._unusable else planners.RandomResizedCrop(self.size, scale, ratio, flip=0.0)

    def _draw(self, heights, widths, u):
        if self._unusable:
            raise RuntimeError(str(self._unusable))
        top, left, h, w = self._windows.windows(heights, widths, u)
        return dict(top=top, left=left, height=h, width=w)

    def _step(self, p, heights, widths):
        out_h, out_w = self.size
        m = _scale_shift(p["width"] / out_w, p["left"], p["height"] / out_h, p["top"])
        crop = (p["left"], p["left"] + p["width"], p["top"], p["top"] + p["height"])
        return _Step(m, np.full_like(heights, out_h), np.full_like(widths, out_w), crop)


class Resize(_Geometry):
    """torchvision's ``Resize``. With an int (or size None and max_size) each image keeps its aspect ratio, so the
    output size is per sample: a later crop must fix it (``GeometryPlanner`` refuses a pipeline that does not)."""

    def __init__(self, size, interpolation="bilinear", max_size=None, antialias=True):
        if isinstance(size, int):
            size = [size]
        elif isinstance(size, collections.abc.Sequence) and len(size) in {1, 2}:
            size = list(size)
            _check_int_sizes(size)
        elif size is None:
            if not isinstance(max_size, int):
                raise ValueError(f"max_size must be an integer when size is None, but got {max_size} instead.")
        else:
            raise ValueError(
                f"size can be an integer, a sequence of one or two integers, or None, but got {size} instead.")
        # torchvision raises these at the first image
        if size is not None:
            _positive(size)
        if max_size is not None and size is not None and len(size) != 1:
            raise ValueError("max_size should only be passed if size is None or specifies the length of the smaller "
                             "edge, i.e. size should be an int or a sequence of length 1 in torchscript mode.")
        if max_size is not None and size is not None and max_size <= size[0]:
            raise ValueError(f"max_size = {max_size} must be strictly greater than the requested size for the "
                             f"smaller edge size = {size}")
        self.size = size
        self.interpolation = interpolation
        self.max_size = max_size
        self.antialias = antialias
        _interpolation(interpolation, antialias)

    @property
    def sets_size(self):
        return self.size is not None and len(self.size) == 2

    def resized_size(self, heights, widths):
        """torchvision's ``_compute_resized_output_size`` for every canvas: (new_h, new_w) int64 arrays."""
        heights = np.asarray(heights, np.int64)
        widths = np.asarray(widths, np.int64)
        if self.sets_size:
            return np.full_like(heights, self.size[0]), np.full_like(widths, self.size[1])
        portrait = widths <= heights
        short = np.minimum(heights, widths).astype(np.float64)
        long = np.maximum(heights, widths).astype(np.float64)
        # int(a * long / short) as torchvision computes it in Python floats (a * long is exact, the quotient is
        # correctly rounded, as numpy's float64 division is)
        if self.size is None:
            new_short = np.floor(self.max_size * short / long).astype(np.int64)
            new_long = np.full_like(heights, self.max_size)
        else:
            new_short = np.full_like(heights, self.size[0])
            new_long = np.floor(self.size[0] * long / short).astype(np.int64)
            if self.max_size is not None:
                over = new_long > self.max_size
                capped = np.floor(self.max_size * new_short.astype(np.float64) / new_long).astype(np.int64)
                new_short = np.where(over, capped, new_short)
                new_long = np.where(over, self.max_size, new_long)
        return np.where(portrait, new_long, new_short), np.where(portrait, new_short, new_long)

    def _step(self, p, heights, widths):
        new_h, new_w = self.resized_size(heights, widths)
        return _Step(_scale_shift(widths / new_w, 0.0, heights / new_h, 0.0), new_h, new_w)


class CenterCrop(_Geometry):
    """torchvision's ``CenterCrop``: its anchor (round((size - crop) / 2)); a crop larger than the canvas is padded
    by (crop - size) // 2 before it, with 0 in torchvision and with the pipeline's fill here."""

    sets_size = True

    def __init__(self, size):
        self.size = _setup_size(size, error_msg="Please provide only two dimensions (h, w) for size.")

    @staticmethod
    def _anchor(size, out):
        return np.where(size >= out, np.round((size - out) / 2.0), -((out - size) // 2)).astype(np.int64)

    def _step(self, p, heights, widths):
        out_h, out_w = self.size
        left, top = self._anchor(widths, out_w), self._anchor(heights, out_h)
        m = _scale_shift(1.0, left, 1.0, top)
        crop = (left, left + out_w, top, top + out_h)
        return _Step(m, np.full_like(heights, out_h), np.full_like(widths, out_w), crop, reach=True)


def _check_padding(padding):
    """torchvision's _check_padding_arg (ValueError) and _parse_pad_padding: [left, right, top, bottom]."""
    err = f"Padding must be an int or a 1, 2, or 4 element of tuple or list, got {padding}."
    if isinstance(padding, (tuple, list)):
        if len(padding) not in (1, 2, 4) or not all(isinstance(p, int) for p in padding):
            raise ValueError(err)
    elif not isinstance(padding, int):
        raise ValueError(err)
    if isinstance(padding, int):
        return [padding] * 4
    if len(padding) == 1:
        return [padding[0]] * 4
    if len(padding) == 2:
        return [padding[0], padding[0], padding[1], padding[1]]
    return [padding[0], padding[2], padding[1], padding[3]]


def _check_padding_mode(t, padding_mode):
    """torchvision's _check_padding_mode_arg (ValueError), then fastload's refusal of the modes it cannot run."""
    if padding_mode not in ("constant", "edge", "reflect", "symmetric"):
        raise ValueError("Padding mode should be either constant, edge, reflect or symmetric")
    if padding_mode != "constant":
        raise ValueError(f"{type(t).__name__}(padding_mode={padding_mode!r}): fastload pads with a constant fill only "
                         f"(the warp reads outside the image as the pipeline's fill); use padding_mode='constant'")


class RandomCrop(_Geometry):
    """torchvision's ``RandomCrop(size, padding=None, pad_if_needed=False, fill=0, padding_mode="constant")``: the
    canvas padded by ``padding`` (and, with pad_if_needed, by what it lacks of ``size`` on both sides), then a
    uniform integer offset per sample (torchvision's two randints: columns 0 and 1). The padding is read as the
    pipeline's fill; padding_mode other than "constant" is refused. A crop larger than the padded canvas raises
    torchvision's ValueError, naming the sample."""

    columns = 2
    sets_size = True
    fill_error = RuntimeError  # torch's constant pad, which torchvision's pad uses

    def __init__(self, size, padding=None, pad_if_needed=False, fill=0, padding_mode="constant"):
        self.size = _setup_size(size, error_msg="Please provide only two dimensions (h, w) for size.")
        if pad_if_needed or padding is not None:
            if padding is not None:
                _check_padding(padding)
            _check_padding_mode(self, padding_mode)
        _check_fill(fill)
        if pad_if_needed or padding is not None:
            _check_pad_fill(fill)
        self._pads = _check_padding(padding) if padding else [0, 0, 0, 0]
        self.padding = list(self._pads) if padding else None  # torchvision's [left, right, top, bottom]
        self.pad_if_needed = pad_if_needed
        self.fill = fill
        self.padding_mode = padding_mode

    @property
    def places_fill(self):
        """Only a crop that can pad places fill pixels (and so joins the pipeline's one fill value)."""
        return self.pad_if_needed or self.padding is not None

    def draw(self, heights, widths, seed, epoch, indices):
        p = super().draw(heights, widths, seed, epoch, indices)
        bad = np.flatnonzero(p.pop("bad"))
        if len(bad):
            i = bad[0]
            raise ValueError(f"sample {np.asarray(indices).reshape(-1)[i]}: Required crop size {self.size} is larger "
                             f"than {'padded ' if self.padding is not None else ''}input image size "
                             f"({p['padded_h'][i]}, {p['padded_w'][i]}).")
        return p

    def _draw(self, heights, widths, u):
        left_pad, right_pad, top_pad, bottom_pad = (np.full(len(heights), v, np.int64) for v in self._pads)
        ph, pw = heights + top_pad + bottom_pad, widths + left_pad + right_pad
        ch, cw = self.size
        if self.pad_if_needed:
            dh, dw = np.maximum(ch - ph, 0), np.maximum(cw - pw, 0)
            top_pad, ph = top_pad + dh, ph + 2 * dh
            left_pad, pw = left_pad + dw, pw + 2 * dw
        # torch.randint(0, n + 1) where the padded canvas is larger, else 0
        top = np.minimum(np.floor(u[:, 0] * (ph - ch + 1)), np.maximum(ph - ch, 0)).astype(np.int64)
        left = np.minimum(np.floor(u[:, 1] * (pw - cw + 1)), np.maximum(pw - cw, 0)).astype(np.int64)
        # the crop's corner in the unpadded canvas
        return dict(top=top - top_pad, left=left - left_pad, bad=(ph < ch) | (pw < cw), padded_h=ph, padded_w=pw)

    def _step(self, p, heights, widths):
        out_h, out_w = self.size
        left, top = p["left"], p["top"]
        m = _scale_shift(np.ones(len(left)), left, 1.0, top)
        # a crop of the canvas as a whole (torchvision resized all of it): clip with the filter's reach
        crop = (left, left + out_w, top, top + out_h)
        return _Step(m, np.full_like(heights, out_h), np.full_like(widths, out_w), crop, reach=True)


class Pad(_Geometry):
    """torchvision's ``Pad(padding, fill=0, padding_mode="constant")``: the canvas grows by ``padding`` (left,
    right, top, bottom as torchvision parses it; negative values crop), the new border is the pipeline's fill.
    padding_mode other than "constant" is refused."""

    fill_error = RuntimeError  # torch's constant pad, which torchvision's pad uses

    def __init__(self, padding, fill=0, padding_mode="constant"):
        self._pads = _check_padding(padding)
        _check_padding_mode(self, padding_mode)
        _check_fill(fill)
        _check_pad_fill(fill)
        self.padding = padding if isinstance(padding, int) else list(padding)
        self.fill = fill
        self.padding_mode = padding_mode

    def draw(self, heights, widths, seed, epoch, indices):
        left, right, top, bottom = self._pads
        bad = np.flatnonzero((np.asarray(heights) + top + bottom <= 0) | (np.asarray(widths) + left + right <= 0))
        if len(bad):
            i = bad[0]
            raise RuntimeError(f"sample {np.asarray(indices).reshape(-1)[i]}: padding {self._pads} (left, right, top, "
                               f"bottom) leaves nothing of a {heights[i]}x{widths[i]} canvas")  # torch's pad: too
        return {}

    def _step(self, p, heights, widths):
        left, right, top, bottom = self._pads
        one = np.ones(len(heights))
        m = _scale_shift(one, -float(left), one, -float(top))
        # the new canvas' extent on the old one: bounds what is visible where a negative padding crops
        crop = (np.full(len(heights), -left), widths + right, np.full(len(heights), -top), heights + bottom)
        return _Step(m, heights + top + bottom, widths + left + right, crop, reach=True)


class RandomHorizontalFlip(_Geometry):
    """torchvision's ``RandomHorizontalFlip(p)``: one Bernoulli draw per sample (column 0)."""

    columns = 1
    axis = 0  # x

    def __init__(self, p=0.5):
        self.p = probability(p)

    def _draw(self, heights, widths, u):
        return dict(flip=u[:, 0] < self.p)

    def _step(self, p, heights, widths):
        size = (widths, heights)[self.axis]
        sign = np.where(p["flip"], -1.0, 1.0)
        offset = np.where(p["flip"], size.astype(np.float64), 0.0)  # x_in = size - x_out
        ones = np.ones(len(size))
        m = _scale_shift(sign, offset, ones, 0.0) if self.axis == 0 else _scale_shift(ones, 0.0, sign, offset)
        return _Step(m, heights, widths)


class RandomVerticalFlip(RandomHorizontalFlip):
    """torchvision's ``RandomVerticalFlip(p)``: one Bernoulli draw per sample (column 0)."""

    axis = 1  # y


def _keep_resampling(t, interpolation, fill, center):
    """RandomAffine's and RandomRotation's interpolation, fill and center, checked as torchvision checks them."""
    _interpolation(interpolation)
    _check_fill(fill)
    if center is not None:
        _check_sequence_input(center, "center", req_sizes=(2,))
    t.interpolation, t.fill, t.center = interpolation, fill, center


def uniform_bounds(lo, hi, who):
    """Raise as torch's ``uniform_(lo, hi)`` does, where torchvision draws a parameter on [lo, hi]: a reversed or
    non-finite range is a RuntimeError at the first image (fastload: at the first batch's planning)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):  # NaN too
        raise RuntimeError(f"{who}: uniform_: from={lo} or to={hi} is out of bounds for float")
    if lo > hi:
        raise RuntimeError(f"{who}: uniform_ expects to return a [from, to) range, but found from={lo} > to={hi}")


class RandomAffine(_Geometry):
    """torchvision's ``RandomAffine``. Per sample, from columns 0-5 of its stream: angle, translate (x, y; rounded
    as torchvision rounds them), scale, shear (x, y) -- each uniform on torchvision's range, unused ones ignored.
    Interpolation NEAREST (the default) is honoured as the one bilinear resample (module docstring)."""

    columns = 6

    def __init__(self, degrees, translate=None, scale=None, shear=None, interpolation="nearest", fill=0,
                 center=None):
        self.degrees = _setup_angle(degrees, name="degrees", req_sizes=(2,))
        if translate is not None:
            _check_sequence_input(translate, "translate", req_sizes=(2,))
            for t in translate:
                if not (0.0 <= t <= 1.0):
                    raise ValueError("translation values should be between 0 and 1")
        self.translate = translate
        if scale is not None:
            _check_sequence_input(scale, "scale", req_sizes=(2,))
            for s in scale:
                if s <= 0:
                    raise ValueError("scale values should be positive")
        self.scale = scale
        self.shear = _setup_angle(shear, name="shear", req_sizes=(2, 4)) if shear is not None else None
        _keep_resampling(self, interpolation, fill, center)

    def _draw(self, heights, widths, u):
        b = len(u)
        lo, hi = self.degrees
        for pair in (self.degrees, self.scale or (1, 1), *(zip(*[iter(self.shear)] * 2) if self.shear else ())):
            uniform_bounds(*pair, self)
        params = dict(angle=lo + (hi - lo) * u[:, 0], tx=np.zeros(b, np.int64), ty=np.zeros(b, np.int64),
                      scale=np.ones(b), shear_x=np.zeros(b), shear_y=np.zeros(b))
        if self.translate is not None:
            max_dx = self.translate[0] * widths.astype(np.float64)
            max_dy = self.translate[1] * heights.astype(np.float64)
            # int(round(uniform(-max, max))): np.round is half-to-even like Python's round
            params["tx"] = np.round(max_dx * (2.0 * u[:, 1] - 1.0)).astype(np.int64)
            params["ty"] = np.round(max_dy * (2.0 * u[:, 2] - 1.0)).astype(np.int64)
        if self.scale is not None:
            params["scale"] = self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, 3]
        if self.shear is not None:
            params["shear_x"] = self.shear[0] + (self.shear[1] - self.shear[0]) * u[:, 4]
            if len(self.shear) == 4:
                params["shear_y"] = self.shear[2] + (self.shear[3] - self.shear[2]) * u[:, 5]
        return params

    def _step(self, p, heights, widths):
        m = _inverse_affine(p["angle"], p["tx"], p["ty"], p["scale"], p["shear_x"], p["shear_y"], self.center,
                            heights, widths)
        return _Step(m, heights, widths, canvas=True)


class RandomRotation(_Geometry):
    """torchvision's ``RandomRotation``: angle uniform in ``degrees`` (column 0), anticlockwise, about ``center``.
    ``expand=True`` gives every sample its own canvas size: accepted here as torchvision does, refused by
    ``GeometryPlanner``. Interpolation NEAREST (the default) is honoured as the one bilinear resample."""

    columns = 1

    def __init__(self, degrees, interpolation="nearest", expand=False, center=None, fill=0):
        self.degrees = _setup_angle(degrees, name="degrees", req_sizes=(2,))
        self.expand = expand
        _keep_resampling(self, interpolation, fill, center)

    def _draw(self, heights, widths, u):
        lo, hi = self.degrees
        uniform_bounds(lo, hi, self)
        return dict(angle=lo + (hi - lo) * u[:, 0])

    def _step(self, p, heights, widths):
        zero = np.zeros(len(heights))
        # F.rotate turns anticlockwise: torchvision builds its matrix with -angle
        m = _inverse_affine(-p["angle"], zero, zero, 1.0, zero, zero, self.center, heights, widths)
        return _Step(m, heights, widths, canvas=True)


# ---------------------------------------------------------------- the planner

def _aligned(a):
    """Per map [B, 3, 3]: whether it takes axis-aligned boxes to axis-aligned boxes (no rotation but quarter turns,
    no shear), up to the rounding of cos/sin at multiples of 90 degrees."""
    a = np.asarray(a)
    big = np.maximum(np.abs(a[:, :2, :2]).max((1, 2)), 1e-300)
    small = lambda v: np.abs(v) <= 1e-12 * big  # noqa: E731
    return (small(a[:, 0, 1]) & small(a[:, 1, 0])) | (small(a[:, 0, 0]) & small(a[:, 1, 1]))


def _reach(row_x, row_y):
    """Original pixels the warp's filter reads beyond a sample centre along one input axis: its support
    max(1, |row|) rounded up, plus one for the tap rounding (planners.CenterCrop's margin)."""
    return np.ceil(np.maximum(1.0, np.hypot(row_x, row_y))) + 1


class GeometryPlanner:
    """The geometric steps of a pipeline (in order), planned per batch before decoding (CONTRACT.md).

    steps: geometry transforms of this module. extra_fill: the policies' fill, used where their ``extra`` maps
    reveal the outside of the canvas (it must agree with the steps' fill). dct_downscale: let the decoder scale
    by 1/2, 1/4 or 1/8 where the composed map shrinks by at least that much. None (default): where a step draws
    the crop or warp per sample (RandomResizedCrop, RandomCrop, RandomAffine, RandomRotation: training), not where
    the geometry is fixed (Resize, CenterCrop, Pad, flips: evaluation, which then gives torchvision's pixels
    within one level, where the DCT scale would cost 31-41 dB on photos twice the resize or more).
    """

    def __init__(self, steps, extra_fill=None, *, dct_downscale=None):
        self.steps = list(steps)
        if not self.steps:
            raise ValueError("GeometryPlanner needs at least one geometric transform (one that fixes the output "
                             "size: RandomResizedCrop, CenterCrop, RandomCrop or Resize((h, w)))")
        for t in self.steps:
            if not isinstance(t, _Geometry):
                raise TypeError(f"{t!r} is not a fastload geometric transform")
            if isinstance(t, RandomRotation) and t.expand:
                raise ValueError(f"{t!r}: expand=True gives every sample its own canvas size, which fastload's "
                                 f"fixed-size batches cannot hold; use expand=False")
        random = [t for t in self.steps if t.columns]
        streams = [t.stream for t in random]
        if len(set(streams)) != len(streams):
            raise ValueError(f"the random geometric steps {random} share streams {streams}: each must draw from "
                             f"its own (Compose sets transform.stream)")
        size = None
        for t in self.steps:
            if isinstance(t, Resize):
                size = tuple(t.size) if t.sets_size else None
            elif t.sets_size:
                size = tuple(t.size)
            elif isinstance(t, Pad) and size is not None:
                left, right, top, bottom = t._pads
                size = (size[0] + top + bottom, size[1] + left + right)
        if size is None:
            raise ValueError(f"the output size of {self.steps} is not fixed (it follows each image's size or aspect "
                             f"ratio): end the geometry with RandomResizedCrop, CenterCrop, RandomCrop or Resize((h, w))")
        self.out_size = size
        fills = {fill_triple(t.fill, t.fill_error) for t in self.steps if places_fill(t)}
        if extra_fill is not None:
            fills.add(fill_triple(extra_fill))
        if len(fills) > 1:
            raise ValueError(f"fastload applies one fill value per pipeline; these transforms ask for {sorted(fills)}")
        self.fill = fills.pop() if fills else (0.0, 0.0, 0.0)
        if dct_downscale is None:
            dct_downscale = any(not isinstance(t, RandomHorizontalFlip) for t in random)
        self.dct_downscale = bool(dct_downscale)

    def with_size(self, size):
        """A planner with output ``size`` (int or (h, w)): a resolution schedule's step. The step that fixes the
        output size gets it; size-carrying steps before it (a Resize before a CenterCrop) are scaled by the same
        factor, rounded, so the crop keeps its share of the image (Resize(256) + CenterCrop(224) at 192: Resize(219)
        + CenterCrop(192)). The steps are copies with the same streams: the same draws at any size."""
        size = _setup_size(size, error_msg="Please provide only two dimensions (h, w) for size.")
        sized = (RandomResizedCrop, Resize, CenterCrop, RandomCrop)
        last = max(i for i, t in enumerate(self.steps) if isinstance(t, sized))
        # Pads after it add their borders to the output: the step gets what is left of ``size``
        left, right, top, bottom = np.sum([t._pads for t in self.steps[last + 1:] if isinstance(t, Pad)] or
                                          [[0, 0, 0, 0]], 0).tolist()
        inner = (size[0] - top - bottom, size[1] - left - right)
        if min(inner) <= 0:
            raise ValueError(f"size {size} leaves nothing inside the padding that follows the last crop or resize")
        fh = inner[0] / (self.out_size[0] - top - bottom)
        fw = inner[1] / (self.out_size[1] - left - right)
        steps = []
        for i, t in enumerate(self.steps):
            if i <= last and isinstance(t, sized):
                t = copy.copy(t)
                if i == last:  # the constructor's rule: the last size-carrying step fixes the size
                    t.size = list(inner) if isinstance(t, Resize) else inner
                elif isinstance(t, Resize):
                    t.size = None if t.size is None else (
                        [round(t.size[0] * fh)] if len(t.size) == 1 else [round(t.size[0] * fh), round(t.size[1] * fw)])
                    t.max_size = None if t.max_size is None else round(t.max_size * fh)
                else:
                    t.size = (round(t.size[0] * fh), round(t.size[1] * fw))
                if isinstance(t, RandomResizedCrop) and t._windows is not None:
                    t._windows = t._windows.with_size(t.size)
            steps.append(t)
        return GeometryPlanner(steps, extra_fill=self.fill, dct_downscale=self.dct_downscale)

    def plan(self, heights, widths, seed, epoch, indices, extra=None, read=None):
        """GeometryPlan for a batch: image sizes (int arrays [B]), sample indices, and optionally ``extra``
        (float64 [B, 3, 3], output -> input in pixel-index coordinates of the final canvas) applied last, or
        ``read`` (float64 [B, 4]: x0, x1, y0, y1 in edge coordinates of the final canvas), the part of the output
        that a later step reads (the policies' NEAREST gather): the window covers only its preimage; the output
        elsewhere is fill. The matrices and DCT scale stay the steps' own either way.

        Window: the bounding box of the output rectangle's preimage plus the filter's reach, clipped to the image
        and to every crop that bounds what torchvision filters (RandomResizedCrop: its crop exactly, since it
        resizes the crop alone; CenterCrop, RandomCrop: their crop plus the resize filter's reach, since they cut an
        image resized whole). Visible box (the matrices' columns 3-4): the image clipped by every crop exactly, so
        an output pixel is fill where torchvision's is, whatever the window and the DCT scale (a downscaled decode
        ends on a whole decoded pixel, which may cover the image's last columns only in part). Where this differs
        from torchvision:
        - the fill boundary is hard (a pixel is fill or image, by its centre) where torchvision blends the last
          pixel with fill (grid_sample's bilinear mask): a band of about one pixel along fill edges;
        - a canvas (a crop's, or the input of RandomAffine / RandomRotation, outside which torchvision fills) can
          only clip while it is axis-aligned in the original image (a rotation by a multiple of 90 degrees is): a
          step that reads outside a canvas left rotated or sheared (RandomRotation then Pad, two rotations, a
          BILINEAR policy's rotate after RandomRotation) raises ValueError naming both, instead of showing image
          where torchvision shows fill;
        - CenterCrop pads with the pipeline's fill where torchvision pads with 0.
        """
        heights = np.asarray(heights, dtype=np.int64).reshape(-1)
        widths = np.asarray(widths, dtype=np.int64).reshape(-1)
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if not len(heights) == len(widths) == len(indices):
            raise ValueError("heights, widths and indices must have the same length")
        bad = np.flatnonzero((heights <= 0) | (widths <= 0))
        if len(bad):
            i = bad[0]
            raise ValueError(f"sample {indices[i]}: image size {heights[i]}x{widths[i]} is not positive")
        b = len(heights)
        a = _affine_maps(b)  # canvas edge coordinates -> original edge coordinates
        clip = np.zeros((b, 4))  # what the filter may read, in the original: x0, x1, y0, y1
        clip[:, 1], clip[:, 3] = widths, heights
        shown = clip.copy()  # what is visible: the crops' boxes without the filter's reach
        ch, cw = heights, widths
        flips = np.zeros(b, np.int64)
        tilted = []  # (step, map to the original, box [n, 4], samples) for the boxes not axis-aligned there
        for t in self.steps:
            params = t.draw(ch, cw, seed, epoch, indices)
            with np.errstate(divide="ignore", invalid="ignore"):  # a canvas resized to nothing: refused below
                step = t._step(params, ch, cw)
            empty = np.flatnonzero((step.heights < 1) | (step.widths < 1))
            if len(empty):  # e.g. Resize(24, max_size=30) of a 4000x1 image: torchvision fails on it too
                i = empty[0]
                raise ValueError(f"sample {indices[i]}: {t!r} turns its {ch[i]}x{cw[i]} canvas into "
                                 f"{step.heights[i]}x{step.widths[i]} (a side rounds to 0 pixels); torchvision "
                                 f"cannot resize it either")
            if step.canvas:  # torchvision fills where it reads outside its input canvas: as a crop of all of it
                step = step._replace(crop=(0.0, cw, 0.0, ch), reach=True)
            if step.crop is not None:  # what it shows of its input canvas: its box inside that canvas
                x0, x1, y0, y1 = step.crop
                step = step._replace(crop=(np.maximum(x0, 0), np.minimum(x1, cw), np.maximum(y0, 0),
                                           np.minimum(y1, ch)))
                clip, shown, tilted = self._bound(clip, shown, tilted, a, step, t)
            a = a @ step.map
            ch, cw = step.heights, step.widths
            if isinstance(t, RandomHorizontalFlip) and t.axis == 0:
                flips += params["flip"]
        out_h, out_w = self.out_size
        if extra is not None:  # a BILINEAR policy's rotate/shear/translate: fill outside the final canvas too
            final = _Step(None, None, None, crop=(0.0, cw, 0.0, ch), reach=True)
            clip, shown, tilted = self._bound(clip, shown, tilted, a, final, None)
            extra = np.asarray(extra, np.float64).reshape(b, 3, 3)
            # pixel-index -> edge coordinates: T(.5) . extra . T(-.5)
            one = np.ones(b)
            a = a @ _scale_shift(one, 0.5, one, 0.5) @ extra @ _scale_shift(one, -0.5, one, -0.5)
        if read is None:
            read = np.zeros((b, 4))
            read[:, 1], read[:, 3] = out_w, out_h
        read = np.asarray(read, np.float64).reshape(b, 4)
        self._check_tilted(tilted, a, read, indices)
        x0, x1, y0, y1 = self._box(a, read)
        rx, ry = _reach(a[:, 0, 0], a[:, 0, 1]), _reach(a[:, 1, 0], a[:, 1, 1])
        left = np.clip(np.floor(np.maximum(x0 - rx, clip[:, 0])), 0, widths - 1).astype(np.int64)
        right = np.clip(np.ceil(np.minimum(x1 + rx, clip[:, 1])), left + 1, widths).astype(np.int64)
        top = np.clip(np.floor(np.maximum(y0 - ry, clip[:, 2])), 0, heights - 1).astype(np.int64)
        bottom = np.clip(np.ceil(np.minimum(y1 + ry, clip[:, 3])), top + 1, heights).astype(np.int64)
        # DCT scale from the map's smallest step along the output axes (|column|): it must not upsample
        d = self._downscale(np.hypot(a[:, 1, 1], a[:, 0, 1]) * out_h, np.hypot(a[:, 0, 0], a[:, 1, 0]) * out_w)
        # output pixel index (u + .5 in edge coordinates) -> original edge -> decoded-crop index (planners._finish)
        m = np.empty((b, 2, 5), np.float64)
        for row, origin in ((0, left), (1, top)):
            m[:, row, 0] = a[:, row, 0] / d
            m[:, row, 1] = a[:, row, 1] / d
            m[:, row, 2] = (a[:, row, 0] * 0.5 + a[:, row, 1] * 0.5 + a[:, row, 2]) / d - 0.5 - origin // d
            # the visible interval in the decoded crop's edge coordinates (its first pixel starts at origin // d)
            m[:, row, 3] = shown[:, 2 * row] / d - origin // d
            m[:, row, 4] = shown[:, 2 * row + 1] / d - origin // d
        windows = np.stack([top, left, bottom - top, right - left, d], axis=1)
        return GeometryPlan(torch.from_numpy(windows), torch.from_numpy(m.astype(np.float32)), self.fill,
                            flips % 2 == 1)

    def _bound(self, clip, shown, tilted, a, step, t):
        """A crop box (or a whole canvas) of ``step`` bounds what the filter may read (clip) and what is visible
        (shown) from now on where ``a`` keeps it axis-aligned in the original; where not, it goes to ``tilted``
        for _check_tilted."""
        clip = self._clip(clip, a, step)
        shown = self._clip(shown, a, step._replace(reach=False))
        off = np.flatnonzero(~_aligned(a))
        if len(off):
            box = np.stack(np.broadcast_arrays(*(np.asarray(v, np.float64) for v in step.crop), np.zeros(len(a))),
                           1)[:, :4]
            tilted = tilted + [(t, a[off], box[off], off)]
        return clip, shown, tilted

    @staticmethod
    def _clip(clip, a, step):
        """The visible box narrowed by a crop (its box in the canvas that ``a`` maps to the original), for the
        samples where that canvas is still axis-aligned in the original (a crop after a rotation cannot clip)."""
        x0, x1, y0, y1 = (np.asarray(v, np.float64) for v in step.crop)
        # far edge as origin + scale * extent, the way planners.py (and _box on the next canvas) rounds it, so
        # that axis-aligned pipelines give planners' windows to the last bit
        ox, oy = a[:, 0, 0] * x0 + a[:, 0, 2], a[:, 1, 1] * y0 + a[:, 1, 2]
        xs = (ox, ox + a[:, 0, 0] * (x1 - x0))
        ys = (oy, oy + a[:, 1, 1] * (y1 - y0))
        bx0, bx1, by0, by1 = np.minimum(*xs), np.maximum(*xs), np.minimum(*ys), np.maximum(*ys)
        straight = (a[:, 0, 1] == 0) & (a[:, 1, 0] == 0)
        if not straight.all():  # a quarter turn: the box's image is the box of its corners' images, chosen per
            # sample whatever else its batch holds (planning is a function of the sample alone); samples not
            # axis-aligned at all keep ``clip`` below
            corners = np.stack(np.broadcast_arrays(x0, x1, y0, y1, np.zeros(len(a))), 1)[:, :4]
            turned = GeometryPlanner._box(a, corners)
            bx0, bx1, by0, by1 = (np.where(straight, v, t) for v, t in zip((bx0, bx1, by0, by1), turned))
        rx, ry = (_reach(a[:, 0, 0], a[:, 0, 1]), _reach(a[:, 1, 0], a[:, 1, 1])) if step.reach else (0.0, 0.0)
        box = np.stack([np.maximum(clip[:, 0], bx0 - rx), np.minimum(clip[:, 1], bx1 + rx),
                        np.maximum(clip[:, 2], by0 - ry), np.minimum(clip[:, 3], by1 + ry)], 1)
        return np.where(_aligned(a)[:, None], box, clip)

    def _check_tilted(self, tilted, a, read, indices):
        """A canvas that is not axis-aligned in the original cannot clip (the warp's visible part is a box there):
        the pixels a later step (or a BILINEAR policy's ``extra``) reads must lie inside it, else ValueError."""
        for t, ac, box, rows in tilted:
            # the output's read box -> the tilted box's canvas: inverse(ac) . a, at the read box's corners
            m = np.linalg.inv(ac) @ a[rows]
            u0, u1, v0, v1 = read[rows].T
            bx0, bx1, by0, by1 = box.T
            tol = 1e-6 * (1.0 + np.abs(box).max(1))
            for u, v in ((u0, v0), (u1, v0), (u0, v1), (u1, v1)):
                x = m[:, 0, 0] * u + m[:, 0, 1] * v + m[:, 0, 2]
                y = m[:, 1, 0] * u + m[:, 1, 1] * v + m[:, 1, 2]
                out = np.flatnonzero((x < bx0 - tol) | (x > bx1 + tol) | (y < by0 - tol) | (y > by1 + tol))
                if len(out):
                    readers = self.steps[self.steps.index(t):] if t is not None else []
                    readers = ", ".join(map(repr, readers)) or "a policy's BILINEAR rotate, shear or translate"
                    raise ValueError(
                        f"sample {indices[rows[out[0]]]}: an earlier RandomAffine or RandomRotation left the canvas "
                        f"rotated or sheared in the image, and what follows ({readers}) reads outside it, where "
                        f"torchvision shows fill: fastload clips only to canvases that stay axis-aligned, and "
                        f"refuses rather than show image there. Keep the rotation last among the geometric steps, "
                        f"or follow it only with steps that stay inside its canvas (a smaller CenterCrop, "
                        f"RandomResizedCrop, Resize, flips)")

    @staticmethod
    def _box(a, read):
        """Bounding box (x0, x1, y0, y1), in original edge coordinates, of the canvas rectangle read [B, 4] (x0, x1,
        y0, y1) under a."""
        u0, u1, v0, v1 = read.T
        corners = [(u0, v0), (u1, v0), (u0, v1), (u1, v1)]
        xs = np.stack([a[:, 0, 0] * u + a[:, 0, 1] * v + a[:, 0, 2] for u, v in corners])
        ys = np.stack([a[:, 1, 0] * u + a[:, 1, 1] * v + a[:, 1, 2] for u, v in corners])
        return xs.min(0), xs.max(0), ys.min(0), ys.max(0)

    def _downscale(self, extent_h, extent_w):
        """planners' rule: the largest d in (1, 2, 4, 8) with floor(extent / d) >= output size; 1 when off."""
        out_h, out_w = self.out_size
        d = np.ones(len(extent_h), dtype=np.int64)
        if self.dct_downscale:
            for cand in (2, 4, 8):
                fits = (np.floor(extent_h / cand + 1e-9) >= out_h) & (np.floor(extent_w / cand + 1e-9) >= out_w)
                d = np.where(fits, cand, d)
        return d
