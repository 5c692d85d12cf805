"""RandomErasing (fastload.transforms.erasing): box distribution against torchvision's make_params, the erase on
real photos against a per-sample reference, value="random" noise, validation like torchvision."""
import warnings

import numpy as np
import pytest
import scipy.stats as st
import torch
import torchvision.transforms.v2 as T2
from PIL import Image

from fastload.transforms.erasing import RandomErasing

from distributions import chi2_same  # tests/distributions.py
from like_torchvision import raises_like_torchvision  # tests/like_torchvision.py

H, W = 24, 40  # small, non-square: rows and columns cannot be swapped unnoticed
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CUDA = pytest.param("cuda", marks=pytest.mark.cuda)


@pytest.fixture(scope="module")
def photos(imagenet_dir):
    """float32 [12, 3, H, W]: 12 real photos, resized and normalised as the loader's output would be."""
    paths = sorted(imagenet_dir.glob("class_*/*.jpg"))[::4][:12]
    imgs = [np.asarray(Image.open(p).convert("RGB").resize((W, H), Image.BILINEAR)) for p in paths]
    x = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).float().div(255)
    return (x - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]


# ---------------------------------------------------------------- the boxes

@pytest.mark.parametrize("height,width,scale,ratio", [
    (H, W, (0.02, 0.33), (0.3, 3.3)),  # torchvision's defaults
    (60, 45, (0.1, 0.6), (0.5, 2.0)),
    (6, 90, (0.02, 0.33), (0.3, 3.3)),  # a strip: many attempts fail, some samples exhaust all 10 (not erased)
])
def test_boxes_follow_torchvision(height, width, scale, ratio):
    """Area fraction (with 'not erased' as its own value), aspect ratio and box centre over many draws: our table
    against torchvision's own RandomErasing.make_params, two-sample chi-square p > 0.001."""
    n = 3000
    t = RandomErasing(p=1.0, scale=scale, ratio=ratio).table(0, 0, np.arange(n), height, width).double().numpy()
    tv = T2.RandomErasing(p=1.0, scale=scale, ratio=ratio)
    torch.manual_seed(0)
    img = torch.empty(3, height, width)
    theirs = []
    for _ in range(n):
        q = tv.make_params([img])
        theirs.append((q["i"], q["j"], q["h"], q["w"]) if q["v"] is not None else (0, 0, 0, 0))
    theirs = np.array(theirs, dtype=np.float64)
    for box in (t, theirs):
        top, left, h, w = box.T
        assert (top >= 0).all() and (top + h <= height).all() and (left >= 0).all() and (left + w <= width).all()
    ours_area, tv_area = (b[:, 2] * b[:, 3] / (height * width) for b in (t, theirs))
    assert chi2_same(ours_area, tv_area) > 1e-3
    ours_e, tv_e = t[t[:, 2] > 0], theirs[theirs[:, 2] > 0]
    assert chi2_same(np.log(ours_e[:, 2] / ours_e[:, 3]), np.log(tv_e[:, 2] / tv_e[:, 3])) > 1e-3
    assert chi2_same(ours_e[:, 0] + ours_e[:, 2] / 2, tv_e[:, 0] + tv_e[:, 2] / 2) > 1e-3
    assert chi2_same(ours_e[:, 1] + ours_e[:, 3] / 2, tv_e[:, 1] + tv_e[:, 3] / 2) > 1e-3
    if height == 6:
        assert 0 < (t[:, 2] == 0).sum() < n  # the fallback was exercised


def test_p_draw():
    """With p < 1 a sample is erased iff its p draw says so: the boxes are those of p=1 (the p draw moves no other
    draw), and the erased share among samples with a box is Binomial(p)."""
    n = 4000
    full = RandomErasing(p=1.0).table(3, 1, np.arange(n), H, W)
    some = RandomErasing(p=0.3).table(3, 1, np.arange(n), H, W)
    erased = some[:, 2] > 0
    assert torch.equal(some[erased], full[erased])
    assert (some[~erased] == 0).all()
    assert st.binomtest(int(erased.sum()), int((full[:, 2] > 0).sum()), 0.3).pvalue > 1e-3
    assert (RandomErasing(p=0.0).table(3, 1, np.arange(n), H, W) == 0).all()
    # keyed by sample index: a sample's box does not depend on the batch it comes in
    assert torch.equal(RandomErasing(p=0.3).table(3, 1, [17, 5], H, W), some[[17, 5]])


# ---------------------------------------------------------------- the erase

def reference(x, table, values):
    """The erase written sample by sample: values [B, C, h, w]-broadcastable per sample, or a list of noise."""
    ref = x.clone()
    for i, (top, left, h, w) in enumerate(table.long().tolist()):
        if h > 0:
            ref[i, :, top:top + h, left:left + w] = values[i] if isinstance(values, list) else values
    return ref


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("value", [0, -1.5, (0.25, -2.0, 1.75)])
def test_erased_pixels_equal_value_and_others_are_untouched(photos, value, device):
    e = RandomErasing(p=0.7, value=value)
    indices = np.arange(100, 100 + len(photos))
    table = e.table(0, 0, indices, H, W)
    assert 0 < (table[:, 2] > 0).sum() < len(photos)
    x = photos.to(device)
    before = x.clone()
    out = e.apply(x, table, 0, 0, indices)
    assert torch.equal(x, before)  # not in place
    v = torch.tensor(value, dtype=torch.float32).reshape(-1, 1, 1)
    assert torch.equal(out.cpu(), reference(photos, table, v))
    inplace = RandomErasing(p=0.7, value=value, inplace=True)
    assert inplace.apply(x, table, 0, 0, indices) is x and torch.equal(x.cpu(), out.cpu())


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_random_value_is_deterministic_standard_normal_noise(photos, device):
    e = RandomErasing(p=1.0, scale=(0.2, 0.5), value="random")
    e.stream = 1004
    indices = np.arange(40, 40 + len(photos))
    table = e.table(9, 2, indices, H, W)
    out = e.apply(photos.to(device), table, 9, 2, indices).cpu()
    mask = reference(torch.zeros_like(photos, dtype=torch.bool), table, True)
    assert torch.equal(out[~mask], photos[~mask])  # outside the boxes: untouched
    # same draws on CPU and CUDA (host noise), and again on a second run
    assert torch.equal(out, e.apply(photos, table, 9, 2, indices))
    noise = out[mask].double().numpy()
    n = len(noise)
    assert n > 3000
    # N(0, 1): the sample mean has std 1/sqrt(n), the sample variance std sqrt(2/n); 5 of those (a failure rate of
    # ~6e-7 for real N(0, 1) noise) still catches a shift or scale error of 0.1 at this n
    assert abs(noise.mean()) < 5 / np.sqrt(n)
    assert abs(noise.var() - 1) < 5 * np.sqrt(2 / n)
    assert st.kstest(noise, "norm").pvalue > 1e-3
    # the noise of a sample is its own: another batch composition, another stream position, the same pixels
    sub = [3, 0]
    again = e.apply(photos[sub].to(device), table[sub], 9, 2, indices[sub]).cpu()
    assert torch.equal(again, out[sub])
    # and it changes with the epoch
    assert not torch.equal(e.apply(photos, table, 9, 3, indices)[mask], out[mask])


# ---------------------------------------------------------------- validation like torchvision

@pytest.mark.parametrize("kwargs", [dict(p=1.5), dict(p=-0.1), dict(value="noise"), dict(value={1: 2}),
                                    dict(value=None), dict(scale=0.5), dict(ratio=3), dict(scale=(0.5, 1.5)),
                                    dict(scale=(-0.1, 0.3))])
def test_constructor_validation_like_torchvision(kwargs):
    raises_like_torchvision(lambda: RandomErasing(**kwargs), lambda: T2.RandomErasing(**kwargs))


def test_reversed_ranges_warn_like_torchvision():
    for kwargs in (dict(scale=(0.3, 0.02)), dict(ratio=(3.3, 0.3))):
        with pytest.warns(UserWarning, match="min, max"):
            T2.RandomErasing(**kwargs)
        with pytest.warns(UserWarning, match="min, max"):
            RandomErasing(**kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RandomErasing()


def test_apply_validation(photos):
    indices = np.arange(len(photos))
    # a value per channel for another channel count: torchvision raises ValueError at make_params
    raises_like_torchvision(lambda: RandomErasing(p=1.0, value=(1.0, 2.0)).apply(
        photos, RandomErasing(p=1.0).table(0, 0, indices, H, W), 0, 0, indices),
        lambda: T2.RandomErasing(p=1.0, value=(1.0, 2.0))(photos[0]))
    e = RandomErasing(p=1.0)
    with pytest.raises(ValueError, match="batch of 12"):
        e.apply(photos, e.table(0, 0, indices[:5], H, W), 0, 0, indices)
    big = e.table(0, 0, indices, 2 * H, 2 * W)
    s = int(((big[:, 0] + big[:, 2] > H) | (big[:, 1] + big[:, 3] > W)).nonzero()[0, 0])
    with pytest.raises(ValueError, match=f"sample {s} "):
        e.apply(photos, big, 0, 0, indices)
    with pytest.raises(TypeError, match="float"):
        e.apply((photos * 50).to(torch.uint8), e.table(0, 0, indices, H, W), 0, 0, indices)
