"""Issue 17 items 3-5 on real photos: repeated augmentation in FastLoader, resolution schedules (size_schedule,
set_size) with exact resume across a size change, and the recipe presets."""
import numpy as np
import pytest
import torch

import fastload as fl
import fastload.transforms as T
from fastload import recipes
from fastload.transforms import Pipeline
from fastload.transforms.geometry import GeometryPlanner

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def pipeline(size, policy=False):
    """RRC + flip (+ TrivialAugmentWide) + normalise + RandomErasing: every per-sample part that depends on the size."""
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), *([T.TrivialAugmentWide()] if policy else []),
                      T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD), T.RandomErasing(0.5)])


def collect(loader, limit=None):
    out = []
    for x, y in loader:
        out.append((x.clone(), y.clone()))
        if limit is not None and len(out) == limit:
            break
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)


# --- repeated augmentation ------------------------------------------------------------------------------------------

def test_repeats_give_every_copy_its_own_crop_over_the_ranks(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    n, reps, ws = len(ds), 4, 4
    plain = fl.FastLoader(ds, batch_size=6, seed=2, transform=pipeline(24), rank=0, world_size=ws)
    ranks = [fl.FastLoader(ds, batch_size=6, seed=2, transform=pipeline(24), rank=r, world_size=ws, repeats=reps)
             for r in range(ws)]
    assert len(ranks[0]) == len(plain)  # the epoch keeps its length
    epochs = [collect(loader) for loader in ranks]
    keys = [loader.sampler.epoch_keys(0) for loader in ranks]
    labels = np.asarray(ds.labels)
    images = {}  # key -> image
    for r in range(ws):
        x = torch.cat([b[0] for b in epochs[r]])
        y = torch.cat([b[1] for b in epochs[r]])
        assert torch.equal(y, torch.from_numpy(labels[keys[r] % n]))  # each copy reads its sample
        images.update({int(k): x[i] for i, k in enumerate(keys[r])})
    # RASampler with world size = reps: rank r holds copy r of the same samples, in the same order
    assert all(np.array_equal(keys[r] % n, keys[0] % n) for r in range(ws))
    assert all(np.array_equal(keys[r] // n, np.full(len(keys[r]), r)) for r in range(ws))
    # every copy of a sample is augmented its own way: its crop window differs
    key_array = np.concatenate(keys)
    plan = ranks[0].pipeline.plan(np.asarray(ds.heights)[key_array % n], np.asarray(ds.widths)[key_array % n], 2, 0,
                                  key_array)
    windows = {int(k): tuple(w.tolist()) for k, w in zip(key_array, plan.windows)}
    for i in np.unique(keys[0] % n).tolist():
        copies = [i + c * n for c in range(reps)]
        assert len({windows[k] for k in copies}) == reps
        for a in range(reps):
            for b in range(a + 1, reps):
                assert not torch.equal(images[copies[a]], images[copies[b]])
    # copy 0 draws exactly what it would without repeats
    solo = fl.FastLoader(ds, batch_size=n, shuffle=False, seed=2, transform=pipeline(24))
    x0 = torch.cat([b[0] for b in epochs[0]])
    assert torch.equal(x0, next(iter(solo))[0][torch.from_numpy(keys[0])])


def test_repeats_resume_exactly(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    make = lambda: fl.FastLoader(ds, batch_size=8, seed=5, transform=pipeline(24), repeats=4, workers=2)
    reference = make()
    collect(reference)
    full = collect(reference)  # epoch 1
    interrupted = make()
    collect(interrupted)
    collect(interrupted, limit=2)
    state = interrupted.state_dict()
    assert state["sampler"]["repeats"] == 4 and state["batches_done"] == 2
    resumed = make()
    resumed.load_state_dict(state)
    assert_same(full[2:], collect(resumed))
    with pytest.raises(ValueError, match="repeats"):
        fl.FastLoader(ds, batch_size=8, seed=5, transform=pipeline(24)).load_state_dict(state)


# --- resolution schedules -------------------------------------------------------------------------------------------

def test_size_schedule_changes_the_size_at_its_epoch_as_a_loader_built_at_that_size(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    schedule = lambda epoch: 24 if epoch < 1 else (32, 40)
    loader = fl.FastLoader(ds, batch_size=16, seed=1, transform=pipeline(24, policy=True), size_schedule=schedule)
    first, second = collect(loader), collect(loader)  # epoch 1's producers start while epoch 0 ends
    assert {tuple(x.shape[2:]) for x, _ in first} == {(24, 24)}
    assert {tuple(x.shape[2:]) for x, _ in second} == {(32, 40)}
    # the crops, DCT downscale, policies' canvas, erasing boxes and stage follow the size: the batches are those of
    # a loader whose pipeline has that size
    native = fl.FastLoader(ds, batch_size=16, seed=1, transform=pipeline((32, 40), policy=True))
    native.set_epoch(1)
    assert_same(second, collect(native))
    assert loader.size_of(0) == (24, 24) and loader.size_of(5) == (32, 40)


def test_set_size_between_epochs_and_resume_across_the_change(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    make = lambda: fl.FastLoader(ds, batch_size=8, seed=4, crop=fl.RandomResizedCrop(24))
    reference = make()
    epoch0 = collect(reference)
    reference.set_size(40)
    epoch1 = collect(reference)
    assert {tuple(x.shape[2:]) for x, _ in epoch0} == {(24, 24)} and {tuple(x.shape[2:]) for x, _ in epoch1} == {(40, 40)}
    native = fl.FastLoader(ds, batch_size=8, seed=4, crop=fl.RandomResizedCrop(40))  # the shorthand's planner too
    native.set_epoch(1)
    assert_same(epoch1, collect(native))

    # state at the end of epoch 0 after set_size: the resumed loader (built at 24) continues at 40
    run = make()
    collect(run)
    run.set_size(40)
    state = run.state_dict()
    assert state["epoch"] == 1 and state["size"] == [40, 40]
    resumed = make()
    resumed.load_state_dict(state)
    assert_same(epoch1, collect(resumed))

    # mid-epoch: set_size applies to the next epoch; the one in progress resumes at its own size
    run = make()
    collect(run)
    part = collect(run, limit=2)  # epoch 1 at 24
    run.set_size(40)
    state = run.state_dict()
    assert state["size"] == [24, 24] and state["next_size"] == [40, 40]
    straight = make()
    collect(straight)
    whole1 = collect(straight)
    assert_same(part, whole1[:2])
    resumed = make()
    resumed.load_state_dict(state)
    assert_same(whole1[2:], collect(resumed))
    assert {tuple(x.shape[2:]) for x, _ in collect(resumed)} == {(40, 40)}  # epoch 2


def test_schedule_resume_across_the_change(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    make = lambda: fl.FastLoader(ds, batch_size=16, seed=6, transform=pipeline(24),
                                 size_schedule=recipes.linear_ramp(0, 2, 16, 48, step=16))
    reference = make()
    epochs = [collect(reference) for _ in range(3)]
    assert [tuple(e[0][0].shape[2:]) for e in epochs] == [(16, 16), (32, 32), (48, 48)]
    for epoch, done in ((1, 0), (1, 2), (2, 1)):
        run = make()
        for _ in range(epoch):
            collect(run)
        if done:
            collect(run, limit=done)
        state = run.state_dict()
        assert state["epoch"] == epoch and state["size"] == list(epochs[epoch][0][0].shape[2:])
        resumed = make()
        resumed.load_state_dict(state)
        assert_same(epochs[epoch][done:], collect(resumed))
    other = fl.FastLoader(ds, batch_size=16, seed=6, transform=pipeline(24), size_schedule=lambda e: 24)
    with pytest.raises(ValueError, match="size_schedule gives"):
        other.load_state_dict(state)


def test_size_arguments_are_checked(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    with pytest.raises(ValueError, match=r"size_schedule\(0\) returned 24.5"):
        fl.FastLoader(ds, transform=pipeline(24), size_schedule=lambda e: 24.5)
    with pytest.raises(TypeError, match="size_schedule must be a callable"):
        fl.FastLoader(ds, transform=pipeline(24), size_schedule=32)
    loader = fl.FastLoader(ds, transform=pipeline(24), size_schedule=lambda e: 32)
    with pytest.raises(ValueError, match="has a size_schedule"):
        loader.set_size(40)
    with pytest.raises(ValueError, match="size"):
        fl.FastLoader(ds, transform=pipeline(24)).set_size(0)


def test_with_size_scales_the_steps_before_the_size_fixing_one(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    h, w, idx = np.asarray(ds.heights), np.asarray(ds.widths), np.arange(len(ds))
    resized = GeometryPlanner([T.Resize(40), T.CenterCrop(32)]).with_size(48)
    direct = GeometryPlanner([T.Resize(60), T.CenterCrop(48)])
    assert resized.out_size == (48, 48)
    a, b = resized.plan(h, w, 0, 0, idx), direct.plan(h, w, 0, 0, idx)
    assert torch.equal(a.windows, b.windows) and torch.equal(a.matrices, b.matrices)
    a = fl.CenterCrop(32, resize=40).with_size(48).plan(h, w, 0, 0, idx)
    b = fl.CenterCrop(48, resize=60).plan(h, w, 0, 0, idx)
    assert torch.equal(a.windows, b.windows) and torch.equal(a.matrices, b.matrices)


# --- recipes --------------------------------------------------------------------------------------------------------

def ffcv_get_resolution(epoch, min_res, max_res, end_ramp, start_ramp):
    """FFCV's ImageNetTrainer.get_resolution (ffcv-imagenet train_imagenet.py)."""
    assert min_res <= max_res
    if epoch <= start_ramp:
        return min_res
    if epoch >= end_ramp:
        return max_res
    interp = np.interp([epoch], [start_ramp, end_ramp], [min_res, max_res])
    return int(np.round(interp[0] / 32)) * 32


@pytest.mark.parametrize("start,end,lo,hi", [(65, 76, 160, 192), (13, 15, 160, 192), (10, 40, 128, 256), (5, 5, 160, 192)])
def test_linear_ramp_is_ffcv_get_resolution(start, end, lo, hi):
    ramp = recipes.linear_ramp(start, end, lo, hi)
    assert [ramp(e) for e in range(100)] == [ffcv_get_resolution(e, lo, hi, end, start) for e in range(100)]
    with pytest.raises(ValueError, match="min_res"):
        recipes.linear_ramp(0, 10, 192, 160)


def test_ffcv_recipe_is_the_rn50_config():
    r = recipes.ffcv_low_res()
    assert r.loader_kwargs["size_schedule"] is r.size_schedule
    # rn50_88_epochs.yaml: min_res 160, max_res 192, start_ramp 65, end_ramp 76; validation resolution 256
    assert [r.size_schedule(e) for e in range(88)] == [ffcv_get_resolution(e, 160, 192, 76, 65) for e in range(88)]
    assert Pipeline.build(r.train).out_size == (160, 160) and Pipeline.build(r.eval).out_size == (256, 256)
    resize, crop = Pipeline.build(r.eval).geometry.steps
    assert resize.size == [int(256 / (224 / 256))] and crop.size == (256, 256)


def test_torchvision_v2_recipe_trains_and_evaluates(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    r = recipes.torchvision_v2(size=32, num_classes=4, eval_size=32, eval_resize=36)
    built = Pipeline.build(r.train)
    kinds = [type(t).__name__ for t in built.transforms]
    assert kinds == ["RandomResizedCrop", "RandomHorizontalFlip", "TrivialAugmentWide", "ToDtype", "Normalize",
                     "RandomErasing", "RandomChoice"]
    assert built.erasing[0].p == 0.1 and r.label_smoothing == 0.1
    assert sorted((type(t).__name__, t.alpha) for t in built.batch_ops[0].transforms) == [("CutMix", 1.0),
                                                                                          ("MixUp", 0.2)]
    assert [type(t).__name__ for t in Pipeline.build(recipes.torchvision_v2().eval).transforms][:2] == \
        ["Resize", "CenterCrop"]
    assert Pipeline.build(recipes.torchvision_v2().eval).geometry.steps[0].size == [232]
    train = fl.FastLoader(ds, batch_size=12, seed=0, drop_last=True, transform=r.train, **r.loader_kwargs)
    for x, y in train:
        assert x.shape == (12, 3, 32, 32) and y.shape == (12, 4) and y.dtype == torch.float32
        assert torch.allclose(y.sum(1), torch.ones(12))
    val = fl.FastLoader(ds, batch_size=16, shuffle=False, pad=False, transform=r.eval)
    x, y = next(iter(val))
    assert x.shape == (16, 3, 32, 32) and y.dtype == torch.int64


def test_torchvision_v2_repeats_only_when_distributed(monkeypatch):
    """torchvision's train.py builds its RASampler only when distributed: one process gets no repeats (its 4
    copies would come in a row, and MixUp/CutMix would mix most samples with themselves); torchrun's WORLD_SIZE
    (before init_process_group) or an explicit world_size turns them on."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert recipes.torchvision_v2().loader_kwargs == {"repeats": 1}
    assert recipes.torchvision_v2(world_size=8).loader_kwargs == {"repeats": 4}
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert recipes.torchvision_v2().loader_kwargs == {"repeats": 4}
