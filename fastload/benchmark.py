"""Loader throughput and training efficiency, side by side with torchvision: the engine of `fastload bench`.

Every number is measured in the run that prints it: one warm-up epoch (page cache, worker start-up, CUDA
context, allocator), then ``epochs`` timed epochs. The torchvision baseline is what users run today:
ImageFolder (or PIL over the LMDB records) + RandomResizedCrop + RandomHorizontalFlip + ToTensor + Normalize
in a DataLoader with ``workers`` processes, pinned and copied to the GPU when the device is CUDA.
"""
import io
import os
import time

import torch
from tqdm import tqdm

from .loader import IMAGENET_MEAN, IMAGENET_STD, FastLoader
from .transforms import RandomResizedCrop


def open_dataset(path):
    """A FolderDataset for a folder, an LMDBDataset for a store made by `fastload pack`."""
    from .datasets import FolderDataset, LMDBDataset
    return LMDBDataset(path) if LMDBDataset.is_store(path) else FolderDataset(path)


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _timed_epochs(make_iter, epochs, total, label, progress, device, step=None):
    """Runs one warm-up epoch and `epochs` timed ones; returns images/s over the timed ones."""
    bar = tqdm(total=total * (epochs + 1), desc=label, unit="img", disable=not progress, leave=False)
    images, start = 0, None
    for epoch in range(epochs + 1):
        if epoch == 1:
            _sync(device)
            start = time.perf_counter()
        for x, y in make_iter(epoch):
            if step is not None:
                step(x, y)
            if epoch >= 1:
                images += len(y)
            bar.update(len(y))
    _sync(device)
    bar.close()
    return images / (time.perf_counter() - start)


def fastload_rate(dataset, *, batch_size=256, threads=None, epochs=2, device="cpu", size=224, progress=True,
                  step=None):
    loader = FastLoader(dataset, batch_size=batch_size, crop=RandomResizedCrop(size), device=device,
                        threads=threads, drop_last=True, channels_last=step is not None)

    def run(epoch):
        loader.set_epoch(epoch)
        return loader
    rate = _timed_epochs(run, epochs, len(loader) * batch_size, "fastload", progress, device, step)
    return rate, loader.stats()


class _PILRecords(torch.utils.data.Dataset):
    """What a user without fastload does with an LMDB store: PIL decode of each record, then transforms."""

    def __init__(self, dataset, transform):
        self.dataset, self.transform = dataset, transform

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        from PIL import Image
        rec = self.dataset.record(i)
        return self.transform(Image.open(io.BytesIO(bytes(rec.data))).convert("RGB")), rec.label


def torchvision_rate(dataset, *, batch_size=256, workers=None, epochs=2, device="cpu", size=224, progress=True,
                     step=None):
    import torchvision
    from torchvision import transforms as T
    tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    root = getattr(dataset, "root", None)
    tv = torchvision.datasets.ImageFolder(root, transform=tf) if root and os.path.isdir(root) and not hasattr(
        dataset, "store_path") else _PILRecords(dataset, tf)
    workers = os.cpu_count() if workers is None else workers
    on_gpu = torch.device(device).type == "cuda"
    loader = torch.utils.data.DataLoader(tv, batch_size=batch_size, shuffle=True, num_workers=workers,
                                         pin_memory=on_gpu, drop_last=True, persistent_workers=workers > 0)

    def run(epoch):
        for x, y in loader:
            if on_gpu:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            yield x, y
    return _timed_epochs(run, epochs, len(loader) * batch_size, "torchvision", progress, device, step)


def training_step(model_name, device, batch_size):
    """A real training step: torchvision model, SGD, bf16 autocast, channels_last."""
    import torchvision
    model = getattr(torchvision.models, model_name)(num_classes=1000).to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        y = y.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def ceiling_rate(step, batch_size, size, device, steps=60):
    """Images/s of the training step alone, on one fixed batch already on the GPU."""
    x = torch.randn(batch_size, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch_size,), device=device)
    for _ in range(10):
        step(x, y)
    _sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        step(x, y)
    _sync(device)
    return steps * batch_size / (time.perf_counter() - t)


def run(data, *, baseline=None, device="cpu", batch_size=256, threads=None, workers=None, epochs=2, size=224,
        model=None, progress=True):
    """Measures and returns a list of result rows (dicts): pipeline, images_per_s, and efficiency with a model."""
    dataset = open_dataset(data)
    rows = []
    step = training_step(model, device, batch_size) if model else None
    ceiling = None
    if step is not None:
        ceiling = ceiling_rate(step, batch_size, size, device)
        rows.append({"pipeline": f"{model} on a fixed GPU batch (ceiling)", "images_per_s": ceiling,
                     "efficiency": 1.0})
    rate, stats = fastload_rate(dataset, batch_size=batch_size, threads=threads, epochs=epochs, device=device,
                                size=size, progress=progress, step=step)
    rows.append({"pipeline": f"fastload FastLoader ({device}, {threads or os.cpu_count()} threads)",
                 "images_per_s": rate, "stats": stats})
    if baseline == "torchvision":
        tv = torchvision_rate(dataset, batch_size=batch_size, workers=workers, epochs=epochs, device=device,
                              size=size, progress=progress, step=step)
        rows.append({"pipeline": f"torchvision DataLoader ({workers if workers is not None else os.cpu_count()}"
                                 f" workers)", "images_per_s": tv})
    if ceiling:
        for row in rows[1:]:
            row["efficiency"] = row["images_per_s"] / ceiling
    fast = rows[1 if ceiling else 0]["images_per_s"]
    for row in rows:
        row["vs_fastload"] = row["images_per_s"] / fast
    return rows


def format_table(rows, title=""):
    lines = [title] if title else []
    with_eff = any("efficiency" in r for r in rows)
    head = f"{'pipeline':<52} {'img/s':>9} {'speed-up':>9}" + (f" {'efficiency':>10}" if with_eff else "")
    lines += [head, "-" * len(head)]
    base = rows[-1]["images_per_s"]  # the last row is the baseline when there is one
    for r in rows:
        line = f"{r['pipeline']:<52} {r['images_per_s']:9.0f} {r['images_per_s'] / base:8.2f}x"
        if with_eff:
            line += f" {r['efficiency']:10.3f}" if "efficiency" in r else f" {'':>10}"
        lines.append(line)
    return "\n".join(lines)


def plot(rows, path, title="fastload vs torchvision"):
    """A horizontal bar chart of images/s, one bar per pipeline, numbers on the bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [r["pipeline"] for r in rows][::-1]
    values = [r["images_per_s"] for r in rows][::-1]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 1.4))
    bars = ax.barh(names, values, color=["#1f77b4" if "fastload" in n else "#999999" for n in names])
    for bar, v in zip(bars, values):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {v:,.0f}", va="center")
    ax.set_xlabel("images per second (higher is better)")
    ax.set_title(title)
    ax.set_xlim(0, max(values) * 1.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
