"""fastload.transforms.policies against torchvision.transforms.v2's own AutoAugment / RandAugment /
TrivialAugmentWide: the distribution of (op, magnitude) draws, the parameters each op gets, the geometric
matrices (pixel for pixel against torchvision's affine/rotate), independence and determinism of the draws."""
import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy import stats
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import _auto_augment
from torchvision.transforms.v2 import functional as TF

from fastload.transforms import policies as P
from fastload.transforms.functional import OPS

N = 100_000  # fastload's draws per policy, as issue 16 asks
# torchvision's draws: 100k calls cost 10-30 s per policy on the 2-core machine, so 10k; test_chi2_has_power shows
# that 10k against 100k still detects a 2-point shift of one op's frequency. Both sides are seeded: deterministic.
N_TV = 10_000
H, W = 176, 200  # the canvas: TranslateX/Y magnitudes of AutoAugment/RandAugment depend on it

PAIRS = [  # (fastload policy, torchvision policy) with the same arguments
    (P.TrivialAugmentWide(), v2.TrivialAugmentWide()),
    (P.RandAugment(), v2.RandAugment()),
    (P.RandAugment(num_ops=3, magnitude=-3, num_magnitude_bins=11), v2.RandAugment(3, -3, 11)),
    (P.AutoAugment(), v2.AutoAugment()),
    (P.AutoAugment(v2.AutoAugmentPolicy.SVHN), v2.AutoAugment(v2.AutoAugmentPolicy.SVHN)),
]
IDS = ["trivialaugment", "randaugment", "randaugment-3-m-3-b11", "autoaugment-imagenet", "autoaugment-svhn"]


def _key(name, magnitude):
    return f"{name}:{round(magnitude, 4) + 0.0:g}"  # + 0.0: -0.0 (a negated zero bin) is the zero bin


_TV_CACHE = {}


def _torchvision_draws(tv, n):
    key = (repr(tv), n)
    if key not in _TV_CACHE:
        _TV_CACHE[key] = _torchvision_draws_uncached(tv, n)
    return _TV_CACHE[key]


def _torchvision_draws_uncached(tv, n):
    """One category per call: the ordered (op, magnitude) list that _apply_image_or_video_transform received."""
    calls, current = [], []
    tv = copy.copy(tv)  # the recording method is set on a copy: the shared instance stays torchvision's

    def record(image, transform_id, magnitude, interpolation, fill):
        current.append(_key(transform_id, magnitude))
        return image

    tv._apply_image_or_video_transform = record
    image = torch.zeros(3, H, W, dtype=torch.uint8)  # only its size is read: the ops are recorded, not run
    torch.manual_seed(0)
    for _ in range(n):
        tv(image)
        calls.append("|".join(current))
        current.clear()
    return calls


def _fastload_draws(policy, n, seed=0, epoch=0):
    op, magnitude, applied = policy.draws(seed, epoch, np.arange(n), H, W)
    names = policy.op_names
    pairs, inverse = np.unique(np.stack([op.ravel(), np.round(magnitude.ravel(), 4) + 0.0]), axis=1,
                               return_inverse=True)
    labels = np.array([_key(names[int(o)], m) for o, m in pairs.T] + [""], dtype=object)
    slots = np.where(applied.ravel(), inverse.ravel(), len(labels) - 1).reshape(op.shape)
    return ["|".join(x for x in row if x) for row in zip(*(labels[slots[:, s]] for s in range(op.shape[1])))]


def _two_sample_chi2(a, b):
    """p-value that two samples of categories come from one distribution (categories seen < 10 times in both
    samples together are pooled into one, so that every expected count is large enough for the chi-square)."""
    cats, inverse = np.unique(np.array(a + b, dtype=object).astype(str), return_inverse=True)
    counts = np.zeros((2, len(cats)))
    np.add.at(counts, (np.repeat([0, 1], [len(a), len(b)]), inverse), 1)
    total = counts.sum(0)
    rare = total < 10
    table = np.concatenate([counts[:, ~rare], counts[:, rare].sum(1, keepdims=True)], 1)
    table = table[:, table.sum(0) > 0]
    return stats.chi2_contingency(table)[1], table.shape[1]


def _chi2_joint_and_marginals(ours, tv):
    """p-values of the joint categories (all ops of a call with magnitudes and signs) and of each position's
    marginal (the k-th op applied, with magnitude and sign, or none), which has more power for one op's rate."""
    out = [_two_sample_chi2(ours, tv)]
    for k in range(3):
        pick = lambda draws: [(d.split("|") + ["none"] * 3)[k] if d else "none" for d in draws]  # noqa: E731
        out.append(_two_sample_chi2(pick(ours), pick(tv)))
    return out


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_draws_match_torchvision_distribution(pair):
    ours, tv = pair
    results = _chi2_joint_and_marginals(_fastload_draws(ours, N), _torchvision_draws(tv, N_TV))
    assert results[0][1] > 20  # the joint (ops, magnitudes, signs) categories, not a degenerate test
    for p, categories in results:
        assert p > 0.001, f"{type(ours).__name__}: chi-square p = {p:.2g} over {categories} categories"


def test_chi2_has_power():
    """The distribution test with these sample sizes detects a small error: RandAugment's draws with 2% of the
    samples' first op turned into Identity (2 points more Identity, 1/15 fewer of every other op) fail it."""
    ours = _fastload_draws(P.RandAugment(), N)
    shifted = [("Identity:0|" + d.split("|", 1)[1]) if i % 50 == 0 else d for i, d in enumerate(ours)]
    tv = _torchvision_draws(v2.RandAugment(), N_TV)
    assert min(p for p, _ in _chi2_joint_and_marginals(ours, tv)) > 0.001
    assert min(p for p, _ in _chi2_joint_and_marginals(shifted, tv)) < 0.001  # the threshold the tests use


class _Recorder:
    """Stands in for torchvision.transforms.v2.functional inside _auto_augment: records the op it was asked for."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def op(image, **kwargs):
            self.calls.append((name, kwargs))
            return image
        return op


_TV_FUNCTIONAL = {  # torchvision functional -> (fastload op, keyword holding its parameter)
    "adjust_brightness": ("brightness", "brightness_factor"), "adjust_saturation": ("saturation", "saturation_factor"),
    "adjust_contrast": ("contrast", "contrast_factor"), "adjust_sharpness": ("sharpness", "sharpness_factor"),
    "posterize": ("posterize", "bits"), "solarize": ("solarize", "threshold"), "autocontrast": ("autocontrast", None),
    "equalize": ("equalize", None), "invert": ("invert", None), "affine": ("identity", None),
    "rotate": ("identity", None),
}


@pytest.mark.parametrize("pair", PAIRS, ids=IDS)
def test_table_holds_what_torchvision_passes_to_each_op(pair, monkeypatch):
    """Each drawn op, run through torchvision's own _apply_image_or_video_transform on a uint8 image: the
    functional it calls and its parameter are the table's op code and parameter (geometric ops, Identity and
    ops not applied leave the identity in the slot)."""
    ours, tv = pair
    recorder = _Recorder()
    monkeypatch.setattr(_auto_augment, "F", recorder)
    image = torch.zeros(3, H, W, dtype=torch.uint8)
    n = 3000
    table, _ = ours.plan(7, 2, np.arange(n), H, W)
    op, magnitude, applied = ours.draws(7, 2, np.arange(n), H, W)
    assert table.ops.shape == (n, ours.slots) and table.params.shape == (n, ours.slots, 3)
    assert table.ops.dtype == torch.int64 and table.params.dtype == torch.float32
    seen = set()
    for i in range(n):
        for s in range(ours.slots):
            code, param = table.ops[i, s].item(), table.params[i, s].tolist()
            if not applied[i, s]:
                assert code == 0 and param == [0.0, 0.0, 0.0]
                continue
            recorder.calls.clear()
            tv._apply_image_or_video_transform(image, ours.op_names[op[i, s]], float(magnitude[i, s]),
                                               interpolation=tv.interpolation, fill=tv._fill)
            name, kwargs = recorder.calls[0] if recorder.calls else ("identity", {})
            fl_op, key = _TV_FUNCTIONAL.get(name, ("identity", None))
            seen.add(name)
            assert code == OPS[fl_op], (i, s, name)
            expected = kwargs[key] if key else 0.0
            if name == "solarize":  # the integer threshold that solarizes the same uint8 pixels as torchvision's
                pixels = torch.arange(256, dtype=torch.uint8)
                solarized = TF.solarize(pixels.view(1, 1, 256), threshold=expected).flatten() != pixels
                assert torch.equal(pixels.float() >= param[0], solarized), (i, s, kwargs)
                assert param[0] == int(param[0])
            else:
                # a blend's p1: 1 - the factor torchvision was given, from its double (CONTRACT.md)
                one_minus = float(np.float32(1.0 - expected)) if fl_op in ("contrast", "saturation", "sharpness") \
                    else 0.0
                assert param == [float(np.float32(expected)), one_minus, 0.0], (i, s, name, kwargs)
    assert len(seen) >= 5 and seen & {"rotate", "affine"}


@pytest.fixture(scope="module")
def photo(imagenet_dir):
    path = sorted(Path(imagenet_dir).rglob("*.jpg"))[3]
    img = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)
    assert img.shape[1] >= 256 and img.shape[2] >= 256
    return img


def _nearest(img, matrix, fill):
    """Resample img [3, H, W] by nearest neighbour with matrix (output pixel -> input pixel), numpy float64.
    Also returns, per output pixel, whether its source coordinate lies within 1e-3 of a rounding tie."""
    _, h, w = img.shape
    i, j = np.mgrid[0:h, 0:w].astype(np.float64)
    x = matrix[0, 0] * j + matrix[0, 1] * i + matrix[0, 2]
    y = matrix[1, 0] * j + matrix[1, 1] * i + matrix[1, 2]
    xi, yi = np.rint(x).astype(np.int64), np.rint(y).astype(np.int64)
    inside = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
    src = img.numpy()
    out = np.empty_like(src)
    fill = np.broadcast_to(np.asarray(0.0 if fill is None else fill, np.float64), (3,))
    for c in range(3):
        out[c] = np.where(inside, src[c][np.clip(yi, 0, h - 1), np.clip(xi, 0, w - 1)], np.uint8(round(fill[c])))
    tie = (np.abs(np.abs(x - np.floor(x)) - 0.5) < 1e-3) | (np.abs(np.abs(y - np.floor(y)) - 0.5) < 1e-3)
    return out, tie


@pytest.mark.parametrize("policy,size", [
    (P.TrivialAugmentWide(), (176, 200)), (P.TrivialAugmentWide(fill=128), (176, 176)),
    (P.RandAugment(num_ops=1, magnitude=27), (150, 180)), (P.AutoAugment(v2.AutoAugmentPolicy.SVHN), (160, 144)),
], ids=["ta-176x200", "ta-fill128-square", "ra-m27-150x180", "aa-svhn-160x144"])
def test_geometric_matrix_resamples_like_torchvision(policy, size, photo):
    """For samples whose only op is geometric: torchvision's own op (F.affine / F.rotate through
    _apply_image_or_video_transform, NEAREST) on a real photo equals resampling it by nearest neighbour with
    the planned matrix, except at pixels whose source coordinate is within 1e-3 of a .5 tie, where torchvision's
    float32 grid and this float64 check may round to different neighbours (ShearX by 0.2 about the corner hits
    exact ties, for example)."""
    h, w = size
    img = photo[:, :h, :w].contiguous()
    tv = {P.TrivialAugmentWide: v2.TrivialAugmentWide, P.RandAugment: v2.RandAugment,
          P.AutoAugment: v2.AutoAugment}[type(policy)](fill=policy.fill)
    n = 4000
    op, magnitude, applied = policy.draws(3, 0, np.arange(n), h, w)
    _, maps = policy.plan(3, 0, np.arange(n), h, w)
    extra = P.composed(maps)
    names = np.array(policy.op_names)
    geometric = np.isin(names[op], P._GEOMETRIC) & applied
    single = geometric.sum(1) == 1
    tested = {}
    for i in np.flatnonzero(single):
        s = int(np.flatnonzero(geometric[i])[0])
        name = names[op[i, s]]
        if tested.get(name, 0) >= 3:
            continue
        tested[name] = tested.get(name, 0) + 1
        expected = tv._apply_image_or_video_transform(img, name, float(magnitude[i, s]), interpolation=tv.interpolation,
                                                      fill=tv._fill).numpy()
        got, tie = _nearest(img, extra[i], policy.fill)
        differ = (got != expected).any(0)
        assert not (differ & ~tie).any(), f"{name} {magnitude[i, s]}: {int((differ & ~tie).sum())} pixels differ"
        assert tie.mean() < 0.25  # most pixels are compared exactly (a shear of 1/15 about the corner puts every
        # 15th row on a tie, for example)
    assert set(tested) == {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"} & set(names[op[applied]])
    assert len(tested) >= 3
    # samples without a geometric op get the identity
    assert np.array_equal(extra[~geometric.any(1)], np.broadcast_to(np.eye(3), (int((~geometric.any(1)).sum()), 3, 3)))


def test_rotate_90_on_a_square_canvas_matches_torchvisions_rot90(photo):
    """TrivialAugmentWide's Rotate bin 20 is exactly 90 degrees; torchvision then takes its rot90 fast path on a
    square image (and an affine grid on others): the planned matrix must agree with both, exactly."""
    for h, w in ((176, 176), (160, 200)):
        img = photo[:, :h, :w].contiguous()
        for angle in (90.0, -90.0, 135.0, -135.0):
            expected = v2.functional.rotate(img, angle).numpy()
            got, tie = _nearest(img, P.geometric_matrices("Rotate", [angle], h, w)[0], None)
            assert not ((got != expected).any(0) & ~tie).any(), (h, w, angle)
            if angle in (90.0, -90.0) and h == w:
                assert np.array_equal(got, expected)


def test_two_geometric_ops_keep_their_slots_and_compose_in_order():
    """RandAugment's samples with two geometric ops: each op's map in its own slot (the stage resamples twice, as
    torchvision does), the identity elsewhere; composed (BILINEAR: into the warp) = first op's matrix @ second op's
    (output -> second op's input = first op's output -> first op's input)."""
    ra = P.RandAugment()
    n = 5000
    op, magnitude, applied = ra.draws(11, 0, np.arange(n), H, W)
    table, maps = ra.plan(11, 0, np.arange(n), H, W)
    extra = P.composed(maps)
    names = np.array(ra.op_names)
    geometric = np.isin(names[op], P._GEOMETRIC) & applied
    assert maps.shape == (n, 2, 3, 3)
    assert np.array_equal(maps[~geometric], np.broadcast_to(np.eye(3), (int((~geometric).sum()), 3, 3)))
    assert (table.ops.numpy()[geometric] == 0).all()  # the identity op in a geometric op's slot
    both = np.flatnonzero(geometric.all(1))
    assert len(both) > 50
    for i in both[:60]:
        m = [P.geometric_matrices(names[op[i, s]], magnitude[i, s:s + 1], H, W)[0] for s in range(2)]
        np.testing.assert_allclose(maps[i], np.stack(m), rtol=0, atol=1e-12)
        np.testing.assert_allclose(extra[i], m[0] @ m[1], rtol=0, atol=1e-9)
    # and a shear followed by a translation is not the translation followed by the shear
    sx, tx = P.geometric_matrices("ShearX", [0.3], H, W)[0], P.geometric_matrices("TranslateY", [10.0], H, W)[0]
    assert not np.allclose(sx @ tx, tx @ sx)


@pytest.mark.parametrize("policy", [P.TrivialAugmentWide(), P.RandAugment(), P.AutoAugment()],
                         ids=["ta", "ra", "aa"])
def test_samples_draw_independently(policy):
    """Neighbouring samples of one batch: the joint table of their first ops is independent (chi-square), so
    their agreement rate is the one of independent draws (sum of squared op frequencies)."""
    n = 60_000
    op, _, _ = policy.draws(5, 1, np.arange(n), H, W)
    a, b = op[0::2, 0], op[1::2, 0]
    k = len(policy.op_names)
    joint = np.zeros((k, k))
    np.add.at(joint, (a, b), 1)
    joint = joint[joint.sum(1) > 0][:, joint.sum(0) > 0]
    assert stats.chi2_contingency(joint)[1] > 0.001
    freq = np.bincount(op[:, 0], minlength=k) / n
    agree = (a == b).mean()
    expected = (freq ** 2).sum()
    assert abs(agree - expected) < 5 * math.sqrt(expected * (1 - expected) / len(a))
    if isinstance(policy, P.RandAugment):  # the two ops of one sample are independent too
        joint = np.zeros((k, k))
        np.add.at(joint, (op[:, 0], op[:, 1]), 1)
        assert stats.chi2_contingency(joint)[1] > 0.001


@pytest.mark.parametrize("policy", [P.TrivialAugmentWide(), P.RandAugment(), P.AutoAugment()],
                         ids=["ta", "ra", "aa"])
def test_draws_are_a_function_of_seed_epoch_index(policy):
    idx = np.array([5, 900, 17, 123456, 3])
    table, extra = policy.plan(1, 4, idx, H, W)
    for pos in ([2, 0], [4], [1, 3]):  # the same samples in other batches, other orders
        t2, e2 = policy.plan(1, 4, idx[pos], H, W)
        assert torch.equal(t2.ops, table.ops[pos]) and torch.equal(t2.params, table.params[pos])
        assert np.array_equal(e2, extra[pos])
    many = np.arange(2000)
    a, _, _ = policy.draws(1, 4, many, H, W)
    b, _, _ = policy.draws(1, 5, many, H, W)
    c, _, _ = policy.draws(2, 4, many, H, W)
    policy.stream = 7
    d, _, _ = policy.draws(1, 4, many, H, W)
    policy.stream = 0
    for other in (b, c, d):  # another epoch, seed or stream: about 1 - sum(p^2) of the ops differ
        assert (other[:, 0] != a[:, 0]).mean() > 0.5


def _tv_error(make, image=None):
    """The exception type torchvision raises for these arguments, at construction or on the first image."""
    try:
        t = make()
        if image is not None:
            torch.manual_seed(0)
            for _ in range(200):  # the bad argument is used when a geometric op is drawn
                t(image)
    except Exception as e:  # noqa: BLE001 - the type is what we compare
        return type(e)
    return None


@pytest.mark.parametrize("args", [
    dict(num_ops=-1), dict(num_ops=1.5), dict(magnitude=31), dict(interpolation="sideways"), dict(fill="red"),
    dict(fill={"others": "red"}), dict(interpolation=99),
])
def test_randaugment_validation_like_torchvision(args):
    image = torch.zeros(3, 16, 16, dtype=torch.uint8)
    expected = _tv_error(lambda: v2.RandAugment(**args), image)
    assert expected is not None
    with pytest.raises(expected):
        P.RandAugment(**args)


@pytest.mark.parametrize("cls", ["TrivialAugmentWide", "AutoAugment"])
@pytest.mark.parametrize("args", [dict(interpolation="sideways"), dict(fill="red"), dict(fill=object())])
def test_policy_validation_like_torchvision(cls, args):
    image = torch.zeros(3, 16, 16, dtype=torch.uint8)
    expected = _tv_error(lambda: getattr(v2, cls)(**args), image)
    assert expected is not None
    with pytest.raises(expected):
        getattr(P, cls)(**args)


def test_autoaugment_policy_argument():
    with pytest.raises(_tv_error(lambda: v2.AutoAugment("imagenet"))):
        P.AutoAugment("imagenet")
    # torchvision's enum and fastload's are both accepted and give the same draws
    a = P.AutoAugment(v2.AutoAugmentPolicy.CIFAR10).draws(0, 0, np.arange(100), H, W)
    b = P.AutoAugment(P.AutoAugmentPolicy.CIFAR10).draws(0, 0, np.arange(100), H, W)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_bins_that_are_not_ints_raise_like_torchvision():
    image = torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8)
    for bins in (3.0, None):
        with pytest.raises(TypeError):
            torch.manual_seed(0)
            for _ in range(50):  # until torchvision draws an op that uses the bins
                v2.TrivialAugmentWide(num_magnitude_bins=bins)(image)
        with pytest.raises(TypeError, match="num_magnitude_bins"):
            P.TrivialAugmentWide(num_magnitude_bins=bins)


def test_fewer_than_two_bins_refused():
    # torchvision's Posterize bins divide by num_bins - 1: one bin gives NaN bits rather than an error
    for make in (lambda: P.TrivialAugmentWide(1), lambda: P.RandAugment(magnitude=0, num_magnitude_bins=1)):
        with pytest.raises(ValueError, match="num_magnitude_bins"):
            make()


def test_fill_is_torchvisions_value_for_the_image():
    assert P.TrivialAugmentWide(fill=(1, 2, 3)).fill == [1.0, 2.0, 3.0]
    assert P.RandAugment(fill={tv_tensors.Image: 9, "others": 1}).fill == 9
    assert P.AutoAugment(fill={"others": 4}).fill == 4
    assert P.AutoAugment().fill is None
    assert P.AutoAugment().kind == "policy" and P.AutoAugment().slots == 2 and P.RandAugment(3).slots == 3
