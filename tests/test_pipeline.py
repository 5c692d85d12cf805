"""FastLoader(transform=...): the pipeline end to end on real photos (the parts have their own test files)."""
import enum
import functools

import numpy as np
import pytest
import torch
import torchvision.transforms.v2 as TV
import torchvision.transforms.v2.functional as TF

import fastload as fl
import fastload.transforms as T
from fastload import benchmark, ops
from fastload.loader import IMAGENET_MEAN, IMAGENET_STD
from fastload.transforms.functional import apply_table
from test_functional import _tv_table  # tests/test_functional.py: a table's slots through torchvision, in order


def _policy_pipeline(size=48, extra=(), fill=None):
    rotate = [T.RandomRotation(15, fill=fill)] if fill is not None else []
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), *rotate, T.TrivialAugmentWide(fill=fill),
                      T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ToDtype(torch.float32, scale=True),
                      T.Normalize(IMAGENET_MEAN, IMAGENET_STD), *extra])


@pytest.mark.parametrize("fill", [None, [124, 116, 104]], ids=["no-fill", "per-channel-fill"])
def test_batch_equals_the_stage_composed_by_hand(imagenet_dir, fill):
    """A batch is: planned windows decoded, warped to uint8 (rounded), the policy's NEAREST rotate/shear/translate
    gathered from that (test_affine_nearest: torchvision's), the photometric table applied by the reference ops
    (exact to torchvision per sample: test_functional), then normalised. With a per-channel fill (timm's mean
    pixel; a RandomRotation before the policy too), each channel's uncovered pixels take its own value."""
    ds = fl.FolderDataset(imagenet_dir)
    loader = fl.FastLoader(ds, batch_size=8, shuffle=False, transform=_policy_pipeline(fill=fill))
    x, y = next(iter(loader))
    idx = np.arange(8)
    pipe = loader.pipeline
    plan = pipe.plan(np.asarray(ds.heights)[idx], np.asarray(ds.widths)[idx], 0, 0, idx)
    with ds.reader() as r:
        data, offsets, shapes, status, _ = ops.decode_crops([r.get(i) for i in range(8)], plan.windows)
    assert int(status.abs().sum()) == 0
    fills = [0.0] if fill is None else fill
    u8 = ops.warp_ragged(data, offsets, shapes, plan.matrices, 48, in_scale=1.0, out_dtype=torch.uint8, fill=fills)
    if fill is not None:  # the rotation's corners: each channel its own fill
        corners = (u8 == torch.tensor(fill, dtype=torch.uint8)[:, None, None]).all(1)
        assert int(corners.sum()) > 8 * 20
    extra = pipe._policy_maps(0, 0, idx)
    assert 0 < int((extra != np.eye(3)).any(axis=(1, 2)).sum()) < 8  # some samples rotate/shear/translate
    u8 = ops.affine_nearest(u8, torch.from_numpy(extra[:, :2]).float(), fill=fills)  # the identity copies the others
    table = pipe.table(0, 0, idx)
    assert table.ops.shape == (8, 1 + 4)  # TrivialAugmentWide's slot, then ColorJitter's four
    ref = apply_table(u8, table.ops, table.params).float() / 255
    ref = (ref - torch.tensor(IMAGENET_MEAN)[:, None, None]) / torch.tensor(IMAGENET_STD)[:, None, None]
    # The stage folds (x / 255 - mean) / std into one multiply-add: float32 rounding apart, 1e-5 of ~[-2, 3].
    torch.testing.assert_close(x, ref, atol=1e-5, rtol=0)
    assert torch.equal(y, torch.as_tensor(np.asarray(ds.labels)[idx]))


@pytest.mark.cuda
def test_cuda_per_channel_fill_follows_the_cpu(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    tf = _policy_pipeline(64, fill=[124, 116, 104])
    cpu = [x for x, _ in fl.FastLoader(ds, batch_size=16, seed=5, transform=tf)]
    gpu = [x.cpu() for x, _ in fl.FastLoader(ds, batch_size=16, seed=5, transform=tf, device="cuda")]
    diff = torch.cat([(a - b).abs().flatten() for a, b in zip(cpu, gpu)])
    assert float(diff.mean()) < 2e-3 and float(diff.quantile(0.999)) <= 0.1


def test_same_batches_whatever_the_threads_and_after_resume(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    tf = _policy_pipeline(extra=[T.RandomErasing(0.5)])
    one = [x for x, _ in fl.FastLoader(ds, batch_size=8, seed=3, threads=1, workers=1, transform=tf)]
    two = fl.FastLoader(ds, batch_size=8, seed=3, threads=4, workers=3, transform=tf)
    it = iter(two)
    first = [next(it)[0] for _ in range(2)]
    state = two.state_dict()
    two.close()
    resumed = fl.FastLoader(ds, batch_size=8, seed=3, threads=4, transform=tf)
    resumed.load_state_dict(state)
    rest = [x for x, _ in resumed]
    assert len(one) == len(first) + len(rest)
    for a, b in zip(one, first + rest):
        assert torch.equal(a, b)
    other = next(iter(fl.FastLoader(ds, batch_size=8, seed=4, transform=tf)))[0]
    assert not torch.equal(one[0], other)


def test_batch_ops_give_soft_targets(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    tf = _policy_pipeline(extra=[T.RandomChoice([T.MixUp(alpha=0.2, num_classes=4), T.CutMix(alpha=1.0,
                                                                                               num_classes=4)])])
    x, y = next(iter(fl.FastLoader(ds, batch_size=8, transform=tf)))
    assert x.shape == (8, 3, 48, 48) and y.shape == (8, 4) and y.dtype == torch.float32
    torch.testing.assert_close(y.sum(1), torch.ones(8))


def test_batch_ops_mix_batch_k_with_batch_ks_draws(imagenet_dir):
    """MixUp/CutMix run where the batch is finished (producer on CPU, side stream on CUDA) with parameters drawn
    when the batch was made: batch k equals the un-mixed pipeline's batch k mixed by the op for (seed, epoch, k)."""
    ds = fl.FolderDataset(imagenet_dir)
    mix = T.RandomChoice([T.MixUp(alpha=0.2, num_classes=4), T.CutMix(alpha=1.0, num_classes=4)])
    loader = fl.FastLoader(ds, batch_size=8, seed=2, transform=_policy_pipeline(extra=[mix]))
    mixed = list(loader)
    plain = list(fl.FastLoader(ds, batch_size=8, seed=2, transform=_policy_pipeline()))
    assert len(mixed) == len(plain) == 6
    mix = loader.pipeline.batch_ops[0]  # the pipeline's copy, with the stream of its position
    for k, ((xm, ym), (xp, yp)) in enumerate(zip(mixed, plain)):
        xr, yr = mix.apply(xp, yp, 2, 0, k)
        assert torch.equal(xm, xr) and torch.equal(ym, yr), k
    assert len({mix.choose(2, 0, k) for k in range(6)}) == 2  # both ops were exercised


def test_each_rank_draws_its_own_batch_ops(imagenet_dir):
    """Under torchrun each rank's batch k mixes with the draws of global batch k * world_size + rank (every rank
    drew the same lambda, box and MixUp/CutMix choice at each step: one draw for the whole global batch)."""
    ds = fl.FolderDataset(imagenet_dir)
    mix = T.RandomChoice([T.MixUp(alpha=0.2, num_classes=4), T.CutMix(alpha=1.0, num_classes=4)])
    ranks = [fl.FastLoader(ds, batch_size=4, seed=2, rank=r, world_size=2, transform=_policy_pipeline(extra=[mix]))
             for r in range(2)]
    plain = [list(fl.FastLoader(ds, batch_size=4, seed=2, rank=r, world_size=2, transform=_policy_pipeline()))
             for r in range(2)]
    op = ranks[0].pipeline.batch_ops[0]
    for r, loader in enumerate(ranks):
        for k, ((xm, ym), (xp, yp)) in enumerate(zip(loader, plain[r])):
            xr, yr = op.apply(xp, yp, 2, 0, 2 * k + r)
            assert torch.equal(xm, xr) and torch.equal(ym, yr), (r, k)
    draws = [op.plan(2, 0, g, 4, 48, 48) for g in range(8)]  # (MixUp or CutMix, weights) per global batch
    assert len({(c, float(w[0, 0])) for c, w in draws}) == 8


def test_uint8_output_without_todtype(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    x, _ = next(iter(fl.FastLoader(ds, batch_size=4, transform=T.Compose([T.RandomResizedCrop(32),
                                                                         T.RandomEqualize(p=1.0)]))))
    assert x.dtype == torch.uint8 and int(x.max()) == 255  # equalize stretches every image to the full range


def test_skipped_samples_get_their_replacements_parameters(imagenet_dir, tmp_path):
    """on_error="skip": the photometric table follows the sample that replaced a broken one."""
    import shutil
    root = tmp_path / "ds"
    shutil.copytree(imagenet_dir, root)
    first_class = sorted(p for p in root.iterdir() if p.is_dir())[0]
    victim = sorted(first_class.iterdir())[0]
    data = victim.read_bytes()
    victim.write_bytes(data[:len(data) // 2] + b"\xff\xd9")  # half the scan, EOI re-appended
    ds = fl.FolderDataset(root)
    loader = fl.FastLoader(ds, batch_size=len(ds), shuffle=False, on_error="skip", transform=_policy_pipeline())
    maker = loader._maker
    from fastload.producer import Slot
    batch = maker.make(np.arange(len(ds)), 0, Slot(pin=False))
    assert batch.counts["skipped"] >= 1
    assert batch.indices[0] != 0  # sample 0 was replaced
    expected = loader.pipeline.table(0, 0, batch.indices)
    assert torch.equal(batch.params.table.ops, expected.ops) and torch.equal(batch.params.table.params,
                                                                             expected.params)


def my_augmentation(x):
    return x


@pytest.mark.parametrize("bad, error, words", [
    (lambda: T.Compose([T.RandomResizedCrop(32), lambda im: im]), TypeError, "not a fastload transform"),
    (lambda: T.Compose([T.RandomResizedCrop(32), T.Lambda(lambda im: im)]), TypeError, "a Python function"),
    (lambda: T.Compose([T.RandomResizedCrop(32), TV.ColorJitter(0.4)]), TypeError, "fastload.transforms.ColorJitter"),
    (lambda: T.Compose([T.RandomResizedCrop(32), TV.ElasticTransform()]), TypeError, "no equivalent"),
    (lambda: T.Compose([T.ColorJitter(0.4), T.RandomResizedCrop(32)]), ValueError, "geometry first"),
    (lambda: T.Compose([T.RandomResizedCrop(32), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]), ValueError,
     "ToDtype(torch.float32, scale=True)"),
    (lambda: T.Compose([T.ColorJitter(0.4)]), ValueError, "fix the output size"),
    (lambda: T.Compose([T.RandomResizedCrop(32), T.MixUp(num_classes=4), T.ToDtype(torch.float32, scale=True)]),
     ValueError, "must come last"),
    # torchvision would solarize the float image (threshold 0.5 on 0-1): fastload's ops run on uint8
    (lambda: T.Compose([T.RandomResizedCrop(32), T.ToDtype(torch.float32, scale=True), T.RandomSolarize(0.5)]),
     ValueError, "comes after ToDtype"),
    # torchvision normalises the erased value too; fastload erases the normalised batch
    (lambda: T.Compose([T.RandomResizedCrop(32), T.ToDtype(torch.float32, scale=True), T.RandomErasing(1.0),
                        T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]), ValueError, "after RandomErasing"),
    (lambda: T.Compose([T.RandomResizedCrop(32), T.ToDtype(torch.float32, scale=True), T.Normalize([0.5] * 3, [0.5] * 3),
                        T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]), ValueError, "after another Normalize"),
    (lambda: T.Compose([T.RandomResizedCrop(32), T.ToDtype(torch.float32, scale=True),
                        T.Normalize(IMAGENET_MEAN, IMAGENET_STD), T.ToDtype(torch.uint8, scale=True)]),
     ValueError, "converts the image once"),
    # torchvision would carry (and normalise) values rounded to the narrower type
    (lambda: T.Compose([T.RandomResizedCrop(32), T.ToDtype(torch.bfloat16, scale=True), T.ToDtype(torch.float32)]),
     ValueError, "rounded to torch.bfloat16"),
    (lambda: T.Compose([T.RandomResizedCrop(32), T.ToDtype(torch.float32, scale=True), T.ToDtype(torch.float16),
                        T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]), ValueError, "after a float-to-float ToDtype"),
    # a user's own function, however wrapped, by its name (not "builtins.function")
    (lambda: T.Compose([T.RandomResizedCrop(32), my_augmentation]), TypeError, "test_pipeline.my_augmentation"),
    (lambda: T.Compose([T.RandomResizedCrop(32), functools.partial(my_augmentation)]), TypeError,
     "functools.partial(test_pipeline.my_augmentation)"),
    (lambda: T.Compose([T.RandomResizedCrop(32), T.Lambda(my_augmentation)]), TypeError,
     "Lambda(test_pipeline.my_augmentation)"),
    (lambda: T.Compose([T.RandomResizedCrop(32), T.ToDtype(torch.float32, scale=True), T.Normalize([], [])]),
     RuntimeError, "one value, or one per channel"),
])
def test_what_fastload_cannot_run_is_refused_naming_it(imagenet_dir, bad, error, words):
    ds = fl.FolderDataset(imagenet_dir)
    with pytest.raises(error) as e:
        fl.FastLoader(ds, batch_size=4, transform=bad())
    assert words in str(e.value)
    if "fastload runs these transforms" in str(e.value):  # the list names transforms, and only transforms
        listed = str(e.value).split("arguments: ")[1].split(". Import")[0].split(", ")
        assert {"TrivialAugmentWide", "RandomErasing", "Normalize"} <= set(listed)
        assert all(isinstance(getattr(T, n), type) and not issubclass(getattr(T, n), enum.Enum) for n in listed)
        assert "AutoAugmentPolicy" not in listed and "Pipeline" not in listed


def test_a_tensor_p_works_as_in_torchvision(imagenet_dir):
    """torchvision keeps a 0-d tensor p and compares with it; the same draws as the float."""
    ds = fl.FolderDataset(imagenet_dir)

    def first(p):
        tf = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(p), T.RandomApply([T.RandomInvert(p)], p),
                        T.RandomGrayscale(p), T.ToDtype(torch.float32, scale=True), T.RandomErasing(p)])
        return next(iter(fl.FastLoader(ds, batch_size=8, seed=2, transform=tf)))[0]

    assert torch.equal(first(torch.tensor(0.5)), first(0.5))
    with pytest.raises(ValueError, match="interval"):
        T.RandomInvert(torch.tensor(1.5))


def test_a_transform_shared_by_two_pipelines_keeps_each_pipelines_draws(imagenet_dir):
    """Pipelines copy their transforms: the stream a position gives a shared object in one pipeline does not
    change the draws of another pipeline that holds it elsewhere."""
    ds = fl.FolderDataset(imagenet_dir)
    policy = T.TrivialAugmentWide()
    first = fl.FastLoader(ds, batch_size=8, seed=1, transform=T.Compose([T.RandomResizedCrop(48), policy]))
    before = next(iter(first))[0]
    fl.FastLoader(ds, batch_size=8, seed=1, transform=T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(),
                                                                 policy]))
    first.set_epoch(0)  # its first batch again (a new iteration goes on after the batch taken)
    assert torch.equal(next(iter(first))[0], before)


def test_transform_and_shorthand_arguments_are_one_way(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    with pytest.raises(ValueError, match="transform= replaces mean"):
        fl.FastLoader(ds, transform=_policy_pipeline(), mean=(0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="transform= replaces crop"):
        fl.FastLoader(ds, transform=_policy_pipeline(), crop=fl.RandomResizedCrop(32))


def test_bench_specs_build_the_same_pipeline_for_both_loaders():
    for spec in benchmark.TRANSFORMS:
        ours, theirs, batch_op = benchmark.pipelines(spec, 176, num_classes=4)
        theirs = theirs.transforms + ([batch_op] if batch_op is not None else [])  # the recipe's collate_fn
        assert [type(t).__name__ for t in ours.transforms] == [type(t).__name__ for t in theirs]
    from fastload import cli
    assert cli.build_parser().parse_args(["bench", "d", "--transform", "randaugment"]).transform == "randaugment"
    bench = next(a for a in cli.build_parser()._subparsers._group_actions if a.choices).choices["bench"]
    choices = next(a.choices for a in bench._actions if a.dest == "transform")
    assert tuple(choices) == benchmark.TRANSFORMS  # `fastload bench --transform` lists what benchmark can build


def test_a_harmless_libjpeg_warning_is_decoded_and_counted(imagenet_dir, tmp_path):
    """Strict mode keeps a JPEG whose only fault is junk between header markers (Pillow decodes it to the same
    pixels) and counts it in stats()['warnings'] (issue 19 item 16)."""
    import shutil

    from test_native_validation import _insert_before  # tests/ is on sys.path (conftest)
    root = tmp_path / "ds"
    shutil.copytree(imagenet_dir, root)
    first_class = sorted(p for p in root.iterdir() if p.is_dir())[0]
    victim = sorted(first_class.iterdir())[0]
    clean = victim.read_bytes()
    victim.write_bytes(_insert_before(clean, 0xDB, b"\x12\x34\x56"))
    ds = fl.FolderDataset(root)
    assert len(ds) == len(fl.FolderDataset(imagenet_dir))  # the scan kept it
    loader = fl.FastLoader(ds, batch_size=4, shuffle=False, crop=fl.CenterCrop(32), strict=True)
    x, _ = next(iter(loader))
    reference = next(iter(fl.FastLoader(fl.FolderDataset(imagenet_dir), batch_size=4, shuffle=False,
                                        crop=fl.CenterCrop(32))))[0]
    assert torch.equal(x, reference)  # the junk changes no pixel
    assert loader.stats()["warnings"] == 1 and loader.stats()["skipped"] == 0


def _assert_same(a, b, where="prepared"):
    """a and b hold the same values: nested tuples/lists/dicts of tensors (any device), arrays and plain values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a.cpu(), b.cpu()), where
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (u, v) in enumerate(zip(a, b)):
            _assert_same(u, v, f"{where}.{a._fields[i]}" if hasattr(a, "_fields") else f"{where}[{i}]")
    elif hasattr(a, "__dict__") and not callable(a):  # a transform's plan object
        assert type(a) is type(b), where
        _assert_same(vars(a), vars(b), where)
    else:
        assert a == b, where


@pytest.mark.cuda
@pytest.mark.parametrize("spec", benchmark.TRANSFORMS)
def test_cuda_and_cpu_loaders_draw_identical_parameters(imagenet_dir, spec):
    """Everything random is drawn on the host from (seed, epoch, index): a CUDA loader prepares each batch (crop
    plan, photometric table, policy maps, erasing boxes, MixUp/CutMix draws) exactly as a CPU loader does."""
    ds = fl.FolderDataset(imagenet_dir)
    tf = benchmark.pipelines(spec, 64, num_classes=4)[0]
    cpu = fl.FastLoader(ds, batch_size=8, seed=7, transform=tf)
    gpu = fl.FastLoader(ds, batch_size=8, seed=7, transform=tf, device="cuda")
    indices = np.arange(len(ds))[::-1][:8].copy()
    for epoch, k in ((0, 0), (3, 2)):
        _assert_same(cpu._maker.prepare(indices, epoch, k), gpu._maker.prepare(indices, epoch, k))


@pytest.mark.cuda
@pytest.mark.parametrize("spec", ["trivialaugment", "randaugment", "torchvision_v2", "threeaugment"])
def test_cuda_batches_follow_the_cpu_ones(imagenet_dir, spec):
    """Same draws on both devices (the tables are made on the host), same stage maths. The warps differ by up to
    0.024 pixel values before rounding to uint8 (the CUDA fast path's integer row weights, README), so a pixel can
    land one level apart and an op can move it further (equalize's stretch, posterize's step): compare typical
    error, not every pixel."""
    ds = fl.FolderDataset(imagenet_dir)
    tf = benchmark.pipelines(spec, 64)[0]
    cpu = [x for x, _ in fl.FastLoader(ds, batch_size=16, seed=5, transform=tf)]
    gpu = [x.cpu() for x, _ in fl.FastLoader(ds, batch_size=16, seed=5, transform=tf, device="cuda")]
    diff = torch.cat([(a - b).abs().flatten() for a, b in zip(cpu, gpu)])
    assert float(diff.mean()) < 2e-3 and float(diff.quantile(0.999)) <= 0.1


def test_a_subset_plans_as_the_rows_of_its_batch_plan(imagenet_dir):
    """Plans are per sample (counter RNG of seed, epoch, index): the engines' decoder hands the cores the rows of
    the batch plan for the samples the engines cannot take instead of planning them again; that must be the same."""
    ds = fl.FolderDataset(imagenet_dir)
    for spec in benchmark.TRANSFORMS:
        loader = fl.FastLoader(ds, batch_size=8, transform=benchmark.pipelines(spec, 64, num_classes=4)[0])
        maker = loader._maker
        for epoch in range(2):
            for k, batch in enumerate(loader._epoch_batches(epoch)):
                batch = np.asarray(batch)
                windows, matrices, other = maker.plan(batch, epoch)
                rest = np.arange(k % 2, len(batch), 2)
                w, m, o = maker.plan(batch[rest], epoch)
                rows = torch.from_numpy(rest)
                assert torch.equal(windows[rows], w) and torch.equal(matrices[rows], m), (spec, epoch, k)
                assert np.array_equal(other[rest], o)
        loader.close()


def _planned_together_cases():
    """(name, fastload pipeline): every bench spec, and pipelines whose planning takes other paths (a BILINEAR
    policy composed into the warp, RandomAffine / RandomRotation, RandomErasing with noise, Grayscale(1))."""
    cases = [(spec, benchmark.pipelines(spec, 64, num_classes=4)[0]) for spec in benchmark.TRANSFORMS]
    bilinear = T.InterpolationMode.BILINEAR
    cases += [("bilinear_policy", T.Compose([T.RandomResizedCrop(48), T.RandAugment(interpolation=bilinear)])),
              ("affine", T.Compose([T.Resize(56), T.CenterCrop(48), T.RandomAffine(20, translate=(0.1, 0.1),
                                                                                   shear=10), T.ColorJitter(0.4, 0.4)])),
              ("rotation", T.Compose([T.RandomResizedCrop(40), T.RandomRotation(90, fill=9)])),
              ("erasing_noise", T.Compose([T.RandomResizedCrop(40), T.ToDtype(torch.float32, scale=True),
                                           T.RandomErasing(0.7, value="random")])),
              ("grey", T.Compose([T.RandomResizedCrop(40), T.Grayscale(1), T.RandomAutocontrast(0.5)]))]
    return cases


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_batches_planned_together_are_each_batch_planned_alone(imagenet_dir, device):
    """A planner prepares its producer's next batches in one pass (BatchMaker.prepare_many): each batch must get
    exactly what prepare() gives it alone (windows, matrices, tables, policy maps, erasing boxes, batch ops'
    draws), a short last batch included, with the tables pinned for a GPU. AugMix plans per batch: one at a time."""
    ds = fl.FolderDataset(imagenet_dir)
    for name, tf in _planned_together_cases() + [("augmix", T.Compose([T.RandomResizedCrop(32), T.AugMix()]))]:
        loader = fl.FastLoader(ds, batch_size=7, transform=tf, device=device, seed=3)
        maker = loader._maker
        for epoch in (0, 2):
            batches = loader._epoch_batches(epoch)
            ks = [1, 3, 5, len(batches) - 1]  # a producer's every other batch, and the epoch's short last one
            assert len(batches[ks[-1]]) < 7
            together = maker.prepare_many([batches[k] for k in ks], epoch, ks)
            assert len(together) == (1 if name == "augmix" else len(ks)), name
            for k, prepared in zip(ks, together):
                _assert_same(prepared, maker.prepare(batches[k], epoch, k), f"{name}, epoch {epoch}, batch {k}")
                table = prepared.params.table
                if device == "cuda" and table is not None:
                    assert table.ops.is_pinned() and table.params.is_pinned()
                nearest = prepared.params.nearest
                if device == "cuda" and nearest is not None:
                    assert nearest.packed.is_pinned()
        loader.close()


@pytest.mark.parametrize("workers", [1, 3])
def test_a_planning_error_is_raised_by_its_own_batch(imagenet_dir, workers):
    """Planned several at a time, a batch whose planning fails (here an index that claims a sample is 0 pixels
    high) still raises when the loop reaches it, naming the sample, after the batches before it are delivered."""
    ds = fl.FolderDataset(imagenet_dir)
    loader = fl.FastLoader(ds, batch_size=4, shuffle=False, workers=workers,
                           transform=T.Compose([T.RandomResizedCrop(32), T.TrivialAugmentWide()]))
    loader._maker.heights[9] = 0  # batch 2
    seen = []
    with pytest.raises(ValueError, match="sample 9: image size 0x"):
        for x, _ in loader:
            seen.append(x.shape[0])
    assert seen == [4, 4]
    # in one pass with the batches before it, those come back alone, then it raises when it comes first
    batches = loader._epoch_batches(0)
    assert len(loader._maker.prepare_many(batches[:4], 0, [0, 1, 2, 3])) == 2
    with pytest.raises(ValueError, match="sample 9: image size 0x"):
        loader._maker.prepare_many(batches[2:4], 0, [2, 3])


def test_a_pass_that_fails_where_each_batch_does_not_warns_once(imagenet_dir, monkeypatch):
    """If planning batches together failed where each alone succeeds (a bug of the pass itself), the batches are
    still what prepare() gives them, and a RuntimeWarning says so once instead of planning silently at twice the
    cost."""
    loader = fl.FastLoader(fl.FolderDataset(imagenet_dir), batch_size=4, seed=2,
                           transform=T.Compose([T.RandomResizedCrop(32), T.RandAugment()]))
    maker = loader._maker

    def broken(*args):
        raise IndexError("a bug in the pass")
    monkeypatch.setattr(maker, "_prepare_together", broken)
    batches = loader._epoch_batches(1)
    with pytest.warns(RuntimeWarning, match="IndexError: a bug in the pass"):
        got = maker.prepare_many(batches[:3], 1, [0, 1, 2])
    for k, prepared in enumerate(got):
        _assert_same(prepared, maker.prepare(batches[k], 1, k))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(maker.prepare_many(batches[3:6], 1, [3, 4, 5])) == 3


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_random_crop_with_padding_runs_as_planned(imagenet_dir, device):
    """Resize + RandomCrop(padding, fill) + flip (a low-resolution recipe's geometry) in the loader: the batch is
    the planned windows warped and normalised (the pixels against torchvision: test_geometry), on either device, and
    the padding reaches the batch as the normalised fill."""
    ds = fl.FolderDataset(imagenet_dir)
    tf = T.Compose([T.Resize(72), T.RandomCrop(64, padding=6, fill=50), T.RandomHorizontalFlip(),
                    T.ToDtype(torch.float32, scale=True), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    loader = fl.FastLoader(ds, batch_size=8, shuffle=False, transform=tf, device=device)
    x, _ = next(iter(loader))
    idx = np.arange(8)
    plan = loader.pipeline.plan(np.asarray(ds.heights)[idx], np.asarray(ds.widths)[idx], 0, 0, idx)
    with ds.reader() as r:
        data, offsets, shapes, status, _ = ops.decode_crops([r.get(i) for i in range(8)], plan.windows)
    ref = ops.warp_ragged(data.to(device), offsets.to(device), shapes.to(device), plan.matrices.to(device), 64,
                          mean=IMAGENET_MEAN, std=IMAGENET_STD, fill=50.0)
    # CUDA's fast path rounds its row weights (up to 0.024 levels, README): 1e-3 of the normalised range
    torch.testing.assert_close(x, ref, atol=0 if device == "cpu" else 1e-3, rtol=0)
    fill = (50 / 255 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    border = [(x[i, :, :, 0].cpu() - fill[:, None]).abs().max() < 1e-6 or
              (x[i, :, 0, :].cpu() - fill[:, None]).abs().max() < 1e-6 for i in range(8)]
    assert any(border)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_padding_is_fill_exactly_with_dct_downscale(imagenet_dir, device):
    """Resize + Pad at 1/8 of the photos' size: the decode is DCT-downscaled, and a photo whose width or height is
    not a multiple of 8 ends on a decoded pixel that covers it only in part. The padding is still the fill, on
    every sample and both devices (it once took that pixel's image content: the decoded window, not the image,
    bounded the image), and the image reaches the padding's edge. (A RandomAffine that draws the identity makes
    the geometry per sample: a fixed one decodes at full scale.)"""
    ds = fl.FolderDataset(imagenet_dir)
    n = 32
    odd = np.flatnonzero((np.asarray(ds.widths) % 8 != 0) | (np.asarray(ds.heights) % 8 != 0))[:n]
    assert len(odd) == n
    tf = T.Compose([T.Resize((40, 60)), T.RandomAffine(degrees=0, fill=7), T.Pad(5, fill=7)])
    loader = fl.FastLoader(torch.utils.data.Subset(ds, odd), batch_size=n, shuffle=False, transform=tf,
                           device=device)
    x, _ = next(iter(loader))
    assert x.dtype == torch.uint8 and x.shape == (n, 3, 50, 70)
    inside = torch.zeros(50, 70, dtype=torch.bool)
    inside[5:45, 5:65] = True
    assert torch.all(x[:, :, ~inside] == 7)
    assert loader.pipeline.plan(np.asarray(ds.heights)[odd], np.asarray(ds.widths)[odd], 0, 0,
                                np.arange(n)).windows[:, 4].gt(1).all()
    edge = x[:, :, inside].reshape(n, 3, 40, 60)
    assert (edge[:, :, :, -1] != 7).any() and (edge[:, :, -1, :] != 7).any()


def test_float_casts_uint8_no_ops_and_typed_fills_run_as_torchvision_means_them(imagenet_dir):
    """What torchvision accepts and fastload can run exactly: a float-to-float ToDtype after the conversion (a cast
    of the values), ToDtype(uint8) on the uint8 image (nothing), fill given per tv_tensors type."""
    from torchvision import tv_tensors
    ds = fl.FolderDataset(imagenet_dir)
    first = lambda *tf: next(iter(fl.FastLoader(ds, batch_size=8, shuffle=False, seed=1, transform=T.Compose(tf))))[0]
    crop = (T.RandomResizedCrop(32), T.RandomHorizontalFlip())
    norm = (T.ToDtype(torch.float32, scale=True), T.Normalize(IMAGENET_MEAN, IMAGENET_STD))
    f32 = first(*crop, *norm)
    half = first(*crop, *norm, T.ToDtype(torch.float16))
    assert half.dtype == torch.float16 and torch.equal(half, f32.half())
    assert torch.equal(first(*crop, *norm, T.ToDtype(torch.float32, scale=True)), f32)
    assert torch.equal(first(*crop, T.ToDtype(torch.uint8), *norm), f32)
    assert torch.equal(first(*crop, T.Identity(), *norm, T.ToPureTensor()), f32)  # (a position is a stream)
    plain = first(T.CenterCrop(24), T.Pad(4, fill=128))
    typed = first(T.CenterCrop(24), T.Pad(4, fill={tv_tensors.Image: 128, "others": 0}))
    assert torch.equal(plain, typed) and int((plain[:, :, 0, :] == 128).sum()) == 8 * 3 * 32


def test_interpolation_mode_is_torchvisions_vocabulary():
    """``T.InterpolationMode`` as torchvision's (names and values); the policies refuse, at construction, the
    modes torchvision refuses at the first tensor image it moves (ValueError), and run the two it runs."""
    assert {m.name: m.value for m in T.InterpolationMode} == {m.name: m.value for m in TV.InterpolationMode}
    image = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
    for name in ("BICUBIC", "LANCZOS", "BOX", "NEAREST_EXACT", "HAMMING"):
        with pytest.raises(ValueError):  # torchvision: at the first geometric op it draws
            torch.manual_seed(0)
            for _ in range(50):
                TV.RandAugment(interpolation=TV.InterpolationMode[name])(image)
        for mode in (T.InterpolationMode[name], TV.InterpolationMode[name]):
            with pytest.raises(ValueError, match="unsupported with Tensor input"):
                T.RandAugment(interpolation=mode)
    for name in ("NEAREST", "BILINEAR"):
        assert T.TrivialAugmentWide(interpolation=T.InterpolationMode[name])._interpolation == name.lower()
        assert T.RandomRotation(10, interpolation=T.InterpolationMode[name]).interpolation == T.InterpolationMode[name]


def test_a_policy_of_no_ops_runs_as_torchvision_runs_it(imagenet_dir):
    """RandAugment(num_ops=0) (torchvision: the image unchanged) with NEAREST: no slots, no maps, the crops as they
    are."""
    ds = fl.FolderDataset(imagenet_dir)
    first = lambda *tf: next(iter(fl.FastLoader(ds, batch_size=8, shuffle=False, seed=2, transform=T.Compose(tf))))[0]
    assert torch.equal(first(T.RandomResizedCrop(32), T.RandAugment(num_ops=0)), first(T.RandomResizedCrop(32)))


def _grey_pipeline(mean=(0.5,), std=(0.5,), extra=()):
    return T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.Grayscale(),
                      T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomAutocontrast(0.5), T.RandomGrayscale(0.5),
                      T.ToDtype(torch.float32, scale=True), T.Normalize(mean, std), *extra])


def _torchvision_reference(ds, loader, idx):
    """The loader's batch of these samples composed from torchvision's functional ops on the true channel count:
    the planned windows decoded and warped to uint8 (test_warp: torchvision's resize), then, transform by
    transform and sample by sample, torchvision's op with the drawn parameters (a policy's NEAREST map first,
    affine_nearest: test_affine_nearest), Grayscale / RGB as torchvision's, then ToDtype and Normalize."""
    pipe = loader.pipeline
    h, w = pipe.out_size
    plan = pipe.plan(np.asarray(ds.heights)[idx], np.asarray(ds.widths)[idx], 0, 0, idx)
    with ds.reader() as r:
        data, offsets, shapes, status, _ = ops.decode_crops([r.get(int(i)) for i in idx], plan.windows)
    u8 = ops.warp_ragged(data, offsets, shapes, plan.matrices, (h, w), in_scale=1.0, out_dtype=torch.uint8)
    images = list(u8)
    for t in pipe.photometric:
        if isinstance(t, (T.Grayscale, T.RGB)):
            n = 3 if isinstance(t, T.RGB) else t.num_output_channels
            images = [TF.rgb_to_grayscale(im, n) if im.shape[0] == 3 and isinstance(t, T.Grayscale)
                      else im.repeat(n, 1, 1) if im.shape[0] == 1 and n == 3 else im for im in images]
            continue
        table, maps = pipe._policy_plan(t, 0, 0, idx, h, w) if t.kind == "policy" else (t.table(0, 0, idx), None)
        for i in range(len(idx)):
            for s in range(table.ops.shape[1]):
                if maps is not None and not np.allclose(maps[i, s], np.eye(3)):
                    m = torch.from_numpy(maps[i, s][:2]).float()[None]
                    images[i] = ops.affine_nearest(images[i][None].contiguous(), m, fill=pipe.fill[0])[0]
                images[i] = _tv_table(images[i], table.ops[i, s:s + 1], table.params[i, s:s + 1])
    out = torch.stack(images)
    if pipe.dtype == torch.uint8:
        return out
    out = TF.to_dtype(out, torch.float32, scale=True)
    return torch.stack([TF.normalize(o, pipe.mean, pipe.std) for o in out]) if pipe.mean is not None else out


GREY_PIPELINES = {
    "jitter": lambda: _grey_pipeline(),
    "policies": lambda: T.Compose([T.RandomResizedCrop(48), T.Grayscale(), T.TrivialAugmentWide(),
                                   T.RandAugment(num_ops=3), T.ColorJitter(0.4, 0.4, 0.4, 0.1),
                                   T.ToDtype(torch.float32, scale=True), T.Normalize((0.5,), (0.5,))]),
    "containers": lambda: T.Compose([
        T.RandomResizedCrop(48), T.RandomOrder([T.ColorJitter(0.4, 0.4), T.RandomInvert()]), T.Grayscale(),
        T.RandomChoice([T.ColorJitter(0.4, 0.4, 0.4), T.RandomEqualize(1.0)]),
        T.RandomApply([T.RandomGrayscale(1.0), T.ColorJitter(contrast=0.5)], p=0.7),
        T.ToDtype(torch.float32, scale=True), T.Normalize((0.5,), (0.5,))]),
    "back to RGB": lambda: T.Compose([
        T.RandomResizedCrop(48), T.Grayscale(), T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RGB(),
        T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.Grayscale(), T.ColorJitter(0.4, 0.4), T.Grayscale(3),
        T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ToDtype(torch.float32, scale=True),
        T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]),
    "wide normalise": lambda: _grey_pipeline(IMAGENET_MEAN, (0.25,)),
    "uint8": lambda: T.Compose(_grey_pipeline().transforms[:6]),
}


@pytest.mark.parametrize("name", list(GREY_PIPELINES))
def test_grayscale_one_channel_batches_are_torchvisions(imagenet_dir, name):
    """Grayscale() (torchvision's default: one channel) gives [B, 1, H, W] batches, and what follows it acts as
    torchvision's ops act on a one-channel image (saturation, hue, RandomGrayscale leave it as it is; contrast
    blends with its own mean; a policy's fill and maps on the one channel), until RGB() or Grayscale(3) makes
    three channels again; a Normalize of three means broadcasts it to three. The stage carries the grey image in
    three equal channels: exact to torchvision's per-sample ops but for float32 rounding of the normalisation."""
    ds = fl.FolderDataset(imagenet_dir)
    idx = np.arange(8)
    for channels_last in (False, True):
        loader = fl.FastLoader(ds, batch_size=8, shuffle=False, channels_last=channels_last,
                               transform=GREY_PIPELINES[name]())
        x, _ = next(iter(loader))
        ref = _torchvision_reference(ds, loader, idx)
        assert x.shape == ref.shape and x.dtype == ref.dtype
        assert x.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        torch.testing.assert_close(x, ref, atol=0 if x.dtype == torch.uint8 else 1e-5, rtol=0)
    one = {"jitter": 1, "policies": 1, "containers": 1, "back to RGB": 3, "wide normalise": 3, "uint8": 1}[name]
    assert x.shape[1] == one
    if name == "jitter":  # after Grayscale's slot: no saturation/hue/grayscale left, contrast flagged
        table = loader.pipeline.table(0, 0, idx)
        codes = table.ops[:, 1:]
        assert not torch.isin(codes, torch.tensor([3, 4, 11])).any() and (codes == 2).any()
        assert (table.params[:, 1:, 2][codes == 2] == 1).all()


def test_grayscale_one_channel_with_erasing_and_mixing(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    tf = _grey_pipeline(extra=[T.RandomErasing(1.0, value=[0.0]), T.MixUp(alpha=0.2, num_classes=4)])
    x, y = next(iter(fl.FastLoader(ds, batch_size=8, transform=tf)))
    assert x.shape == (8, 1, 48, 48) and y.shape == (8, 4)
    tf = _grey_pipeline(extra=[T.RandomErasing(1.0), T.CutMix(alpha=1.0, num_classes=4)])
    x, y = next(iter(fl.FastLoader(ds, batch_size=8, transform=tf)))
    assert x.shape == (8, 1, 48, 48) and y.shape == (8, 4)


def test_reprs_show_the_arguments_torchvision_shows():
    """What a user prints to check a pipeline: every argument torchvision's repr shows, and nothing internal."""
    for ours, theirs in ((T.Normalize([0.5], [0.2], inplace=True), TV.Normalize([0.5], [0.2], inplace=True)),
                         (T.RandomErasing(inplace=True), TV.RandomErasing(inplace=True)),
                         (T.Resize(8), TV.Resize(8)), (T.RandomCrop(8), TV.RandomCrop(8))):
        names = [part.split("=")[0].strip() for part in repr(theirs).split("(", 1)[1].split(", ") if "=" in part]
        for name in names:
            assert f"{name}=" in repr(ours), (name, repr(ours))
        assert "sets_size" not in repr(ours) and "stream" not in repr(ours)


@pytest.mark.parametrize("bad, theirs, error, words", [
    (lambda T: T.RandomApply([T.Grayscale()], p=0.5), None, TypeError, "one- and three-channel"),
    (lambda T: T.RandomChoice([T.Grayscale(), T.RandomInvert()]), None, TypeError, "one- and three-channel"),
    # torchvision gives one channel here, but where the one-channel ops start is drawn per sample
    (lambda T: T.RandomOrder([T.Grayscale(), T.ColorJitter(0.4)]), None, TypeError, "outside the container"),
    (lambda T: T.Compose([T.RandomResizedCrop(32), T.Grayscale(), T.RandomApply([T.Grayscale(3)])]), None,
     TypeError, "turn some grey images back"),
    # torchvision raises these when the first one-channel image arrives
    (lambda T: T.Compose([T.RandomResizedCrop(32), T.Grayscale(), T.TrivialAugmentWide(fill=[128, 128, 128])]), True,
     ValueError, "cannot broadcast"),
    (lambda T: T.Compose([T.RandomResizedCrop(32), T.Grayscale(), T.ToDtype(torch.float32, scale=True),
                          T.Normalize((0.5,), (0.2, 0.3, 0.4))]), True, RuntimeError, "cannot broadcast"),
    (lambda T: T.Compose([T.RandomResizedCrop(32), T.Grayscale(), T.ToDtype(torch.float32, scale=True),
                          T.Normalize((0.4, 0.5, 0.6), (0.5,), inplace=True)]), True, RuntimeError, "cannot broadcast"),
    (lambda T: T.Compose([T.RandomResizedCrop(32), T.ToDtype(torch.float32, scale=True),
                          T.Normalize((0.4, 0.5), (0.5,))]), True, RuntimeError, "2 cannot"),  # (on RGB too)
    (lambda T: T.Compose([T.RandomResizedCrop(32), T.Grayscale(), T.AugMix()]), None, ValueError,
     "after Grayscale(num_output_channels=1)"),
    # torchvision raises this when the first one-channel image arrives
    (lambda T: T.Compose([T.RandomResizedCrop(32), T.Grayscale(), T.ToDtype(torch.float32, scale=True),
                          T.RandomErasing(1.0, value=[0.1, 0.2, 0.3])]), True, ValueError, "either a single value"),
])
def test_channel_count_refusals(imagenet_dir, bad, theirs, error, words):
    ds = fl.FolderDataset(imagenet_dir)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        fl.FastLoader(ds, batch_size=4, transform=bad(T))
    if theirs:  # (a policy raises only when it draws a geometric op: 50 draws)
        tv = bad(TV)
        with pytest.raises(error):
            for _ in range(50):
                tv(torch.zeros(3, 40, 40, dtype=torch.uint8))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["jitter", "policies", "back to RGB"])
def test_cuda_grayscale_one_channel_follows_the_cpu(imagenet_dir, name):
    ds = fl.FolderDataset(imagenet_dir)
    tf = T.Compose(GREY_PIPELINES[name]().transforms + [T.RandomErasing(0.5)])
    cpu = [x for x, _ in fl.FastLoader(ds, batch_size=16, seed=5, transform=tf)]
    gpu = [x.cpu() for x, _ in fl.FastLoader(ds, batch_size=16, seed=5, transform=tf, device="cuda")]
    assert all(g.shape == c.shape and g.shape[1] == (3 if name == "back to RGB" else 1) for g, c in zip(gpu, cpu))
    diff = torch.cat([(a - b).abs().flatten() for a, b in zip(cpu, gpu)])
    assert float(diff.mean()) < 2e-3 and float(diff.quantile(0.999)) <= 0.1  # as test_cuda_batches_follow_the_cpu_ones


def test_torchvision_v1_pipelines_move_over(imagenet_dir):
    """The deprecated ToTensor() of a v1 pipeline (PIL image -> float32 on 0-1) and ConvertImageDtype(dtype) are
    ToDtype(dtype, scale=True); RGB() is a no-op (every JPEG decodes to RGB). Same batches as the v2 spelling."""
    ds = fl.FolderDataset(imagenet_dir)

    def first(*middle, dtype=torch.float32):
        tf = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), *middle,
                        T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
        x = next(iter(fl.FastLoader(ds, batch_size=8, seed=2, transform=tf)))[0]
        assert x.dtype == dtype
        return x

    v2 = first(T.ToDtype(torch.float32, scale=True))
    with pytest.warns(UserWarning, match=r"`ToTensor\(\)` is deprecated"):  # as torchvision's v2.ToTensor
        to_tensor = T.ToTensor()
    assert torch.equal(first(to_tensor), v2)
    assert torch.equal(first(T.RGB(), T.ConvertImageDtype()), v2)
    # (normalised in float32, then rounded once to float16, as fastload's ToDtype(float16) does: README)
    assert torch.equal(first(T.ConvertImageDtype(torch.float16), dtype=torch.float16), v2.half())
    assert repr(to_tensor) == "ToTensor()" and T.ConvertImageDtype().dtype == TV.ConvertImageDtype().dtype
