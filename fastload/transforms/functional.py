"""Batched photometric ops with per-sample parameters: torchvision.transforms.v2.functional, one call per batch.

Every op takes ``x`` [B, C, H, W], uint8 (0-255) or floating (0-1), on any device, and a parameter that is a number
(shared by the batch) or a tensor [B] (one value per sample). The result equals torchvision's op applied to each
sample with that sample's parameter; the ops replay torchvision's float operations in its order, so on uint8 they
round and truncate the same way (see ``tests/test_functional.py`` for what is exact and what is bounded):

- torchvision's ``t.add_(u, alpha=python_float)`` is a fused multiply-add in ATen (``vec::fmadd`` on CPU, contracted
  by nvcc on CUDA). With a per-sample alpha it becomes ``torch.addcmul(t, u, alpha)``, which ATen also computes as
  one fused multiply-add (test_fma_matches_torch_add checks it on the running build).
- Python-float parameters are cast to the computation dtype where torchvision's scalar would be; ``1 - factor``
  is computed in float64 first, as Python does. Parameter tensors therefore travel as float64.

Each op is a torch custom op (``torch.ops.fastload.<name>``) with a fake kernel, so torch.compile traces through
it; the public function validates, turns a number into a tensor and moves the parameters to ``x``'s device
(non-blocking; values are checked on the host only when they are there already: a parameter tensor on the GPU is
trusted, since checking it would synchronise).

``apply_table`` executes a ``PhotometricTable`` (CONTRACT.md): per slot, samples grouped by op code on the host.
``photometric`` executes one on a uint8 batch in a single native op (``torch.ops.fastload.photometric``: per slot a
statistics kernel and an apply kernel on CUDA) and writes the normalised output: the loader's path.
"""
import functools
import math
import numbers
from typing import NamedTuple, Optional

import numpy as np
import torch
from torch import Tensor
from torch.nn.functional import conv2d, pad

from ..ops import _norm_params, fill_values, nearest_maps

__all__ = [
    "OPS", "PhotometricTable", "CheckedTable", "checked_table", "apply_table", "photometric",
    "adjust_brightness", "adjust_contrast", "adjust_saturation", "adjust_hue", "adjust_sharpness",
    "posterize", "solarize", "autocontrast", "equalize", "invert", "rgb_to_grayscale", "gaussian_blur",
]

OPS = {"identity": 0, "brightness": 1, "contrast": 2, "saturation": 3, "hue": 4, "sharpness": 5, "posterize": 6,
       "solarize": 7, "autocontrast": 8, "equalize": 9, "invert": 10, "grayscale": 11, "gaussian_blur": 12}


def solarize_threshold(threshold):
    """The integer t with ``x >= t`` exactly where torchvision's solarize inverts a uint8 x: torch compares the uint8
    image with a Python-float threshold in float32, so t = ceil(float32(threshold)) (255 * float32(2/3) =
    170.0000051 is 170.0 there: the pixels at 170 invert). A number or a numpy array; float32 results."""
    return np.ceil(np.float32(threshold))


class PhotometricTable(NamedTuple):
    ops: Tensor  # int64 [B, S], host: op code of slot s for each sample (OPS)
    params: Tensor  # float32 [B, S, 3], host: the op's parameters p0, p1, p2

    @classmethod
    def identity(cls, batch, slots=0):
        """``slots`` identity slots for ``batch`` samples (none: the output cast alone)."""
        return cls(torch.zeros(batch, slots, dtype=torch.int64), torch.zeros(batch, slots, 3, dtype=torch.float32))

    def on_one_channel(self, start, end):
        """The table whose slots [start, end) act on a one-channel (grey) image carried in three equal channels, as
        torchvision's ops act on the one-channel image after Grayscale(num_output_channels=1): saturation, hue and
        grayscale return it as it is (identity; Grayscale(3) repeats it), contrast blends with the mean of its one
        channel (p2 = 1); every other op treats the channels alike, so it acts on each as on the one."""
        ops, params = self.ops.clone(), self.params.clone()
        tail_ops, tail_params = ops[:, start:end], params[:, start:end]
        keep = (tail_ops == OPS["saturation"]) | (tail_ops == OPS["hue"]) | (tail_ops == OPS["grayscale"])
        tail_ops[keep] = OPS["identity"]
        tail_params[keep] = 0.0
        tail_params[..., 2][tail_ops == OPS["contrast"]] = 1.0
        return PhotometricTable(ops, params)


# ---------------------------------------------------------------------------------------------------------------
# helpers shared by the kernels

def _bound(x):
    return 1.0 if x.is_floating_point() else 255.0


def _cdtype(x):
    """The dtype torchvision computes in: the image's own float dtype, float32 for uint8."""
    return x.dtype if x.is_floating_point() else torch.float32


def _col(t):
    return t.view(-1, 1, 1, 1)


_HALF = (torch.float16, torch.bfloat16)


def _fma(a, b, alpha):
    """a + alpha * b rounded once: torchvision's ``a.add_(b, alpha=...)`` with a per-sample alpha [B] (a
    half-precision sum is computed in float32, as ATen's kernel does)."""
    if a.dtype in _HALF:
        return torch.addcmul(a.float(), b.float(), _col(alpha.float())).to(a.dtype)
    return torch.addcmul(a, b, _col(alpha))


def _times(x, factor):
    """x * factor [B] in the computation dtype, as torchvision's ``x.mul(factor)`` with a Python float: a
    half-precision image times the float32 factor, rounded once (not times the factor rounded to half first)."""
    dt = _cdtype(x)
    if dt in _HALF:
        return (x.float() * _col(factor.float())).to(dt)
    return x.to(dt) * _col(factor.to(dt))


def _gray(x):
    """torchvision's luma in the computation dtype (unrounded), [B, 1, H, W]."""
    r, g, b = x.unbind(dim=-3)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(-3)


def _one_minus(ratio, one_minus=None):
    """A blend's 1 - ratio: ``one_minus`` where the caller has it more exactly than ratio (a table's p1)."""
    return (1.0 - ratio) if one_minus is None else one_minus


def _blend(x, other, ratio, one_minus=None):
    """torchvision's _blend: x * ratio + other * (1 - ratio), clamped, truncated to uint8 for uint8 images.
    ``one_minus``: 1 - ratio where the caller has it more exactly than ratio (a table's p1), else computed."""
    dt = _cdtype(x)
    out = _fma(_times(x, ratio), other, _one_minus(ratio, one_minus).to(dt)).clamp_(0, _bound(x))
    return out.to(x.dtype)


def _invert(x):
    return 1.0 - x if x.is_floating_point() else x.bitwise_not()


def _to_uint8(x):
    """torchvision's float -> uint8 scaling (to_dtype_image): x * 255.999, truncated."""
    return x if x.dtype == torch.uint8 else x.mul(255.0 + 1.0 - 1e-3).to(torch.uint8)


def _from_uint8(x, dtype):
    return x if dtype == torch.uint8 else x.to(dtype).mul_(1.0 / 255)


def _layout(x):
    """The memory format of an op's output: channels_last where x keeps its channels innermost (a channels_last
    batch, or HWC images permuted to NCHW), else contiguous. One rule for the kernels and their fakes, since
    torch.compile's generated code checks every output's strides against the fake's."""
    return torch.channels_last if x.shape[1] > 1 and x.stride(1) == 1 else torch.contiguous_format


def _empty(x, channels=None):
    shape = (x.shape[0], x.shape[1] if channels is None else channels) + tuple(x.shape[2:])
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=_layout(x))


def _same(x, *args):
    return _empty(x)


def _op(name, fake=_same):
    """Register ``fn`` as the custom op fastload::<name> (one implementation for every device) with a fake kernel.
    The output is laid out by ``_layout``, whatever strides fn's torch ops left (a copy where they differ)."""
    def wrap(fn):
        @functools.wraps(fn)
        def laid_out(x, *args, **kwargs):
            out = fn(x, *args, **kwargs)
            layout = _layout(x)
            if out.stride() == torch.empty(out.shape, device="meta", memory_format=layout).stride():
                return out
            return torch.empty_like(out, memory_format=layout).copy_(out)
        op = torch.library.custom_op(f"fastload::{name}", mutates_args=())(laid_out)
        op.register_fake(fake)
        return op
    return wrap


# ---------------------------------------------------------------------------------------------------------------
# the kernels (custom ops): x [B, C, H, W]; per-sample parameters already on x's device. Outputs never alias x.

@_op("adjust_brightness")
def _brightness(x: Tensor, factor: Tensor) -> Tensor:
    dt = _cdtype(x)
    return _times(x, factor).clamp_(0, _bound(x)).to(x.dtype)


@_op("adjust_contrast")
def _contrast(x: Tensor, factor: Tensor, one_minus: Optional[Tensor] = None,
              one_channel: Optional[Tensor] = None) -> Tensor:
    """one_channel: bool [B], samples whose three channels carry one grey image (after Grayscale(1)): blended
    with the mean of channel 0, as torchvision blends that one-channel image."""
    fp = x.is_floating_point()
    if x.shape[-3] == 3:
        gray = _gray(x)
        if not fp:
            gray = gray.floor_()
    else:
        gray = x.to(_cdtype(x))
    mean = gray.mean(dim=(-3, -2, -1), keepdim=True)
    if one_channel is not None and x.shape[-3] == 3:
        own = x[:, :1].to(_cdtype(x)).mean(dim=(-3, -2, -1), keepdim=True)
        mean = torch.where(one_channel.view(-1, 1, 1, 1), own, mean)
    return _blend(x, mean, factor, one_minus)


@_op("adjust_saturation")
def _saturation(x: Tensor, factor: Tensor, one_minus: Optional[Tensor] = None) -> Tensor:
    if x.shape[-3] == 1:  # torchvision (and PIL): a grayscale image is returned as is
        return x.clone()
    gray = _gray(x)
    if not x.is_floating_point():
        gray = gray.floor_()
    return _blend(x, gray, factor, one_minus)


@_op("adjust_sharpness")
def _sharpness(x: Tensor, factor: Tensor, one_minus: Optional[Tensor] = None) -> Tensor:
    c, h, w = x.shape[-3:]
    if x.numel() == 0 or h <= 2 or w <= 2:
        return x.clone()
    fp = x.is_floating_point()
    dt = _cdtype(x)
    out = x.to(dt, copy=True).contiguous()
    if fp:  # torchvision's normalised kernel: 1/13 around, 5/13 in the middle
        k = torch.full((3, 3), 1.0 / 13.0, dtype=dt, device=x.device)
        k[1, 1] = 5.0 / 13.0
        blurred = conv2d(out, k.expand(c, 1, 3, 3), groups=c)
    else:
        # torchvision rounds conv(x, kernel / 13) to an integer. Its exact value is k / 13 with k an integer, never
        # closer than 1/26 to a rounding tie, so round(k / 13) with k from an integer kernel (exact in float32 on
        # any conv algorithm, TF32 included) is what torchvision's float conv rounds to, on every device.
        k = torch.ones((3, 3), dtype=dt, device=x.device)
        k[1, 1] = 5.0
        blurred = conv2d(out, k.expand(c, 1, 3, 3), groups=c).div_(13.0).round_()
    inner = out[..., 1:-1, 1:-1]
    inner.copy_(_fma(inner, blurred.sub_(inner), _one_minus(factor, one_minus).to(dt)))
    return out.clamp_(0, _bound(x)).to(x.dtype)


def _rgb_to_hsv(image):
    """torchvision's _rgb_to_hsv, op for op (float32 [B, 3, H, W] -> h, s, v)."""
    r, g, _ = image.unbind(dim=-3)
    minc, maxc = torch.aminmax(image, dim=-3)
    eqc = maxc == minc
    channels_range = maxc - minc
    ones = torch.ones_like(maxc)
    s = channels_range / torch.where(eqc, ones, maxc)
    channels_range_divisor = torch.where(eqc, ones, channels_range).unsqueeze_(dim=-3)
    rc, gc, bc = ((maxc.unsqueeze(dim=-3) - image) / channels_range_divisor).unbind(dim=-3)
    mask_maxc_neq_r = maxc != r
    mask_maxc_eq_g = maxc == g
    hg = rc.add(2.0).sub_(bc).mul_(mask_maxc_eq_g & mask_maxc_neq_r)
    hr = bc.sub_(gc).mul_(~mask_maxc_neq_r)
    hb = gc.add_(4.0).sub_(rc).mul_(mask_maxc_neq_r.logical_and_(mask_maxc_eq_g.logical_not_()))
    h = hr.add_(hg).add_(hb)
    h = h.mul_(1.0 / 6.0).add_(1.0).fmod_(1.0)
    return h, s, maxc


# For sector i = floor(6 h) mod 6, which of (v, p, q, t) each of r, g, b takes (torchvision's table).
_HSV_SELECT = ((0, 2, 1, 1, 3, 0), (3, 0, 0, 2, 1, 1), (1, 1, 3, 0, 0, 2))


def _hsv_to_rgb(h, s, v):
    """torchvision's _hsv_to_rgb, op for op."""
    h6 = h.mul(6)
    i = torch.floor(h6)
    f = h6.sub_(i)
    i = i.to(dtype=torch.int32)
    sxf = s * f
    one_minus_s = 1.0 - s
    q = (1.0 - sxf).mul_(v).clamp_(0.0, 1.0)
    t = sxf.add_(one_minus_s).mul_(v).clamp_(0.0, 1.0)
    p = one_minus_s.mul_(v).clamp_(0.0, 1.0)
    i.remainder_(6)
    vpqt = torch.stack((v, p, q, t), dim=-3)
    select = torch.tensor(_HSV_SELECT, dtype=torch.long).to(device=h.device, non_blocking=True)
    select = select[:, i].moveaxis(0, -3)
    return vpqt.gather(-3, select)


@_op("adjust_hue")
def _hue(x: Tensor, factor: Tensor) -> Tensor:
    if x.shape[-3] == 1 or x.numel() == 0:
        return x.clone()
    image = x.to(torch.float32).mul_(1.0 / 255) if x.dtype == torch.uint8 else x.to(torch.float32)
    h, s, v = _rgb_to_hsv(image)
    h = h.add_(factor.to(torch.float32).view(-1, 1, 1)).remainder_(1.0)
    rgb = _hsv_to_rgb(h, s, v)
    return _to_uint8(rgb) if x.dtype == torch.uint8 else rgb.to(x.dtype)


@_op("posterize")
def _posterize(x: Tensor, bits: Tensor) -> Tensor:
    bits = _col(bits.long())
    if x.is_floating_point():
        levels = (1 << bits).to(x.dtype)
        return torch.minimum(x.mul(levels).floor_().clamp_(min=0), levels - 1).mul_(1.0 / levels)
    mask = ((1 << bits) - 1) << (8 - bits)  # bits = 8: 255, bits = 0: 0
    return x & mask.to(torch.uint8)


@_op("solarize")
def _solarize(x: Tensor, threshold: Tensor) -> Tensor:
    return torch.where(x >= _col(threshold.to(_cdtype(x))), _invert(x), x)


@_op("autocontrast")
def _autocontrast(x: Tensor) -> Tensor:
    if x.numel() == 0:  # no pixels: no range to take (amin of nothing raises); torchvision returns it as it is
        return x.clone(memory_format=torch.contiguous_format)
    bound = _bound(x)
    image = x.to(_cdtype(x))
    minimum = image.amin(dim=(-2, -1), keepdim=True)
    maximum = image.amax(dim=(-2, -1), keepdim=True)
    flat = maximum == minimum  # a constant channel is left as it is
    inv_scale = torch.where(flat, 1.0, (maximum - minimum).mul_(1.0 / bound))
    minimum = torch.where(flat, 0.0, minimum)
    return (image - minimum).div_(inv_scale).clamp_(0, bound).to(x.dtype)


@_op("equalize")
def _equalize(x: Tensor) -> Tensor:
    """torchvision's (PIL's) histogram equalisation, per sample and channel: histograms [B, C, 256] by scatter_add."""
    image = _to_uint8(x)
    flat = image.flatten(start_dim=-2).long()  # [B, C, H*W]
    hist = torch.zeros(image.shape[:-2] + (256,), dtype=torch.int32, device=x.device)
    hist.scatter_add_(-1, flat, torch.ones(1, dtype=torch.int32, device=x.device).expand_as(flat))
    cum = hist.cumsum(dim=-1)
    # PIL's step: pixels that are not of the channel's largest value (first maximum of the cumulative histogram), / 255
    top = cum.argmax(dim=-1, keepdim=True)
    step = (flat.shape[-1] - hist.gather(-1, top)).div(255, rounding_mode="floor")
    lut = (cum[..., :-1] + step // 2).div(step.clamp(min=1), rounding_mode="floor").clamp_(0, 255).to(torch.uint8)
    lut = torch.cat([lut.new_zeros(lut.shape[:-1] + (1,)), lut], dim=-1)
    equalized = lut.gather(-1, flat).view_as(image)
    keep = (step == 0).unsqueeze(-1)  # [B, C, 1, 1]: a channel with step 0 is left as it is
    return _from_uint8(torch.where(keep, image, equalized), x.dtype)


@_op("invert")
def _invert_op(x: Tensor) -> Tensor:
    return _invert(x)


def _grayscale_fake(x, num_output_channels):
    return _empty(x, num_output_channels)


@_op("rgb_to_grayscale", fake=_grayscale_fake)
def _grayscale(x: Tensor, num_output_channels: int) -> Tensor:
    if x.shape[-3] == 1:
        return x.repeat(1, num_output_channels, 1, 1)
    gray = _gray(x).to(x.dtype)
    return gray.expand(-1, num_output_channels, -1, -1).contiguous()


def _kernel1d(size, sigma, dtype):
    """torchvision's _get_gaussian_kernel1d for each sample's sigma [B] -> [B, size]."""
    lim = (size - 1) / (2.0 * math.sqrt(2.0))
    t = torch.linspace(-lim, lim, steps=size, dtype=dtype, device=sigma.device)
    return torch.softmax(t.div(sigma.to(dtype).unsqueeze(-1)).pow(2).neg(), dim=-1)


@_op("gaussian_blur")
def _gaussian_blur(x: Tensor, kx: int, ky: int, sigma: Tensor) -> Tensor:
    """Reflect padding as torchvision, then the separable blur: one grouped conv per axis, a (sample, channel)
    pair per group, each with its sample's 1-D kernel (torchvision convolves with their outer product)."""
    b, c, h, w = x.shape
    if x.numel() == 0:
        return x.clone()
    dt = _cdtype(x)
    wx = _kernel1d(kx, sigma[:, 0], dt).repeat_interleave(c, dim=0)  # [B*C, kx]
    wy = _kernel1d(ky, sigma[:, 1], dt).repeat_interleave(c, dim=0)
    out = pad(x.to(dt), [kx // 2, kx // 2, ky // 2, ky // 2], mode="reflect")
    out = out.reshape(1, b * c, h + ky - 1, w + kx - 1)
    out = conv2d(out, wx.view(b * c, 1, 1, kx), groups=b * c)
    out = conv2d(out, wy.view(b * c, 1, ky, 1), groups=b * c).view(b, c, h, w)
    return out if x.is_floating_point() else out.round_().to(x.dtype)


# ---------------------------------------------------------------------------------------------------------------
# public functions: validation (torchvision's messages and exception types, naming the sample) and parameters

def _check_image(x, name, channels=(1, 3)):
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: the image must be a tensor [B, C, H, W], got {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(f"{name}: the image must be a batch [B, C, H, W], got shape {tuple(x.shape)}")
    if not (x.dtype == torch.uint8 or x.is_floating_point()):
        raise TypeError(f"{name}: the image must be uint8 (0-255) or floating (0-1), got {x.dtype}")
    if channels is not None and x.shape[1] not in channels:
        raise TypeError(f"Input image tensor permitted channel values are {list(channels)}, but found {x.shape[1]}")


def _param(x, value, name, check=None, dtype=torch.float64):
    """A number or a tensor [B] -> a tensor [B] of ``dtype`` on x's device. ``check(v) -> (ok, (exception,
    message))`` (one of the checks below) runs on a number always (a constant under torch.compile too) and on a CPU
    tensor's values outside torch.compile; a tensor on the GPU is trusted (checking it would synchronise)."""
    b = x.shape[0]
    if isinstance(value, Tensor):
        if value.shape not in ((b,), ()):
            raise ValueError(f"{name} must be a number or a tensor [B] = [{b}], got shape {tuple(value.shape)}")
        host = value.detach().expand(b).double().numpy() if value.device.type == "cpu" and b > 0 \
            and not torch.compiler.is_compiling() else None
        out = value.to(device=x.device, dtype=dtype, non_blocking=True).expand(b)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        host = value
        out = torch.full((b,), value, dtype=dtype, device=x.device)
    else:
        raise TypeError(f"{name} must be a number or a tensor [B], got {type(value).__name__}")
    if check is not None and host is not None:
        ok, (exc, message) = check(host)
        if isinstance(host, np.ndarray):
            bad = np.flatnonzero(~ok)
            if bad.size:
                i = int(bad[0])
                where = f"{name}[{i}]" if value.ndim else name
                raise exc(message.format(name=where, v=float(host[i])))
        elif not ok:
            raise exc(message.format(name=name, v=float(host)))
    return out.contiguous()


# The parameter checks: (ok, (exception, message)) for a number or a numpy array of them (then ok is elementwise),
# written with operators that mean the same on both, so torch.compile checks a number as it traces (a symbolic
# float there: `not` and comparisons only, no `== False` on its result).
def _not(b):
    return ~b if isinstance(b, np.ndarray) else not b


def _non_negative(v):
    return _not(v < 0), (ValueError, "{name} ({v}) is not non-negative.")  # NaN passes, as in torchvision


def _hue_range(v):
    return (v >= -0.5) & (v <= 0.5), (ValueError, "{name} ({v}) is not in [-0.5, 0.5].")


def _bits_range(v):
    return (v >= 0) & (v <= 8) & (v % 1 == 0), \
        (TypeError, "{name} must be a positive integer in the range [0, 8], got {v} instead.")


def _at_most(bound):
    def check(v):
        return _not(v > bound), (TypeError, "Threshold should be less or equal the maximum value of the dtype, but "
                                            "got {v} ({name})")
    return check


def _factor_op(op, name, x, factor):
    _check_image(x, name.split("_factor")[0])
    return op(x, _param(x, factor, name, _non_negative))


def adjust_brightness(inpt, brightness_factor):
    """inpt * factor, clamped (torchvision's adjust_brightness per sample)."""
    return _factor_op(_brightness, "brightness_factor", inpt, brightness_factor)


def adjust_contrast(inpt, contrast_factor):
    """Blend with the sample's mean luma (torchvision's adjust_contrast per sample)."""
    return _factor_op(_contrast, "contrast_factor", inpt, contrast_factor)


def adjust_saturation(inpt, saturation_factor):
    """Blend with the sample's luma image (torchvision's adjust_saturation per sample)."""
    return _factor_op(_saturation, "saturation_factor", inpt, saturation_factor)


def adjust_sharpness(inpt, sharpness_factor):
    """Blend with a 3x3 smoothing of the inside, borders kept (torchvision's adjust_sharpness per sample)."""
    return _factor_op(_sharpness, "sharpness_factor", inpt, sharpness_factor)


def adjust_hue(inpt, hue_factor):
    """Rotate the hue by hue_factor turns in [-0.5, 0.5] through HSV in float32 (torchvision's adjust_hue)."""
    _check_image(inpt, "adjust_hue")
    return _hue(inpt, _param(inpt, hue_factor, "hue_factor", _hue_range))


def posterize(inpt, bits):
    """Keep the top ``bits`` (0-8) bits of each value (torchvision's posterize per sample)."""
    _check_image(inpt, "posterize", channels=None)
    if isinstance(bits, numbers.Real) and not isinstance(bits, numbers.Integral):  # torchvision: int bits only
        raise TypeError(f"bits must be a positive integer in the range [0, 8], got {bits} instead.")
    if isinstance(bits, Tensor) and bits.is_floating_point() and bits.device != torch.device("cpu"):
        raise TypeError("posterize: bits must be an integer tensor (or a CPU tensor, checked to hold integers)")
    return _posterize(inpt, _param(inpt, bits, "bits", _bits_range, dtype=torch.int64))


def solarize(inpt, threshold):
    """Invert the values >= threshold, on the image's scale: 0-255 for uint8, 0-1 for float (torchvision's)."""
    _check_image(inpt, "solarize", channels=None)
    return _solarize(inpt, _param(inpt, threshold, "threshold", _at_most(_bound(inpt))))


def autocontrast(inpt):
    """Stretch each sample's channels to the full range (torchvision's autocontrast)."""
    _check_image(inpt, "autocontrast")
    return _autocontrast(inpt)


def equalize(inpt):
    """Histogram equalisation of each sample's channels (torchvision's equalize, PIL's lookup table)."""
    _check_image(inpt, "equalize", channels=None)
    return _equalize(inpt)


def invert(inpt):
    """255 - inpt for uint8, 1 - inpt for float."""
    _check_image(inpt, "invert", channels=None)
    return _invert_op(inpt)


def rgb_to_grayscale(inpt, num_output_channels=1):
    """Luma 0.2989 R + 0.587 G + 0.114 B, truncated to uint8, in 1 or 3 channels (torchvision's rgb_to_grayscale)."""
    if isinstance(inpt, Tensor) and inpt.ndim == 4 and inpt.shape[1] not in (1, 3):  # torchvision's unbind: ValueError
        raise ValueError(f"rgb_to_grayscale: the image needs 1 or 3 channels, got {inpt.shape[1]}")
    _check_image(inpt, "rgb_to_grayscale")
    if num_output_channels not in (1, 3):
        raise ValueError(f"num_output_channels must be 1 or 3, got {num_output_channels}.")
    return _grayscale(inpt, num_output_channels)


def _kernel_size(kernel_size):
    if isinstance(kernel_size, numbers.Integral):
        kernel_size = (kernel_size, kernel_size)
    elif len(kernel_size) != 2:
        raise ValueError(f"If kernel_size is a sequence its length should be 2. Got {len(kernel_size)}")
    for k in kernel_size:
        if not isinstance(k, numbers.Integral) or isinstance(k, bool):  # torchvision's linspace raises it
            raise TypeError(f"kernel_size should hold ints, got {list(kernel_size)}")
        if k % 2 == 0 or k < 0:
            raise ValueError(f"kernel_size should have odd and positive integers. Got {kernel_size}")
    return int(kernel_size[0]), int(kernel_size[1])


def gaussian_blur(inpt, kernel_size, sigma=None):
    """torchvision's gaussian_blur with a kernel size (kx, ky) shared by the batch and a sigma per sample:
    a number, (sx, sy), a tensor [B] or [B, 2]; None: 0.15 * k + 0.35 per axis, as torchvision."""
    _check_image(inpt, "gaussian_blur", channels=None)
    kx, ky = _kernel_size(kernel_size)
    if sigma is None:
        sigma = (kx * 0.15 + 0.35, ky * 0.15 + 0.35)
    if isinstance(sigma, numbers.Real) and not isinstance(sigma, bool):
        sigma = (sigma, sigma)
    if isinstance(sigma, (list, tuple)):
        if len(sigma) == 1:
            sigma = (sigma[0], sigma[0])
        elif len(sigma) != 2:
            raise ValueError(f"If sigma is a sequence, its length should be 2. Got {len(sigma)}")
        if any(float(s) <= 0 for s in sigma):  # numbers: checked under torch.compile too (constants)
            raise ValueError(f"sigma should have positive values. Got {list(sigma)}")
        sigma = torch.tensor([float(s) for s in sigma], dtype=torch.float64).expand(inpt.shape[0], 2)
    elif isinstance(sigma, Tensor):
        if sigma.shape == (inpt.shape[0],) or sigma.ndim == 0:
            sigma = sigma.unsqueeze(-1).expand(inpt.shape[0], 2)
        elif sigma.shape != (inpt.shape[0], 2):
            raise ValueError(f"sigma must be a number, (sx, sy), or a tensor [B] or [B, 2] with B = {inpt.shape[0]}, "
                             f"got shape {tuple(sigma.shape)}")
    else:
        raise TypeError(f"sigma should be either float or sequence of floats. Got {type(sigma)}")
    if sigma.device.type == "cpu" and not torch.compiler.is_compiling() and sigma.numel():
        bad = (sigma <= 0).any(dim=1)
        if bad.any():
            i = int(bad.nonzero()[0])
            raise ValueError(f"sigma should have positive values. Got {sigma[i].tolist()} (sample {i})")
    sigma = sigma.to(device=inpt.device, dtype=torch.float64, non_blocking=True).contiguous()
    return _gaussian_blur(inpt, kx, ky, sigma)


# ---------------------------------------------------------------------------------------------------------------
# the table executor

# op code -> kernel(x [n, C, H, W], parameter rows p [n, 3] on x's device); 12 (gaussian_blur) is applied by
# apply_table itself, which also groups its samples by kernel size.
def _table_one_minus(p):
    """A blend slot's 1 - factor (float64 [N]): p1 where the table carries it, else 1 - p0 (CONTRACT.md)."""
    return torch.where(p[:, 1] != 0, p[:, 1].double(), 1.0 - p[:, 0].double())


_TABLE_OPS = {
    1: lambda x, p: _brightness(x, p[:, 0].double()),
    2: lambda x, p: _contrast(x, p[:, 0].double(), _table_one_minus(p), p[:, 2] != 0),
    3: lambda x, p: _saturation(x, p[:, 0].double(), _table_one_minus(p)),
    4: lambda x, p: _hue(x, p[:, 0].double()),
    5: lambda x, p: _sharpness(x, p[:, 0].double(), _table_one_minus(p)),
    6: lambda x, p: _posterize(x, p[:, 0].round().long()),
    7: lambda x, p: _solarize(x, p[:, 0].double()),
    8: lambda x, p: _autocontrast(x),
    9: lambda x, p: _equalize(x),
    10: lambda x, p: _invert_op(x),
    11: lambda x, p: _grayscale(x, x.shape[1]),  # keeps the batch's channel count
}


def apply_table(x, ops, params):
    """Run a PhotometricTable on the batch x [B, C, H, W]: slot s = 0..S-1 in order, each sample its own op.

    The table is on the host, so the samples are grouped by op code (and blur kernel size) there, without a
    device sync; each group is gathered with index_select, transformed and put back with index_copy_. The
    parameters are validated on the host as the public functions do. Returns a new tensor (x is not modified).
    """
    table = PhotometricTable(ops, params)
    b = x.shape[0]
    _check_image(x, "apply_table")
    if table.ops.device.type != "cpu" or table.params.device.type != "cpu":
        raise ValueError("apply_table: the PhotometricTable must be on the host (CPU tensors)")
    _check_table(table, x, "apply_table")

    groups = []  # (slot, code, kernel size or None, host sample indices)
    for s in range(table.ops.shape[1]):
        codes = table.ops[:, s]
        for code in codes.unique().tolist():
            if code == 0:
                continue
            idx = (codes == code).nonzero().squeeze(1)
            if code == 12:
                sizes = table.params[idx, s, :2].long()
                for size in sizes.unique(dim=0).tolist():
                    groups.append((s, code, _kernel_size(size), idx[(sizes == torch.tensor(size)).all(dim=1)]))
            else:
                groups.append((s, code, None, idx))
    if not groups:
        return x.clone()

    # One host -> device copy for all the indices and one for all the parameter rows.
    idx_all = torch.cat([g[3] for g in groups])
    rows_all = torch.cat([table.params[g[3], g[0]] for g in groups])
    if x.is_cuda:
        idx_all, rows_all = idx_all.pin_memory(), rows_all.pin_memory()
    idx_dev = idx_all.to(x.device, non_blocking=True).split([len(g[3]) for g in groups])
    rows_dev = rows_all.to(x.device, non_blocking=True).split([len(g[3]) for g in groups])

    out = x.clone()
    for (s, code, size, idx), i, p in zip(groups, idx_dev, rows_dev):
        whole = len(idx) == b
        sub = out if whole else out.index_select(0, i)
        y = _gaussian_blur(sub, *size, p[:, 2:3].double().expand(-1, 2).contiguous()) if code == 12 \
            else _TABLE_OPS[code](sub, p)
        if whole:
            out = y
        else:
            out.index_copy_(0, i, y)
    return out


def _check_table(table, x, name):
    """The table's shapes and op codes, then the public functions' checks of its parameters, on the whole host
    table at once, naming sample and slot. In numpy: the loader checks a table per batch in its producer threads,
    and every small torch call there would hand the GIL over and wait to get it back."""
    b = x.shape[0]
    if table.ops.ndim != 2 or table.ops.shape[0] != b or table.params.shape != table.ops.shape + (3,):
        raise ValueError(f"{name}: expected ops [B, S] and params [B, S, 3] with B = {b}, got "
                         f"{tuple(table.ops.shape)} and {tuple(table.params.shape)}")
    ops, params = table.ops.numpy(), table.params.numpy()
    bad = (ops < 0) | (ops >= len(OPS))
    if bad.any():
        i, s = _first(bad)
        raise ValueError(f"{name}: sample {i}, slot {s}: unknown op code {int(ops[i, s])}")
    _check_table_params(ops, params, x, name)


def _first(bad):
    """(sample, slot) of the first True in a bool [B, S] array."""
    return np.argwhere(bad)[0].tolist()


def _check_table_params(ops, params, x, name):
    p0 = params[..., 0].astype(np.float64)
    checks = {1: _non_negative, 2: _non_negative, 3: _non_negative, 5: _non_negative, 4: _hue_range, 6: _bits_range,
              7: _at_most(_bound(x))}
    grey = params[..., 2]  # contrast's p2: 1 after Grayscale(1) (PhotometricTable.on_one_channel), else 0
    bad = (ops == OPS["contrast"]) & (grey != 0) & (grey != 1)
    if bad.any():
        i, s = _first(bad)
        raise ValueError(f"{name}: sample {i}, slot {s}: contrast's p2 must be 0 (an RGB image) or 1 (a grey image "
                         f"in three equal channels), got {float(grey[i, s])}")
    names = {1: "brightness_factor", 2: "contrast_factor", 3: "saturation_factor", 4: "hue_factor", 5: "sharpness_factor",
             6: "bits", 7: "threshold"}
    for code, check in checks.items():
        ok, (exc, message) = check(p0)
        bad = ~ok & (ops == code)
        if bad.any():
            i, s = _first(bad)
            raise exc(f"{name}: sample {i}, slot {s}: " + message.format(name=names[code], v=float(p0[i, s])))
    blur = ops == 12
    if blur.any():
        size, sigma = params[..., :2], params[..., 2]
        bad = blur & ((size < 1) | (size % 2 != 1)).any(axis=-1)
        if bad.any():
            i, s = _first(bad)
            raise ValueError(f"{name}: sample {i}, slot {s}: kernel_size should have odd and positive "
                             f"integers. Got {params[i, s, :2].tolist()}")
        bad = blur & ~(sigma > 0)
        if bad.any():
            i, s = _first(bad)
            raise ValueError(f"{name}: sample {i}, slot {s}: sigma should have positive values. "
                             f"Got {float(sigma[i, s])}")


# ---------------------------------------------------------------------------------------------------------------
# the fused executor: torch.ops.fastload.photometric (fastload/native/augment*.{h,cpp,cu})

_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.uint8)


def photometric(x, table, *, mean=None, std=None, in_scale=1.0 / 255, out_dtype=torch.float32, channels_last=False,
                nearest=None):
    """Run a PhotometricTable on a uint8 batch x [B, 3, H, W] and write ``cast((v * in_scale - mean) / std)`` in
    ``out_dtype`` (NCHW, or channels_last): apply_table then ToDtype + Normalize in one native op.

    ``nearest`` (samples [N], matrices [N, 2, 3], fill[, slots]): slot ``slots[k]`` (a host list, non-decreasing;
    default all 0) reads sample ``samples[k]``'s input through its nearest map, as if ``ops.affine_nearest_`` had
    moved that slot's input first (fill outside), without writing x or a pass of its own: the stage's policy
    rotate/shear/translate, between the ops torchvision applies before and after them.

    Equal to ``apply_table`` followed by the pipeline's normalisation bit for bit, except gaussian_blur (its
    weights and sums in another order: within 1 level on uint8). A uint8 output holds the 0-255 pixels (no
    mean/std). A host table is checked as apply_table checks it and copied to x's device (pinned, non-blocking);
    a table already on x's CUDA device is trusted (a sample whose slot it cannot run is left unchanged there).
    """
    ops, params = table[0], table[1]
    _check_image(x, "photometric", channels=(3,))
    if x.dtype != torch.uint8:
        raise TypeError(f"photometric: x must be uint8 (0-255), got {x.dtype}")
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"photometric: out_dtype must be one of {list(_OUT_DTYPES)}, got {out_dtype}")
    if out_dtype == torch.uint8:
        if mean is not None or std is not None:
            raise ValueError("photometric: a uint8 output holds the 0-255 pixels; mean/std need a floating out_dtype")
        alpha, beta = _norm_params(3, None, None, 1.0, x.device)
    else:
        alpha, beta = _norm_params(3, mean, std, in_scale, x.device)
    if isinstance(table, CheckedTable):  # checked (and pinned for a GPU) where the loader made it
        if table.ops.shape[0] != x.shape[0] or table.size != tuple(x.shape[-2:]):
            raise ValueError(f"photometric: the table was checked for {table.ops.shape[0]} images of "
                             f"{table.size}, x is {tuple(x.shape)}")
    elif ops.device.type == "cpu" and params.device.type == "cpu":
        table = checked_table(PhotometricTable(ops, params), *x.shape[-2:], batch=x.shape[0], pin=x.is_cuda)
        ops, params = table.ops, table.params
    ops = ops.to(device=x.device, dtype=torch.int64, non_blocking=True).contiguous()
    params = params.to(device=x.device, dtype=torch.float32, non_blocking=True).contiguous()
    maps = {}
    if nearest is not None:
        samples, matrices, fill, *slots = nearest
        slots = slots[0] if slots and slots[0] is not None else [0] * len(samples)
        samples, matrices = nearest_maps(samples, matrices, x.shape[0], x.device, slots, ops.shape[1])
        maps = {"samples": samples, "matrices": matrices, "fill": fill_values(fill), "map_slots": [int(s) for s in slots]}
    return torch.ops.fastload.photometric(x.contiguous(), ops, params, alpha, beta, out_dtype, channels_last, **maps)


class CheckedTable(NamedTuple):
    """A PhotometricTable checked for a batch of ``ops.shape[0]`` images of ``size`` (H, W): int64 ops and float32
    params, contiguous, pinned when it goes to a GPU. ``photometric`` runs it without checking it again."""
    ops: Tensor
    params: Tensor
    size: tuple


def checked_table(table, height, width, *, batch=None, pin=False):
    """``table`` checked as apply_table checks it, for uint8 images of height x width (done once per batch where
    the loader makes it, in a producer thread, rather than in the training loop's thread)."""
    batch = table.ops.shape[0] if batch is None else batch
    shape = torch.empty((batch, 3, height, width), dtype=torch.uint8, device="meta")  # shape and dtype only
    _check_table(table, shape, "photometric")
    _check_blur_sizes(table, shape, "photometric")
    ops, params = table.ops.to(torch.int64).contiguous(), table.params.to(torch.float32).contiguous()
    if pin:
        ops, params = ops.pin_memory(), params.pin_memory()
    return CheckedTable(ops, params, (int(height), int(width)))


def _check_blur_sizes(table, x, name):
    """Reflect padding needs kernel_size // 2 < side: kx <= 2 W - 1 and ky <= 2 H - 1."""
    h, w = x.shape[-2:]
    params = table.params.numpy()
    size = params[..., :2]
    bad = (table.ops.numpy() == OPS["gaussian_blur"]) & ((size[..., 0] > 2 * w - 1) | (size[..., 1] > 2 * h - 1))
    if bad.any():
        i, s = _first(bad)
        raise ValueError(f"{name}: sample {i}, slot {s}: kernel_size {params[i, s, :2].tolist()} is too "
                         f"large for reflect padding of a {h}x{w} image (at most {2 * w - 1}, {2 * h - 1})")


@torch.library.register_fake("fastload::photometric")
def _photometric_fake(x, ops, params, alpha, beta, out_dtype, channels_last, samples=None, matrices=None, fill=(0.0,),
                      map_slots=()):
    out = x.new_empty(x.shape, dtype=out_dtype)
    return out.contiguous(memory_format=torch.channels_last) if channels_last else out
