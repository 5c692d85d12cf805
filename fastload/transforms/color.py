"""torchvision.transforms.v2's photometric transforms, as per-sample parameter planners.

Each class takes torchvision's arguments (same defaults, same validation and exception types) and, instead of
changing an image, writes a ``PhotometricTable`` for a batch (CONTRACT.md): ``.table(seed, epoch, indices)`` gives
every sample its own draw, made exactly as torchvision's ``make_params`` makes it (same distributions), from
``fastload.rng.uniforms`` on the transform's ``stream``. ``functional.photometric`` executes the table in the
loader's stage on the uint8 image (the canvas after the geometry), as torchvision's uint8 pipelines do: thresholds
(``RandomSolarize``) are therefore on the 0-255 scale, which is what torchvision uses for uint8 images.
"""
import collections.abc
import numbers

import numpy as np
import torch

from .. import rng
from .functional import OPS, PhotometricTable, solarize_threshold
from .geometry import probability, uniform_bounds

__all__ = ["ColorJitter", "RandomGrayscale", "Grayscale", "GaussianBlur", "RandomInvert", "RandomPosterize",
           "RandomSolarize", "RandomAdjustSharpness", "RandomAutocontrast", "RandomEqualize"]


_BLENDS = (OPS["contrast"], OPS["saturation"], OPS["sharpness"])


def _table(ops, params):
    """PhotometricTable from numpy int [B, S] codes and float64 [B, S, 3] parameters. A blend's p1 is 1 - factor,
    computed here from the double factor as torchvision computes it (CONTRACT.md): 1 + a policy magnitude is often
    no float32, and then float32(1 - float32(factor)) is not torchvision's float32(1 - factor)."""
    params = np.array(params, dtype=np.float64)
    blend = np.isin(ops, _BLENDS)
    params[..., 1] = np.where(blend, 1.0 - params[..., 0], params[..., 1])
    return PhotometricTable(torch.from_numpy(np.ascontiguousarray(ops, dtype=np.int64)),
                            torch.from_numpy(np.ascontiguousarray(params, dtype=np.float32)))


class _Photometric:
    """What every photometric transform shares: kind, stream, and drawing ``columns`` uniforms per sample."""

    kind = "photometric"
    stream = 0  # set by Compose; each transform reads only its own stream
    slots = 1
    columns = 1  # rng.uniforms columns read per sample

    def table(self, seed, epoch, indices):
        u = rng.uniforms(seed, epoch, indices, self.columns, stream=self.stream)
        ops = np.zeros((len(u), self.slots), np.int64)
        params = np.zeros((len(u), self.slots, 3), np.float64)
        self._fill_table(u, ops, params)
        return _table(ops, params)

    def _fill_table(self, u, ops, params):
        raise NotImplementedError(f"{type(self).__name__} must define _fill_table")

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_") and k != "stream")
        return f"{type(self).__name__}({args})"


class _RandomApply(_Photometric):
    """torchvision's ``_RandomApplyTransform``: the op with probability p (one Bernoulli draw per sample)."""

    op = None  # name in OPS

    def __init__(self, p=0.5):
        self.p = probability(p)

    def _param(self):
        return 0.0

    def _fill_table(self, u, ops, params):
        applied = u[:, 0] < self.p
        ops[applied, 0] = OPS[self.op]
        params[applied, 0, 0] = self._param()


class RandomInvert(_RandomApply):
    op = "invert"


class RandomAutocontrast(_RandomApply):
    op = "autocontrast"


class RandomEqualize(_RandomApply):
    op = "equalize"


class RandomGrayscale(_RandomApply):
    """torchvision's ``RandomGrayscale(p=0.1)``: the output keeps the input's 3 channels, as in torchvision."""

    op = "grayscale"

    def __init__(self, p=0.1):
        super().__init__(p=p)


class RandomPosterize(_RandomApply):
    op = "posterize"

    def __init__(self, bits, p=0.5):
        super().__init__(p=p)
        # torchvision checks this when the first image arrives (F.posterize); a loader can say so at once
        if not isinstance(bits, int) or not 0 <= bits <= 8:
            raise TypeError(f"bits must be a positive integer in the range [0, 8], got {bits} instead.")
        self.bits = bits

    def _param(self):
        return self.bits


class RandomSolarize(_RandomApply):
    """torchvision's ``RandomSolarize(threshold, p=0.5)``. fastload's photometric stage runs on uint8 images, so
    ``threshold`` is on the 0-255 scale, as torchvision takes it for uint8 images (pixels >= threshold invert)."""

    op = "solarize"

    def __init__(self, threshold, p=0.5):
        super().__init__(p=p)
        if threshold > 255:  # torchvision raises this on the first uint8 image (F.solarize)
            raise TypeError(f"Threshold should be less or equal the maximum value of the dtype, but got {threshold}")
        self.threshold = threshold

    def _param(self):
        return float(solarize_threshold(self.threshold))


class RandomAdjustSharpness(_RandomApply):
    op = "sharpness"

    def __init__(self, sharpness_factor, p=0.5):
        super().__init__(p=p)
        if sharpness_factor < 0:  # torchvision raises this on the first image (F.adjust_sharpness)
            raise ValueError(f"sharpness_factor ({sharpness_factor}) is not non-negative.")
        self.sharpness_factor = sharpness_factor

    def _param(self):
        return float(self.sharpness_factor)


class Grayscale(_Photometric):
    """torchvision's ``Grayscale(num_output_channels=1)``: 3 writes the grey value to all three channels; 1
    (torchvision's default) makes the loader's batches [B, 1, H, W]. The stage carries the grey image in three
    equal channels, the transforms after it act as torchvision's act on a one-channel image
    (``PhotometricTable.on_one_channel``) until an ``RGB()`` or ``Grayscale(3)`` repeats it to three, and the
    output keeps one channel (a Normalize of three means broadcasts it to three, as torchvision's does). It cannot
    sit in a RandomApply, RandomChoice or RandomOrder: where the one-channel ops start would be drawn per sample."""

    columns = 0

    def __init__(self, num_output_channels=1):
        if num_output_channels not in (1, 3):
            raise ValueError(f"num_output_channels must be 1 or 3, got {num_output_channels}.")
        self.num_output_channels = num_output_channels

    def _fill_table(self, u, ops, params):
        ops[:, 0] = OPS["grayscale"]


def _setup_number_or_seq(arg, name):
    """torchvision.transforms.v2._utils._setup_number_or_seq: a number or 1-2 numbers -> [min, max]."""
    if not isinstance(arg, (int, float, collections.abc.Sequence)):
        raise TypeError(f"{name} should be a number or a sequence of numbers. Got {type(arg)}")
    if isinstance(arg, collections.abc.Sequence) and len(arg) not in (1, 2):
        raise ValueError(f"If {name} is a sequence its length should be 1 or 2. Got {len(arg)}")
    if isinstance(arg, collections.abc.Sequence):
        for element in arg:
            if not isinstance(element, (int, float)):
                raise ValueError(f"{name} should be a sequence of numbers. Got {type(element)}")
    if isinstance(arg, (int, float)):
        return [float(arg), float(arg)]
    return [float(arg[0]), float(arg[0])] if len(arg) == 1 else [float(arg[0]), float(arg[1])]


class GaussianBlur(_Photometric):
    """torchvision's ``GaussianBlur(kernel_size, sigma=(0.1, 2.0))``: sigma uniform in [min, max] per sample
    (the same sigma in x and y, as torchvision). Table parameters: (kernel x, kernel y, sigma)."""

    def __init__(self, kernel_size, sigma=(0.1, 2.0)):
        self.kernel_size = _setup_size(kernel_size, "Kernel size should be a tuple/list of two integers")
        for ks in self.kernel_size:
            if ks <= 0 or ks % 2 == 0:
                raise ValueError("Kernel size value should be an odd and positive number.")
            if not isinstance(ks, numbers.Integral) or isinstance(ks, bool):  # torchvision: linspace(steps=ks)
                raise TypeError(f"Kernel size values should be integers, got {self.kernel_size}")
        self.sigma = _setup_number_or_seq(sigma, "sigma")
        if not 0.0 < self.sigma[0] <= self.sigma[1]:
            raise ValueError(f"sigma values should be positive and of the form (min, max). Got {self.sigma}")

    def _fill_table(self, u, ops, params):
        lo, hi = self.sigma
        uniform_bounds(lo, hi, self)  # an infinite sigma: torchvision's uniform_ fails at the first image
        ops[:, 0] = OPS["gaussian_blur"]
        params[:, 0, 0] = self.kernel_size[0]
        params[:, 0, 1] = self.kernel_size[1]
        params[:, 0, 2] = lo + (hi - lo) * u[:, 0]


def _setup_size(size, error_msg):
    """torchvision.transforms.transforms._setup_size."""
    if isinstance(size, numbers.Number):
        return int(size), int(size)
    if isinstance(size, collections.abc.Sequence) and len(size) == 1:
        return size[0], size[0]
    if len(size) != 2:
        raise ValueError(error_msg)
    return size


class ColorJitter(_Photometric):
    """torchvision's ``ColorJitter(brightness, contrast, saturation, hue)``.

    Per sample, as torchvision's make_params: a uniformly random order of the four adjustments and each factor
    uniform in its range. Only the adjustments that are set take a slot (an unset one is the identity in
    torchvision), so ``slots`` is their count and their order is a uniform random permutation of them, which is
    the order torchvision's ``randperm(4)`` induces on them.
    """

    _OPS = ("brightness", "contrast", "saturation", "hue")  # torchvision's fn_idx 0..3

    def __init__(self, brightness=None, contrast=None, saturation=None, hue=None):
        self.brightness = self._check_input(brightness, "brightness")
        self.contrast = self._check_input(contrast, "contrast")
        self.saturation = self._check_input(saturation, "saturation")
        self.hue = self._check_input(hue, "hue", center=0, bound=(-0.5, 0.5), clip_first_on_zero=False)
        self._active = [(name, getattr(self, name)) for name in self._OPS if getattr(self, name) is not None]
        self.slots = len(self._active)
        self.columns = 2 * self.slots  # a sort key and a factor per adjustment

    @staticmethod
    def _check_input(value, name, center=1.0, bound=(0, float("inf")), clip_first_on_zero=True):
        """torchvision's ColorJitter._check_input, unchanged: the range [min, max], or None for the identity."""
        if value is None:
            return None
        if isinstance(value, (int, float)):
            if value < 0:
                raise ValueError(f"If {name} is a single number, it must be non negative.")
            value = [center - value, center + value]
            if clip_first_on_zero:
                value[0] = max(value[0], 0.0)
        elif isinstance(value, collections.abc.Sequence) and len(value) == 2:
            value = [float(v) for v in value]
        else:
            raise TypeError(f"{name}={value} should be a single number or a sequence with length 2.")
        if not bound[0] <= value[0] <= value[1] <= bound[1]:
            raise ValueError(f"{name} values should be between {bound} and increasing, but got {value}.")
        return None if value[0] == value[1] == center else (float(value[0]), float(value[1]))

    def _fill_table(self, u, ops, params):
        n = self.slots
        for _, (lo, hi) in self._active:  # an infinite bound: torchvision's uniform_ fails at the first image
            uniform_bounds(lo, hi, self)
        order = np.argsort(u[:, :n], axis=1, kind="stable")  # sorting iid uniforms: a uniform permutation
        codes = np.array([OPS[name] for name, _ in self._active], np.int64)
        lo = np.array([r[0] for _, r in self._active])
        hi = np.array([r[1] for _, r in self._active])
        # [B, n], column k for adjustment k; float32 numbers, as torchvision's uniform_ draws them (its 1 - factor
        # then is 1 - the float32 too)
        factors = (lo + (hi - lo) * u[:, n:]).astype(np.float32).astype(np.float64)
        ops[:] = codes[order]
        params[:, :, 0] = np.take_along_axis(factors, order, axis=1)

    def __repr__(self):
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._OPS)
        return f"ColorJitter({args})"
