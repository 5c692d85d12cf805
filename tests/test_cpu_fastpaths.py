"""The CPU kernels' fast paths against the reference code they replace (warp_cpu.cpp, augment_cpu.cpp).

- warp: uint8 RGB samples with a rotation or shear take a padded fast path (the baseline build: SSE, two pixels at a
  time; the AVX2 build: eight pixels at a time, one per lane, weights reused where the centres repeat); float32
  samples of the same values take warp.h's per-pixel loop (warp_pixel_general). All must give the same bits. Both
  builds are tested: FASTLOAD_WARP_BASELINE=1 makes an AVX2 machine take the baseline one.
- hue: the CPU op computes hue on whole planes without branches (vectorised); every one of the 2^24 colours must
  equal torchvision's adjust_hue exactly, at the ends of the factor range too.
- the policies' nearest gather (eight pixels a step with AVX2) and the photometric op's sharpness (16 pixels a step):
  same bits in both builds, and equal to the scalar float32 path / torchvision.
"""
import math

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF

import fastload.transforms.functional as F
from fastload import ops
from fastload.transforms import policies as P

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _ragged(images):
    """HWC uint8 images -> (data, offsets, shapes) of a ragged batch, the last sample ending the buffer (so a read
    past its last pixel would leave the tensor)."""
    flat = [im.reshape(-1) for im in images]
    offsets = torch.tensor(np.cumsum([0] + [f.numel() for f in flat[:-1]]), dtype=torch.int64)
    shapes = torch.tensor([list(im.shape) for im in images], dtype=torch.int64)
    return torch.cat(flat), offsets, shapes


def _matrix(angle, shear, scale, tx, ty, out, h, w):
    """An output -> input matrix: rotation by `angle`, shear along x, isotropic shrink `scale`, centred, shifted."""
    a, s = math.radians(angle), math.tan(math.radians(shear))
    rot = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]]) @ np.array([[1, s], [0, 1]]) * scale
    centre_out = (out - 1) / 2
    t = np.array([(w - 1) / 2 + tx, (h - 1) / 2 + ty]) - rot @ np.array([centre_out, centre_out])
    return np.concatenate([rot, t[:, None]], axis=1)


@pytest.fixture
def build(request, monkeypatch):
    if request.param == "baseline":
        monkeypatch.setenv("FASTLOAD_WARP_BASELINE", "1")
    else:
        monkeypatch.delenv("FASTLOAD_WARP_BASELINE", raising=False)
    return request.param


def _assert_fast_equals_reference(data, offsets, shapes, matrices, out, dtypes=None):
    """The uint8 input's fast path against warp.h's loop on the same values as float32, over output types, fills and
    layouts."""
    dtypes = dtypes or ((torch.uint8, None, None, 1.0), (torch.float32, MEAN, STD, 1 / 255),
                        (torch.float16, MEAN, STD, 1 / 255), (torch.bfloat16, MEAN, STD, 1 / 255))
    for dtype, mean, std, in_scale in dtypes:
        for fill in (0.0, 127.0):
            for channels_last in (False, True):
                kw = dict(mean=mean, std=std, in_scale=in_scale, out_dtype=dtype, channels_last=channels_last,
                          fill=fill)
                fast = ops.warp_ragged(data, offsets, shapes, matrices, out, **kw)
                reference = ops.warp_ragged(data.float(), offsets, shapes, matrices, out, **kw)
                assert torch.equal(fast, reference), (dtype, fill, channels_last)


@pytest.mark.parametrize("build", ["dispatched", "baseline"], indirect=True)
def test_general_warp_uint8_path_equals_reference_loop(build):
    rng = np.random.default_rng(3)
    sizes = [(97, 131), (64, 64), (300, 181), (33, 250), (224, 224), (5, 7), (180, 120), (150, 260)]
    images = [torch.from_numpy(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    data, offsets, shapes = _ragged(images)
    out = 96
    # rotations, pure shears (x and y), large shrink (support > 2), enlargement, samples that reach the bottom-right
    # corner (the read guard) and samples partly outside the image (fill)
    params = [(30, 0, 1.4, 0, 0), (0, 17, 1.0, 5, -3), (-12, -25, 2.7, 0, 0), (90, 0, 0.6, 0, 0),
              (7, 3, 1.0, 40, 30), (45, 0, 0.05, 0, 0), (-170, 10, 1.9, -20, 15), (3, 0, 2.2, 60, 55)]
    mats = [_matrix(*p, out, h, w) for p, (h, w) in zip(params, sizes)]
    mats[3][0, 0] = 0.0  # a y-shear-like matrix with an exact zero
    matrices = torch.tensor(np.stack(mats), dtype=torch.float32)
    assert bool(((matrices[:, 0, 1] != 0) | (matrices[:, 1, 0] != 0)).all())  # every sample takes the general path
    _assert_fast_equals_reference(data, offsets, shapes, matrices, out)
    fast = ops.warp_ragged(data, offsets, shapes, matrices, out, out_dtype=torch.uint8, mean=None, std=None,
                           in_scale=1.0)
    assert fast.float().std() > 20  # the samples are not all fill


@pytest.mark.parametrize("build", ["dispatched", "baseline"], indirect=True)
def test_general_warp_uint8_path_on_photos(build, photos):
    """Real photos, cropped to sizes that end at their borders, under the geometry the policies make and more: output
    widths that leave partial groups of eight, pure shears (weights reused along rows or down columns: m[3] or m[1]
    exactly 0), quarter turns, flips, shrinks from 0.3x to 4x (up to 9 taps per axis, past the unrolled 3-5), windows
    on the image's last pixel (no spare byte to read past) and partly outside (fill), uint8 saturation (in_scale 3)."""
    rng = np.random.default_rng(7)
    rgbs = [full.permute(1, 2, 0).to(torch.uint8) for _, full in photos]
    crops = []
    for k in range(12):
        im = rgbs[k % len(rgbs)]
        h, w = int(rng.integers(40, min(420, im.shape[0]))), int(rng.integers(40, min(420, im.shape[1])))
        y, x = (im.shape[0] - h, im.shape[1] - w) if k % 3 == 0 else (int(rng.integers(0, im.shape[0] - h)),
                                                                      int(rng.integers(0, im.shape[1] - w)))
        crops.append(im[y:y + h, x:x + w].contiguous())
    data, offsets, shapes = _ragged(crops)
    for out in ((61, 97), (80, 80)):
        out_h, out_w = out
        mats = []
        for k, (h, w) in enumerate(shapes[:, :2].tolist()):
            angle = [0, 0, 90, -90, 180, 30, -17, 135, 5, 8, 45, -60][k]
            shear = [17, 0, 0, 0, 0, 0, 10, 0, -25, 0, 0, 0][k]
            scale = [1.3, 0.3, 1.0, 2.0, 4.0, 1.6, 0.8, 2.5, 1.9, 1.2, 3.2, 1.45][k]
            a, s = math.radians(angle), math.tan(math.radians(shear))
            lin = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]]) @ np.array([[1, s], [0, 1]])
            lin = lin * scale * min(h / out_h, w / out_w)
            if k == 1:
                lin = np.array([[1.0, 0.0], [0.4, 1.0]]) * scale  # vertical shear: m[1] == 0, x weights per column
            if k in (4, 8):
                lin[:, 0] *= -1  # flip
            centre = np.array([(w - 1) / 2, (h - 1) / 2])
            if k in (0, 7):
                centre = np.array([w - 2.0, h - 2.0])  # the bottom-right corner: last pixel, fill
            if k == 9:
                centre = centre + np.array([w * 0.45, -h * 0.4])  # partly outside
            t = centre - lin @ np.array([(out_w - 1) / 2, (out_h - 1) / 2])
            mats.append(np.concatenate([lin, t[:, None]], 1))
        matrices = torch.tensor(np.stack(mats), dtype=torch.float32)
        matrices[2, 0, 0] = matrices[2, 1, 1] = 0.0  # an exact quarter turn
        matrices[0, 1, 0] = 0.0  # a horizontal shear: m[3] == 0, y weights along rows
        assert bool(((matrices[:, 0, 1] != 0) | (matrices[:, 1, 0] != 0)).all())
        _assert_fast_equals_reference(data, offsets, shapes, matrices, out, dtypes=(
            (torch.uint8, None, None, 1.0), (torch.float32, MEAN, STD, 1 / 255), (torch.uint8, None, None, 3.0),
            (torch.bfloat16, MEAN, STD, 1 / 255)))
        got = ops.warp_ragged(data, offsets, shapes, matrices, out, out_dtype=torch.uint8, mean=None, std=None,
                              in_scale=1.0)
        assert got.float().std() > 20 and bool((got == 0).any())  # real content, and some fill


def test_baseline_and_avx2_builds_agree(monkeypatch, photos):
    """The two builds against each other on the loader's own input: TrivialAugmentWide-like rotations of photo crops
    to 224 px (on a machine without AVX2 both runs take the baseline build)."""
    rgbs = [full.permute(1, 2, 0).to(torch.uint8) for _, full in photos]
    crops = [im[:300, :360].contiguous() for im in rgbs]
    data, offsets, shapes = _ragged(crops)
    matrices = torch.tensor(np.stack([_matrix(a, sh, 1.4, 3, -2, 224, 300, 360) for a, sh in
                                      ((23, 0), (-30, 0), (0, 16), (11, -9))]), dtype=torch.float32)
    outs = {}
    for build in ("dispatched", "baseline"):
        monkeypatch.setenv("FASTLOAD_WARP_BASELINE", "1" if build == "baseline" else "0")
        outs[build] = [ops.warp_ragged(data, offsets, shapes, matrices, 224, **kw) for kw in
                       (dict(mean=MEAN, std=STD), dict(out_dtype=torch.uint8, mean=None, std=None, in_scale=1.0))]
    for a, b in zip(outs["dispatched"], outs["baseline"]):
        assert torch.equal(a, b)


def test_hue_every_colour_matches_torchvision():
    v = torch.arange(1 << 24, dtype=torch.int64)
    colours = torch.stack([v >> 16, (v >> 8) & 255, v & 255]).to(torch.uint8).view(3, 4096, 4096)
    for factor in (-0.5, -0.1234, 0.3337, 0.5):
        got = F.adjust_hue(colours[None], torch.tensor([factor]))[0]
        ref = TF.adjust_hue(colours, factor)
        assert torch.equal(got, ref), factor


def test_separable_rows_agree_between_builds(monkeypatch, photos):
    """Axis-aligned samples (the separable path): the AVX2 build finishes each row eight pixels at a time from a row
    of sums, the baseline build pixel by pixel; same bits for uint8 and float outputs, planar and channels-last, over
    output widths that leave 0-7 pixels after the last group of eight, fills included (crops shifted past the edge)."""
    scales = ((1.0, 0, 0), (0.7, 13.5, 7.25), (1.3, -20, 4), (0.55, 101, 77))
    crops = [full.permute(1, 2, 0).to(torch.uint8)[:300, :360].contiguous() for _, full in photos][:len(scales)]
    data, offsets, shapes = _ragged(crops)
    for out in ((224, 224), (57, 171), (9, 7), (40, 5)):
        oh, ow = out
        mats = torch.tensor([[[s * 360 / ow, 0, tx], [0, s * 300 / oh, ty]] for s, tx, ty in scales[:len(crops)]],
                            dtype=torch.float32)
        outs = {}
        for build in ("dispatched", "baseline"):
            monkeypatch.setenv("FASTLOAD_WARP_BASELINE", "1" if build == "baseline" else "0")
            outs[build] = [ops.warp_ragged(data, offsets, shapes, mats, out, channels_last=cl, fill=fill, **kw)
                           for kw in (dict(mean=MEAN, std=STD), dict(out_dtype=torch.uint8, mean=None, std=None,
                                                                     in_scale=1.0))
                           for cl in (False, True) for fill in (0.0, 127.0)]
        for a, b in zip(outs["dispatched"], outs["baseline"]):
            assert torch.equal(a, b), out
        assert outs["dispatched"][4].float().std() > 20  # uint8, planar: real content


def _both_builds(monkeypatch, run):
    """run() with the AVX2 code dispatched, then with FASTLOAD_WARP_BASELINE=1 (the baseline build)."""
    outs = []
    for baseline in ("0", "1"):
        monkeypatch.setenv("FASTLOAD_WARP_BASELINE", baseline)
        outs.append(run())
    return outs


@pytest.mark.parametrize("size", [(224, 224), (57, 171), (9, 7), (40, 5), (2, 2)])
def test_nearest_gather_rows_agree_between_builds(monkeypatch, photos, size):
    """The policies' nearest gather (uint8 NCHW, rotations and shears: no row is one run): the AVX2 build gathers
    eight pixels a step, the baseline build one; same bits, for the in-place op and inside the photometric op, on
    every output width's tail of 0-7 pixels, with pixels outside (fill) and matrices that map everything outside."""
    h, w = size
    x = torch.stack([full.to(torch.uint8)[:, :h, :w] for _, full in photos][:4]).contiguous()
    angles = (17.0, -30.0, 135.0, 3.0)
    m = [P.geometric_matrices("Rotate", [a], h, w)[0][:2] for a in angles[:2]]
    m.append(P.geometric_matrices("ShearY", [0.45], h, w)[0][:2])
    m.append(np.array([[0.5, 1.0, 4e4], [-1.0, 0.5, 0.0]]))  # every pixel far outside: fill
    m = torch.from_numpy(np.stack(m[:len(x)])).float()
    table = F.PhotometricTable(torch.zeros(len(x), 1, dtype=torch.int64), torch.zeros(len(x), 1, 3))

    def run():
        return [ops.affine_nearest(x, m, fill=fill) for fill in (0.0, 127.5)] + [
            F.photometric(x, table, out_dtype=torch.uint8, nearest=(torch.arange(len(x)), m, 200.0))]
    fast, base = _both_builds(monkeypatch, run)
    for a, b in zip(fast, base):
        assert torch.equal(a, b)
    assert torch.equal(fast[0], ops.affine_nearest(x.float(), m).to(torch.uint8))  # the float32 (scalar) path
    if h * w >= 64:
        assert (fast[0][:3] != 0).float().mean() > 0.5 and bool((fast[0][3] == 0).all())


@pytest.mark.parametrize("size", [(224, 224), (57, 171), (9, 18), (5, 33), (3, 3), (40, 2)])
def test_sharpness_rows_agree_between_builds_and_torchvision(monkeypatch, photos, size):
    """The photometric op's sharpness slot: the AVX2 build computes 16 pixels of a row a step (3x3 sums in 16-bit
    lanes), the baseline build one; both equal torchvision's adjust_sharpness sample by sample, factors from 0
    through 2 to an extreme one that saturates, on widths that leave 0-15 pixels of a row to the scalar tail."""
    h, w = size
    x = torch.stack([full.to(torch.uint8)[:, :h, :w] for _, full in photos][:4]).contiguous()
    factors = torch.tensor([0.0, 0.37, 1.8, 3e4])
    params = torch.zeros(len(x), 1, 3)
    params[:, 0, 0] = factors
    table = F.PhotometricTable(torch.full((len(x), 1), F.OPS["sharpness"], dtype=torch.int64), params)

    def run():
        return F.photometric(x, table, out_dtype=torch.uint8)
    fast, base = _both_builds(monkeypatch, run)
    assert torch.equal(fast, base)
    for i, f in enumerate(factors.tolist()):
        assert torch.equal(fast[i], TF.adjust_sharpness(x[i], f)), f


@pytest.mark.parametrize("build", ["dispatched", "baseline"], indirect=True)
def test_separable_rows_with_fill_columns_equal_the_per_pixel_loop(build, photos):
    """Axis-aligned samples whose output runs past the window's left or right edge (a NEAREST policy's moved sample
    decodes only what its gather reads): the fixed-tap row path covers the columns that read the image and fills
    the rest; the same bits as the per-pixel loop that planar (CHW) input takes, for every output type and fill."""
    crops = [full.to(torch.uint8)[:, :120, :150] for _, full in photos][:3]
    hwc = [c.permute(1, 2, 0).contiguous() for c in crops]
    chw = [c.contiguous() for c in crops]
    # shifted left, right, both (a shrink), and flipped: x_in = sx * u + ox
    mats = torch.tensor([[[1.3, 0, -40.0], [0, 1.1, 3.0]], [[0.9, 0, 90.0], [0, 0.8, 9.0]],
                         [[-2.1, 0, 190.0], [0, 1.7, 0.0]]], dtype=torch.float32)
    for dtype, mean, std, in_scale in ((torch.uint8, None, None, 1.0), (torch.float32, MEAN, STD, 1 / 255)):
        for fill in (0.0, 127.0):
            kw = dict(mean=mean, std=std, in_scale=in_scale, out_dtype=dtype, fill=fill)
            fast = ops.warp_ragged(*_ragged(hwc), mats, (60, 80), **kw)
            flat = [c.reshape(-1) for c in chw]
            offsets = torch.tensor(np.cumsum([0] + [f.numel() for f in flat[:-1]]), dtype=torch.int64)
            shapes = torch.tensor([[120, 150, 3]] * 3, dtype=torch.int64)
            loop = ops.warp_ragged(torch.cat(flat), offsets, shapes, mats, (60, 80), hwc=False, **kw)
            assert torch.equal(fast, loop), (dtype, fill)
            edge = fast[:, 0] if dtype == torch.uint8 else fast[:, 0] * STD[0] + MEAN[0]
            assert bool((edge[0, :, 0] == edge[0, 0, 0]).all()) and bool((edge[1, :, -1] == edge[1, 0, -1]).all())
