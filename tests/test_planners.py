"""Crop planners: torchvision's algorithm, the vectorised plan, windows, matrices, and pixels end to end."""
import io
import math

import numpy as np
import pytest
import torch
import torchvision.transforms as T1
import torchvision.transforms.v2 as T2
import torchvision.transforms.v2.functional as F
from PIL import Image

from fastload import ops, rng
from fastload.transforms.planners import CenterCrop, CropPlan, RandomResizedCrop

from photos import encode_jpeg  # tests/photos.py

# image sizes: ImageNet-like, 1080p, tiny, and extreme aspect ratios that exhaust the 10 attempts (fallback)
SIZES = [(375, 500), (500, 333), (1080, 1920), (224, 224), (1, 1), (1, 7), (9, 2), (20, 2000), (3000, 40),
         (17, 31), (480, 640), (2000, 60)]


def random_sizes(n, seed=0):
    g = np.random.default_rng(seed)
    h = np.exp(g.uniform(0, math.log(4000), n)).astype(np.int64) + 1
    w = (h * np.exp(g.uniform(-2, 2, n))).astype(np.int64) + 1
    return h, w


# ---------------------------------------------------------------- torchvision's algorithm

@pytest.mark.parametrize("scale,ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.35, 0.9), (0.5, 2.0))])
def test_get_params_equals_torchvision(scale, ratio):
    planner = RandomResizedCrop(224, scale, ratio)
    hs, ws = random_sizes(150)
    sizes = SIZES + list(zip(hs.tolist(), ws.tolist()))
    fallbacks = 0
    for k, (h, w) in enumerate(sizes):
        img = torch.empty(1, 1, 1).expand(3, h, w)  # only the shape is read
        for seed in (k, k + 10_000):
            torch.manual_seed(seed)
            ours = planner.get_params(h, w)
            after = torch.rand(1)  # and the same number of draws was consumed
            torch.manual_seed(seed)
            assert ours == tuple(T2.RandomResizedCrop.get_params(img, list(scale), list(ratio))), (h, w, seed)
            assert torch.equal(after, torch.rand(1))
            torch.manual_seed(seed)
            assert ours == tuple(T1.RandomResizedCrop.get_params(img, list(scale), list(ratio)))
            # an explicit generator draws the same stream
            assert ours == planner.get_params(h, w, torch.Generator().manual_seed(seed))
            fallbacks += ours == planner._fallback(h, w)
    assert fallbacks >= 10  # the fallback branch was exercised


def scalar_reference(planner, height, width, u):
    """torchvision's get_params written out with the per-sample uniforms in place of torch's draws."""
    area = height * width
    lo, hi = math.log(planner.ratio[0]), math.log(planner.ratio[1])
    for k in range(10):
        target_area = area * (planner.scale[0] + (planner.scale[1] - planner.scale[0]) * u[2 * k])
        aspect_ratio = math.exp(lo + (hi - lo) * u[2 * k + 1])
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            return int(u[20] * (height - h + 1)), int(u[21] * (width - w + 1)), h, w, False
    in_ratio = width / height
    if in_ratio < min(planner.ratio):
        w, h = width, int(round(width / min(planner.ratio)))
    elif in_ratio > max(planner.ratio):
        h, w = height, int(round(height * max(planner.ratio)))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w, True


@pytest.mark.parametrize("scale,ratio", [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.5, 1.0), (0.2, 5.0))])
def test_vectorised_plan_equals_scalar_algorithm(scale, ratio):
    planner = RandomResizedCrop(224, scale, ratio)
    hs, ws = random_sizes(3000, seed=1)
    hs = np.concatenate([hs, [s[0] for s in SIZES]])
    ws = np.concatenate([ws, [s[1] for s in SIZES]])
    idx = np.arange(len(hs)) * 7 + 3
    plan = planner.plan(hs, ws, 42, 5, idx)
    u = rng.uniforms(42, 5, idx, planner.num_uniforms)
    ref = [scalar_reference(planner, int(h), int(w), row) for h, w, row in zip(hs, ws, u)]
    assert plan.windows[:, :4].tolist() == [list(r[:4]) for r in ref]
    assert sum(r[4] for r in ref) >= 20  # the fallback branch was exercised
    np.testing.assert_array_equal(plan.flipped, u[:, -1] < 0.5)
    assert 0.45 < plan.flipped.mean() < 0.55


# ---------------------------------------------------------------- windows, scales, matrices

def planners():
    return [RandomResizedCrop(224), RandomResizedCrop((96, 160), dct_downscale=False),
            RandomResizedCrop(32, scale=(0.01, 0.05)), CenterCrop(224, dct_downscale=True),
            CenterCrop((128, 192), resize=150, flip=0.5, dct_downscale=True), CenterCrop(224, resize=200),
            CenterCrop(64)]


@pytest.mark.parametrize("planner", planners(), ids=lambda p: f"{type(p).__name__}{p.size}")
def test_windows_inside_image_and_matrices_inside_crop(planner):
    hs, ws = random_sizes(2000, seed=2)
    hs = np.concatenate([hs, [s[0] for s in SIZES]])
    ws = np.concatenate([ws, [s[1] for s in SIZES]])
    plan = planner.plan(hs, ws, 0, 0, np.arange(len(hs)))
    assert isinstance(plan, CropPlan)
    assert plan.windows.dtype == torch.int64 and plan.windows.shape == (len(hs), 5)
    assert plan.matrices.dtype == torch.float32 and plan.matrices.shape == (len(hs), 2, 5)
    assert plan.flipped.dtype == bool and plan.flipped.shape == (len(hs),)
    top, left, h, w, d = (c.numpy() for c in plan.windows.T)
    assert np.all((top >= 0) & (left >= 0) & (h >= 1) & (w >= 1))
    assert np.all((top + h <= hs) & (left + w <= ws))
    assert set(np.unique(d)) <= {1, 2, 4, 8}
    out_h, out_w = planner.size
    # the DCT scale is the largest that keeps the crop at least the output size, 1 when switched off
    if not planner.dct_downscale:
        assert np.all(d == 1)
    elif isinstance(planner, RandomResizedCrop):
        fits = lambda k: (h // k >= out_h) & (w // k >= out_w)  # noqa: E731
        assert np.all(fits(d) | (d == 1)) and not np.any(fits(2 * d) & (d < 8))
    # every output pixel's centre lands inside the decoded crop (no fill), whatever the flip
    dec_h = -(-(top + h) // d) - top // d
    dec_w = -(-(left + w) // d) - left // d
    assert np.all((dec_h >= 1) & (dec_w >= 1))
    m = plan.matrices.double().numpy()
    xs = np.stack([m[:, 0, 2], m[:, 0, 0] * (out_w - 1) + m[:, 0, 2]], 1)
    ys = np.stack([m[:, 1, 2], m[:, 1, 1] * (out_h - 1) + m[:, 1, 2]], 1)
    if isinstance(planner, RandomResizedCrop):
        eps = 1e-3
        assert np.all((xs >= -0.5 - eps) & (xs <= dec_w[:, None] - 0.5 + eps))
        assert np.all((ys >= -0.5 - eps) & (ys <= dec_h[:, None] - 0.5 + eps))
        # the visible box is the crop: every output pixel's centre (edge coordinates) inside it, none is fill
        for pos, row in ((xs, 0), (ys, 1)):
            assert np.all((pos + 0.5 >= m[:, row, 3:4] - eps) & (pos + 0.5 <= m[:, row, 4:5] + eps))
    else:
        # CenterCrop at scale 1: the resize filter's reach (support max(1, s) around each centre) stays inside
        # the window unless the window already touches the image edge there (where torch clamps too)
        one = d == 1
        for axis, pos, lo_win, n_win, img in ((0, xs, left, w, ws), (1, ys, top, h, hs)):
            support = np.maximum(1, np.abs(m[:, axis, axis]))
            reach_lo = pos.min(1) + 0.5 - support  # edge coordinates of the decoded crop
            reach_hi = pos.max(1) + 0.5 + support
            ok_lo = (reach_lo >= -1e-3) | (lo_win == 0)
            ok_hi = (reach_hi <= n_win + 1e-3) | (lo_win + n_win == img)
            assert np.all((ok_lo & ok_hi)[one])


def test_plan_is_pure_and_deterministic():
    planner = RandomResizedCrop(224)
    hs, ws = random_sizes(64, seed=3)
    idx = np.arange(64) + 1000
    a = planner.plan(hs, ws, 7, 1, idx)
    b = planner.plan(hs, ws, 7, 1, idx)
    assert torch.equal(a.windows, b.windows) and torch.equal(a.matrices, b.matrices)
    perm = np.random.default_rng(0).permutation(64)
    c = planner.plan(hs[perm], ws[perm], 7, 1, idx[perm])  # another batch composition / order
    assert torch.equal(c.windows, a.windows[perm]) and torch.equal(c.matrices, a.matrices[perm])
    one = planner.plan(hs[5:6], ws[5:6], 7, 1, idx[5:6])
    assert torch.equal(one.windows[0], a.windows[5])
    assert not torch.equal(planner.plan(hs, ws, 7, 2, idx).windows, a.windows)  # epochs differ
    assert not torch.equal(planner.plan(hs, ws, 8, 1, idx).windows, a.windows)  # seeds differ


def test_matrix_formula_and_flip():
    planner = RandomResizedCrop(100, flip=1.0)
    plan = planner.plan([1000], [1000], 0, 0, [0])
    top, left, h, w, d = plan.windows[0].tolist()
    assert plan.flipped[0]
    a = w / 100 / d
    tx = (0.5 * w / 100 + left) / d - 0.5 - left // d
    e = h / 100 / d
    ty = (0.5 * h / 100 + top) / d - 0.5 - top // d
    box_x = (left / d - left // d, (left + w) / d - left // d)  # the crop, in the decoded crop's edge coordinates
    box_y = (top / d - top // d, (top + h) / d - top // d)
    expect = torch.tensor([[-a, 0, a * 99 + tx, *box_x], [0, e, ty, *box_y]], dtype=torch.float32)
    torch.testing.assert_close(plan.matrices[0], expect)
    noflip = RandomResizedCrop(100, flip=0.0).plan([1000], [1000], 0, 0, [0])
    assert not noflip.flipped[0] and torch.equal(noflip.windows, plan.windows)


def test_center_crop_geometry_matches_torchvision_sizes():
    planner = CenterCrop(224)
    assert planner.resize == 256
    for h, w in [(375, 500), (500, 375), (256, 256), (333, 999), (1080, 1920), (1001, 300)]:
        new_h, new_w = planner.resized_size(np.array([h]), np.array([w]))
        assert [int(new_h[0]), int(new_w[0])] == list(F.resize(torch.empty(1, 1, 1).expand(1, h, w), [256],
                                                               antialias=False).shape[-2:])


def test_bad_arguments():
    with pytest.raises(ValueError):
        RandomResizedCrop(0)
    with pytest.raises(ValueError):
        RandomResizedCrop(224, flip=1.5)
    with pytest.raises(ValueError):
        RandomResizedCrop(224).plan([10, 10], [10], 0, 0, [0, 1])
    with pytest.raises(ValueError):
        CenterCrop(224).plan([0], [10], 0, 0, [0])


# ---------------------------------------------------------------- pixels: decode_crop + warp vs torchvision

def fastload_pixels(data, plan, i, size):
    top, left, h, w, d = plan.windows[i].tolist()
    crop = ops.decode_crop(data, top, left, h, w, d)
    return ops.warp_affine(crop[None].float(), plan.matrices[i][None], size, layout="NHWC")[0]


def rrc_reference(planner, full, window):
    top, left, h, w, _ = window
    return F.resized_crop(full, top, left, h, w, list(planner.size), antialias=True)


def center_reference(planner, full, window):
    return F.center_crop(F.resize(full, [planner.resize], antialias=True), list(planner.size))


def compare(jobs, reference, per_image, float64=False):
    """Every planned window through decode_crop + warp_affine and through the torchvision reference on Pillow's
    full decode. Returns dicts: downscale d, ours, ref (float32) and, with float64=True, ref64."""
    rows = []
    for k, (data, full, planner) in enumerate(jobs):
        _, H, W = full.shape
        plan = planner.plan(np.full(per_image, H), np.full(per_image, W), 0, 0, np.arange(per_image) + 1000 * k)
        full64 = full.double() if float64 else None
        for i in range(per_image):
            window = plan.windows[i].tolist()
            flip = F.horizontal_flip if plan.flipped[i] else (lambda t: t)
            row = {"d": window[4], "ours": fastload_pixels(data, plan, i, planner.size),
                   "ref": flip(reference(planner, full, window))}
            if float64:
                row["ref64"] = flip(reference(planner, full64, window))
            rows.append(row)
    return rows


def maxdiff(a, b):
    return (a.double() - b.double()).abs().max().item()


def psnr(a, b):
    mse = ((a.double() - b.double()) ** 2).mean().item()
    return 10 * math.log10(255 ** 2 / max(mse, 1e-20))


def check_exact(rows):
    # "Within float rounding": both sides compute each sample position in float32 (torch: scale * (i + 0.5),
    # the warp: a * u + t), so positions differ by a few ulps (3e-5 px at coordinates of a few hundred) and a
    # value moves by that times the local slope, up to ~255 per pixel at a sharp edge: a few 1e-3, not 1e-3.
    # The measure of "rounding" is torchvision itself: its float32 result is that far from its float64 one, and
    # ours must be no further from float64 than torchvision's own float32 is (x1.5 + 1e-3 of slack).
    assert all(r["d"] == 1 for r in rows)
    ours64 = max(maxdiff(r["ours"], r["ref64"]) for r in rows)
    tv64 = max(maxdiff(r["ref"], r["ref64"]) for r in rows)
    assert ours64 <= 1.5 * tv64 + 1e-3, (ours64, tv64)
    assert max(maxdiff(r["ours"], r["ref"]) for r in rows) <= 1e-2
    assert np.mean([(r["ours"] - r["ref"]).abs().mean().item() for r in rows]) < 1e-4


def check_psnr(rows, min_windows):
    scaled = [psnr(r["ours"], r["ref"]) for r in rows if r["d"] > 1]
    assert len(scaled) >= min_windows
    assert np.median(scaled) >= 35.0 and np.percentile(scaled, 1) >= 30.0, (np.median(scaled),
                                                                            np.percentile(scaled, 1))
    # windows that did not need DCT scaling are still exact
    assert all(maxdiff(r["ours"], r["ref"]) <= 1e-2 for r in rows if r["d"] == 1)
    return scaled


def test_random_resized_crop_exact_without_dct(photos):
    jobs = [(data, full, RandomResizedCrop(s, dct_downscale=False)) for data, full in photos[:3] for s in (224, 96)]
    check_exact(compare(jobs, rrc_reference, per_image=15, float64=True))


def test_random_resized_crop_psnr_with_dct(photos):
    # 224 crops of the 1080p mosaic and 96 crops of the small photos: both get downscaled by 2, 4 and 8
    jobs = [(data, full, RandomResizedCrop(224 if full.shape[1] >= 1080 else 96)) for data, full in photos]
    rows = compare(jobs[:3], rrc_reference, per_image=80) + compare(jobs[3:], rrc_reference, per_image=40)
    check_psnr(rows, min_windows=200)
    assert {2, 4} <= {r["d"] for r in rows}


@pytest.fixture(scope="module")
def center_jobs(photos):
    """Many image sizes for CenterCrop (one window per image and planner): sub-rectangles of the mosaic."""
    data, mosaic = photos[3]
    g = np.random.default_rng(1)
    images = [(data, mosaic)] + [(d, f) for d, f in photos[:3]]
    rgb = mosaic.permute(1, 2, 0).to(torch.uint8).numpy()
    while len(images) < 80:
        h = int(g.integers(240, 800))
        w = int(np.clip(h * np.exp(g.uniform(-0.8, 0.8)), 120, 1200))
        y, x = g.integers(0, 1080 - h + 1), g.integers(0, 1920 - w + 1)
        jpg = encode_jpeg(np.ascontiguousarray(rgb[y:y + h, x:x + w]))
        images.append((jpg, torch.from_numpy(np.array(Image.open(io.BytesIO(jpg)))).permute(2, 0, 1).float()))
    return images


def test_center_crop_exact_without_dct(center_jobs):
    planners = [CenterCrop(224, flip=0.5, dct_downscale=False), CenterCrop((160, 96), resize=128, flip=0.5,
                                                                           dct_downscale=False)]
    jobs = [(data, full, planners[k % 2]) for k, (data, full) in enumerate(center_jobs[1:17])]  # not the 1080p one
    check_exact(compare(jobs, center_reference, per_image=1, float64=True))


def test_center_crop_psnr_with_dct(center_jobs):
    planners = [CenterCrop(s, flip=0.5, dct_downscale=True) for s in (224, 160, 112, 64)]
    jobs = [(data, full, p) for data, full in center_jobs for p in planners]
    rows = compare(jobs, center_reference, per_image=1)
    check_psnr(rows, min_windows=200)
    assert {2, 4, 8} <= {r["d"] for r in rows}
