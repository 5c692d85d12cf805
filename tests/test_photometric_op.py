"""torch.ops.fastload.photometric (fastload/native/augment*): a PhotometricTable and the output cast in one op.

On real photos (corpus JPEGs resized to several sizes, odd ones included) with random tables holding every op
code in several slots: the CPU op equals functional.apply_table followed by the pipeline's normalisation bit for
bit (gaussian_blur: within 1 level, see test_blur_within_one_level); the CUDA op equals the CPU op bit for bit.
"""
import glob

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image

import fastload.transforms.functional as F
from fastload import ops
from fastload.transforms.functional import OPS, PhotometricTable

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIZES = [(1, 1), (7, 5), (64, 80), (176, 176)]
OUT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.uint8]
BLUR = OPS["gaussian_blur"]


def _normalise(x, mean, std, in_scale, dtype):
    """The reference normalisation: uint8 -> dtype as ``(x * in_scale - mean) / std`` in one multiply-add per value
    (what ToDtype(scale=True) + Normalize compute, folded as the warp kernel folds them)."""
    c = x.shape[1]
    alpha, beta = ops._norm_params(c, mean, std, in_scale, x.device)
    return torch.addcmul(beta.view(1, c, 1, 1), x.to(torch.float32), alpha.view(1, c, 1, 1)).to(dtype)


@pytest.fixture(scope="module")
def decoded(imagenet_dir):
    """Eight corpus JPEGs from all four classes, decoded (uint8 [3, H, W] each)."""
    files = sorted(glob.glob(str(imagenet_dir / "class_*" / "*.jpg")))[::6][:8]
    assert len(files) == 8
    return [torch.from_numpy(np.array(Image.open(f).convert("RGB"))).permute(2, 0, 1).contiguous() for f in files]


def _batch(decoded, h, w):
    """The photos resized to h x w (a 1-pixel side: the corner of a 2-pixel resize, which torch's antialiased
    resize refuses); sample 1 made constant and sample 2 the luma of its photo (flat channels: autocontrast's and
    equalize's edge cases)."""
    x = torch.stack([TF.resize(d, [max(h, 2), max(w, 2)], antialias=True)[:, :h, :w] for d in decoded]).contiguous()
    x[1] = x[1].float().mean(dim=(1, 2), keepdim=True).round().to(torch.uint8)
    x[2] = TF.rgb_to_grayscale(x[2], num_output_channels=3)
    return x


def _table(n, slots, h, w, seed, codes=range(len(OPS))):
    """Every code of ``codes`` in every slot (a shuffled cycle per slot) with random parameters in range."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.tensor(list(codes), dtype=torch.int64)
    ops = torch.stack([codes[torch.randperm(len(codes), generator=g)].repeat(n // len(codes) + 1)[:n]
                       for _ in range(slots)], dim=1) if slots else torch.empty(n, 0, dtype=torch.int64)
    u = torch.rand(n, slots, 3, generator=g)
    params = torch.zeros(n, slots, 3)
    factor = (u[..., 0] * 2).where(u[..., 1] > 0.1, u[..., 1].round())  # some exact 0 and 1
    for name in ("brightness", "contrast", "saturation", "sharpness"):
        params[..., 0] = torch.where(ops == OPS[name], factor, params[..., 0])
    # contrast of a grey image carried in three channels (after Grayscale(1)): the mean of channel 0
    params[..., 2] = torch.where((ops == OPS["contrast"]) & (u[..., 2] < 0.5), 1.0, params[..., 2])
    params[..., 0] = torch.where(ops == OPS["hue"], u[..., 0] - 0.5, params[..., 0])
    params[..., 0] = torch.where(ops == OPS["posterize"], (u[..., 0] * 9).floor(), params[..., 0])
    params[..., 0] = torch.where(ops == OPS["solarize"], (u[..., 0] * 256).floor(), params[..., 0])
    kx = ((u[..., 0] * 5).floor() * 2 + 1).clamp(max=2 * w - 1)
    ky = ((u[..., 1] * 5).floor() * 2 + 1).clamp(max=2 * h - 1)
    blur = torch.stack([kx, ky, u[..., 2] * 2 + 0.1], dim=-1)
    params = torch.where((ops == BLUR).unsqueeze(-1), blur, params)
    return PhotometricTable(ops, params)


def _reference(x, table, out_dtype, channels_last):
    """apply_table, then the pipeline's ToDtype + Normalize (uint8: the pixels as they are)."""
    y = F.apply_table(x, *table)
    if out_dtype != torch.uint8:
        y = _normalise(y, MEAN, STD, 1.0 / 255, out_dtype)
    return y.contiguous(memory_format=torch.channels_last) if channels_last else y


def _run(x, table, out_dtype, channels_last=False):
    norm = {} if out_dtype == torch.uint8 else {"mean": MEAN, "std": STD}
    return F.photometric(x, table, out_dtype=out_dtype, channels_last=channels_last, **norm)


def _assert_equal(out, ref):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert out.is_contiguous(memory_format=torch.channels_last) == ref.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("size", SIZES + [(256, 257)], ids=str)  # 256 x 257: the largest exact luma sum (< 2^24)
def test_cpu_equals_apply_table(decoded, size):
    """Every op but gaussian_blur, three slots, on real photos: uint8 out equals apply_table exactly."""
    h, w = size
    x = _batch(decoded, h, w)
    for seed in range(4 if h * w < 10_000 else 1):
        table = _table(len(x), 3, h, w, seed, codes=range(BLUR))
        _assert_equal(_run(x, table, torch.uint8), _reference(x, table, torch.uint8, False))


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_cpu_cast_equals_pipeline(decoded, out_dtype, channels_last):
    """The output cast: the pipeline's addcmul normalisation and dtype, in either layout."""
    x = _batch(decoded, 33, 47)
    table = _table(len(x), 2, 33, 47, 7, codes=range(BLUR))
    _assert_equal(_run(x, table, out_dtype, channels_last), _reference(x, table, out_dtype, channels_last))


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_value_map_last_folds_into_the_cast(decoded, out_dtype, channels_last):
    """The CPU op folds a last slot that maps values through a table (brightness, contrast, posterize, solarize,
    autocontrast, equalize, invert) into the output cast; a slot of another kind before it and identity slots after
    it included, every map in every dtype and layout."""
    maps = ["brightness", "contrast", "posterize", "solarize", "autocontrast", "equalize", "invert"]
    value = {"brightness": 1.3, "contrast": 0.6, "posterize": 3, "solarize": 100, "saturation": 1.7, "hue": 0.2}
    rows = [(["saturation", "hue"][i % 2], maps[i % len(maps)], "identity") for i in range(8)]
    ops = torch.tensor([[OPS[name] for name in row] for row in rows], dtype=torch.int64)
    params = torch.zeros(8, 3, 3)
    params[..., 0] = torch.tensor([[value.get(name, 0.0) for name in row] for row in rows])
    x = _batch(decoded, 33, 47)
    table = PhotometricTable(ops, params)
    _assert_equal(_run(x, table, out_dtype, channels_last), _reference(x, table, out_dtype, channels_last))


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
def test_no_slots_is_the_cast(decoded, out_dtype):
    x = _batch(decoded, 64, 80)
    table = PhotometricTable(torch.zeros(len(x), 0, dtype=torch.int64), torch.zeros(len(x), 0, 3))
    _assert_equal(_run(x, table, out_dtype), _reference(x, table, out_dtype, False))


def test_blur_within_one_level(decoded):
    """gaussian_blur after other ops: within 1 level of apply_table. The weights (float64 exp here, float32
    softmax there) and the order of the sums differ, so a sum within float32 rounding of k + 0.5 may round the
    other way; such ties are rare on photos (measured: 7 of 743,424 values at 176 x 176)."""
    for h, w in [(7, 5), (64, 80), (176, 176)]:
        x = _batch(decoded, h, w)
        before = _table(len(x), 2, h, w, 11, codes=range(BLUR))
        blur = _table(len(x), 1, h, w, 12, codes=[BLUR])
        table = PhotometricTable(torch.cat([before.ops, blur.ops], 1), torch.cat([before.params, blur.params], 1))
        out, ref = _run(x, table, torch.uint8).int(), _reference(x, table, torch.uint8, False).int()
        diff = (out - ref).abs()
        assert diff.max() <= 1
        assert (diff > 0).float().mean() < 1e-3
        assert (out != F.apply_table(x, *before).int()).any()  # the blur did something


def _blur_weights(k, sigma):
    """augment.h's normalised float32 weights, step by step: exp_nonpositive from correctly rounded float64 steps
    (each fused multiply-add exact in Fractions, rounded once), the taps summed in order, each divided and rounded
    to float32, subnormals flushed."""
    from fractions import Fraction

    def dfma(a, b, c):
        return float(Fraction(a) * Fraction(b) + Fraction(c))

    def exp_nonpositive(x):
        if x < -104.0:
            return 0.0
        n = float(np.rint(x * 1.4426950408889634))
        r = dfma(-n, 6.93147180369123816490e-01, x)
        r = dfma(-n, 1.90821492927058770002e-10, r)
        p = 1.0 / 6227020800.0
        for f in (479001600.0, 39916800.0, 3628800.0, 362880.0, 40320.0, 5040.0, 720.0, 120.0, 24.0, 6.0, 2.0):
            p = dfma(p, r, 1.0 / f)
        return dfma(dfma(p, r, 1.0), r, 1.0) * 2.0 ** n

    s = float(np.float32(sigma))
    taps = [exp_nonpositive(-((float(i - k // 2) * float(i - k // 2)) / (2.0 * (s * s)))) for i in range(k)]
    total = 0.0
    for t in taps:
        total += t
    return [0.0 if w < 1.17549435e-38 else w for w in (float(np.float32(t / total)) for t in taps)]


def _defined_blur(x, kx, ky, sigma):
    """augment.h's blur by its definition, uint8 [B, C, H, W]: each pixel's taps summed i = 0..k-1 from 0 with
    float32 fused multiply-adds (blur_row's order; the product and sum exact in 64-bit long doubles, then rounded
    once to float32), reflected borders, rounded half to even."""
    def reflect(i, n):
        i = -i if i < 0 else i
        return 2 * (n - 1) - i if i >= n else i

    def fma_pass(planes, w, axis):
        n, r = planes.shape[axis], len(w) // 2
        padded = np.take(planes, [reflect(i - r, n) for i in range(n + 2 * r)], axis=axis)
        acc = np.zeros(planes.shape, np.longdouble)
        for i, wi in enumerate(w):
            acc = (np.longdouble(wi) * np.take(padded, range(i, i + n), axis=axis) + acc).astype(np.float32)
            acc = acc.astype(np.longdouble)
        return acc

    rows = fma_pass(x.numpy().astype(np.longdouble), _blur_weights(kx, sigma), 3)
    sums = fma_pass(rows, _blur_weights(ky, sigma), 2).astype(np.float64)
    return torch.from_numpy(np.clip(np.rint(sums), 0, 255).astype(np.uint8))


def test_cpu_blur_is_its_defined_sums_exactly(decoded):
    """The CPU blur equals its definition (_defined_blur) bit for bit: its passes may run across rows, but each
    pixel's sums must keep blur_row's order, which the CUDA kernels share (on a GPU test_cuda_equals_cpu checks the
    two against each other; this holds it on any machine). ~1.3M values: a change of summation order flips a few."""
    if np.finfo(np.longdouble).nmant < 63:
        pytest.skip("the definition needs long doubles of 64 bits or more (exact float32 products and sums)")
    for (h, w), (kx, ky, sigma) in [((176, 176), (5, 5, 1.1)), ((160, 224), (9, 3, 2.0)), ((224, 96), (3, 7, 0.6)),
                                    ((6, 4), (7, 3, 0.37)), ((11, 7), (1, 9, 2.0))]:
        x = _batch(decoded, h, w)
        table = PhotometricTable(torch.full((len(x), 1), BLUR),
                                 torch.tensor([[[kx, ky, sigma]]] * len(x), dtype=torch.float32))
        assert torch.equal(_run(x, table, torch.uint8), _defined_blur(x, kx, ky, sigma)), (h, w, kx, ky, sigma)


def test_sharpness_keeps_borders_and_small_images(decoded):
    for h, w in [(2, 9), (9, 2), (3, 3)]:
        x = _batch(decoded, h, w)
        table = PhotometricTable(torch.full((len(x), 1), OPS["sharpness"]), torch.full((len(x), 1, 3), 1.7))
        _assert_equal(_run(x, table, torch.uint8), _reference(x, table, torch.uint8, False))


def test_validation(decoded):
    x = _batch(decoded, 7, 5)
    one, zero = torch.ones(3), torch.zeros(3)
    op = torch.ops.fastload.photometric
    ops, params = torch.zeros(8, 2, dtype=torch.int64), torch.zeros(8, 2, 3)
    bad = ops.clone()
    bad[5, 1] = 13
    with pytest.raises(ValueError, match="sample 5, slot 1: unknown op code 13"):
        op(x, bad, params, one, zero, torch.float32, False)
    with pytest.raises(ValueError, match="sample 5, slot 1: unknown op code 13"):
        F.photometric(x, (bad, params))
    post = ops.clone()
    post[3, 0] = OPS["posterize"]
    p = params.clone()
    p[3, 0, 0] = 9
    with pytest.raises(ValueError, match="sample 3, slot 0: posterize bits"):
        op(x, post, p, one, zero, torch.float32, False)
    blur = ops.clone()
    blur[2, 1] = BLUR
    p = params.clone()
    p[2, 1] = torch.tensor([11.0, 3.0, 1.0])  # 11 > 2 * 5 - 1
    with pytest.raises(ValueError, match="sample 2, slot 1: gaussian_blur"):
        op(x, blur, p, one, zero, torch.float32, False)
    with pytest.raises(ValueError, match="sample 2, slot 1: kernel_size"):
        F.photometric(x, (blur, p))
    p[2, 1] = torch.tensor([3.0, 4.0, 1.0])
    with pytest.raises(ValueError, match="sample 2, slot 1: kernel_size should have odd"):
        F.photometric(x, (blur, p))
    with pytest.raises(RuntimeError, match="x must be uint8"):
        op(x.float(), ops, params, one, zero, torch.float32, False)
    with pytest.raises(RuntimeError, match=r"\[B, 3, H, W\]"):
        op(x[:, :1], ops, params, one, zero, torch.float32, False)
    with pytest.raises(RuntimeError, match="contiguous"):
        op(x.transpose(2, 3), ops, params, one, zero, torch.float32, False)
    with pytest.raises(RuntimeError, match="ops must be"):
        op(x, ops[:4], params, one, zero, torch.float32, False)
    with pytest.raises(RuntimeError, match="params must be"):
        op(x, ops, params.double(), one, zero, torch.float32, False)
    with pytest.raises(RuntimeError, match="alpha and beta"):
        op(x, ops, params, one[:2], zero, torch.float32, False)
    with pytest.raises(RuntimeError, match="out_dtype"):
        op(x, ops, params, one, zero, torch.int32, False)
    huge = torch.empty(1, 3, 1, 2 ** 30, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="too large"):
        op(huge, ops[:1], params[:1], one, zero, torch.float32, False)
    with pytest.raises(TypeError, match="uint8"):
        F.photometric(x.float(), (ops, params))
    with pytest.raises(ValueError, match="mean/std"):
        F.photometric(x, (ops, params), mean=MEAN, out_dtype=torch.uint8)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_opcheck(decoded, device):
    x = _batch(decoded, 7, 5).to(device)
    table = _table(len(x), 2, 7, 5, 3)
    alpha, beta = torch.rand(3, device=device), torch.rand(3, device=device)
    for out_dtype, channels_last in [(torch.float32, False), (torch.bfloat16, True), (torch.uint8, False)]:
        torch.library.opcheck(torch.ops.fastload.photometric.default,
                              (x, table.ops.to(device), table.params.to(device), alpha, beta, out_dtype,
                               channels_last))


# --- CUDA: bit for bit the CPU op ----------------------------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_contrast_of_a_grey_image_in_three_channels_is_torchvisions_on_its_one_channel(decoded, device):
    """p2 = 1 (the slots after Grayscale(1)): the blend target is the mean of the one grey channel, as torchvision's
    adjust_contrast computes it for a one-channel image (the floored luma of three equal channels is one level
    lower: a different mean)."""
    x = TF.rgb_to_grayscale(_batch(decoded, 64, 80), num_output_channels=1)
    factors = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0]  # exact in float32: p0 is torchvision's factor
    ops_ = torch.full((8, 1), OPS["contrast"], dtype=torch.int64)
    params = torch.tensor([[[f, 0.0, 1.0]] for f in factors], dtype=torch.float32)
    out = F.photometric(x.expand(-1, 3, -1, -1).to(device), (ops_, params), out_dtype=torch.uint8).cpu()
    ref = torch.stack([TF.adjust_contrast(x[i], f) for i, f in enumerate(factors)])
    assert torch.equal(out, ref.expand(-1, 3, -1, -1))
    luma = F.photometric(x.expand(-1, 3, -1, -1).to(device), (ops_, params * torch.tensor([1.0, 1.0, 0.0])),
                         out_dtype=torch.uint8).cpu()
    assert not torch.equal(luma, out)  # the flag is what makes the difference


@pytest.mark.cuda
@pytest.mark.parametrize("size", SIZES + [(33, 47)], ids=str)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_cuda_equals_cpu(decoded, size, out_dtype, channels_last):
    h, w = size
    x = _batch(decoded, h, w)
    for seed, slots in [(0, 0), (1, 1), (2, 3), (3, 4)]:
        table = _table(len(x), slots, h, w, seed)
        cpu = _run(x, table, out_dtype, channels_last)
        cuda = _run(x.cuda(), table, out_dtype, channels_last)
        assert cuda.device.type == "cuda"
        _assert_equal(cuda.cpu(), cpu)


@pytest.mark.cuda
def test_cuda_equals_cpu_large_batch_and_kernels(decoded):
    """256 samples (several stats blocks per sample, atomics from many blocks) and blur kernels whose row sums
    fit the shared band (ky 101) or not (ky 241: recomputed per pixel)."""
    x = _batch(decoded, 176, 176).repeat(32, 1, 1, 1)
    table = _table(len(x), 2, 176, 176, 5)
    _assert_equal(_run(x.cuda(), table, torch.float32).cpu(), _run(x, table, torch.float32))
    for ky in (101, 241):
        n = 8
        ops = torch.full((n, 1), BLUR)
        params = torch.tensor([[[15.0, float(ky), 9.0]]]).repeat(n, 1, 1)
        _assert_equal(_run(x[:n].cuda(), (ops, params), torch.uint8).cpu(), _run(x[:n], (ops, params), torch.uint8))


@pytest.mark.cuda
def test_cuda_device_table_bad_slot_is_identity(decoded):
    """A table already on the device is not read back: a slot it cannot run leaves the sample unchanged."""
    x = _batch(decoded, 64, 80)
    table = _table(len(x), 2, 64, 80, 9, codes=range(BLUR))
    ops = table.ops.clone()
    ops[4, 0] = 99
    out = torch.ops.fastload.photometric(x.cuda(), ops.cuda(), table.params.cuda(), torch.ones(3, device="cuda"),
                                         torch.zeros(3, device="cuda"), torch.uint8, False)
    ops[4, 0] = OPS["identity"]
    _assert_equal(out.cpu(), _run(x, (ops, table.params), torch.uint8))


# --- nearest maps: the listed samples read through affine_nearest_'s maps ------------------------------------

def _maps(n, h, w):
    """Maps for samples 0, 2, 3, 5, 6, 7 of a batch of 8: every policy op (rotations past 90 degrees, shears both
    ways, a translation partly off the image: the CPU's row-copy path), a zoom out and a NaN matrix (every pixel
    the fill)."""
    from fastload.transforms import policies as P
    names = ["Rotate", "ShearX", "ShearY", "TranslateX", "Rotate", "Rotate"]
    mags = [33.3, -0.7, 0.25, w * 0.6, -135.0, 10.0]
    m = torch.from_numpy(np.stack([P.geometric_matrices(name, [g], h, w)[0][:2] for name, g in zip(names, mags)]))
    m = m.float()
    m[1] *= 2.5
    m[5, 0, 2] = float("nan")
    samples = torch.tensor([0, 2, 3, 5, 6, 7][:n])
    return samples, m[:len(samples)]


def _first_slot(code, n, h, w, seed):
    """A two-slot table whose first slot is ``code`` for every sample (the slot the listed samples are read
    through their maps in), the second random."""
    first, second = _table(n, 1, h, w, seed, codes=[code]), _table(n, 1, h, w, seed + 1)
    return PhotometricTable(torch.cat([first.ops, second.ops], 1), torch.cat([first.params, second.params], 1))


def _moved_first(x, samples, m, fill):
    y = x.clone()
    ops.affine_nearest_(y, samples, m, fill)
    return y


@pytest.mark.parametrize("size", SIZES + [(33, 47)], ids=str)
def test_maps_equal_moving_the_samples_first(decoded, size):
    """photometric(x, nearest=maps) equals affine_nearest_ on a copy followed by photometric, every op (blur too)
    in every slot, fills rounded as affine_nearest_ rounds them; x itself is not written."""
    h, w = size
    x = _batch(decoded, h, w)
    before = x.clone()
    samples, m = _maps(len(x), h, w)
    for seed, slots, fill in [(0, 0, 0.0), (1, 1, 127.6), (2, 3, 300.0), (3, 2, [10.0, 128.5, 251.0])]:
        table = _table(len(x), slots, h, w, seed)
        moved = _moved_first(x, samples, m, fill)
        for out_dtype in (torch.float32, torch.uint8):
            norm = {} if out_dtype == torch.uint8 else {"mean": MEAN, "std": STD}
            got = F.photometric(x, table, out_dtype=out_dtype, nearest=(samples, m, fill), **norm)
            _assert_equal(got, _run(moved, table, out_dtype))
    assert torch.equal(x, before)


@pytest.mark.parametrize("size", [(33, 47), (64, 80)], ids=str)
def test_maps_every_op_in_the_first_slot(decoded, size):
    """Each op code in the first slot of every sample (statistics and neighbourhoods of the moved image included)."""
    h, w = size
    x = _batch(decoded, h, w)
    samples, m = _maps(len(x), h, w)
    moved = _moved_first(x, samples, m, 31.0)
    for code in range(len(OPS)):
        table = _first_slot(code, len(x), h, w, code)
        got = F.photometric(x, table, out_dtype=torch.uint8, nearest=(samples, m, 31.0))
        _assert_equal(got, _run(moved, table, torch.uint8))


def test_maps_are_checked(decoded):
    x = _batch(decoded, 16, 16)
    table = _table(len(x), 1, 16, 16, 0)
    samples, m = _maps(len(x), 16, 16)
    with pytest.raises(ValueError, match="distinct"):
        F.photometric(x, table, nearest=(torch.tensor([0, 0]), m[:2], [0.0]))
    with pytest.raises(ValueError, match="index the batch"):
        F.photometric(x, table, nearest=(torch.tensor([8]), m[:1], [0.0]))
    with pytest.raises(ValueError, match=r"\[N, 2, 3\]"):
        F.photometric(x, table, nearest=(samples, m[:2], [0.0]))
    op = torch.ops.fastload.photometric
    one, zero = torch.ones(3), torch.zeros(3)
    with pytest.raises(RuntimeError, match="out of range"):
        op(x, table.ops, table.params, one, zero, torch.uint8, False, torch.tensor([9]), m[:1], [0.0])
    with pytest.raises(RuntimeError, match="listed twice"):
        op(x, table.ops, table.params, one, zero, torch.uint8, False, torch.tensor([1, 1]), m[:2], [0.0])
    with pytest.raises(RuntimeError, match="both samples and matrices"):
        op(x, table.ops, table.params, one, zero, torch.uint8, False, samples, None, [0.0])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_opcheck_with_maps(decoded, device):
    x = _batch(decoded, 8, 12).to(device)
    table = _table(len(x), 2, 8, 12, 4)
    samples, m = _maps(len(x), 8, 12)
    alpha, beta = torch.rand(3, device=device), torch.rand(3, device=device)
    for out_dtype, channels_last in [(torch.float32, True), (torch.uint8, False)]:
        torch.library.opcheck(torch.ops.fastload.photometric.default,
                              (x, table.ops.to(device), table.params.to(device), alpha, beta, out_dtype,
                               channels_last, samples.to(device), m.to(device), [5.0, 0.0, 255.0]))


@pytest.mark.cuda
@pytest.mark.parametrize("size", [(7, 5), (33, 47), (64, 80), (176, 176)], ids=str)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_cuda_maps_equal_cpu(decoded, size, out_dtype, channels_last):
    """The CUDA op reads the listed samples through their maps in its first launch (stats, and a kernel of their
    own for the pixels, blur and sharpness neighbours included): bit for bit the CPU op, which moves them first."""
    h, w = size
    x = _batch(decoded, h, w)
    samples, m = _maps(len(x), h, w)
    for seed, slots in [(0, 0), (1, 1), (2, 3)]:
        table = _table(len(x), slots, h, w, seed)
        norm = {} if out_dtype == torch.uint8 else {"mean": MEAN, "std": STD}
        fill = 9.0 if slots != 1 else [9.0, 130.0, 250.0]  # one value, or one per channel
        cpu = F.photometric(x, table, out_dtype=out_dtype, channels_last=channels_last, nearest=(samples, m, fill),
                            **norm)
        cuda = F.photometric(x.cuda(), table, out_dtype=out_dtype, channels_last=channels_last,
                             nearest=(samples.cuda(), m.cuda(), fill), **norm)
        _assert_equal(cuda.cpu(), cpu)


@pytest.mark.cuda
@pytest.mark.parametrize("size", [(33, 47), (176, 176)], ids=str)
def test_cuda_maps_every_op_in_the_first_slot(decoded, size):
    h, w = size
    x = _batch(decoded, h, w)
    samples, m = _maps(len(x), h, w)
    for code in range(len(OPS)):
        table = _first_slot(code, len(x), h, w, code)
        for out_dtype, channels_last in [(torch.float32, True), (torch.uint8, False)]:
            norm = {} if out_dtype == torch.uint8 else {"mean": MEAN, "std": STD}
            cpu = F.photometric(x, table, out_dtype=out_dtype, channels_last=channels_last,
                                nearest=(samples, m, 31.0), **norm)
            cuda = F.photometric(x.cuda(), table, out_dtype=out_dtype, channels_last=channels_last,
                                 nearest=(samples.cuda(), m.cuda(), 31.0), **norm)
            _assert_equal(cuda.cpu(), cpu)


@pytest.mark.cuda
def test_cuda_sample_listed_twice_is_read_through_one_map(decoded):
    """A device list is not checked: a sample listed twice takes one of its maps, stats and pixels alike."""
    x = _batch(decoded, 64, 80)
    samples, m = _maps(len(x), 64, 80)
    table = _first_slot(OPS["equalize"], len(x), 64, 80, 3)
    twice = torch.cat([samples, samples[:1]])
    maps = torch.cat([m, m[4:5]])  # sample 0 again, with sample 6's rotation
    out = F.photometric(x.cuda(), table, out_dtype=torch.uint8, nearest=(twice.cuda(), maps.cuda(), 0.0)).cpu()
    either = [F.photometric(x, table, out_dtype=torch.uint8, nearest=(samples, mm, 0.0))
              for mm in (m, maps[[6, 1, 2, 3, 4, 5]])]  # sample 0 with its own map or with the second one
    assert not torch.equal(*either) and any(torch.equal(out, e) for e in either)


def _slot_maps(n, slots, h, w):
    """Maps spread over the slots (the policies' geometric ops: each moves its slot's input): samples 0, 2, 3 at
    slot 0, samples 0, 5, 7 at the last slot (sample 0 moved twice), sample 6 in the middle one; ordered by slot."""
    samples, m = _maps(n, h, w)  # rows: samples 0, 2, 3, 5, 6, 7
    rows = [0, 1, 2, 0, 3, 5, 4] if slots >= 3 else [0, 1, 2, 0, 3, 5]
    listed = torch.tensor([0, 2, 3, 0, 5, 7, 6][:len(rows)])
    where = [0, 0, 0, slots - 1, slots - 1, slots - 1, 1][:len(rows)]
    order = np.argsort(where, kind="stable")
    return listed[order], m[rows][order], [where[k] for k in order]


def _moved_at_slots(x, table, samples, m, slots, fill):
    """The reference: slot by slot, the slot's listed samples moved by affine_nearest_ first, then the slot alone
    (the op without maps, tested against apply_table above; gaussian_blur within 1 level of it)."""
    y = x.clone()
    for s in range(table.ops.shape[1]):
        sel = [k for k, at in enumerate(slots) if at == s]
        if sel:
            ops.affine_nearest_(y, samples[sel], m[sel], fill)
        y = _run(y, PhotometricTable(table.ops[:, s:s + 1], table.params[:, s:s + 1]), torch.uint8)
    return y


@pytest.mark.parametrize("size", [(33, 47), (64, 80)], ids=str)
def test_maps_move_the_input_of_their_slot(decoded, size):
    """nearest=(samples, matrices, fill, slots): each map moves its slot's input, as affine_nearest_ between the
    slots would (a sample moved at two slots resamples twice, as torchvision does), every op in every slot."""
    h, w = size
    x = _batch(decoded, h, w)
    matters = []
    for seed, slots in [(3, 2), (4, 3), (5, 3)]:
        table = _table(len(x), slots, h, w, seed)
        samples, m, where = _slot_maps(len(x), slots, h, w)
        ref = _moved_at_slots(x, table, samples, m, where, 17.0)
        got = F.photometric(x, table, out_dtype=torch.uint8, nearest=(samples, m, 17.0, where))
        _assert_equal(got, ref)
        got = F.photometric(x, table, mean=MEAN, std=STD, channels_last=True, nearest=(samples, m, 17.0, where))
        _assert_equal(got, _normalise(ref, MEAN, STD, 1.0 / 255, torch.float32).contiguous(
            memory_format=torch.channels_last))
        # where a map is matters: samples 5 and 7 moved before slot 0 instead of the last slot
        late = [k for k, at in enumerate(where) if int(samples[k]) in (5, 7)]
        early = _moved_at_slots(x, table, samples[late], m[late], [0] * len(late), 17.0)
        matters.append(not torch.equal(early[[5, 7]], ref[[5, 7]]))
    assert any(matters)


def test_a_bad_table_value_names_the_op_sample_and_slot(decoded):
    x = _batch(decoded, 16, 16)
    table = _table(len(x), 2, 16, 16, 0, codes=[OPS["contrast"]])
    table.params[3, 1, 0] = -0.5
    with pytest.raises(ValueError, match=r"^photometric: sample 3, slot 1: contrast_factor \(-0.5\) is not non-negative"):
        F.photometric(x, table)


def test_slot_lists_are_checked(decoded):
    x = _batch(decoded, 16, 16)
    table = _table(len(x), 2, 16, 16, 0)
    samples, m, where = _slot_maps(len(x), 2, 16, 16)
    with pytest.raises(ValueError, match="non-decreasing"):
        F.photometric(x, table, nearest=(samples, m, [0.0], where[::-1]))
    with pytest.raises(ValueError, match="below 2"):
        F.photometric(x, table, nearest=(samples, m, [0.0], [0] * (len(where) - 1) + [2]))
    with pytest.raises(ValueError, match="distinct within a slot"):
        F.photometric(x, table, nearest=(samples, m, [0.0], [0] * len(where)))  # sample 0 twice in slot 0
    op = torch.ops.fastload.photometric
    one, zero = torch.ones(3), torch.zeros(3)
    with pytest.raises(RuntimeError, match="non-decreasing"):
        op(x, table.ops, table.params, one, zero, torch.uint8, False, samples, m, [0.0], where[::-1])
    with pytest.raises(RuntimeError, match="is not a slot"):
        op(x, table.ops, table.params, one, zero, torch.uint8, False, samples, m, [0.0], [5] * len(where))
    with pytest.raises(RuntimeError, match="one slot per listed sample"):
        op(x, table.ops, table.params, one, zero, torch.uint8, False, samples, m, [0.0], where[:2])
    with pytest.raises(RuntimeError, match="listed twice"):
        op(x, table.ops, table.params, one, zero, torch.uint8, False, samples, m, [0.0], [0] * len(where))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_opcheck_with_slot_maps(decoded, device):
    x = _batch(decoded, 8, 12).to(device)
    table = _table(len(x), 3, 8, 12, 4)
    samples, m, where = _slot_maps(len(x), 3, 8, 12)
    torch.library.opcheck(torch.ops.fastload.photometric.default,
                          (x, table.ops.to(device), table.params.to(device), torch.rand(3, device=device),
                           torch.rand(3, device=device), torch.float32, True, samples.to(device), m.to(device), [5.0],
                           where))


@pytest.mark.cuda
@pytest.mark.parametrize("size", [(7, 5), (33, 47), (176, 176)], ids=str)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.uint8], ids=str)
def test_cuda_slot_maps_equal_cpu(decoded, size, out_dtype):
    """The CUDA launches of a slot read its listed samples through their maps (stats and pixels): bit for bit the
    CPU op, every op in every slot, maps at the first, a middle and the last slot."""
    h, w = size
    x = _batch(decoded, h, w)
    norm = {} if out_dtype == torch.uint8 else {"mean": MEAN, "std": STD}
    for seed, slots in [(3, 2), (4, 3), (5, 3)]:
        table = _table(len(x), slots, h, w, seed)
        samples, m, where = _slot_maps(len(x), slots, h, w)
        for channels_last in (False, True):
            cpu = F.photometric(x, table, out_dtype=out_dtype, channels_last=channels_last,
                                nearest=(samples, m, 9.0, where), **norm)
            cuda = F.photometric(x.cuda(), table, out_dtype=out_dtype, channels_last=channels_last,
                                 nearest=(samples.cuda(), m.cuda(), 9.0, where), **norm)
            _assert_equal(cuda.cpu(), cpu)
