"""MixUp, CutMix (fastload.transforms.mixing), RandomChoice of them (fastload.transforms.containers) on batches of real photos: outputs against references
built sample by sample from the un-mixed batch, torchvision's own transform, Beta and box distributions."""
import math

import numpy as np
import pytest
import scipy.stats as st
import torch
import torchvision.transforms.v2 as T2
from PIL import Image

from fastload.transforms.containers import RandomChoice
from fastload.transforms.mixing import CutMix, MixUp, beta_from_uniforms, _COLUMNS
from fastload import rng

from distributions import chi2_same  # tests/distributions.py
from like_torchvision import raises_like_torchvision  # tests/like_torchvision.py

H, W = 24, 40  # small, non-square: rows and columns cannot be swapped unnoticed
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CUDA = pytest.param("cuda", marks=pytest.mark.cuda)
MODES = ("batch", "pair", "elem")


@pytest.fixture(scope="module")
def photos(imagenet_dir):
    """(x float32 [13, 3, H, W] normalised, y int64 [13] class indices): 13 real photos of 4 classes (odd: the
    middle sample of pair mode is covered)."""
    paths = sorted(imagenet_dir.glob("class_*/*.jpg"))[::4][:13]
    imgs = [np.asarray(Image.open(p).convert("RGB").resize((W, H), Image.BILINEAR)) for p in paths]
    x = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).float().div(255)
    x = (x - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    y = torch.tensor([int(p.parent.name.split("_")[1]) for p in paths])
    assert len(set(y.tolist())) == 4
    return x, y


def one_hot(y, n=4):
    return torch.nn.functional.one_hot(y, n).float()


def expected_partner(mode, b):
    return [(i - 1) % b if mode == "batch" else b - 1 - i for i in range(b)]


def reference_targets(y, p):
    """Target i = lam_i * one_hot(y_i) + (1 - lam_i) * one_hot(y_partner), with torchvision's float32 weights."""
    oh = one_hot(y)
    return torch.stack([oh[j] * np.float32(1.0 - lam) + oh[i] * np.float32(lam)
                        for i, (j, lam) in enumerate(zip(p.partner, p.lam))])


# ---------------------------------------------------------------- outputs against per-sample references

@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("mode", MODES)
def test_mixup_is_the_convex_combination_its_parameters_name(photos, mode, device):
    x, y = photos
    b = len(x)
    m = MixUp(alpha=0.8, num_classes=4, mode=mode)
    p = m.params(7, 2, 5, b, H, W)
    assert list(p.partner) == expected_partner(mode, b)
    ref = torch.stack([x[j] * np.float32(1.0 - lam) + x[i] * np.float32(lam)
                       for i, (j, lam) in enumerate(zip(p.partner, p.lam))])
    before = x.clone()
    out, target = m.apply(x.to(device), y.to(device), 7, 2, 5)
    assert torch.equal(x, before)  # the input is not modified
    assert out.device.type == target.device.type == device
    # mul and add are correctly rounded in IEEE float32 on CPU and CUDA alike: the CUDA output is bit-exact too
    assert torch.equal(out.cpu(), ref)
    assert torch.equal(target.cpu(), reference_targets(y, p))
    # float32 lam and 1 - lam sum to 1 within one float32 rounding each
    torch.testing.assert_close(target.sum(1).cpu(), torch.ones(b), rtol=0, atol=2e-7)
    if mode == "batch":
        assert len(set(p.lam)) == 1
    else:
        assert all(p.lam[i] == p.lam[b - 1 - i] for i in range(b)) if mode == "pair" else len(set(p.lam)) == b
    assert ((p.lam > 0.01) & (p.lam < 0.99)).any()  # real mixing happened (alpha 0.8: most lambdas are inside)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("mode", MODES)
def test_cutmix_pastes_the_box_its_parameters_name(photos, mode, device):
    x, y = photos
    b = len(x)
    m = CutMix(alpha=1.0, num_classes=4, mode=mode)
    pasted = []
    for batch_index in range(6):
        p = m.params(3, 1, batch_index, b, H, W)
        assert list(p.partner) == expected_partner(mode, b)
        ref = x.clone()
        shares = []
        for i, ((y1, y2, x1, x2), j) in enumerate(zip(p.box, p.partner)):
            ref[i, :, y1:y2, x1:x2] = x[j, :, y1:y2, x1:x2]
            inside = torch.zeros(H, W, dtype=torch.bool)
            inside[y1:y2, x1:x2] = True
            shares.append(inside.sum().item() / (H * W))
            pasted.append((y1, y2, x1, x2))
        out, target = m.apply(x.to(device), y.to(device), 3, 1, batch_index)
        assert torch.equal(out.cpu(), ref)
        # the target weight of the partner is its share of the pixels (lambda corrected for the clipped box)
        np.testing.assert_allclose(1.0 - p.lam, shares, rtol=0, atol=1e-12)
        assert torch.equal(target.cpu(), reference_targets(y, p))
        torch.testing.assert_close(target.sum(1).cpu(), torch.ones(b), rtol=0, atol=2e-7)
    pasted = np.array(pasted)
    assert (pasted[:, 1] > pasted[:, 0]).mean() > 0.5  # most boxes are not empty
    clipped = (pasted[:, 0] == 0) | (pasted[:, 1] == H) | (pasted[:, 2] == 0) | (pasted[:, 3] == W)
    assert clipped.any() and not clipped.all()  # both kinds of box were exercised


@pytest.mark.parametrize("cls", [MixUp, CutMix])
def test_batch_mode_equals_torchvision_with_the_same_parameters(photos, cls):
    """torchvision's own transform() given our lambda (and box) produces exactly our batch and targets."""
    x, y = photos
    m = cls(alpha=1.0, num_classes=4)
    tv = getattr(T2, cls.__name__)(alpha=1.0, num_classes=4)
    for batch_index in range(4):
        p = m.params(11, 0, batch_index, len(x), H, W)
        params = {"labels": y, "batch_size": len(x), "lam": float(p.lam[0]), "lam_adjusted": float(p.lam[0])}
        if p.box is not None:
            y1, y2, x1, x2 = (int(v) for v in p.box[0])
            params["box"] = (x1, y1, x2, y2)  # torchvision's order
        out, target = m.apply(x, y, 11, 0, batch_index)
        assert torch.equal(out, tv.transform(x, params))
        assert torch.equal(target, tv.transform(y, params))


def test_soft_labels_are_mixed_as_given(photos):
    x, y = photos
    soft = torch.softmax(x.mean((2, 3)) @ torch.ones(3, 4).cumsum(1), 1)  # real-valued, rows summing to 1
    for m in (MixUp(alpha=1.0, mode="elem"), CutMix(alpha=1.0, num_classes=4, mode="pair")):
        p = m.params(0, 0, 1, len(x), H, W)
        _, target = m.apply(x, soft, 0, 0, 1)
        ref = torch.stack([soft[j] * np.float32(1 - lam) + soft[i] * np.float32(lam)
                           for i, (j, lam) in enumerate(zip(p.partner, p.lam))])
        assert torch.equal(target, ref)


# ---------------------------------------------------------------- determinism and distributions

def test_elem_lambdas_differ_across_the_batch_and_repeat_across_runs(photos):
    x, y = photos
    for cls in (MixUp, CutMix):
        m = cls(alpha=1.0, num_classes=4, mode="elem")
        m.stream = 1003
        p = m.params(5, 3, 17, len(x), H, W)
        assert len(np.unique(p.lam)) == len(x)
        again = cls(alpha=1.0, num_classes=4, mode="elem")
        again.stream = 1003
        q = again.params(5, 3, 17, len(x), H, W)
        assert np.array_equal(p.lam, q.lam) and (p.box is None or np.array_equal(p.box, q.box))
        a, b = m.apply(x, y, 5, 3, 17), again.apply(x, y, 5, 3, 17)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        for other in ((5, 3, 18), (5, 4, 17), (6, 3, 17)):  # the batch index, epoch and seed each change the draw
            assert not np.array_equal(m.params(*other, len(x), H, W).lam, p.lam)
        # element i's draw does not depend on the batch size (lam: CutMix's depends on the box, drawn the same)
        assert np.array_equal(m.params(5, 3, 17, 5, H, W).lam[:3], p.lam[:3])


@pytest.mark.parametrize("alpha", [0.2, 1.0, 2.0])
def test_lambdas_are_beta_alpha_alpha(alpha):
    """Kolmogorov-Smirnov against scipy's Beta(alpha, alpha), on min(lam, 1 - lam) (whose CDF is 2 F): near 1
    lam itself rounds to 1.0 in float64 where the Beta CDF has mass, near 0 the value is exact."""
    lam = MixUp(alpha=alpha, num_classes=4, mode="elem").params(0, 0, 0, 4000, H, W).lam
    assert st.kstest(np.minimum(lam, 1 - lam), lambda t: 2 * st.beta(alpha, alpha).cdf(t)).pvalue > 1e-3
    # batch mode: one lambda per batch, the same distribution over batches
    m = MixUp(alpha=alpha, num_classes=4)
    lam = np.array([m.params(1, 0, k, 2, H, W).lam[0] for k in range(1000)])
    assert st.kstest(np.minimum(lam, 1 - lam), lambda t: 2 * st.beta(alpha, alpha).cdf(t)).pvalue > 1e-3
    # the sampler itself, straight from uniforms
    lam = beta_from_uniforms(alpha, rng.uniforms(2, 0, np.arange(4000), _COLUMNS))
    assert st.kstest(np.minimum(lam, 1 - lam), lambda t: 2 * st.beta(alpha, alpha).cdf(t)).pvalue > 1e-3


def test_cutmix_boxes_follow_torchvision():
    """Box area share and corners over many draws: ours (elem mode, one call) against torchvision's make_params."""
    n = 3000
    ours = CutMix(alpha=1.0, num_classes=4, mode="elem").params(0, 0, 0, n, H, W)
    tv = T2.CutMix(alpha=1.0, num_classes=4)
    torch.manual_seed(0)
    img = torch.empty(3, H, W)
    theirs = [tv.make_params([img]) for _ in range(n)]
    assert chi2_same(ours.lam, np.array([t["lam_adjusted"] for t in theirs])) > 1e-3
    tv_box = np.array([t["box"] for t in theirs])  # (x1, y1, x2, y2)
    for k, col in enumerate((1, 3, 0, 2)):  # our (y1, y2, x1, x2)
        assert chi2_same(ours.box[:, k], tv_box[:, col]) > 1e-3


# ---------------------------------------------------------------- RandomChoice

def test_random_choice_picks_with_p_per_batch(photos):
    x, y = photos
    mix, cut = MixUp(alpha=0.2, num_classes=4), CutMix(alpha=1.0, num_classes=4)
    rc = RandomChoice([mix, cut], p=[1, 3])
    assert rc.p == T2.RandomChoice([T2.Identity(), T2.Identity()], p=[1, 3]).p
    rc.stream = 1007
    mix, cut = rc.transforms  # the container's own copies (a transform listed twice draws twice)
    streams = {rc.stream, mix.stream, cut.stream}
    assert len(streams) == 3  # each child draws from its own stream
    picks = np.array([rc.choose(0, 0, k) for k in range(2000)])
    assert st.binomtest(int((picks == 1).sum()), len(picks), 0.75).pvalue > 1e-3
    assert np.array_equal(picks, [rc.choose(0, 0, k) for k in range(2000)])
    for k in (int(np.argmax(picks == 0)), int(np.argmax(picks == 1))):
        chosen = (mix, cut)[picks[k]]
        out, target = rc.apply(x, y, 0, 0, k)
        ref_out, ref_target = chosen.apply(x, y, 0, 0, k)
        assert torch.equal(out, ref_out) and torch.equal(target, ref_target)


# ---------------------------------------------------------------- validation like torchvision

@pytest.fixture(autouse=True)
def _distribution_checks_on():
    """torchvision's MixUp/CutMix refuse a bad alpha through torch.distributions.Beta's argument checks, which a
    torch.compile anywhere earlier in the process turns off globally (Distribution.set_default_validate_args(False)):
    the reference must see them on."""
    before = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(True)
    yield
    torch.distributions.Distribution.set_default_validate_args(before)


@pytest.mark.parametrize("kwargs", [dict(alpha=0.0), dict(alpha=-1.0), dict(alpha=math.nan), dict(alpha="x"),
                                    dict(alpha=None), dict(alpha="1"), dict(labels_getter="labels")])
@pytest.mark.parametrize("name", ["MixUp", "CutMix"])
def test_constructor_validation_like_torchvision(name, kwargs):
    ours, theirs = globals()[name], getattr(T2, name)
    raises_like_torchvision(lambda: ours(num_classes=4, **kwargs), lambda: theirs(num_classes=4, **kwargs))


@pytest.mark.parametrize("name", ["MixUp", "CutMix"])
def test_a_labels_getter_function_is_refused_not_ignored(name):
    """torchvision calls it to find the labels; FastLoader hands the op the dataset's labels, so it never would."""
    getattr(T2, name)(num_classes=4, labels_getter=lambda inputs: inputs[1])
    with pytest.raises(ValueError, match="never be called"):
        globals()[name](num_classes=4, labels_getter=lambda inputs: inputs[1])
    # None: torchvision finds no labels and raises at the first batch; fastload says so when the op is built
    batch = (torch.zeros(2, 3, 4, 4), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="The labels must be a tensor, but got <class 'NoneType'>"):
        getattr(T2, name)(num_classes=4, labels_getter=None)(*batch)
    with pytest.raises(ValueError, match="labels_getter=None gives MixUp/CutMix no labels"):
        globals()[name](num_classes=4, labels_getter=None)


@pytest.mark.parametrize("name", ["MixUp", "CutMix"])
def test_keyword_only_arguments_and_mode(name):
    ours, theirs = globals()[name], getattr(T2, name)
    raises_like_torchvision(lambda: ours(1.0), lambda: theirs(1.0))
    with pytest.raises(ValueError, match="mode"):
        ours(mode="batches")


def test_apply_validation_like_torchvision(photos):
    x, y = photos
    cases = [(dict(), x, y),  # index labels without num_classes
             (dict(num_classes=5), x, one_hot(y)),  # soft labels with the wrong num_classes
             (dict(num_classes=4), x, y[:5]),  # batch sizes differ
             (dict(num_classes=4), x[0], y),  # not a batch
             (dict(num_classes=4), x, y[:, None, None])]  # labels of 3 dims
    for kwargs, xb, yb in cases:
        for name in ("MixUp", "CutMix"):
            raises_like_torchvision(lambda: globals()[name](**kwargs).apply(xb, yb, 0, 0, 0),
                                    lambda: getattr(T2, name)(**kwargs)(xb, yb))
    for value in (4, -1):  # torchvision's one_hot raises RuntimeError; fastload names the sample
        bad = y.clone()
        bad[6] = value
        raises_like_torchvision(lambda: MixUp(num_classes=4).apply(x, bad, 0, 0, 0),
                                lambda: T2.MixUp(num_classes=4)(x, bad))
        with pytest.raises(RuntimeError, match=f"label {value} of sample 6"):
            MixUp(num_classes=4).apply(x, bad, 0, 0, 0)


@pytest.mark.parametrize("name", ["MixUp", "CutMix"])
def test_alpha_and_num_classes_types_raise_like_torchvision(photos, name):
    """torchvision takes these in its constructor and raises at the first batch; fastload when built."""
    x, y = photos
    for kwargs in (dict(alpha=True, num_classes=4), dict(num_classes=4.0), dict(num_classes="4")):
        raises_like_torchvision(lambda: globals()[name](**kwargs), lambda: getattr(T2, name)(**kwargs)(x, y))
    assert globals()[name](num_classes=np.int64(4)).num_classes == 4
    for bad in (0, -1):  # torchvision's one_hot takes -1 as the width of each batch: targets that change width
        with pytest.raises(ValueError, match="num_classes must be at least 1"):
            globals()[name](num_classes=bad)


def test_random_choice_validation_like_torchvision():
    for args in ((MixUp(num_classes=4),), ([],), ([MixUp(num_classes=4)], [1, 2])):
        raises_like_torchvision(lambda: RandomChoice(*args), lambda: T2.RandomChoice(*args))
    with pytest.raises(TypeError, match="or batch ops .MixUp, CutMix., per batch; Identity"):
        RandomChoice([MixUp(num_classes=4), T2.Identity()])


@pytest.mark.cuda
def test_cuda_batch_with_host_labels(photos):
    """Labels arriving on the host with a CUDA batch: targets on the batch's device, equal to the CPU run."""
    x, y = photos
    m = CutMix(alpha=1.0, num_classes=4, mode="elem")
    out, target = m.apply(x.cuda(), y, 0, 0, 2)
    ref_out, ref_target = m.apply(x, y, 0, 0, 2)
    assert target.is_cuda and torch.equal(out.cpu(), ref_out) and torch.equal(target.cpu(), ref_target)
