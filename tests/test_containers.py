"""RandomChoice, RandomApply and RandomOrder of photometric transforms (fastload.transforms.containers), drawn per sample:
choice and apply rates against torchvision's own forward, tables equal to the chosen children's, draws independent
between neighbours, nested containers, validation like torchvision's, and the loader's batches on real photos equal
to torchvision's ops applied sample by sample with the same draws (DeiT III's 3-Augment, SimCLR's colour
distortion)."""
import copy
import math

import numpy as np
import pytest
import torch
from scipy import stats
from torchvision.transforms import v2

import fastload as fl
import fastload.transforms as T
from fastload import ops
from fastload.transforms.functional import OPS
from test_functional import _tv_table  # tests/test_functional.py: a table's slots through torchvision, in order
from like_torchvision import raises_like_torchvision  # tests/like_torchvision.py

N = 100_000  # fastload's draws (cheap)
N_TV = 20_000  # calls of torchvision's own forward


def _three_augment():
    """DeiT III's 3-Augment choice in torchvision's spelling: one of grayscale, solarize, blur per image."""
    return T.RandomChoice([T.RandomGrayscale(p=1.0), T.RandomSolarize(128, p=1.0), T.GaussianBlur(5, (0.1, 2.0))],
                          p=[1, 2, 3])


def _tv_forward_counts(tv, n):
    """How often torchvision's own forward of ``tv`` calls each of its children (replaced by recorders), n calls."""
    tv = copy.copy(tv)
    calls = []
    tv.transforms = [(lambda k: lambda *inputs: calls.append(k) or inputs[0])(k) for k in range(len(tv.transforms))]
    torch.manual_seed(0)
    img = torch.zeros(3, 1, 1, dtype=torch.uint8)
    for _ in range(n):
        tv(img)
    return np.bincount(np.asarray(calls, dtype=np.int64), minlength=len(tv.transforms))


def test_random_choice_frequencies_match_torchvision():
    """Per sample, child k with probability p[k]: goodness of fit on 100k draws, and against torchvision's forward
    (20k calls, its multinomial draw) by a two-sample chi-square test."""
    ours = _three_augment()
    ours.stream = 1003
    choices = ours.choices(0, 0, np.arange(N))
    counts = np.bincount(choices, minlength=3)
    assert stats.chisquare(counts, N * np.asarray(ours.p)).pvalue > 0.001
    theirs = _tv_forward_counts(v2.RandomChoice([v2.RandomGrayscale(1.0)] * 3, p=[1, 2, 3]), N_TV)
    assert ours.p == v2.RandomChoice([v2.RandomGrayscale(1.0)] * 3, p=[1, 2, 3]).p
    assert stats.chi2_contingency(np.stack([counts, theirs]))[1] > 0.001
    # the test has power: a 10% shift of one probability is seen
    assert stats.chisquare(counts, N * np.array([1 / 6 * 1.1, 2 / 6, 3 / 6 - 1 / 60])).pvalue < 1e-6


def test_random_choice_table_is_the_chosen_childs():
    """Sample i's slots are its chosen child's (drawn on the child's own stream, as the child alone would draw
    them), then identity up to the widest child."""
    jitter = T.ColorJitter(0.4, 0.4, 0.4, 0.1)  # 4 slots
    ours = T.RandomChoice([T.RandomGrayscale(p=1.0), jitter, T.GaussianBlur(3)])
    ours.stream = 1004
    idx = np.arange(3000) * 7 + 11
    table, chosen = ours.table(2, 5, idx), ours.choices(2, 5, idx)
    assert ours.slots == 4 and table.ops.shape == (3000, 4) and table.params.shape == (3000, 4, 3)
    assert set(np.unique(chosen)) == {0, 1, 2}
    for k, child in enumerate(ours.transforms):
        rows = torch.from_numpy(chosen == k)
        own = child.table(2, 5, idx)
        assert torch.equal(table.ops[rows, :child.slots], own.ops[rows])
        assert torch.equal(table.params[rows, :child.slots], own.params[rows])
        assert (table.ops[rows, child.slots:] == OPS["identity"]).all()
        assert (table.params[rows, child.slots:] == 0).all()
    # the choice does not steer the child's draws: the jitter's brightness factors of the samples that chose it
    # are distributed as all of its draws
    own = jitter.table(2, 5, np.arange(N))
    picked = torch.from_numpy(ours.choices(2, 5, np.arange(N)) == 1)
    factors = own.params[..., 0][own.ops == OPS["brightness"]]
    chosen_factors = own.params[picked][..., 0][own.ops[picked] == OPS["brightness"]]
    edges = np.linspace(0.6, 1.4, 21)
    h_all, h_chosen = np.histogram(factors, edges)[0], np.histogram(chosen_factors, edges)[0]
    assert stats.chi2_contingency(np.stack([h_all - h_chosen, h_chosen]))[1] > 0.001


def test_random_apply_rate_and_table_match_torchvision():
    """With probability p per sample all children in order (their slots one after another), else identity:
    binomial test on 100k draws and two-sample test against torchvision's forward."""
    ours = T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(p=1.0)], p=0.8)
    ours.stream = 1005
    idx = np.arange(N)
    applied = ours.applied(0, 0, idx)
    assert stats.binomtest(int(applied.sum()), N, 0.8).pvalue > 0.001
    theirs = _tv_forward_counts(v2.RandomApply([v2.RandomGrayscale(1.0)], p=0.8), N_TV)[0]
    assert stats.chi2_contingency(np.array([[applied.sum(), N - applied.sum()], [theirs, N_TV - theirs]]))[1] > 0.001
    table = ours.table(0, 0, idx[:5000])
    rows = torch.from_numpy(applied[:5000])
    parts = [t.table(0, 0, idx[:5000]) for t in ours.transforms]
    assert ours.slots == 5 and table.ops.shape == (5000, 5)
    assert torch.equal(table.ops[rows], torch.cat([p.ops for p in parts], 1)[rows])
    assert torch.equal(table.params[rows], torch.cat([p.params for p in parts], 1)[rows])
    assert (table.ops[~rows] == OPS["identity"]).all() and (table.params[~rows] == 0).all()
    assert (T.RandomApply([T.RandomGrayscale(1.0)], p=0.0).table(0, 0, idx[:100]).ops == 0).all()
    assert (T.RandomApply([T.RandomGrayscale(1.0)], p=1.0).table(0, 0, idx[:100]).ops == OPS["grayscale"]).all()


def test_neighbours_draw_independently_and_nested_containers_too():
    """Samples 2k and 2k+1 of a batch choose independently (3 x 3 contingency); two nested containers at two
    positions of one pipeline draw independently of each other down to their grandchildren (whose streams are
    hashed: shifting a derived stream again would wrap modulo 2^64 to the same stream in both)."""
    ours = _three_augment()
    ours.stream = 1003
    chosen = ours.choices(0, 0, np.arange(N))
    joint = np.zeros((3, 3))
    np.add.at(joint, (chosen[0::2], chosen[1::2]), 1)
    assert stats.chi2_contingency(joint)[1] > 0.001
    nested = T.RandomApply([T.RandomChoice([T.RandomGrayscale(0.5), T.RandomSolarize(128, 0.5)])], p=1.0)
    pipe = T.Pipeline.build(T.Compose([T.RandomResizedCrop(32), nested, nested]))
    grandchildren = [g for t in pipe.photometric for g in t.transforms[0].transforms]
    assert len({g.stream % (1 << 64) for g in grandchildren}) == 4
    idx = np.arange(N)
    first, second = (t.table(0, 0, idx).ops[:, 0].numpy() for t in pipe.photometric)
    codes = {OPS["identity"]: 0, OPS["grayscale"]: 1, OPS["solarize"]: 2}
    first, second = (np.vectorize(codes.get)(v) for v in (first, second))
    joint = np.zeros((3, 3))
    np.add.at(joint, (first, second), 1)
    assert stats.chi2_contingency(joint)[1] > 0.001
    assert (np.bincount(first, minlength=3) / N > [0.45, 0.2, 0.2]).all()


def test_a_transform_listed_twice_draws_twice_and_compose_children_run_in_order():
    """As torchvision calls a transform object once per listing: RandomApply([j, j]) and Compose([..., j, j]) draw
    j's factors independently for each listing; a Compose child of RandomChoice runs all its transforms."""
    j = T.ColorJitter(brightness=0.4)
    twice = T.RandomApply([j, j], p=1.0)
    twice.stream = 1006
    table = twice.table(0, 0, np.arange(1000))
    assert (table.params[:, 0, 0] != table.params[:, 1, 0]).all()
    pipe = T.Pipeline.build(T.Compose([T.RandomResizedCrop(32), j, j]))
    table = pipe.table(0, 0, np.arange(1000))
    assert (table.params[:, 0, 0] != table.params[:, 1, 0]).all()
    choice = T.RandomChoice([T.Compose([T.RandomGrayscale(1.0), T.RandomInvert(1.0)]), T.RandomSolarize(128, 1.0)])
    choice.stream = 1007
    ops = choice.table(0, 0, np.arange(1000)).ops
    grayed = ops[:, 0] == OPS["grayscale"]
    assert grayed.any() and (ops[grayed, 1] == OPS["invert"]).all()
    assert (ops[~grayed] == torch.tensor([OPS["solarize"], OPS["identity"]])).all()


def test_random_order_is_uniform_like_torchvisions_and_keeps_each_childs_slots():
    """Per sample, the children's slot blocks in a uniformly drawn order: the 6 orders of 3 children against
    uniform (100k draws) and against torchvision's forward (20k calls, its randperm); each block holds the child's
    own rows."""
    children = [T.ColorJitter(brightness=0.4, contrast=0.4), T.RandomGrayscale(1.0), T.RandomSolarize(128, 1.0)]
    ours = T.RandomOrder(children)
    ours.stream = 1008
    idx = np.arange(N)
    order = ours.orders(0, 0, idx)
    codes = order @ np.array([9, 3, 1])
    counts = np.bincount(codes, minlength=27)[np.unique(codes)]
    assert len(counts) == 6 and stats.chisquare(counts).pvalue > 0.001
    tv = copy.copy(v2.RandomOrder([v2.RandomGrayscale(1.0)] * 3))
    seen = []
    tv.transforms = [(lambda k: lambda *inputs: seen.append(k) or inputs[0])(k) for k in range(3)]
    torch.manual_seed(0)
    for _ in range(N_TV):
        tv(torch.zeros(3, 1, 1, dtype=torch.uint8))
    theirs = np.bincount(np.asarray(seen).reshape(-1, 3) @ np.array([9, 3, 1]), minlength=27)[np.unique(codes)]
    assert stats.chi2_contingency(np.stack([counts, theirs]))[1] > 0.001
    table = ours.table(0, 0, idx[:2000])
    parts = [t.table(0, 0, idx[:2000]) for t in ours.transforms]
    assert ours.slots == 4 and table.ops.shape == (2000, 4)
    for i in range(0, 2000, 97):
        expect_ops = torch.cat([parts[k].ops[i] for k in order[i]])
        expect_params = torch.cat([parts[k].params[i] for k in order[i]])
        assert torch.equal(table.ops[i], expect_ops) and torch.equal(table.params[i], expect_params)
    for args in ((children[1],), ([],)):
        raises_like_torchvision(lambda: T.RandomOrder(*args), lambda: v2.RandomOrder(*args))
    with pytest.raises(TypeError, match="RandomOrder picks among photometric.*; RandomRotation.* is not one"):
        T.RandomOrder([T.RandomRotation(5)])


def test_validation_like_torchvision_and_refused_children_named():
    gray = T.RandomGrayscale(1.0)
    for args in ((gray,), ([],), ([gray], [1, 2])):
        raises_like_torchvision(lambda: T.RandomChoice(*args), lambda: v2.RandomChoice(*args))
    # a negative weight: torchvision's multinomial raises at the first image, fastload when the pipeline is built
    for p in ([-1, 2], [0, 0], [1, -1], [math.inf, 1]):  # (torchvision: ZeroDivisionError when built for zero sums)
        raises_like_torchvision(lambda: T.RandomChoice([gray, gray], p=p),
                                lambda: v2.RandomChoice([v2.RandomGrayscale(1.0)] * 2, p=p)(torch.zeros(3, 2, 2)))
    for args, kwargs in (((gray,), {}), (([],), {}), (([gray],), dict(p=1.5)), (([gray],), dict(p=-0.1))):
        raises_like_torchvision(lambda: T.RandomApply(*args, **kwargs), lambda: v2.RandomApply(*args, **kwargs))
    for children in ([T.RandomRotation(10), gray], [gray, T.TrivialAugmentWide()], [gray, v2.RandomGrayscale()]):
        name = type(children[0] if children[0] is not gray else children[1]).__name__
        with pytest.raises(TypeError, match=f"RandomChoice picks among photometric.*or batch ops.*; {name}.* is not one"):
            T.RandomChoice(children)
        with pytest.raises(TypeError, match=f"RandomApply picks among photometric.*per sample; {name}.* is not one"):
            T.RandomApply(children)
    with pytest.raises(TypeError, match=r"is not one \(a torchvision transform object: use fastload.transforms."
                                        r"ColorJitter"):  # an import mixed up
        T.RandomChoice([gray, v2.ColorJitter(0.4)])
    with pytest.raises(TypeError, match="per batch, not both: RandomGrayscale.* and MixUp"):
        T.RandomChoice([T.MixUp(num_classes=4), gray])
    with pytest.raises(TypeError, match="RandomApply picks among photometric.*; MixUp.* is not one"):
        T.RandomApply([gray, T.MixUp(num_classes=4)])
    assert T.RandomChoice([T.MixUp(num_classes=4), T.CutMix(num_classes=4)]).kind == "batch"
    assert T.RandomChoice([gray]).kind == "photometric" == T.RandomApply([gray]).kind


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("recipe", ["3-augment", "simclr"])
def test_batches_equal_torchvision_per_sample(imagenet_dir, recipe, device):
    """FastLoader's uint8 batches: the planned crops warped to uint8, then, per sample, torchvision's functional ops
    in the order and with the parameters of the pipeline's table: its containers' choices included. Exact but for
    samples that were blurred: the blur is within one level of torchvision's (test_functional), and the ColorJitter
    after it (factors up to 1.4) can stretch that one level to two."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    middle = {"3-augment": [_three_augment(), T.ColorJitter(0.3, 0.3, 0.3)],
              "simclr": [T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), T.RandomGrayscale(p=0.2),
                         T.RandomApply([T.GaussianBlur(9, (0.1, 2.0))], p=0.5)]}[recipe]
    ds = fl.FolderDataset(imagenet_dir)
    n = 16
    loader = fl.FastLoader(ds, batch_size=n, shuffle=False, device=device,
                           transform=T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), *middle]))
    x, _ = next(iter(loader))
    loader.close()
    idx = np.arange(n)
    pipe = loader.pipeline
    plan = pipe.plan(np.asarray(ds.heights)[idx], np.asarray(ds.widths)[idx], 0, 0, idx)
    with ds.reader() as r:
        data, offsets, shapes, status, _ = ops.decode_crops([r.get(i) for i in range(n)], plan.windows)
    assert int(status.abs().sum()) == 0
    # the warp on the loader's device (CUDA's rows round differently from the CPU's by up to 0.024 levels: README)
    u8 = ops.warp_ragged(*(t.to(device) for t in (data, offsets, shapes, plan.matrices)), 40, in_scale=1.0,
                         out_dtype=torch.uint8).cpu()
    table = pipe.table(0, 0, idx)
    ref = torch.stack([_tv_table(u8[i], table.ops[i], table.params[i]) for i in range(n)])
    assert x.dtype == torch.uint8 and x.shape == ref.shape
    diff = (x.cpu().int() - ref.int()).abs()
    blurred = (table.ops == OPS["gaussian_blur"]).any(1)
    assert blurred.any() and (~blurred).any()
    assert diff[~blurred].max() == 0
    assert diff[blurred].max() <= 2
    # the choices differ between samples of the batch
    assert len({tuple(row) for row in table.ops.tolist()}) > 3


def test_a_no_op_child_keeps_the_samples_that_pick_it(imagenet_dir):
    """RandomChoice([Identity(), RandomInvert(1.0)]): each sample is its crop as it is or inverted, by its own
    draw (torchvision runs Identity as a child too; it was refused); RandomOrder and RandomApply take no-ops too."""
    ds = fl.FolderDataset(imagenet_dir)
    crop = [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]

    def batch(*middle):
        loader = fl.FastLoader(ds, batch_size=48, shuffle=False, seed=3, transform=T.Compose(crop + list(middle)))
        return next(iter(loader))[0], loader

    plain, _ = batch(T.Identity())
    chosen, loader = batch(T.RandomChoice([T.Identity(), T.RandomInvert(1.0)]))
    picks = loader.pipeline.photometric[0].choices(3, 0, np.arange(48))
    assert 10 < int(picks.sum()) < 38  # both children picked, per sample
    for i in range(48):
        assert torch.equal(chosen[i], 255 - plain[i] if picks[i] else plain[i])
    assert torch.equal(batch(T.RandomOrder([T.Identity(), T.RandomInvert(1.0)]))[0], 255 - plain)
    assert torch.equal(batch(T.RandomApply([T.ToImage(), T.Identity()], p=0.5))[0], plain)
    assert repr(T.RandomChoice([T.Identity()])) == "RandomChoice([Identity()], p=[1.0])"
    with pytest.raises(TypeError, match="RGB"):  # not a no-op after Grayscale(): still refused in a container
        T.RandomChoice([T.RGB(), T.RandomInvert()])
