"""fastload.transforms.color: per-sample parameter tables drawn as torchvision.transforms.v2 draws them
(ColorJitter's order and factors, GaussianBlur's sigma, the Random* probabilities), and constructor validation
with torchvision's exception types."""
import copy
import itertools

import numpy as np
import pytest
import torch
from scipy import stats
from torchvision.transforms import v2

from fastload.transforms import color as C
from fastload.transforms.functional import OPS

N = 100_000  # fastload's draws (cheap)
N_TV = 20_000  # torchvision's make_params calls (~50 us each); enough to see a 2% change of a factor's bin


def _hist_p(a, b, lo, hi, bins=20):
    """Two-sample chi-square p-value of the histograms of a and b over [lo, hi]."""
    edges = np.linspace(lo, hi, bins + 1)
    table = np.stack([np.histogram(a, edges)[0], np.histogram(b, edges)[0]])
    assert table.sum() == len(a) + len(b)  # nothing outside the range
    return stats.chi2_contingency(table)[1]


def _cat_p(a, b):
    cats = sorted(set(a) | set(b))
    table = np.array([[a.count(c) for c in cats], [b.count(c) for c in cats]])
    return stats.chi2_contingency(table)[1]


JITTERS = [dict(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1),
           dict(brightness=(0.2, 1.7), hue=(-0.5, 0.2)), dict(saturation=0.9)]


@pytest.mark.parametrize("args", JITTERS, ids=["all-four", "brightness-hue", "saturation"])
def test_colorjitter_matches_torchvision_sampling(args):
    """The order of the adjustments that are set (a uniform permutation, what torchvision's randperm(4) induces on
    them) and each factor's distribution, against torchvision's make_params."""
    ours = C.ColorJitter(**args)
    tv = v2.ColorJitter(**args)
    names = [n for n in ("brightness", "contrast", "saturation", "hue") if getattr(tv, n) is not None]
    assert ours.slots == len(names)
    table = ours.table(0, 0, np.arange(N))
    codes, params = table.ops.numpy(), table.params[..., 0].numpy()
    by_code = {OPS[n]: n for n in names}
    our_orders = ["-".join(by_code[c] for c in row) for row in codes]
    our_factors = {n: params[codes == OPS[n]] for n in names}
    assert all(len(f) == N for f in our_factors.values())  # every set adjustment once per sample

    torch.manual_seed(0)
    img = torch.zeros(3, 1, 1, dtype=torch.uint8)
    tv_orders, tv_factors = [], {n: [] for n in names}
    fn_name = ("brightness", "contrast", "saturation", "hue")
    for _ in range(N_TV):
        p = tv.make_params([img])
        tv_orders.append("-".join(fn_name[i] for i in p["fn_idx"].tolist() if fn_name[i] in names))
        for n in names:
            tv_factors[n].append(p[f"{n}_factor"])
    assert len(set(our_orders)) == len(list(itertools.permutations(names)))
    assert _cat_p(our_orders, tv_orders) > 0.001
    for n in names:
        lo, hi = getattr(tv, n)
        assert lo <= our_factors[n].min() and our_factors[n].max() <= hi
        assert _hist_p(our_factors[n], np.array(tv_factors[n]), lo, hi) > 0.001, n


def test_colorjitter_hist_test_has_power():
    """The factor test above detects a range 3% too narrow at the top (what a wrong bound would give)."""
    ours = C.ColorJitter(brightness=(0.5, 1.47)).table(0, 0, np.arange(N)).params[:, 0, 0].numpy()
    tv = v2.ColorJitter(brightness=(0.5, 1.5))
    torch.manual_seed(0)
    theirs = np.array([tv.make_params([torch.zeros(3, 1, 1, dtype=torch.uint8)])["brightness_factor"]
                       for _ in range(N_TV)])
    assert _hist_p(ours, theirs, 0.5, 1.5) < 0.001


def test_gaussian_blur_sigma_matches_torchvision():
    ours = C.GaussianBlur((5, 9), sigma=(0.1, 2.0))
    table = ours.table(3, 1, np.arange(N))
    assert (table.ops == OPS["gaussian_blur"]).all()
    assert (table.params[:, 0, 0] == 5).all() and (table.params[:, 0, 1] == 9).all()  # (kernel x, kernel y)
    tv = v2.GaussianBlur((5, 9), sigma=(0.1, 2.0))
    torch.manual_seed(0)
    theirs = [tv.make_params([torch.zeros(3, 1, 1)])["sigma"][0] for _ in range(N_TV)]
    assert _hist_p(table.params[:, 0, 2].numpy(), np.array(theirs), 0.1, 2.0) > 0.001
    fixed = C.GaussianBlur(3, sigma=1.5).table(0, 0, np.arange(10)).params[:, 0]
    assert (fixed == torch.tensor([3.0, 3.0, 1.5])).all()


RANDOM_APPLY = [  # (fastload, torchvision, op, parameter torchvision passes to the functional)
    (C.RandomInvert(0.3), v2.RandomInvert(0.3), "invert", 0.0),
    (C.RandomAutocontrast(), v2.RandomAutocontrast(), "autocontrast", 0.0),
    (C.RandomEqualize(0.9), v2.RandomEqualize(0.9), "equalize", 0.0),
    (C.RandomGrayscale(), v2.RandomGrayscale(), "grayscale", 0.0),
    (C.RandomPosterize(3, p=0.7), v2.RandomPosterize(3, p=0.7), "posterize", 3.0),
    # threshold 191.5 solarizes uint8 pixels >= 192: the table holds that integer (exact in float32)
    (C.RandomSolarize(191.5, p=0.2), v2.RandomSolarize(191.5, p=0.2), "solarize", 192.0),
    # torch compares the uint8 image with the threshold in float32: 170.0000051 is 170.0, the pixels at 170 invert
    (C.RandomSolarize(255 * 0.6666666865348816, p=0.2), v2.RandomSolarize(255 * 0.6666666865348816, p=0.2), "solarize",
     170.0),
    (C.RandomAdjustSharpness(2.5), v2.RandomAdjustSharpness(2.5), "sharpness", (2.5, -1.5)),  # p1: 1 - factor
]


@pytest.mark.parametrize("ours,tv,op,param", RANDOM_APPLY, ids=[r[2] for r in RANDOM_APPLY])
def test_random_apply_rate_and_parameter(ours, tv, op, param):
    """Applied with probability p per sample (binomial test on 100k draws; torchvision's forward applies when
    rand(1) < p, checked on 20k calls of its own forward with the kernel call recorded)."""
    table = ours.table(0, 0, np.arange(N))
    applied = (table.ops[:, 0] == OPS[op]).numpy()
    assert ((table.ops[:, 0] == 0).numpy() | applied).all()
    param = param if isinstance(param, tuple) else (param, 0.0)
    assert (table.params[applied, 0] == torch.tensor([*param, 0.0])).all()
    assert (table.params[~applied] == 0).all()
    assert stats.binomtest(int(applied.sum()), N, tv.p).pvalue > 0.001
    calls = []
    tv = copy.copy(tv)  # record on a copy: the shared instance stays torchvision's
    tv.transform = lambda inpt, params: calls.append(1) or inpt
    torch.manual_seed(0)
    img = torch.zeros(3, 1, 1, dtype=torch.uint8)
    for _ in range(N_TV):
        tv(img)
    assert _cat_p([1] * int(applied.sum()) + [0] * int(N - applied.sum()),
                  [1] * len(calls) + [0] * (N_TV - len(calls))) > 0.001


def test_grayscale_always_with_torchvisions_default():
    for n in (1, 3):  # 1 (the default) makes one-channel batches: test_pipeline's grayscale tests
        table = C.Grayscale(num_output_channels=n).table(0, 0, np.arange(50))
        assert (table.ops == OPS["grayscale"]).all()
    assert C.Grayscale().num_output_channels == v2.Grayscale().num_output_channels == 1
    with pytest.raises(ValueError):
        C.Grayscale(2)


def test_tables_are_per_sample_and_keyed_by_index():
    t = C.ColorJitter(0.4, 0.4, 0.4, 0.1)
    idx = np.array([7, 1000, 3, 99999])
    full = t.table(2, 5, idx)
    for pos in ([1], [3, 0], [2, 1, 0]):
        part = t.table(2, 5, idx[pos])
        assert torch.equal(part.ops, full.ops[pos]) and torch.equal(part.params, full.params[pos])
    many = np.arange(4000)
    a = t.table(2, 5, many)
    for other in (t.table(2, 6, many), t.table(3, 5, many)):
        assert (other.params != a.params).any(2).all(1).float().mean() > 0.99  # every factor redrawn
    t.stream = 1001
    assert (t.table(2, 5, many).params != a.params).any(2).all(1).float().mean() > 0.99
    # neighbours in a batch are independent: the order of sample 2k and 2k+1 (24 x 24 table) is
    orders = a.ops.numpy() @ np.array([1000, 100, 10, 1])
    _, first = np.unique(orders[0::2], return_inverse=True)
    _, second = np.unique(orders[1::2], return_inverse=True)
    joint = np.zeros((24, 24))
    np.add.at(joint, (first, second), 1)
    assert stats.chi2_contingency(joint)[1] > 0.001


def _tv_error(make, image):
    try:
        make()(image)
    except Exception as e:  # noqa: BLE001 - the type is what we compare
        return type(e)
    return None


BAD = [
    ("ColorJitter", dict(brightness=-0.1)), ("ColorJitter", dict(contrast=(1.5, 0.5))),
    ("ColorJitter", dict(saturation=[1, 2, 3])), ("ColorJitter", dict(hue=0.6)), ("ColorJitter", dict(hue="x")),
    ("ColorJitter", dict(hue=(-0.7, 0.1))),
    ("GaussianBlur", dict(kernel_size=4)), ("GaussianBlur", dict(kernel_size=(3, 5, 7))),
    ("GaussianBlur", dict(kernel_size=3, sigma=0)), ("GaussianBlur", dict(kernel_size=3, sigma=(2.0, 1.0))),
    ("GaussianBlur", dict(kernel_size=3, sigma="a")), ("GaussianBlur", dict(kernel_size=3, sigma=(1, 2, 3))),
    ("GaussianBlur", dict(kernel_size=3, sigma=("a", 1))), ("GaussianBlur", dict(kernel_size=-1)),
    ("GaussianBlur", dict(kernel_size=(3.0, 5.0))), ("GaussianBlur", dict(kernel_size=(True, 3))),
    ("RandomInvert", dict(p=1.5)), ("RandomGrayscale", dict(p=-0.1)),
    ("RandomPosterize", dict(bits=9, p=1.0)), ("RandomPosterize", dict(bits=2.5, p=1.0)),
    ("RandomPosterize", dict(bits=4, p=2.0)),
    ("RandomSolarize", dict(threshold=256, p=1.0)), ("RandomAdjustSharpness", dict(sharpness_factor=-1, p=1.0)),
    ("RandomAutocontrast", dict(p=-1)), ("RandomEqualize", dict(p=1.01)), ("Grayscale", dict(num_output_channels=2)),
]


@pytest.mark.parametrize("name,args", BAD, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD)])
def test_validation_like_torchvision(name, args):
    """The exception type torchvision raises (at construction, or on the first uint8 image for the checks it
    defers: posterize bits, solarize threshold, sharpness factor, grayscale channels), at construction."""
    expected = _tv_error(lambda: getattr(v2, name)(**args), torch.zeros(3, 8, 8, dtype=torch.uint8))
    assert expected is not None
    with pytest.raises(expected):
        getattr(C, name)(**args)


def test_transform_interface():
    for t in (C.ColorJitter(0.1), C.RandomInvert(), C.GaussianBlur(3), C.Grayscale(3)):
        assert t.kind == "photometric" and t.stream == 0
        table = t.table(0, 0, np.arange(5))
        assert table.ops.shape == (5, t.slots) and table.params.shape == (5, t.slots, 3)
        assert table.ops.dtype == torch.int64 and table.params.dtype == torch.float32
    assert C.ColorJitter().slots == 0 and C.ColorJitter(brightness=(1, 1)).slots == 0  # identity, as torchvision


@pytest.mark.parametrize("threshold", [0, 0.5, 17.00000088661909, 127.5, 170.0000051, 191.5, 238.00000101327896, 255])
def test_solarize_thresholds_invert_the_pixels_torchvision_inverts(threshold):
    """torch compares the uint8 image with a float threshold in float32: the table's integer threshold must pick
    exactly the pixels torchvision's solarize inverts (RandomSolarize and the policies' Solarize bins)."""
    from torchvision.transforms.v2 import functional as TF
    from fastload.transforms.functional import solarize_threshold
    pixels = torch.arange(256, dtype=torch.uint8).view(1, 1, 256)
    inverted = TF.solarize(pixels, threshold=threshold) != pixels
    assert torch.equal(pixels.float() >= float(solarize_threshold(threshold)), inverted)
    table = C.RandomSolarize(threshold, p=1.0).table(0, 0, np.arange(4))
    assert (table.params[:, 0, 0] == float(solarize_threshold(threshold))).all()
