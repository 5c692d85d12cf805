"""torchvision.transforms.v2's automatic augmentation policies, planned per sample.

``AutoAugment``, ``RandAugment`` and ``TrivialAugmentWide`` take torchvision's arguments and use its op lists,
magnitude bins (computed with the same ``torch.linspace`` calls, so the values are bit-identical), signs and
probabilities. Unlike torchvision on a batch, every sample draws its own ops and magnitudes, from
``fastload.rng.uniforms`` on the policy's ``stream``.

``plan(seed, epoch, indices, height, width) -> (PhotometricTable, maps)`` splits each sample's ops by slot (slot k =
the k-th op the sample draws):
- a photometric op takes its slot in the table, with the parameters torchvision's ``_apply_image_or_video_transform``
  passes to the functional op (factor 1 + magnitude, posterize bits int(magnitude), solarize threshold 255 *
  magnitude as the integer that inverts the same uint8 pixels); an op that was not applied leaves the identity;
- a geometric op (ShearX/Y, TranslateX/Y, Rotate) leaves the identity op in its slot and its map in ``maps[:, k]``,
  float64 [B, S, 3, 3] mapping output pixel-index coordinates (pixel centres at integers) of the height x width
  canvas to input pixel-index coordinates: the mapping torchvision's ``affine_image``/``rotate_image`` sample with
  (the inverse affine matrix about the image centre, evaluated on ``_affine_grid``'s centred pixel grid; ShearX/Y
  about the corner, ``center=[0, 0]``); other slots hold the identity map.

With ``interpolation=NEAREST`` (the default) the stage runs each map where its slot is, as torchvision does: a
nearest-neighbour gather of the slot's input (``ops.affine_nearest``'s maths, fill outside), so the ops before and
after it see what torchvision's see (the photometric ops before it never see the fill; two geometric ops resample
twice). With BILINEAR the maps compose (``composed``) into the one warp instead (one resample with the warp's
filter, before every photometric op). AugMix, whose chains cannot fold into the warp, is in augmix.py.
"""
from enum import Enum

import numpy as np
import torch

from .. import rng
from .color import _table
from .functional import OPS, solarize_threshold
from .geometry import interpolation_mode

__all__ = ["AutoAugmentPolicy", "AutoAugment", "RandAugment", "TrivialAugmentWide", "InterpolationMode", "composed"]


class InterpolationMode(Enum):
    """torchvision's ``InterpolationMode`` (the same names and values; fastload's transforms take either enum, its
    strings or Pillow's constants). The geometric transforms run BILINEAR and NEAREST; the others are refused."""
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class AutoAugmentPolicy(Enum):
    """torchvision's AutoAugmentPolicy (torchvision's own enum members are accepted too)."""

    IMAGENET = "imagenet"
    CIFAR10 = "cifar10"
    SVHN = "svhn"


_GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
# torchvision's op name -> (OPS code, table parameter from the signed magnitude)
_PHOTOMETRIC = {
    "Identity": ("identity", lambda m: 0.0 * m),
    "Brightness": ("brightness", lambda m: 1.0 + m),
    "Color": ("saturation", lambda m: 1.0 + m),
    "Contrast": ("contrast", lambda m: 1.0 + m),
    "Sharpness": ("sharpness", lambda m: 1.0 + m),
    "Posterize": ("posterize", np.trunc),  # int(magnitude)
    # _max_value(uint8) * magnitude (a Python float), as the integer threshold that decides the same pixels
    # (solarize_threshold: torch compares the uint8 image with it in float32).
    "Solarize": ("solarize", lambda m: solarize_threshold(255.0 * m)),
    "AutoContrast": ("autocontrast", lambda m: 0.0 * m),
    "Equalize": ("equalize", lambda m: 0.0 * m),
    "Invert": ("invert", lambda m: 0.0 * m),
}


def _lin(a, b):
    return lambda num_bins, height, width: torch.linspace(a, b, num_bins)


def _posterize(top, span):
    return lambda num_bins, height, width: (top - (torch.arange(num_bins) / ((num_bins - 1) / span))).round().int()


def _none(num_bins, height, width):
    return None


# torchvision v2's _AUGMENTATION_SPACE of each class: name -> (magnitudes(num_bins, height, width), signed)
_AUTOAUGMENT_SPACE = {
    "ShearX": (_lin(0.0, 0.3), True),
    "ShearY": (_lin(0.0, 0.3), True),
    "TranslateX": (lambda num_bins, height, width: torch.linspace(0.0, 150.0 / 331.0 * width, num_bins), True),
    "TranslateY": (lambda num_bins, height, width: torch.linspace(0.0, 150.0 / 331.0 * height, num_bins), True),
    "Rotate": (_lin(0.0, 30.0), True),
    "Brightness": (_lin(0.0, 0.9), True),
    "Color": (_lin(0.0, 0.9), True),
    "Contrast": (_lin(0.0, 0.9), True),
    "Sharpness": (_lin(0.0, 0.9), True),
    "Posterize": (_posterize(8, 4), False),
    "Solarize": (_lin(1.0, 0.0), False),
    "AutoContrast": (_none, False),
    "Equalize": (_none, False),
    "Invert": (_none, False),
}
_RANDAUGMENT_SPACE = {"Identity": (_none, False),
                      **{k: v for k, v in _AUTOAUGMENT_SPACE.items() if k != "Invert"}}
_TRIVIALAUGMENT_SPACE = {
    "Identity": (_none, False),
    "ShearX": (_lin(0.0, 0.99), True),
    "ShearY": (_lin(0.0, 0.99), True),
    "TranslateX": (_lin(0.0, 32.0), True),
    "TranslateY": (_lin(0.0, 32.0), True),
    "Rotate": (_lin(0.0, 135.0), True),
    "Brightness": (_lin(0.0, 0.99), True),
    "Color": (_lin(0.0, 0.99), True),
    "Contrast": (_lin(0.0, 0.99), True),
    "Sharpness": (_lin(0.0, 0.99), True),
    "Posterize": (_posterize(8, 6), False),
    "Solarize": (_lin(1.0, 0.0), False),
    "AutoContrast": (_none, False),
    "Equalize": (_none, False),
}

# torchvision's AutoAugment._get_policies: sub-policies of (op, probability, magnitude bin)
_POLICIES = {
    AutoAugmentPolicy.IMAGENET: [
        (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)), (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
        (("Solarize", 0.6, 3), ("Equalize", 0.6, None)), (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
        (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
        (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
        (("Equalize", 0.0, None), ("Equalize", 0.8, None)), (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
        (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
        (("ShearX", 0.6, 5), ("Equalize", 1.0, None)), (("Color", 0.4, 0), ("Equalize", 0.6, None)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    ],
    AutoAugmentPolicy.CIFAR10: [
        (("Invert", 0.1, None), ("Contrast", 0.2, 6)), (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
        (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)), (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)), (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
        (("Color", 0.4, 3), ("Brightness", 0.6, 7)), (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
        (("Equalize", 0.6, None), ("Equalize", 0.5, None)), (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
        (("Color", 0.7, 7), ("TranslateX", 0.5, 8)), (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
        (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)), (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
        (("Solarize", 0.5, 2), ("Invert", 0.0, None)), (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.2, None), ("Equalize", 0.6, None)), (("Color", 0.9, 9), ("Equalize", 0.6, None)),
        (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)), (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
        (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)), (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)), (("Equalize", 0.8, None), ("Invert", 0.1, None)),
        (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
    ],
    AutoAugmentPolicy.SVHN: [
        (("ShearX", 0.9, 4), ("Invert", 0.2, None)), (("ShearY", 0.9, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.6, None), ("Solarize", 0.6, 6)), (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)), (("ShearX", 0.9, 4), ("AutoContrast", 0.8, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.4, None)), (("ShearY", 0.9, 5), ("Solarize", 0.2, 6)),
        (("Invert", 0.9, None), ("AutoContrast", 0.8, None)), (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("Solarize", 0.3, 3)), (("ShearY", 0.8, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.9, None), ("TranslateY", 0.6, 6)), (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Contrast", 0.3, 3), ("Rotate", 0.8, 4)), (("Invert", 0.8, None), ("TranslateY", 0.0, 2)),
        (("ShearY", 0.7, 6), ("Solarize", 0.4, 8)), (("Invert", 0.6, None), ("Rotate", 0.8, 4)),
        (("ShearY", 0.3, 7), ("TranslateX", 0.9, 3)), (("ShearX", 0.1, 6), ("Invert", 0.6, None)),
        (("Solarize", 0.7, 2), ("TranslateY", 0.6, 7)), (("ShearY", 0.8, 4), ("Invert", 0.8, None)),
        (("ShearX", 0.7, 9), ("TranslateY", 0.8, 3)), (("ShearY", 0.8, 5), ("AutoContrast", 0.7, None)),
        (("ShearX", 0.7, 2), ("Invert", 0.1, None)),
    ],
}

def _check_interpolation(interpolation):
    """torchvision's _check_interpolation (same exceptions): "nearest" or "bilinear". The other modes torchvision
    accepts here and refuses at the first tensor image a geometric op moves (ValueError): fastload's images are
    tensors, so it refuses them at once."""
    mode = interpolation_mode(interpolation)
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"Interpolation mode '{mode}' is unsupported with Tensor input (use NEAREST, the default, "
                         f"or BILINEAR)")
    return mode


def _check_fill(fill):
    """torchvision's _check_fill_arg (TypeError); a dict is resolved to the image's entry (the loader's input is
    one image), so ``fill`` is what torchvision's functional ops take: None, a number or a sequence."""
    values = fill.values() if isinstance(fill, dict) else [fill]
    for value in values:
        if value is not None and not isinstance(value, (int, float, tuple, list)):
            raise TypeError("Got inappropriate fill arg, only Numbers, tuples, lists and dicts are allowed.")
    if isinstance(fill, dict):
        by_name = {getattr(k, "__name__", k): v for k, v in fill.items()}
        fill = next((by_name[k] for k in ("Image", "Tensor", "others") if k in by_name), None)
    if isinstance(fill, (tuple, list)):
        if len(fill) not in (1, 3):
            raise ValueError("The number of elements in 'fill' cannot broadcast to match the number of channels of "
                             f"the image (3 != {len(fill)})")
        fill = [float(v) for v in fill]
    return fill


def _inverse_affine(center, angle, translate, shear):
    """torchvision's _get_inverse_affine_matrix (scale 1), vectorised: [n, 3, 3] in its centred frame.

    center, translate, shear: [n, 2]; angle: [n] (degrees). Multiples of 90 degrees get exact cos/sin, as
    torchvision's rot90 fast path is exact.
    """
    rot = np.radians(angle)
    sx, sy = np.radians(shear[:, 0]), np.radians(shear[:, 1])
    cos_r, sin_r = np.cos(rot), np.sin(rot)
    right = np.mod(angle, 90.0) == 0
    cos_r[right], sin_r[right] = np.round(cos_r[right]), np.round(sin_r[right])
    cos_rs, sin_rs = np.cos(rot - sy), np.sin(rot - sy)
    cos_rs[right & (sy == 0)], sin_rs[right & (sy == 0)] = cos_r[right & (sy == 0)], sin_r[right & (sy == 0)]
    a = cos_rs / np.cos(sy)
    b = -(a * np.tan(sx) + sin_r)
    c = sin_rs / np.cos(sy)
    d = cos_r - c * np.tan(sx)
    m = np.zeros((len(angle), 3, 3))
    m[:, 0, 0], m[:, 0, 1], m[:, 1, 0], m[:, 1, 1], m[:, 2, 2] = d, -b, -c, a, 1.0
    cx, cy = center[:, 0], center[:, 1]
    ctx, cty = cx + translate[:, 0], cy + translate[:, 1]
    m[:, 0, 2] = cx - m[:, 0, 0] * ctx - m[:, 0, 1] * cty
    m[:, 1, 2] = cy - m[:, 1, 0] * ctx - m[:, 1, 1] * cty
    return m


def geometric_matrices(name, magnitude, height, width):
    """float64 [n, 3, 3]: output pixel index -> input pixel index of torchvision's geometric op ``name`` (one name,
    or one per sample) with the signed magnitudes [n] on a height x width canvas (what
    ``_apply_image_or_video_transform`` does). Each sample's matrix is computed elementwise, so one call over mixed
    ops gives each the bits of its own."""
    mag = np.asarray(magnitude, np.float64)
    n = len(mag)
    names = np.broadcast_to(np.asarray(name), (n,))
    unknown = set(names.tolist()) - set(_GEOMETRIC)
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]} is not a geometric op")
    center, translate, shear = np.zeros((n, 2)), np.zeros((n, 2)), np.zeros((n, 2))
    for axis, (shear_op, translate_op) in enumerate((("ShearX", "TranslateX"), ("ShearY", "TranslateY"))):
        is_shear = names == shear_op
        # F.affine(center=[0, 0]): affine_image moves the centre to the frame whose origin is the image centre
        center[is_shear] = (-0.5 * width, -0.5 * height)
        shear[is_shear, axis] = np.degrees(np.arctan(mag[is_shear]))
        is_translate = names == translate_op
        translate[is_translate, axis] = np.trunc(mag[is_translate])  # translate=[int(magnitude), 0]
    # rotate_image: angle % 360, then the affine matrix of -angle
    angle = np.where(names == "Rotate", -np.mod(mag, 360.0), 0.0)
    m = _inverse_affine(center, angle, translate, shear)
    # _affine_grid + grid_sample(align_corners=False): an output pixel (i, j) is at (j - (W-1)/2, i - (H-1)/2) in
    # the centred frame, and a centred input position x maps back to the pixel index x + (W-1)/2.
    c = np.eye(3)
    c[0, 2], c[1, 2] = (width - 1) / 2.0, (height - 1) / 2.0
    c_inv = np.eye(3)
    c_inv[0, 2], c_inv[1, 2] = -c[0, 2], -c[1, 2]
    return c @ m @ c_inv


def composed(maps):
    """Per-slot maps [B, S, 3, 3] -> float64 [B, 3, 3]: output -> the first slot's input (out -> the last op's
    input = the op before's output -> ... : earlier slots multiply on the left)."""
    out = np.broadcast_to(np.eye(3), (len(maps), 3, 3)).copy()
    for s in range(maps.shape[1]):
        out = out @ maps[:, s]
    return out


class _Policy:
    """What the three policies share: interpolation/fill arguments, the magnitude tables and ``plan``."""

    kind = "policy"
    stream = 0  # set by Compose
    _SPACE = None

    def __init__(self, interpolation, fill):
        self.interpolation = interpolation
        self._interpolation = _check_interpolation(interpolation)
        self.fill = _check_fill(fill)
        self._names = tuple(self._SPACE)
        self._signed = np.array([self._SPACE[k][1] for k in self._names])
        self._geometric = np.isin(self._names, _GEOMETRIC)

    def _magnitudes(self, num_bins, height, width):
        """float64 [len(names), num_bins]: each op's magnitude bins as torchvision computes them (0 for none).
        Cached per canvas: a loader asks for the same bins every batch (read-only, shared by the producers)."""
        key = (num_bins, height, width)
        cache = self.__dict__.setdefault("_bins", {})
        if key not in cache:
            cache[key] = self._compute_magnitudes(num_bins, height, width)
            cache[key].flags.writeable = False
        return cache[key]

    def _compute_magnitudes(self, num_bins, height, width):
        out = np.zeros((len(self._names), num_bins))
        for k, name in enumerate(self._names):
            values = self._SPACE[name][0](num_bins, height, width)
            if values is not None:
                out[k] = values.double().numpy()  # float(float32 tensor element), as torchvision's float(...)
        return out

    def plan(self, seed, epoch, indices, height, width):
        """(PhotometricTable [B, slots], maps float64 [B, slots, 3, 3]) for the samples ``indices``: a slot where a
        sample drew a geometric op holds the identity op and that op's map (output -> input pixel index, applied to
        the slot's input, as torchvision moves the image between the ops before and after it); the other slots
        hold the identity map. ``composed(maps)``: all of a sample's ops as one map."""
        op, magnitude, applied = self.draws(seed, epoch, indices, height, width)
        B, S = op.shape
        codes, params = np.zeros((B, S), np.int64), np.zeros((B, S, 3))
        maps = np.broadcast_to(np.eye(3), (B, S, 3, 3)).copy()
        for s in range(S):
            moved = applied[:, s] & self._geometric[op[:, s]]
            if moved.any():  # all of the slot's geometric ops in one call
                names = np.array(self._names)[op[moved, s]]
                maps[moved, s] = geometric_matrices(names, magnitude[moved, s], height, width)
            for k, name in enumerate(self._names):
                sel = applied[:, s] & (op[:, s] == k)
                if self._geometric[k] or not sel.any():
                    continue
                code, param = _PHOTOMETRIC[name]
                codes[sel, s] = OPS[code]
                params[sel, s, 0] = param(magnitude[sel, s])
        return _table(codes, params), maps

    def draws(self, seed, epoch, indices, height, width):
        """Each sample's ops as torchvision's ``_apply_image_or_video_transform`` would receive them:
        (op [B, S] index into ``self.op_names``, signed magnitude float64 [B, S], applied bool [B, S])."""
        u = rng.uniforms(seed, epoch, indices, self.columns, stream=self.stream)
        return self._draw(u, height, width)

    @property
    def op_names(self):
        return self._names

    def _draw(self, u, height, width):
        raise NotImplementedError(f"{type(self).__name__} must define _draw")

    def _signs(self, op, u):
        """-1 where the op is signed and the sign draw says so (torchvision: ``rand() <= 0.5``), else +1."""
        return np.where(self._signed[op] & (u < 0.5), -1.0, 1.0)

    def __repr__(self):
        hidden = ("stream", "slots", "columns")
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_") and k not in hidden)
        return f"{type(self).__name__}({args})"


def _randint(u, n):
    return np.minimum(np.floor(u * n), n - 1).astype(np.int64)


def _check_bins(num_magnitude_bins):
    # torchvision divides by num_bins - 1 for Posterize's bins: fewer than 2 bins gives NaN bits, not an error
    if not isinstance(num_magnitude_bins, int) or isinstance(num_magnitude_bins, bool):  # torchvision: TypeError
        raise TypeError(f"num_magnitude_bins should be an integer >= 2, got {num_magnitude_bins!r}")
    if num_magnitude_bins < 2:
        raise ValueError(f"num_magnitude_bins should be an integer >= 2, got {num_magnitude_bins}")


class TrivialAugmentWide(_Policy):
    """torchvision's ``TrivialAugmentWide(num_magnitude_bins=31, interpolation=NEAREST, fill=None)``: one op per
    sample, uniform over the 14 ops, a uniform magnitude bin, a random sign for signed ops."""

    _SPACE = _TRIVIALAUGMENT_SPACE
    slots = 1
    columns = 3  # op, magnitude bin, sign

    def __init__(self, num_magnitude_bins=31, interpolation="nearest", fill=None):
        super().__init__(interpolation, fill)
        _check_bins(num_magnitude_bins)
        self.num_magnitude_bins = num_magnitude_bins

    def _draw(self, u, height, width):
        op = _randint(u[:, 0], len(self._names))
        bins = _randint(u[:, 1], self.num_magnitude_bins)
        magnitude = self._magnitudes(self.num_magnitude_bins, height, width)[op, bins] * self._signs(op, u[:, 2])
        return op[:, None], magnitude[:, None], np.ones((len(u), 1), bool)


class RandAugment(_Policy):
    """torchvision's ``RandAugment(num_ops=2, magnitude=9, num_magnitude_bins=31, interpolation=NEAREST,
    fill=None)``: ``num_ops`` ops per sample (one slot each), uniform over the 14 ops, at the fixed magnitude bin,
    a random sign for signed ops."""

    _SPACE = _RANDAUGMENT_SPACE

    def __init__(self, num_ops=2, magnitude=9, num_magnitude_bins=31, interpolation="nearest", fill=None):
        super().__init__(interpolation, fill)
        if not isinstance(num_ops, int) or (num_ops < 0):
            raise ValueError(f"num_ops should be a non-negative integer, but got {num_ops} instead.")
        _check_bins(num_magnitude_bins)
        torch.arange(num_magnitude_bins)[magnitude]  # torchvision's magnitudes[magnitude]: IndexError if outside
        self.num_ops = num_ops
        self.magnitude = magnitude
        self.num_magnitude_bins = num_magnitude_bins
        self.slots = num_ops
        self.columns = 2 * num_ops  # op and sign per slot

    def _draw(self, u, height, width):
        op = _randint(u[:, 0::2], len(self._names))
        bins = np.arange(self.num_magnitude_bins)[self.magnitude]  # a negative magnitude indexes from the end
        table = self._magnitudes(self.num_magnitude_bins, height, width)[:, bins]
        magnitude = table[op] * self._signs(op, u[:, 1::2])
        return op, magnitude, np.ones(op.shape, bool)


class AutoAugment(_Policy):
    """torchvision's ``AutoAugment(policy=IMAGENET, interpolation=NEAREST, fill=None)``: per sample one of the
    policy's 25 sub-policies, each of its two ops applied with its probability, at its magnitude bin (of 10),
    with a random sign for signed ops. Two slots: the sub-policy's first and second op."""

    _SPACE = _AUTOAUGMENT_SPACE
    slots = 2
    columns = 5  # sub-policy, then (applied, sign) per op

    def __init__(self, policy=AutoAugmentPolicy.IMAGENET, interpolation="nearest", fill=None):
        super().__init__(interpolation, fill)
        key = AutoAugmentPolicy(policy.value) if type(policy).__name__ == "AutoAugmentPolicy" else None
        if key not in _POLICIES:
            raise ValueError(f"The provided policy {policy} is not recognized.")
        self.policy = policy
        subs = _POLICIES[key]
        self._sub_op = np.array([[self._names.index(name) for name, _, _ in sub] for sub in subs])
        self._sub_p = np.array([[p for _, p, _ in sub] for sub in subs])
        self._sub_bin = np.array([[b if b is not None else 0 for _, _, b in sub] for sub in subs])

    def _draw(self, u, height, width):
        sub = _randint(u[:, 0], len(self._sub_op))
        op = self._sub_op[sub]
        applied = u[:, 1::2] < self._sub_p[sub]  # torchvision: rand() <= p
        magnitude = self._magnitudes(10, height, width)[op, self._sub_bin[sub]] * self._signs(op, u[:, 2::2])
        return op, magnitude, applied
