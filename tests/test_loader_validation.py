"""What a new user gets wrong, refused when the loader is built with a message that says what to pass; and the
outputs the docs promise for the options that used to go wrong silently: dtype=torch.uint8 (raw 0-255 pixels),
float and multi-dimensional targets, DataPrefetcher on the CPU (issue 19, items 2, 3, 12, 13)."""
import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image
from skimage import data as photos

import fastload as fl

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture()
def ds(imagenet_dir):
    return fl.FolderDataset(imagenet_dir)


# ---- dtype=torch.uint8: the resized pixels, 0-255 ---------------------------------------------------------------

def test_uint8_output_is_the_resized_pixels(ds):
    common = dict(batch_size=len(ds), shuffle=False, crop=fl.CenterCrop(56, resize=64, dct_downscale=False))
    (x8, y8), = list(fl.FastLoader(ds, dtype=torch.uint8, **common))
    (xf, yf), = list(fl.FastLoader(ds, mean=None, std=None, **common))  # the same stage, x / 255 in float
    assert x8.dtype == torch.uint8 and torch.equal(y8, yf)
    # uint8 is the float stage's value rounded: never more than half a level from 255 * (x / 255).
    assert (x8.float() - xf * 255).abs().max().item() <= 0.5 + 1e-3
    for i in range(0, len(ds), 7):  # and torchvision's uint8 pipeline: both round, so within one level
        img = TF.pil_to_tensor(Image.open(ds.paths[i]).convert("RGB"))
        ref = TF.center_crop(TF.resize(img, 64, antialias=True), 56)
        assert (x8[i].int() - ref.int()).abs().max().item() <= 1, ds.paths[i]


def test_uint8_refuses_a_normalisation_it_would_not_apply(ds):
    fl.FastLoader(ds, dtype=torch.uint8, mean=None, std=None)  # both fine: nothing to apply
    fl.FastLoader(ds, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"dtype=torch.uint8 gives the resized pixels as they are \(0-255\)"):
        fl.FastLoader(ds, dtype=torch.uint8, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


# ---- arguments checked when the loader is built -----------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, message", [
    (dict(dtype="float16"), TypeError, r"pass torch.float16, not the string 'float16'"),
    (dict(dtype="torch.bfloat16"), TypeError, r"pass torch.bfloat16"),
    (dict(dtype=torch.float64), ValueError, r"dtype must be torch.float32, torch.float16, torch.bfloat16 or "
                                            r"torch.uint8, got torch.float64"),
    (dict(dtype=np.float16), ValueError, r"dtype must be torch.float32"),
    (dict(device="gpu"), ValueError, r"device='gpu' is not a torch device: use 'cuda'"),
    (dict(device="GPU:1"), ValueError, r"use 'cuda'"),
    (dict(device="tpu"), ValueError, r"device must be 'cpu' or 'cuda\[:n\]', got 'tpu'"),
    (dict(mean=(123.7, 116.3, 103.5)), ValueError, r"mean/std are on the 0-1 scale"),
    (dict(mean=MEAN, std=(58.4, 57.1, 57.4)), ValueError, r"mean/std are on the 0-1 scale"),
    (dict(std=(0.2, 0.0, 0.2)), ValueError, r"std must be positive"),
    (dict(mean=(0.5, 0.5)), ValueError, r"mean needs 1 or 3 values"),
    (dict(flip=7), ValueError, r"flip must be a probability between 0 and 1, got 7"),
    (dict(flip=True), ValueError, r"flip must be a probability"),
    (dict(batch_size=0), ValueError, r"batch_size must be a positive int, got 0"),
    (dict(batch_size=2.5), ValueError, r"batch_size must be a positive int, got 2.5"),
    (dict(prefetch=0), ValueError, r"prefetch must be a positive int, got 0"),
    (dict(workers=0), ValueError, r"workers must be a positive int, got 0"),
    (dict(seed=3.5), TypeError, r"seed must be an int, got 3.5"),
    (dict(seed="0"), TypeError, r"seed must be an int"),
    # fastload.transforms' classes of the same names belong in transform=; crop= takes the shorthand
    (dict(crop=fl.transforms.CenterCrop(224)), TypeError, r"crop= takes the shorthand fastload.RandomResizedCrop "
                                                          r"or fastload.CenterCrop, got CenterCrop"),
    (dict(crop=224), TypeError, r"crop= takes the shorthand"),
])
def test_bad_arguments_are_refused_when_built(ds, kwargs, error, message):
    with pytest.raises(error, match=message):
        fl.FastLoader(ds, **kwargs)


def test_good_arguments_still_build(ds):
    for kwargs in (dict(dtype=torch.float16), dict(dtype=torch.bfloat16), dict(mean=0.5, std=0.5),
                   dict(mean=None, std=None), dict(flip=0), dict(flip=np.float32(0.25)), dict(batch_size=np.int64(4))):
        fl.FastLoader(ds, **kwargs)


def test_flip_does_not_change_a_crop_shared_with_other_loaders(ds):
    shared = fl.RandomResizedCrop(32)
    flipped = fl.FastLoader(ds, crop=shared, flip=1.0, shuffle=False, batch_size=8)
    plain = fl.FastLoader(ds, crop=shared, shuffle=False, batch_size=8)
    assert shared.flip == 0.5 and flipped.crop.flip == 1.0 and plain.crop is shared
    (xf, _), (xp, _) = next(iter(flipped)), next(iter(plain))
    (xr, _) = next(iter(fl.FastLoader(ds, crop=fl.RandomResizedCrop(32, flip=1.0), shuffle=False, batch_size=8)))
    assert torch.equal(xf, xr)  # flip=1.0 is RandomResizedCrop(flip=1.0)'s output
    (xo, _) = next(iter(fl.FastLoader(ds, crop=fl.RandomResizedCrop(32), shuffle=False, batch_size=8)))
    assert torch.equal(xp, xo)  # and the other loader keeps the crop's own probability


def test_load_state_dict_names_what_is_missing(ds):
    loader = fl.FastLoader(ds, batch_size=8)
    with pytest.raises(ValueError, match=r"not a FastLoader state_dict: it lacks 'epoch', 'batches_done', 'seed'"):
        loader.load_state_dict({})
    state = loader.state_dict()
    del state["sampler"]
    with pytest.raises(ValueError, match=r"lacks 'sampler'"):
        loader.load_state_dict(state)


def test_a_state_from_another_world_size_says_so(ds):
    """A state saved with world_size=1 late in its epoch, loaded by a rank of two (whose epoch has half the
    batches): the reason is the world size, not batches_done beyond this loader's epoch."""
    one = fl.FastLoader(ds, batch_size=2, shuffle=False, crop=fl.CenterCrop(16))
    it = iter(one)
    for _ in range(len(one) - 1):
        next(it)
    state = one.state_dict()
    two = fl.FastLoader(ds, batch_size=2, shuffle=False, crop=fl.CenterCrop(16), rank=0, world_size=2)
    assert state["batches_done"] > len(two)
    with pytest.raises(ValueError, match="cannot resume: world_size was 1 when saved, is 2 now"):
        two.load_state_dict(state)
    one.close()


def test_crop_sizes_as_torchvision_takes_them():
    heights, widths, idx = np.array([375, 500]), np.array([500, 333]), np.array([3, 4])
    reference = fl.RandomResizedCrop(224).plan(heights, widths, 0, 0, idx)
    for size in (224.0, [224], (224, 224), np.int64(224)):
        plan = fl.RandomResizedCrop(size).plan(heights, widths, 0, 0, idx)
        assert torch.equal(plan.windows, reference.windows) and torch.equal(plan.matrices, reference.matrices)
    assert fl.CenterCrop(224, resize=256.0).resize == fl.CenterCrop(224, resize=[256]).resize == 256  # short side
    for size in (224.5, 0, -3, (224, 224, 3), True):
        with pytest.raises(ValueError, match=r"size must be a positive int or \(height, width\)"):
            fl.RandomResizedCrop(size)
    with pytest.raises(TypeError, match=r"size must be an int or a sequence"):
        fl.CenterCrop(None)
    with pytest.raises(TypeError, match=r"scale must be a \(min, max\) pair of numbers, got 0.5"):
        fl.RandomResizedCrop(224, scale=0.5)
    with pytest.raises(ValueError, match=r"ratio must be \(min, max\)"):
        fl.RandomResizedCrop(224, ratio=(4 / 3, 3 / 4))


# ---- targets: kept as the dataset has them ----------------------------------------------------------------------

def test_float_and_multidimensional_targets_are_kept(ds):
    common = dict(batch_size=8, shuffle=False, crop=fl.RandomResizedCrop(32))
    ds.labels = np.linspace(0, 1, len(ds))
    ys = [y for _, y in fl.FastLoader(ds, **common)]
    assert all(y.dtype == torch.float64 for y in ys)
    assert torch.equal(torch.cat(ys), torch.from_numpy(ds.labels))
    ds.labels = np.stack([np.linspace(0, 1, len(ds)), np.linspace(1, 0, len(ds))], axis=1).astype(np.float32)
    shuffled = fl.FastLoader(ds, batch_size=8, shuffle=True, seed=2, crop=fl.RandomResizedCrop(32))
    order = shuffled.sampler.epoch_indices(0)
    ys = [y for _, y in shuffled]
    assert ys[0].shape == (8, 2) and ys[0].dtype == torch.float32
    assert torch.equal(torch.cat(ys), torch.from_numpy(ds.labels[order]))


def test_skipped_samples_keep_float_targets(ds, tmp_path, imagenet_dir):
    root = tmp_path / "tree"
    for f in sorted(imagenet_dir.rglob("*.jpg")):
        (root / f.parent.name).mkdir(parents=True, exist_ok=True)
        (root / f.parent.name / f.name).write_bytes(f.read_bytes())
    broken = fl.FolderDataset(root)
    broken.labels = np.arange(len(broken)) / 100.0
    victim = root / broken.paths[3]
    victim.write_bytes(victim.read_bytes()[:2000])  # truncated after the scan
    loader = fl.FastLoader(broken, batch_size=len(broken), shuffle=False, on_error="skip",
                           crop=fl.RandomResizedCrop(32))
    (_, y), = list(loader)
    assert y.dtype == torch.float64 and loader.stats()["skipped"] == 1
    # The replacement brings its own target: some other sample's value, never a cast or a zero.
    assert y[3].item() != broken.labels[3] and y[3].item() in set(broken.labels.tolist())
    assert torch.equal(torch.cat([y[:3], y[4:]]), torch.from_numpy(np.delete(broken.labels, 3)))


def test_targets_that_are_not_numbers_are_refused(ds):
    ds.labels = np.array([f"class {i}" for i in range(len(ds))])
    with pytest.raises(TypeError, match=r"labels must be numbers \(int or float.*got dtype <U"):
        fl.FastLoader(ds)


# ---- DataPrefetcher on the CPU ----------------------------------------------------------------------------------

def _photo_loader(layout="NCHW"):
    imgs = torch.stack([torch.from_numpy(p()[:200, :200]) for p in (photos.astronaut, photos.coffee)])
    images = imgs.permute(0, 3, 1, 2).contiguous() if layout == "NCHW" else imgs
    dataset = torch.utils.data.TensorDataset(images.repeat(4, 1, 1, 1), torch.arange(8) / 8.0)
    return imgs.permute(0, 3, 1, 2), torch.utils.data.DataLoader(dataset, batch_size=4)


def test_data_prefetcher_normalises_on_the_cpu_too():
    chw, loader = _photo_loader()
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    seen = []
    for x, y in fl.DataPrefetcher(loader, device="cpu"):
        assert x.device.type == "cpu" and x.shape == (4, 3, 200, 200) and x.dtype == torch.float32
        expected = (chw[torch.arange(len(seen), len(seen) + 4) % 2].float() / 255 - mean) / std
        # identity matrices: the kernel's bilinear weights are exactly 1 and 0, so only float rounding differs
        assert (x - expected).abs().max() <= 1e-5
        seen.extend(y.tolist())
    assert seen == (torch.arange(8) / 8.0).tolist()  # float labels as they came
    # Resizing in the same pass, channels-last input: torchvision's antialiased resize.
    _, nhwc = _photo_loader("NHWC")
    x, _ = next(iter(fl.DataPrefetcher(nhwc, device="cpu", size=112)))
    ref = (TF.resize(chw.float(), [112, 112], antialias=True) / 255 - mean) / std
    assert (x[:2] - ref).abs().max() <= 1e-3 / 0.225  # the loader's torchvision tolerance (test_loader.py)
    x8, _ = next(iter(fl.DataPrefetcher(loader, device="cpu", dtype=torch.uint8)))
    assert torch.equal(x8[:2], chw)  # uint8: the pixels as they are


class _Images(torch.utils.data.Dataset):
    """uint8 CHW photos with labels of any kind (``label(i)``); sample ``fail_at`` raises OSError."""

    def __init__(self, label=lambda i: i, n=12, fail_at=None):
        self.img = torch.from_numpy(photos.coffee()[:40, :60]).permute(2, 0, 1).contiguous()
        self.label, self.n, self.fail_at = label, n, fail_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.fail_at:
            raise OSError(f"sample {i} is unreadable")
        return self.img, self.label(i)


@pytest.mark.parametrize("label, check", [
    (lambda i: f"img{i}.jpg", lambda y: list(y) == ["img0.jpg", "img1.jpg", "img2.jpg"]),  # file names
    (lambda i: {"id": i}, lambda y: torch.equal(y["id"], torch.arange(3))),            # dicts
    (lambda i: (i, 2 * i), lambda y: torch.equal(y[1], torch.tensor([0, 2, 4]))),       # tuples: a list of tensors
    (lambda i: i, lambda y: torch.equal(y, torch.arange(3))),                           # class indices
], ids=["str", "dict", "tuple", "int"])
def test_data_prefetcher_gives_labels_back_as_they_went_in(label, check):
    # Labels default_collate makes from file names, dicts or tuples raised inside torch.as_tensor
    loader = torch.utils.data.DataLoader(_Images(label, n=3), batch_size=3)
    (x, y), = list(fl.DataPrefetcher(loader, device="cpu"))
    assert x.shape == (3, 3, 40, 60) and check(y)


def test_data_prefetcher_hands_out_the_batch_made_before_the_loaders_error():
    # The loader's error came one batch early: batch [6, 7, 8], which the DataLoader itself gives, was lost
    loader = torch.utils.data.DataLoader(_Images(fail_at=9), batch_size=3)
    it = iter(fl.DataPrefetcher(loader, device="cpu"))
    assert [next(it)[1].tolist() for _ in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    with pytest.raises(OSError, match="sample 9 is unreadable"):
        next(it)


def test_data_prefetcher_refuses_what_it_would_read_wrong():
    def first(images, **kw):
        return next(iter(fl.DataPrefetcher([(images, torch.zeros(len(images)))], device="cpu", **kw)))
    x8 = torch.full((2, 3, 8, 8), 10, dtype=torch.uint8)
    # int32 0-255 values were read as 0-1 floats: 41.55 where the same uint8 pixels give -1.95
    with pytest.raises(TypeError, match="images must be uint8 .0-255. or float .0-1., got torch.int32"):
        first(x8.int())
    assert torch.allclose(first(x8.double() / 255)[0], first(x8)[0], atol=1e-5)  # float64 0-1, as float32
    for kw, error, message in ((dict(layout="bogus"), ValueError, "layout must be 'NCHW', 'NHWC' or None"),
                               (dict(size=0), ValueError, "size"), (dict(size=2.5), ValueError, "size must be a positive int"),
                               (dict(channels_last="no"), TypeError, "channels_last must be True or False")):
        with pytest.raises(error, match=message):
            fl.DataPrefetcher([], device="cpu", **kw)
    assert first(x8.permute(0, 2, 3, 1), layout="nhwc")[0].shape == (2, 3, 8, 8)  # either case
    assert first(x8, size=np.int64(4))[0].shape == (2, 3, 4, 4)
    with pytest.raises(ValueError, match="images have 1 channels .read as NCHW.*mean/std 3: pass layout="):
        first(x8[:, :1])
    with pytest.raises(ValueError, match="with B >= 1"):
        first(x8[:0])
    with pytest.raises(TypeError, match="batches of two items, got a list of 3"):
        next(iter(fl.DataPrefetcher([[x8, torch.zeros(2), "extra"]], device="cpu")))
    assert first(x8.numpy())[0].shape == (2, 3, 8, 8)  # a numpy batch from a custom collate_fn
    # lists of images (a collate_fn that keeps them apart) and PIL images got torch.as_tensor's riddles
    with pytest.raises(TypeError, match="got a tuple of 2 items: use a collate_fn that stacks them"):
        first(tuple(x8))
    from PIL import Image
    with pytest.raises(TypeError, match="got Image"):
        next(iter(fl.DataPrefetcher([(Image.new("RGB", (8, 8)), torch.zeros(2))], device="cpu")))
    # [B, 3, H, 3] fits both layouts: read as NCHW without a word, where warp_affine asks
    with pytest.raises(ValueError, match=r"fit both layouts: pass layout="):
        first(x8[..., :3])
    assert first(x8[..., :3], layout="NCHW")[0].shape == (2, 3, 8, 3)


def test_cpus_pins_the_producers_and_keeps_the_batches(ds):
    import os
    import threading
    core, mine = min(os.sched_getaffinity(0)), os.sched_getaffinity(0)
    loader = fl.FastLoader(ds, batch_size=4, shuffle=True, seed=3, cpus={core}, crop=fl.RandomResizedCrop(32))
    assert loader.threads == 1  # the default thread count follows the cores given
    seen = {}
    start = loader._maker.start

    def recording(*args, **kwargs):
        seen[threading.current_thread().name] = os.sched_getaffinity(0)
        return start(*args, **kwargs)
    loader._maker.start = recording
    pinned = [x for x, _ in loader]
    loader.close()
    assert seen and all(mask == {core} for mask in seen.values())
    assert os.sched_getaffinity(0) == mine  # the training loop's thread keeps its own mask
    free = fl.FastLoader(ds, batch_size=4, shuffle=True, seed=3, threads=1, crop=fl.RandomResizedCrop(32))
    assert all(torch.equal(a, b) for a, (b, _) in zip(pinned, free))
    free.close()


def test_default_threads_follow_the_process_affinity(ds):
    """A process confined to some cores (a SLURM or container cpuset, taskset) gets one decode thread per core it
    may use, not one per core of the machine: the loader is run in a child process pinned to one core."""
    import os
    import subprocess
    import sys
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    core = min(os.sched_getaffinity(0))
    code = ("import os, fastload as fl; from fastload.loader import usable_cores; "
            f"os.sched_setaffinity(0, {{{core}}}); "
            f"l = fl.FastLoader(fl.FolderDataset({str(ds.root)!r}), batch_size=4); "
            "print(usable_cores(), l.threads, os.cpu_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "LOCAL_WORLD_SIZE"})
    assert out.returncode == 0, out.stderr
    usable, threads, machine = map(int, out.stdout.split())
    assert usable == 1 and threads == 1 and machine == os.cpu_count()


@pytest.mark.parametrize("cpus, error, message", [
    (set(), ValueError, "non-empty subset"), ({10 ** 6}, ValueError, "non-empty subset"),
    ("x", TypeError, "collection of CPU core ids")])
def test_cpus_refuses_what_it_cannot_pin(ds, cpus, error, message):
    with pytest.raises(error, match=message):
        fl.FastLoader(ds, batch_size=4, cpus=cpus)


def test_a_numpy_seed_and_batch_size_give_a_state_torch_load_reads(ds, tmp_path):
    # numpy scalars in state_dict() made torch.load (weights_only, the default) refuse the whole checkpoint
    loader = fl.FastLoader(ds, batch_size=np.int64(4), seed=np.int64(3), crop=fl.RandomResizedCrop(24))
    next(iter(loader))
    torch.save({"loader": loader.state_dict()}, tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt")["loader"]
    assert type(state["seed"]) is int and type(state["batch_size"]) is int
    resumed = fl.FastLoader(ds, batch_size=4, seed=3, crop=fl.RandomResizedCrop(24))
    resumed.load_state_dict(state)
    assert resumed.state_dict()["batches_done"] == 1


def test_a_state_for_another_size_is_refused_unless_set_size_chose_it(ds):
    # A loader built for 32 px that loaded a 24 px checkpoint silently made 24 px batches for every later epoch
    old = fl.FastLoader(ds, batch_size=4, crop=fl.RandomResizedCrop(24))
    next(iter(old))
    state = old.state_dict()
    assert "next_size" not in state and not state["size_chosen"]  # its configuration, not a choice to carry over
    legacy = {k: v for k, v in state.items() if k != "size_chosen"}
    legacy["next_size"] = state["size"]  # states before "size_chosen" always carried next_size
    with pytest.raises(ValueError, match=r"state is for size \(24, 24\); this loader makes \(32, 32\)"):
        fl.FastLoader(ds, batch_size=4, crop=fl.RandomResizedCrop(32)).load_state_dict(legacy)
    with pytest.raises(ValueError, match=r"state is for size \(24, 24\); this loader makes \(32, 32\)"):
        fl.FastLoader(ds, batch_size=4, crop=fl.RandomResizedCrop(32)).load_state_dict(state)
    same = fl.FastLoader(ds, batch_size=4, crop=fl.RandomResizedCrop(24))
    same.load_state_dict(state)
    assert next(iter(same))[0].shape[-2:] == (24, 24)
    # set_size's choice travels with the state, whatever the resumed loader was built with
    old.set_size(40)
    state = old.state_dict()
    assert state["next_size"] == [40, 40]
    other = fl.FastLoader(ds, batch_size=4, crop=fl.RandomResizedCrop(32))
    other.load_state_dict(state)
    assert next(iter(other))[0].shape[-2:] == (24, 24)  # the rest of the epoch at its own size
    other.set_epoch(1)
    assert next(iter(other))[0].shape[-2:] == (40, 40) and other.size_of(5) == (40, 40)


def test_the_loaders_sampler_follows_the_loader(ds):
    # loader.sampler.epoch stayed 0 (list(loader.sampler) gave epoch 0's indices), and its own state_dict /
    # load_state_dict were accepted and ignored: the loader holds the position
    loader = fl.FastLoader(ds, batch_size=4, crop=fl.RandomResizedCrop(24))
    loader.set_epoch(3)
    assert loader.sampler.epoch == 3 and list(loader.sampler) == loader.sampler.epoch_indices(3).tolist()
    x, y = next(iter(loader))
    assert torch.equal(y, torch.as_tensor(ds.labels[loader.sampler.epoch_indices(3)[:4]]))
    for call in (loader.sampler.state_dict, lambda: loader.sampler.load_state_dict({"epoch": 1})):
        with pytest.raises(RuntimeError, match="this sampler belongs to a FastLoader"):
            call()
    list(loader)  # epoch 3 finished: the next iteration is epoch 4, and the sampler says so
    next(iter(loader))
    assert loader.sampler.epoch == 4
    # after a resume mid-epoch too: the sampler lists whole epochs (the loader holds the position)
    resumed = fl.FastLoader(ds, batch_size=4, crop=fl.RandomResizedCrop(24))
    resumed.load_state_dict(loader.state_dict())
    assert list(resumed.sampler) == resumed.sampler.epoch_indices(4).tolist()
    list(resumed)
    next(iter(resumed))
    assert list(resumed.sampler) == resumed.sampler.epoch_indices(5).tolist()


def test_images_per_s_counts_from_the_iterations_start(ds):
    # The clock started at the first batch's end: the first batch's time was left out (wait_s exceeded seconds)
    import time
    loader = fl.FastLoader(ds, batch_size=8, crop=fl.RandomResizedCrop(32))
    t0 = time.perf_counter()
    images = sum(len(y) for _, y in loader)
    wall = time.perf_counter() - t0
    s = loader.stats()
    assert s["images"] == images and s["wait_s"] <= s["seconds"]
    assert s["seconds"] >= 0.95 * wall  # the loop's whole time (it was 0.10 s of 0.16)


def test_a_state_for_another_dataset_of_the_same_length_is_refused(ds):
    # Only the length was compared: another subset of 20 samples resumed at the saved position with other samples
    make = lambda indices: fl.FastLoader(torch.utils.data.Subset(ds, indices), batch_size=4,
                                         crop=fl.RandomResizedCrop(24))
    first = make(range(20))
    next(iter(first))
    state = first.state_dict()
    with pytest.raises(ValueError, match="state is for another dataset"):
        make(range(20, 40)).load_state_dict(state)
    with pytest.raises(ValueError, match="state is for another dataset"):
        make(range(19, -1, -1)).load_state_dict(state)  # the same samples in another order
    same = make(range(20))
    same.load_state_dict(state)
    assert same.state_dict()["batches_done"] == 1
    legacy = {k: v for k, v in state.items() if k != "dataset"}  # states from before the check still load
    make(range(20, 40)).load_state_dict(legacy)


def test_a_loader_cannot_be_pickled_and_says_why(ds):
    """pickle, torch.save, deepcopy and a spawn-started process's arguments all pickle: they failed with "cannot
    pickle '_thread._local' object"; the error now says what to carry instead. The dataset pickles."""
    import copy
    import pickle

    loader = fl.FastLoader(ds, batch_size=4)
    for attempt in (lambda: pickle.dumps(loader), lambda: copy.deepcopy(loader)):
        with pytest.raises(TypeError, match="cannot be pickled.*state_dict"):
            attempt()
    assert len(pickle.loads(pickle.dumps(ds))) == len(ds)
