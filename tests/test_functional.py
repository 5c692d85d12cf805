"""fastload.transforms.functional against torchvision.transforms.v2.functional, sample by sample, on real photos.

Each batched op gets a different parameter per sample (edge values included) and must equal torchvision's op
applied to each sample with that sample's parameter. uint8: exact everywhere except gaussian_blur (see its test);
float32: within 1e-5 (the ops replay torchvision's float operations, but a batched reduction or convolution may sum
in another order: float32 rounding of a sum of <= 5,120 terms in [0, 1] stays far below 1e-5).
"""
import glob

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image

import fastload.transforms.functional as F

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
DTYPES = [torch.uint8, torch.float32]


@pytest.fixture(scope="module")
def photos(imagenet_dir):
    """uint8 [6, 3, 64, 80]: six corpus JPEGs (from all four classes), decoded and resized to one size."""
    files = sorted(glob.glob(str(imagenet_dir / "class_*" / "*.jpg")))[::8][:6]
    assert len(files) == 6
    decoded = [torch.from_numpy(np.array(Image.open(f).convert("RGB"))).permute(2, 0, 1) for f in files]
    return torch.stack([TF.resize(image, [64, 80], antialias=True) for image in decoded])


@pytest.fixture(scope="module")
def flat_photos(photos):
    """The photos with the edge cases of the per-image statistics: sample 1 is constant (its own mean colour),
    sample 2 has a constant red channel, sample 3 is the luma of its photo (three equal channels)."""
    x = photos.clone()
    x[1] = photos[1].float().mean(dim=(1, 2), keepdim=True).round().to(torch.uint8)
    x[2, 0] = photos[2, 0].float().mean().round().to(torch.uint8)
    x[3] = TF.rgb_to_grayscale(photos[3], num_output_channels=3)
    return x


def _as(x, dtype, device):
    x = x.to(device)
    return x if dtype == torch.uint8 else TF.to_dtype(x, dtype, scale=True)


def _reference(tv_op, x, params=None, **kwargs):
    """torchvision's op, one sample at a time, each with its own parameter (a Python number, as users pass it)."""
    if params is None:
        return torch.stack([tv_op(x[i], **kwargs) for i in range(len(x))])
    return torch.stack([tv_op(x[i], p.item() if isinstance(p, torch.Tensor) else p, **kwargs)
                        for i, p in enumerate(params)])


def _assert_matches(out, ref, dtype):
    assert out.dtype == ref.dtype and out.shape == ref.shape and out.device == ref.device
    if dtype == torch.uint8:
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    else:
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


# Factors as float32 values, so that the planners' float32 tables and Python floats name the same numbers.
FACTORS = torch.tensor([0.0, 0.5, 1.0, 1.37, 2.0, 0.8137], dtype=torch.float32)
FACTOR_OPS = [(F.adjust_brightness, TF.adjust_brightness), (F.adjust_contrast, TF.adjust_contrast),
              (F.adjust_saturation, TF.adjust_saturation), (F.adjust_sharpness, TF.adjust_sharpness)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ops", FACTOR_OPS, ids=lambda o: o[0].__name__)
def test_factor_ops_match_torchvision(photos, flat_photos, ops, dtype, device):
    op, tv_op = ops
    for images in (photos, flat_photos):
        x = _as(images, dtype, device)
        _assert_matches(op(x, FACTORS), _reference(tv_op, x, FACTORS), dtype)
        _assert_matches(op(x, FACTORS.to(device)), _reference(tv_op, x, FACTORS), dtype)  # already on x's device
    gray = _as(TF.rgb_to_grayscale(photos), dtype, device)  # one channel, where torchvision takes it too
    _assert_matches(op(gray, FACTORS), _reference(tv_op, gray, FACTORS), dtype)
    # a number is shared by the batch
    x = _as(photos, dtype, device)
    _assert_matches(op(x, 1.37), _reference(tv_op, x, [1.37] * len(x)), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_hue_matches_torchvision(photos, flat_photos, dtype, device):
    """Exact on uint8 as well: the op runs torchvision's HSV round trip in float32 operation by operation, the hue
    shift only becomes a per-sample tensor add (the same float32 rounding as its scalar add). The bound would be one
    level if the order of the float32 operations changed; the test holds it at zero."""
    hues = torch.tensor([-0.5, -0.25, 0.0, 0.1, 0.3337, 0.5])
    for images in (photos, flat_photos):
        x = _as(images, dtype, device)
        _assert_matches(F.adjust_hue(x, hues), _reference(TF.adjust_hue, x, hues), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_posterize_matches_torchvision(photos, dtype, device):
    x = _as(photos, dtype, device)
    for bits in ([0, 1, 2, 3, 4, 5], [6, 7, 8, 0, 8, 1]):
        ref = _reference(TF.posterize, x, bits)
        torch.testing.assert_close(F.posterize(x, torch.tensor(bits)), ref, rtol=0, atol=0)
    torch.testing.assert_close(F.posterize(x, 3), _reference(TF.posterize, x, [3] * 6), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_solarize_matches_torchvision(photos, dtype, device):
    """The threshold is on the image's own scale: 0-255 for uint8, 0-1 for float."""
    x = _as(photos, dtype, device)
    scale = 255.0 if dtype == torch.uint8 else 1.0
    thresholds = torch.tensor([0.0, 1.0, 127.5, 128.0, 254.0, 255.0], dtype=torch.float64) * (scale / 255)
    ref = _reference(TF.solarize, x, thresholds)
    torch.testing.assert_close(F.solarize(x, thresholds), ref, rtol=0, atol=0)
    assert not torch.equal(ref[3], x[3]) and torch.equal(ref[0], TF.invert(x[0]))  # the thresholds do something


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["autocontrast", "equalize", "invert"])
def test_statistics_ops_match_torchvision(photos, flat_photos, name, dtype, device):
    """Per-sample, per-channel statistics (min/max, histogram), constant images and channels included."""
    op, tv_op = getattr(F, name), getattr(TF, name)
    for images in (photos, flat_photos):
        x = _as(images, dtype, device)
        out, ref = op(x), _reference(tv_op, x)
        torch.testing.assert_close(out, ref, rtol=0, atol=0 if dtype == torch.uint8 else 1e-6)
        assert not torch.equal(out, x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels", [1, 3])
def test_grayscale_matches_torchvision(photos, channels, dtype, device):
    x = _as(photos, dtype, device)
    out = F.rgb_to_grayscale(x, num_output_channels=channels)
    torch.testing.assert_close(out, _reference(TF.rgb_to_grayscale, x, num_output_channels=channels),
                               rtol=0, atol=0)
    one = out[:, :1]  # a one-channel batch is copied or repeated, as torchvision does
    torch.testing.assert_close(F.rgb_to_grayscale(one, channels), _reference(TF.rgb_to_grayscale, one,
                                                                              num_output_channels=channels))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel_size, sigma", [
    ((5, 7), torch.tensor([0.3, 0.8, 1.0, 1.5, 2.0, 3.0])),
    (3, torch.tensor([[0.5, 2.0], [1.0, 1.0], [2.0, 0.5], [0.1, 0.1], [1.3, 0.7], [4.0, 4.0]])),
    ((9, 1), None),
    (11, 1.7),
    ((3, 5), (0.6, 1.9)),
])
def test_gaussian_blur_matches_torchvision(photos, kernel_size, sigma, dtype, device):
    """Separable per-sample blur against torchvision's 2-D kernel (the outer product of the same 1-D kernels).
    Both are float32 sums of the same products in another order (k + k terms vs k * k terms), so they differ by a
    few float32 ulps (float: << 1e-5); uint8 rounds those sums, and a sum within a few ulps of a .5 tie may round
    the other way: at most one level, on at most 0.1% of the values (none on these photos so far)."""
    x = _as(photos, dtype, device)
    out = F.gaussian_blur(x, kernel_size, sigma)
    if sigma is None or isinstance(sigma, (float, tuple)):
        ref = torch.stack([TF.gaussian_blur(x[i], kernel_size, sigma) for i in range(len(x))])
    else:
        per_sample = sigma.tolist() if sigma.ndim == 2 else [[s, s] for s in sigma.tolist()]
        ref = torch.stack([TF.gaussian_blur(x[i], kernel_size, per_sample[i]) for i in range(len(x))])
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert_within_blur_bound(out, ref, dtype)
    assert not torch.equal(out, x)


def assert_within_blur_bound(out, ref, dtype):
    """The blur's bound: separable sums in another order than torchvision's 2-D kernel move a uint8 value by at
    most one level, on at most 0.1% of values; float32 within its rounding (1e-5)."""
    if dtype == torch.uint8:
        diff = (out.int() - ref.int()).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() <= 1e-3
    else:
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


def _random_table(batch, dtype, generator):
    """A table that uses every op code (including whole-batch slots and two blur kernel sizes in one slot),
    with valid random parameters."""
    codes = torch.arange(24) % 13
    ops = torch.cat([codes[torch.randperm(24, generator=generator)].view(batch, 4),
                     torch.full((batch, 1), F.OPS["brightness"]),  # one op for the whole batch
                     torch.full((batch, 1), F.OPS["gaussian_blur"])], dim=1)
    u = torch.rand(ops.shape + (3,), generator=generator, dtype=torch.float64)
    p = u * 2  # factors in [0, 2)
    hue, post, sol, blur = (ops == F.OPS[k] for k in ("hue", "posterize", "solarize", "gaussian_blur"))
    p[hue] = u[hue] - 0.5
    p[post] = (u[post] * 9).floor()
    p[sol] = u[sol] * (255.0 if dtype == torch.uint8 else 1.0)
    p[blur] = torch.stack([(u[blur][:, 0] * 4).floor() * 2 + 1, (u[blur][:, 1] * 4).floor() * 2 + 1,
                           0.1 + u[blur][:, 2] * 2], dim=1)
    blend = (ops == F.OPS["contrast"]) | (ops == F.OPS["saturation"]) | (ops == F.OPS["sharpness"])
    p[..., 1] = torch.where(blend, 0.0, p[..., 1])  # a blend's p1 = 0: 1 - p0 (CONTRACT.md)
    p[..., 2] = torch.where(blend, 0.0, p[..., 2])  # contrast's p2 = 1: the image is grey (test_photometric_op)
    return F.PhotometricTable(ops, p.float())


_TV = {1: TF.adjust_brightness, 2: TF.adjust_contrast, 3: TF.adjust_saturation, 4: TF.adjust_hue,
       5: TF.adjust_sharpness, 7: TF.solarize}


def _tv_table(image, ops, params):
    """One sample through torchvision, slot by slot, on its own channel count. A blend's factor is 1 - p1 where the
    table carries p1 (CONTRACT.md: the exact 1 - factor torchvision computes from its double factor), else p0."""
    for code, p in zip(ops.tolist(), params.tolist()):
        if code in (2, 3, 5) and p[1] != 0:
            image = _TV[code](image, 1.0 - p[1])
        elif code in _TV:
            image = _TV[code](image, p[0])
        elif code == 6:
            image = TF.posterize(image, int(round(p[0])))
        elif code == 8:
            image = TF.autocontrast(image)
        elif code == 9:
            image = TF.equalize(image)
        elif code == 10:
            image = TF.invert(image)
        elif code == 11:
            image = TF.rgb_to_grayscale(image, num_output_channels=image.shape[-3])
        elif code == 12:
            image = TF.gaussian_blur(image, [int(p[0]), int(p[1])], [p[2], p[2]])
    return image


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_apply_table_matches_sequential_torchvision(photos, seed, dtype, device):
    x = _as(photos, dtype, device)
    table = _random_table(len(x), dtype, torch.Generator().manual_seed(seed))
    assert set(table.ops.flatten().tolist()) == set(range(13))
    before = x.clone()
    out = F.apply_table(x, *table)
    ref = torch.stack([_tv_table(x[i], table.ops[i], table.params[i]) for i in range(len(x))])
    assert torch.equal(x, before)  # x is not modified
    assert out.dtype == ref.dtype and out.shape == ref.shape
    # The chain ends with a blur, so the blur's one-level rounding bound (test_gaussian_blur_matches_torchvision)
    # is the whole uint8 bound; float32: six ops, each within float32 rounding of torchvision's.
    assert_within_blur_bound(out, ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_apply_table_identity_and_grayscale_keeps_channels(photos, device):
    x = photos.to(device)
    ops = torch.zeros(6, 2, dtype=torch.int64)
    ops[::2, 1] = F.OPS["grayscale"]
    out = F.apply_table(x, ops, torch.zeros(6, 2, 3))
    assert out.shape == x.shape and torch.equal(out[1::2], x[1::2])
    assert torch.equal(out[::2], TF.rgb_to_grayscale(x[::2], num_output_channels=3))


def test_apply_table_refuses_bad_tables(photos):
    ops, params = torch.zeros(6, 2, dtype=torch.int64), torch.zeros(6, 2, 3)
    bad = ops.clone()
    bad[4, 1] = 13
    with pytest.raises(ValueError, match="sample 4, slot 1: unknown op code 13"):
        F.apply_table(photos, bad, params)
    bad = ops.clone()
    bad[2, 0] = F.OPS["brightness"]
    worse = params.clone()
    worse[2, 0, 0] = -0.5
    with pytest.raises(ValueError, match=r"sample 2, slot 0: brightness_factor \(-0.5\) is not non-negative"):
        F.apply_table(photos, bad, worse)
    bad[2, 0] = F.OPS["gaussian_blur"]
    worse[2, 0] = torch.tensor([4.0, 3.0, 1.0])
    with pytest.raises(ValueError, match="sample 2, slot 0: kernel_size should have odd"):
        F.apply_table(photos, bad, worse)
    bad[2, 0] = F.OPS["contrast"]
    worse[2, 0] = torch.tensor([1.5, 0.0, 0.5])
    with pytest.raises(ValueError, match="sample 2, slot 0: contrast's p2 must be 0 .* or 1"):
        F.apply_table(photos, bad, worse)
    with pytest.raises(ValueError, match=r"ops \[B, S\] and params \[B, S, 3\]"):
        F.apply_table(photos, ops[:5], params[:5])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_blends_round_as_torchvision(photos, flat_photos, dtype, device):
    """On float16 / bfloat16 images torchvision multiplies by the factor (a Python float) in float32 and rounds
    once: brightness equals it exactly (it rounded the factor to the half type first: one step off in a sixth of
    the values), contrast and saturation too on the CPU. Within one step of the type: sharpness (the 3x3 blur's
    own rounding) and, on CUDA, contrast and saturation (the grey image's rounding there: torch's CUDA kernels for
    torchvision's chain of scalar ops, measured on an H100). On the CPU contrast and saturation are exact where
    ATen's vectorised loop covers torchvision's plane; its scalar tail (a plane not a multiple of 32 values: the
    17x19 crop's last values) rounds torchvision's grey image differently, one step off there."""
    for images in (photos, flat_photos, photos[:, :, :17, :19]):
        ragged = images.shape[-2] * images.shape[-1] % 32 != 0
        exact = {F.adjust_brightness} | ({F.adjust_contrast, F.adjust_saturation}
                                         if device == "cpu" and not ragged else set())
        x = _as(images, dtype, device)
        for op, tv_op in FACTOR_OPS:
            out, ref = op(x, FACTORS), _reference(tv_op, x, FACTORS)
            if op not in exact:
                step = torch.finfo(dtype).eps  # one step of the type at 1.0, the largest value
                torch.testing.assert_close(out, ref, rtol=0, atol=step)
            else:
                assert torch.equal(out, ref), op.__name__


def test_images_without_pixels_pass_through_as_in_torchvision(photos):
    """An image of height or width 0 (or a batch of none): every op returns it, as torchvision does (autocontrast
    raised IndexError: the range of nothing)."""
    for empty in (photos[:, :, :0], photos[:, :, :, :0], photos[:0]):
        for op, tv_op in ((F.autocontrast, TF.autocontrast), (F.equalize, TF.equalize), (F.invert, TF.invert)):
            out = op(empty)
            assert out.shape == empty.shape and out.dtype == empty.dtype
            if len(empty):
                assert tv_op(empty[0]).shape == out[0].shape


@pytest.mark.parametrize("device", DEVICES)
def test_fma_matches_torch_add(photos, device):
    """What makes the blends exact: torchvision's ``a.add_(b, alpha=s)`` rounds a + s * b once (a fused
    multiply-add), and torch.addcmul with a per-sample alpha tensor, which the blends use, must do the same on this
    build. (Rounding twice differs from torchvision in about 0.2% of uint8 outputs.)"""
    a = photos.to(device).float().mul(0.8137)
    b = TF.rgb_to_grayscale(photos.to(device)).float().expand_as(a)
    for ratio in (0.3, 0.8137, 1.37, 1.9):
        alpha = torch.tensor(1.0 - ratio, device=device).float()
        assert torch.equal(torch.addcmul(a, b, alpha.expand(6).view(-1, 1, 1, 1)), a.clone().add_(b, alpha=1 - ratio))


@pytest.mark.parametrize("call, tv_call, match", [
    (lambda x: F.adjust_brightness(x, torch.tensor([1.0, 0.5, -0.1, 1.0, 1.0, 1.0])),
     lambda x: TF.adjust_brightness(x[2], -0.1), r"brightness_factor\[2\] \(-0.1"),
    (lambda x: F.adjust_contrast(x, -1), lambda x: TF.adjust_contrast(x[0], -1), "contrast_factor"),
    (lambda x: F.adjust_hue(x, torch.tensor([0.0, 0.0, 0.0, 0.6, 0.0, 0.0])),
     lambda x: TF.adjust_hue(x[3], 0.6), r"hue_factor\[3\] \(0.6"),
    (lambda x: F.posterize(x, torch.tensor([8, 9, 8, 8, 8, 8])), lambda x: TF.posterize(x[1], 9), r"bits\[1\]"),
    (lambda x: F.posterize(x, 3.0), lambda x: TF.posterize(x[0], 3.0), "bits must be"),
    (lambda x: F.posterize(x, float("nan")), lambda x: TF.posterize(x[0], float("nan")), "bits must be"),
    (lambda x: F.solarize(x, 256.0), lambda x: TF.solarize(x[0], 256.0), "Threshold"),
    (lambda x: F.gaussian_blur(x, 4), lambda x: TF.gaussian_blur(x[0], 4), "odd and positive"),
    (lambda x: F.gaussian_blur(x, 3, torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0])),
     lambda x: TF.gaussian_blur(x[0], 3, 0.0), r"positive values.*sample 4"),
    (lambda x: F.rgb_to_grayscale(x, 2), lambda x: TF.rgb_to_grayscale(x[0], 2), "1 or 3"),
    (lambda x: F.adjust_saturation(torch.cat([x, x[:, :1]], 1), 1.0),
     lambda x: TF.adjust_saturation(torch.cat([x, x[:, :1]], 1)[0], 1.0), "channel"),
    (lambda x: F.rgb_to_grayscale(torch.cat([x, x[:, :1]], 1)),
     lambda x: TF.rgb_to_grayscale(torch.cat([x, x[:, :1]], 1)[0]), "1 or 3 channels"),
    (lambda x: F.gaussian_blur(x, [3.0, 3]), lambda x: TF.gaussian_blur(x[0], [3.0, 3]), "ints"),
    (lambda x: F.gaussian_blur(x[:, :, :4, :4], 9), lambda x: TF.gaussian_blur(x[0, :, :4, :4], 9), "Padding size"),
])
def test_bad_arguments_raise_like_torchvision(photos, call, tv_call, match):
    with pytest.raises(Exception) as tv_error:
        tv_call(photos)
    with pytest.raises(tv_error.type, match=match):
        call(photos)


def test_keyword_arguments_have_torchvisions_names(photos):
    """Keyword calls move over from torchvision: the image is ``inpt``, the parameters keep their names."""
    x = photos[:2]
    for name, kwargs in (("adjust_brightness", dict(brightness_factor=1.3)), ("posterize", dict(bits=3)),
                         ("solarize", dict(threshold=100)), ("invert", {}), ("rgb_to_grayscale",
                                                                               dict(num_output_channels=3)),
                         ("gaussian_blur", dict(kernel_size=[3, 3], sigma=[1.0, 1.0]))):
        ours = getattr(F, name)(inpt=x, **kwargs)
        assert all(torch.equal(ours[i], getattr(TF, name)(inpt=x[i], **kwargs)) for i in range(2)), name


def test_bad_shapes_are_refused(photos):
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        F.invert(photos[0])
    with pytest.raises(ValueError, match=r"tensor \[B\] = \[6\]"):
        F.adjust_brightness(photos, torch.ones(5))
    with pytest.raises(TypeError, match="uint8"):
        F.invert(photos.int())


def _opcheck_cases(x):
    b = x.shape[0]
    f = torch.linspace(0, 2, b, dtype=torch.float64, device=x.device)
    return [
        (torch.ops.fastload.adjust_brightness, (x, f)), (torch.ops.fastload.adjust_contrast, (x, f)),
        (torch.ops.fastload.adjust_saturation, (x, f)), (torch.ops.fastload.adjust_sharpness, (x, f)),
        (torch.ops.fastload.adjust_hue, (x, f / 4 - 0.25)),
        (torch.ops.fastload.posterize, (x, torch.arange(b, device=x.device) % 9)),
        (torch.ops.fastload.solarize, (x, f * (64 if x.dtype == torch.uint8 else 0.25))),
        (torch.ops.fastload.autocontrast, (x,)), (torch.ops.fastload.equalize, (x,)),
        (torch.ops.fastload.invert, (x,)), (torch.ops.fastload.rgb_to_grayscale, (x, 1)),
        (torch.ops.fastload.rgb_to_grayscale, (x, 3)),
        (torch.ops.fastload.gaussian_blur, (x, 5, 3, (f + 0.5).unsqueeze(1).expand(b, 2).contiguous())),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(photos, dtype, device):
    """Schema, fake (meta) kernels and AOT dispatch of every custom op, so torch.compile can trace them."""
    x = _as(photos[:3, :, :16, :20], dtype, device)
    for op, args in _opcheck_cases(x):
        torch.library.opcheck(op, args)


def _laid_out(x, layout):
    """x [B, C, H, W] in another memory layout: a channels_last batch, HWC images permuted to NCHW (the same
    strides, reached another way), or every other column of a wider batch."""
    if layout == "channels_last":
        return x.contiguous(memory_format=torch.channels_last)
    if layout == "hwc_permuted":
        return x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    return torch.stack([x, x], dim=-1).flatten(-2)[..., ::2]  # each column twice, then every other one


@pytest.mark.parametrize("layout", ["channels_last", "hwc_permuted", "every_other_column"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck_on_other_layouts(photos, dtype, layout):
    """The fake kernels promise the strides the kernels return (torch.compile's generated code checks them: a
    channels_last batch failed there for eight of the ops), and the values do not depend on the layout."""
    x = _as(photos[:3, :, :16, :20], dtype, "cpu")
    for op, args in _opcheck_cases(_laid_out(x, layout)):
        torch.library.opcheck(op, args)
        torch.testing.assert_close(op(*args), op(x, *args[1:]), rtol=0, atol=0)


def test_compiles_with_inductor_on_channels_last(photos):
    """The default backend (inductor) on HWC images permuted to NCHW: the same values and strides as eager."""
    def chain(x):
        return F.invert(F.equalize(F.adjust_saturation(F.adjust_brightness(x, 1.3), 0.6)))

    x = _laid_out(photos[:3], "hwc_permuted")
    with torch._inductor.config.patch(fx_graph_cache=False):  # a graph cached with other fakes would be reused
        out = torch.compile(chain, fullgraph=True)(x)
    assert torch.equal(out, chain(x)) and out.stride() == chain(x).stride()


@pytest.mark.parametrize("call", [
    lambda x: F.adjust_brightness(x, -0.5), lambda x: F.adjust_hue(x, 3.0), lambda x: F.solarize(x, 300.0),
    lambda x: F.posterize(x, 9), lambda x: F.gaussian_blur(x, 3, -1.0), lambda x: F.gaussian_blur(x, 3, (1.0, 0.0)),
], ids=["brightness", "hue", "solarize", "posterize", "blur_sigma", "blur_sigma_pair"])
def test_numbers_are_checked_under_torch_compile(photos, call):
    """A number is a constant when traced, so its check runs there too (it was skipped under torch.compile:
    brightness -0.5 gave a black image, posterize(9) zeros, sigma -1 the blur of sigma 1)."""
    with pytest.raises((ValueError, TypeError)):
        call(photos[:2])
    torch._dynamo.reset()
    with pytest.raises((ValueError, TypeError)):  # a graph break at the raise, which then runs eagerly
        torch.compile(call, backend="aot_eager")(photos[:2])


def test_numbers_that_change_between_compiled_calls(photos):
    """A float argument that changes between calls is traced as a symbolic float: its check must still trace (an
    `== False` on the comparison raised InternalTorchDynamoError from the second value on), and still refuse."""
    for op, good, bad in [(F.adjust_brightness, (0.5, 0.7, 0.9), -0.5), (F.adjust_contrast, (0.5, 0.6), -1.0),
                          (F.solarize, (100.0, 120.0), 300.0)]:
        torch._dynamo.reset()
        compiled = torch.compile(op, backend="aot_eager")
        for value in good:
            assert torch.equal(compiled(photos[:2], value), op(photos[:2], value))
        with pytest.raises((ValueError, TypeError)):
            compiled(photos[:2], bad)


def test_compiles_fullgraph(photos):
    """The public functions trace into one graph (numbers become tensors, custom ops stay opaque)."""
    def chain(x, factors, bits):
        return F.equalize(F.posterize(F.adjust_contrast(F.adjust_brightness(x, factors), 0.7), bits))

    x, factors, bits = photos[:3], FACTORS[:3], torch.tensor([2, 5, 8])
    compiled = torch.compile(chain, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, factors, bits), chain(x, factors, bits), rtol=0, atol=0)


@pytest.mark.cuda
def test_cuda_matches_cpu_and_takes_host_parameters(photos):
    """Parameters on the host are moved to the batch's device; CUDA and CPU agree on the integer-exact ops."""
    x = photos.cuda()
    for name in ("adjust_brightness", "adjust_saturation", "adjust_sharpness", "adjust_contrast"):
        out = getattr(F, name)(x, FACTORS)
        assert out.is_cuda
        torch.testing.assert_close(out.cpu(), getattr(F, name)(photos, FACTORS), rtol=0, atol=0)
    torch.testing.assert_close(F.equalize(x).cpu(), F.equalize(photos), rtol=0, atol=0)
