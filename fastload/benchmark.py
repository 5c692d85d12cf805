"""Loader throughput and training efficiency, side by side with torchvision: the engine of `fastload bench`.

Every number is measured in the run that prints it: one warm-up epoch (page cache, worker start-up, CUDA
context, allocator), then ``epochs`` timed epochs. Before each clock starts, a full garbage collection (as timeit and
pyperf keep the collector out of their timings): importing torch leaves ~340,000 objects that the first full
collection of a process walks, holding the GIL for 0.1-0.2 s. A training run pays that once in hours; inside a
few seconds' timing it weighs on whichever contender happens to set it off (6% of a 3 s run of the 2-core CPU
loader, bench/RESULTS.md). The torchvision baseline is what users run today:
ImageFolder (or PIL over the LMDB records) + RandomResizedCrop + RandomHorizontalFlip + ToTensor + Normalize
in a DataLoader with ``workers`` processes, pinned and copied to the GPU when the device is CUDA.

With a model (CUDA only), each pipeline feeds a real training step (torchvision model, SGD, bf16 autocast,
channels_last) and the rate is training images/s; the ceiling is the same step on one fixed batch already on
the GPU, and efficiency = rate / ceiling (1.0: the loader costs the training nothing).

    from fastload import benchmark
    result = benchmark.run("train.lmdb", baseline="torchvision", device="cpu", batch_size=64)
    print(benchmark.format_table(result["rows"], benchmark.describe(result)))
    benchmark.plot(result["rows"], "bench.png", subtitle=benchmark.describe(result))
"""
import gc
import io
import os
import platform
import textwrap
import time

import torch

from .datasets.progress import progress as progress_lines
from .loader import IMAGENET_MEAN, IMAGENET_STD, FastLoader, usable_cores
from .transforms.planners import RandomResizedCrop

__all__ = ["open_dataset", "pipelines", "TRANSFORMS", "fastload_rate", "torchvision_rate", "training_step", "ceiling_rate", "run", "describe",
           "format_table", "plot", "MODELS"]

#: Models --model accepts (torchvision names).
MODELS = ("resnet18", "resnet50")
#: --transform specs: the augmentation between the crop/flip and ToDtype/Normalize (the same for both loaders).
TRANSFORMS = ("plain", "trivialaugment", "randaugment", "autoaugment", "torchvision_v2", "colorjitter", "threeaugment")


def pipelines(spec="plain", size=224, num_classes=1000):  # 1000: the classes of training_step's model
    """(fastload pipeline, torchvision v2 pipeline, torchvision batch op or None) for a --transform spec: the same
    classes with the same arguments, RandomResizedCrop(size) + RandomHorizontalFlip + [augmentation] + ToDtype +
    Normalize, so the two loaders are compared like for like. torchvision's runs on PIL images up to PILToTensor,
    as its reference recipe does (the fastest way to run these on a CPU); in fastload PILToTensor is a no-op.

    "torchvision_v2" is torchvision's reference ImageNet recipe: TrivialAugmentWide, then RandomErasing(0.1) after
    Normalize, then RandomChoice([MixUp(alpha=0.2), CutMix(alpha=1.0)]) on the batch: the last transform of
    fastload's pipeline, and in torchvision's reference the DataLoader's collate_fn (the batch op returned).
    Its repeated-augmentation sampler costs nothing per image and is left out of both."""
    import torchvision.transforms.v2 as TV

    from . import transforms as FT
    if spec not in TRANSFORMS:
        raise ValueError(f"transform must be one of {', '.join(TRANSFORMS)}, got {spec!r}")
    recipe = spec == "torchvision_v2"

    def build(T):
        middle = {"plain": [], "trivialaugment": [T.TrivialAugmentWide()], "torchvision_v2": [T.TrivialAugmentWide()],
                  "randaugment": [T.RandAugment(num_ops=2, magnitude=9)], "autoaugment": [T.AutoAugment()],
                  # SimCLR / BYOL's colour distortion (their 0.8 probability left out): all four jitters a sample
                  "colorjitter": [T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(0.2)],
                  # DeiT III's 3-Augment in torchvision's spelling: one of grayscale, solarize, blur per image (its
                  # PIL blur's radius as sigma; kernel 13 covers 3 sigma), then ColorJitter(0.3, 0.3, 0.3)
                  "threeaugment": [T.RandomChoice([T.RandomGrayscale(p=1.0), T.RandomSolarize(128, p=1.0),
                                                   T.GaussianBlur(13, sigma=(0.1, 2.0))]),
                                   T.ColorJitter(0.3, 0.3, 0.3)]}[spec]
        return [T.RandomResizedCrop(size), T.RandomHorizontalFlip(), *middle, T.PILToTensor(),
                T.ToDtype(torch.float32, scale=True), T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
                *([T.RandomErasing(0.1)] if recipe else [])]

    def mixing(T):
        return T.RandomChoice([T.MixUp(alpha=0.2, num_classes=num_classes), T.CutMix(alpha=1.0,
                                                                                    num_classes=num_classes)])
    ours = FT.Compose(build(FT) + ([mixing(FT)] if recipe else []))
    return ours, TV.Compose(build(TV)), mixing(TV) if recipe else None


class _MixingCollate:
    """torchvision's reference recipe's collate_fn: default_collate, then the batch op (MixUp/CutMix)."""

    def __init__(self, op):
        self.op = op

    def __call__(self, batch):
        return self.op(*torch.utils.data.default_collate(batch))


def open_dataset(path):
    """A FolderDataset for an image folder, an LMDBDataset for a store made by `fastload pack`.

    Raises DatasetError (a ValueError) for a missing path or anything that is neither.
    """
    from .datasets import DatasetError, FolderDataset, LMDBDataset

    path = os.path.abspath(os.fspath(path))
    partial = os.path.exists(path + ".partial")
    if not os.path.exists(path) and not partial:
        raise DatasetError(f"{path}: no such folder or store")
    # What `fastload pack` writes: a folder holding data.mdb (or that file itself); LMDBDataset explains an
    # unfinished pack (DST.partial) better than the folder reader would.
    if partial or path.endswith(".partial") or os.path.isfile(path) or \
            os.path.isfile(os.path.join(path, "data.mdb")):
        return LMDBDataset(path)
    return FolderDataset(path)


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# Warm-up epochs go on past the first until ready() (decoder="auto": its trial has chosen), for at most this many
# batches (a trial that cannot finish, e.g. one batch an epoch, leaves the timing to its first decoder).
_MAX_WARMUP_BATCHES = 400


def _timed_epochs(make_iter, epochs, total, label, progress, device, step=None, ready=None, settle=None):
    """Runs warm-up epochs (one, and more while ``ready()`` is False) and `epochs` timed ones; returns images/s over
    the timed ones. ``settle()`` runs between them: FastLoader's producers stopped (it starts the next epoch's as an
    epoch ends, and batches made before the clock starts would count as made in no time; a DataLoader starts making
    batches at iter(), inside the timing)."""
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")
    # a bar in a terminal, a line every few seconds in a log (no carriage-return frames piling up there)
    bar = progress_lines(total * (epochs + 1), desc=label, unit="img", enabled=progress)

    def run(epoch):  # (batches, images) of one epoch
        batches = images = 0
        for x, y in make_iter(epoch):
            if step is not None:
                step(x, y)
            batches, images = batches + 1, images + len(y)
            bar.update(len(y))
        return batches, images

    epoch, warm_batches = 0, 0
    try:
        while True:  # warm-up
            warm_batches += run(epoch)[0]
            epoch += 1
            if ready is None or ready() or warm_batches >= _MAX_WARMUP_BATCHES:
                break
        if settle is not None:
            settle()
        gc.collect()  # the process's start-up debt paid off the clock (the module's docstring)
        _sync(device)
        start = time.perf_counter()
        images = sum(run(e)[1] for e in range(epoch, epoch + epochs))
        _sync(device)
        seconds = time.perf_counter() - start
    finally:
        bar.close()
    return images / seconds


def _check_batches(n, batch_size):
    if n < batch_size:
        from .datasets import DatasetError
        raise DatasetError(f"the dataset has {n} images, fewer than one batch of {batch_size}; "
                           f"use a batch size of {n} or less")


def loader_shape(transform, size, num_classes=1000):
    """FastLoader's keyword for a --transform spec: crop=RandomResizedCrop(size) (+ flip + normalise, the shorthand)
    for None, else transform= the spec's pipeline (``pipelines``)."""
    if transform is None:
        return {"crop": RandomResizedCrop(size)}
    return {"transform": pipelines(transform, size, num_classes)[0]}


def fastload_rate(dataset, *, batch_size=256, threads=None, epochs=2, device="cpu", size=224, progress=True,
                  step=None, label="fastload", decoder="cpu", transform=None, num_classes=1000):
    """(images/s, loader.stats()) of FastLoader over ``epochs`` timed epochs: RandomResizedCrop(size) + flip +
    normalise (the crop= shorthand), or ``transform`` (a --transform spec, see ``pipelines``)."""
    _check_batches(len(dataset), batch_size)
    loader = FastLoader(dataset, batch_size=batch_size, device=device, threads=threads, drop_last=True,
                        channels_last=step is not None, decoder=decoder,
                        **loader_shape(transform, size, num_classes))

    def run(epoch):
        loader.set_epoch(epoch)
        return loader
    def ready():  # decoder="auto": time what its trial chose, not the trial
        trial = loader.stats().get("decoder_trial")
        return trial is None or trial["chosen"] is not None
    rate = _timed_epochs(run, epochs, len(loader) * batch_size, label, progress, device, step, ready,
                         settle=loader._stop)  # its pool of outputs kept, as between a training loop's epochs
    loader.close()  # no producer thread left (the next epoch's start early) when the baseline forks its workers
    return rate, dict(loader.stats(), threads=loader.threads, workers=loader.workers)


class _PILRecords(torch.utils.data.Dataset):
    """What a user without fastload does with an LMDB store: PIL decode of each record, then transforms."""

    def __init__(self, dataset, transform):
        self.dataset, self.transform = dataset, transform

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        from PIL import Image
        rec = self.dataset.record(i)
        return self.transform(Image.open(io.BytesIO(rec.data)).convert("RGB")), rec.label


def torchvision_dataset(dataset, size=224, transform=None, num_classes=1000):
    """The baseline's dataset: torchvision's ImageFolder over a folder, PIL over an LMDB store's records, with
    the standard training transforms (RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize), or the
    torchvision v2 twin of a --transform spec (``pipelines``)."""
    import torchvision
    if transform is None:
        from torchvision import transforms as T
        tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(),
                        T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    else:
        tf = pipelines(transform, size, num_classes)[1]
    root = getattr(dataset, "root", None)
    if root is not None and os.path.isdir(root) and not getattr(dataset, "skipped", None):
        return torchvision.datasets.ImageFolder(root, transform=tf, allow_empty=True)  # as FolderDataset: warned
    # An LMDB store, or a folder with unreadable files (ImageFolder would crash on them): read what fastload reads.
    return _PILRecords(dataset, tf)


def torchvision_rate(dataset, *, batch_size=256, workers=None, epochs=2, device="cpu", size=224, progress=True,
                     step=None, label="torchvision", transform=None, num_classes=1000):
    """Images/s of torchvision's DataLoader (``workers`` processes, default one per core) over ``epochs`` timed
    epochs, batches pinned and copied to the device when it is CUDA."""
    _check_batches(len(dataset), batch_size)
    tv = torchvision_dataset(dataset, size, transform, num_classes)
    workers = usable_cores() if workers is None else workers
    on_gpu = torch.device(device).type == "cuda"
    batch_op = pipelines(transform, size, num_classes)[2] if transform is not None else None
    loader = torch.utils.data.DataLoader(tv, batch_size=batch_size, shuffle=True, num_workers=workers,
                                         pin_memory=on_gpu, drop_last=True, persistent_workers=workers > 0,
                                         collate_fn=_MixingCollate(batch_op) if batch_op is not None else None)

    def run(epoch):
        for x, y in loader:
            if on_gpu:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            yield x, y
    return _timed_epochs(run, epochs, len(loader) * batch_size, label, progress, device, step)


def training_step(model_name, device, batch_size, num_classes=1000, cuda_graph=False):
    """A real training step: torchvision model, SGD, bf16 autocast, channels_last. Returns step(x, y).

    ``cuda_graph=True``: the step (forward, backward, SGD) is captured in a CUDA graph and replayed (the idea of
    ``torch.compile(mode="reduce-overhead")``): the training thread then queues two copies and one graph a step
    instead of hundreds of kernels, so busy host cores no longer slow the step (bench/RESULTS.md, "What busy cores cost the
    training thread"). A step's first call with a new batch shape trains eagerly once (the optimizer's state and the
    libraries' workspaces exist before capture) and captures; every call is one SGD update either way. A graph
    replays what was captured: the model's train/eval mode and its parameters are fixed at capture.
    ``step.model`` is the model it trains. Either way a batch in pinned host memory is copied asynchronously: the
    caller must not rewrite it until the step has run (FastLoader hands over GPU batches; torch's DataLoader a new
    pinned tensor each batch)."""
    import torchvision
    if model_name not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model_name!r}")
    if cuda_graph and torch.device(device).type != "cuda":
        raise ValueError(f"cuda_graph=True captures the step on a GPU; device is {device}")
    model = getattr(torchvision.models, model_name)(num_classes=num_classes).to(device,
                                                                                memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def eager(x, y):
        x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        y = y.to(device, non_blocking=True)
        # no autocast cache: inside a graph capture its cached casts would outlive the capture
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not cuda_graph):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if not cuda_graph:
        eager.model = model
        return eager

    graphs = {}  # per batch signature (a soft-label batch differs from a class-index one): (graph, x, y)

    def capture(x, y):
        static_x = torch.empty(x.shape, dtype=x.dtype, device=device).contiguous(memory_format=torch.channels_last)
        static_y = torch.empty(y.shape, dtype=y.dtype, device=device)
        static_x.copy_(x, non_blocking=True)
        static_y.copy_(y, non_blocking=True)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # the warm-up step: this call's update
            eager(static_x, static_y)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)  # the graph's backward allocates the gradients in its own pool
        # A stream of the model's device (torch.cuda.graph's default stream belongs to the current device: on
        # another one the model's kernels would run uncaptured). thread_local: a loader's producers may go on
        # queueing their copies on other threads meanwhile.
        with torch.cuda.graph(graph, stream=torch.cuda.Stream(device), capture_error_mode="thread_local"):
            eager(static_x, static_y)
        return graph, static_x, static_y

    def step(x, y):
        key = (tuple(x.shape), x.dtype, tuple(y.shape), y.dtype)
        with torch.cuda.device(device):
            if key not in graphs:
                graphs[key] = capture(x, y)
                return
            graph, static_x, static_y = graphs[key]
            static_x.copy_(x, non_blocking=True)
            static_y.copy_(y, non_blocking=True)
            graph.replay()
    step.model = model
    return step


def fixed_batch(batch_size, size, device):
    """(images float32 [B, 3, size, size] channels_last, class indices [B]) on ``device``: the one batch a ceiling
    trains on, as a loader would hand it over."""
    x = torch.randn(batch_size, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
    return x, torch.randint(0, 1000, (batch_size,), device=device)


def ceiling_rate(step, batch_size, size, device, steps=60, soft_targets=None):
    """Images/s of the training step alone, on one fixed batch already on the GPU. ``soft_targets``: a number of
    classes, for targets as MixUp/CutMix make them (float [B, classes]) instead of class indices: the loaders'
    batches then meet the same loss, and with ``cuda_graph`` the graph captured here."""
    x, y = fixed_batch(batch_size, size, device)
    if soft_targets is not None:
        y = torch.softmax(torch.randn(batch_size, soft_targets, device=device), dim=1)
    for _ in range(10):
        step(x, y)
    gc.collect()  # as before the loaders' clocks (_timed_epochs)
    _sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        step(x, y)
    _sync(device)
    return steps * batch_size / (time.perf_counter() - t)


def _device_name(device):
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(data, *, baseline=None, device="cpu", batch_size=256, threads=None, workers=None, epochs=2, size=224,
        model=None, progress=True, decoder="cpu", transform=None, cuda_graph=False):
    """Measures everything asked for; returns {"config": {...}, "rows": [row, ...]}.

    A row: pipeline (a readable name), kind ("ceiling", "fastload" or "torchvision"), images_per_s, and where
    they apply efficiency (rate / ceiling, with a model), speedup (rate / the torchvision rate), stats (fastload's
    loader.stats()). ``data`` is a path (folder or store) or a dataset. ``cuda_graph``: the model's step captured
    in a CUDA graph (``training_step``), for the ceiling and every loader alike.
    """
    if baseline not in (None, "torchvision"):
        raise ValueError(f"baseline must be None or 'torchvision', got {baseline!r}")
    if model is not None and torch.device(device).type != "cuda":
        raise ValueError("a model's training efficiency is measured on a CUDA device")
    if cuda_graph and model is None:
        raise ValueError("cuda_graph captures a model's training step: it needs a model")
    is_path = isinstance(data, (str, os.PathLike))
    dataset = open_dataset(data) if is_path else data
    source = os.path.abspath(os.fspath(data)) if is_path else \
        getattr(dataset, "path", None) or getattr(dataset, "root", None) or repr(dataset)
    _check_batches(len(dataset), batch_size)
    cores = usable_cores()
    workers = cores if workers is None else workers
    config = {
        "data": source,
        "data_kind": "store" if hasattr(dataset, "meta") else "folder",
        "images": len(dataset), "classes": len(dataset.classes), "batches_per_epoch": len(dataset) // batch_size,
        "device": str(device),
        "device_name": _device_name(device), "cpu_cores": cores, "batch_size": batch_size, "threads": threads,
        "workers": workers if baseline else None, "epochs": epochs, "warmup_epochs": 1, "size": size,
        "model": model, "cuda_graph": bool(cuda_graph), "baseline": baseline, "decoder": decoder,
        "transform": transform or "classic",
        "versions": _versions(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    rows = []
    num_classes = max(1000, len(dataset.classes))  # the model's outputs and MixUp/CutMix's targets cover every label
    step = training_step(model, device, batch_size, num_classes, cuda_graph) if model else None
    ceiling = None
    fed = f"{model} fed by " if model else ""
    if step is not None:
        # torchvision_v2 ends in MixUp/CutMix: both loaders deliver soft targets (and a graph is captured here for
        # them, not while a loader's producers run)
        ceiling = ceiling_rate(step, batch_size, size, device,
                               soft_targets=num_classes if transform == "torchvision_v2" else None)
        graphed = ", CUDA graph" if cuda_graph else ""
        rows.append({"pipeline": f"{model} on a fixed GPU batch (ceiling{graphed})", "kind": "ceiling",
                     "images_per_s": ceiling})
    rate, stats = fastload_rate(dataset, batch_size=batch_size, threads=threads, epochs=epochs, device=device,
                                size=size, progress=progress, step=step, decoder=decoder, transform=transform,
                                num_classes=num_classes)
    config["threads"] = stats["threads"]  # FastLoader's choice unless given
    how = {"nvjpeg": "GPU hardware decoder", "hybrid": "GPU hardware decoder + cores"}.get(stats["decoder"]) or (
        f"{stats['workers']} x {stats['threads']} threads" if stats["workers"] > 1 else f"{stats['threads']} threads")
    if "decoder_trial" in stats:  # decoder="auto": what it measured and chose (the timed epochs follow its trial)
        rates = ", ".join(f"{name} {rate:,.0f}" for name, rate in stats["decoder_trial"]["rates"].items())
        how = f"decoder='auto' chose {stats['decoder']} ({rates} img/s): {how}"
    rows.append({"pipeline": f"{fed}fastload FastLoader ({how})", "kind": "fastload",
                 "images_per_s": rate, "stats": stats})
    if baseline == "torchvision":
        tv = torchvision_rate(dataset, batch_size=batch_size, workers=workers, epochs=epochs, device=device,
                              size=size, progress=progress, step=step, transform=transform,
                              num_classes=num_classes)
        rows.append({"pipeline": f"{fed}torchvision DataLoader ({workers} workers)", "kind": "torchvision",
                     "images_per_s": tv})
        for row in rows:
            if row["kind"] != "ceiling":
                row["speedup"] = row["images_per_s"] / tv
    if ceiling:
        for row in rows:
            row["efficiency"] = row["images_per_s"] / ceiling
    return {"config": config, "rows": rows}


def _versions():
    import fastload
    out = {"fastload": fastload.__version__, "torch": torch.__version__, "python": platform.python_version()}
    try:
        import torchvision
        out["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    return out


def describe(result):
    """One line saying what was measured, for the table's title and the chart's subtitle."""
    c = result["config"]
    what = "LMDB store" if c["data_kind"] == "store" else "image folder"
    line = (f"{os.path.basename(c['data'].rstrip('/')) or c['data']}: {c['images']:,} images ({what}), "
            f"batch {c['batch_size']}, {c['size']}x{c['size']}, {c['device']} ({c['device_name']}), "
            f"{c['cpu_cores']} CPU cores, {c['epochs']} timed epoch{'s' if c['epochs'] != 1 else ''}")
    if c.get("transform", "plain") not in ("plain", "classic"):  # classic: crop= against v1's ToTensor/Normalize
        line += f", crop + flip + {c['transform']} + normalise in both loaders"
    if c.get("cuda_graph"):
        line += ", the training step in a CUDA graph"
    return line


def _baseline_rate(rows):
    for r in rows:
        if r.get("kind", "torchvision" if r["pipeline"].startswith("torchvision") else "") == "torchvision":
            return r["images_per_s"]
    return None


def format_table(rows, title=""):
    """A plain-text table: img/s, speed-up over torchvision (when measured), efficiency (with a model)."""
    base = _baseline_rate(rows)
    with_eff = any("efficiency" in r for r in rows)
    width = max([len("pipeline")] + [len(r["pipeline"]) for r in rows])
    head = f"{'pipeline':<{width}}  {'img/s':>9}"
    if with_eff:
        head += f"  {'efficiency':>10}"
    if base:
        head += f"  {'vs torchvision':>14}"
    lines = [title] if title else []
    lines += [head, "-" * len(head)]
    for r in rows:
        line = f"{r['pipeline']:<{width}}  {r['images_per_s']:9,.0f}"
        if with_eff:
            line += f"  {r['efficiency']:10.3f}" if "efficiency" in r else f"  {'':>10}"
        if base:
            ceiling = r.get("kind") == "ceiling"
            line += f"  {'':>14}" if ceiling else f"  {r['images_per_s'] / base:13.2f}x"
        lines.append(line)
    return "\n".join(lines)


_COLOURS = {"fastload": "#e8590c", "torchvision": "#868e96", "ceiling": "#ced4da"}


def plot(rows, path, title=None, subtitle=None):
    """A horizontal bar chart of images/s, one bar per pipeline, fastload highlighted, numbers on the bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def kind(r):
        return r.get("kind") or ("fastload" if "fastload" in r["pipeline"] else "torchvision")

    rows = list(rows)[::-1]  # barh draws bottom-up: the first row goes on top
    base = _baseline_rate(rows)
    training = any(kind(r) == "ceiling" for r in rows)
    if title is None:
        title = "Training throughput: fastload vs torchvision" if training else \
            "Images per second delivered to training: fastload vs torchvision"
    names = [textwrap.fill(r["pipeline"], 34) for r in rows]
    values = [r["images_per_s"] for r in rows]
    fig, ax = plt.subplots(figsize=(10, 1.0 * len(rows) + 1.6))
    bars = ax.barh(names, values, height=0.6, color=[_COLOURS[kind(r)] for r in rows],
                   edgecolor=["#868e96" if kind(r) == "ceiling" else "none" for r in rows],
                   hatch=None)
    for bar, r in zip(bars, rows):
        if kind(r) == "ceiling":
            bar.set_hatch("//")
    top = max(values)
    labels = []
    for bar, r in zip(bars, rows):
        label = f"  {r['images_per_s']:,.0f} img/s"
        if "efficiency" in r and kind(r) != "ceiling":
            label += f"  ({r['efficiency']:.0%} of ceiling"
            label += f", {r['images_per_s'] / base:.1f}x torchvision)" if base and kind(r) == "fastload" else ")"
        elif base and kind(r) == "fastload":
            label += f"  ({r['images_per_s'] / base:.1f}x torchvision)"
        labels.append(ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, label, va="center", fontsize=11,
                              fontweight="bold" if kind(r) == "fastload" else "normal"))
    for tick, r in zip(ax.get_yticklabels(), rows):
        if kind(r) == "fastload":
            tick.set_fontweight("bold")
    ax.set_xlabel("images per second (higher is better)", fontsize=11)
    ax.set_xlim(0, top * 1.3)
    ax.tick_params(axis="y", labelsize=11)
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    fig.suptitle(title, fontsize=14, fontweight="bold", x=0.02, ha="left")
    if subtitle:
        ax.set_title(textwrap.fill(subtitle, 95), fontsize=9, color="#555555", loc="left")
    fig.tight_layout()
    for _ in range(3):  # widen the axis until the numbers beside the bars fit inside it
        fig.canvas.draw()
        inverse = ax.transData.inverted()
        right = max(inverse.transform(t.get_window_extent().get_points())[1, 0] for t in labels)
        if right <= ax.get_xlim()[1]:
            break
        ax.set_xlim(0, right * 1.04)
        fig.tight_layout()
    if not os.path.splitext(os.fspath(path))[1]:  # matplotlib would add .png itself: say so, the returned path
        path = os.fspath(path) + ".png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
