"""What the JPEG engines share with a training step (issue 18; bench/RESULTS.md, "Why the engines slowed down inside
training": CUDA's 8 hardware queues, which fastload now raises to 32).

Alone the engines decode ~27,000 crops/s at 160 px (this script); with the driver's default 8 queues, beside ResNet-18's step
(even with the step in a CUDA graph and the host idle) about half, and the time went inside nvJPEG's batched decode
call. Run it with CUDA_DEVICE_MAX_CONNECTIONS=8 or 32 in its environment to compare queue counts (fastload's import
sets 32 where it is unset). This runs that call in a loop (its
own thread and stream, crop windows of RandomResizedCrop(SIZE) as the loader plans them) while the GPU does one kind
of other work on another stream, one kind at a time, so that the resource the two share shows itself:

- ``none``: nothing else;
- ``sleep``: ``torch.cuda._sleep`` kernels (a queue that is never empty, one resident block, no work);
- ``tiny``: a stream of one-element kernels (the GPU's front end and the launch path, almost no work);
- ``compute``: bf16 matmuls of 8192 x 8192 (the SMs' tensor cores; little memory traffic per flop);
- ``memory``: an elementwise kernel over 1 GiB in and out (HBM bandwidth through the SMs);
- ``copy``: device-to-device copies of 1 GiB (the copy engines and HBM, no SM);
- ``h2d``: host-to-device copies of 32 MiB from pinned memory (PCIe and the copy engines);
- ``resnet18`` / ``resnet50``: that model's training step at SIZE px on one fixed batch, in a CUDA graph.

Per load and round: the engines' img/s, the decode call's p50 / p90 ms (the call returns once nvJPEG has queued
its last kernel), the batch's p50 ms to its end on the GPU, and the load's own rate beside them and alone.

    python -m bench.engine_contention --data data/imagenet-like [--loads none compute memory ...] [--rounds 2]
"""
import argparse
import contextlib
import os
import threading
import time

import numpy as np
import torch

import fastload as fl
from fastload import nvjpeg
from fastload.benchmark import training_step

LOADS = ("none", "sleep", "tiny", "compute", "memory", "copy", "h2d", "resnet18", "resnet50")


def make_load(name, size, batch):
    """(one unit of work queued on the current stream, its unit's name) for a load, or None for ``none``."""
    if name == "none":
        return None
    if name == "sleep":
        return (lambda: torch.cuda._sleep(1_000_000)), "sleeps"
    if name == "tiny":
        x = torch.zeros(1, device="cuda")

        def tiny():
            for _ in range(100):
                x.add_(1)
        return tiny, "x100 kernels"
    if name == "compute":
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        c = torch.empty_like(a)
        return (lambda: torch.mm(a, a, out=c)), "matmuls"
    if name == "memory":
        a = torch.ones(256 << 20, device="cuda")
        b = torch.empty_like(a)
        return (lambda: torch.mul(a, 2, out=b)), "GiB passes"
    if name == "copy":
        a = torch.ones(1 << 30, dtype=torch.uint8, device="cuda")
        b = torch.empty_like(a)
        return (lambda: b.copy_(a)), "GiB copies"
    if name == "h2d":
        a = torch.ones(32 << 20, dtype=torch.uint8).pin_memory()
        b = torch.empty(a.shape, dtype=torch.uint8, device="cuda")
        return (lambda: b.copy_(a, non_blocking=True)), "32 MiB copies"
    if name in ("resnet18", "resnet50"):
        step = training_step(name, "cuda", batch, cuda_graph=True)
        x = torch.randn(batch, 3, size, size, device="cuda").contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device="cuda")
        step(x, y)  # warm-up and capture
        torch.cuda.synchronize()
        return (lambda: step(x, y)), "steps"
    raise ValueError(f"load must be one of {', '.join(LOADS)}, got {name!r}")


def _queue(work, stream, stop, counts):
    """Queues ``work`` on ``stream`` until ``stop``, at most three units ahead of the GPU; counts finished units."""
    events = []
    with torch.cuda.stream(stream):
        while not stop.is_set():
            work()
            e = torch.cuda.Event(blocking=True)
            e.record(stream)
            events.append(e)
            if len(events) > 3:
                events.pop(0).synchronize()
                counts["units"] += 1
    stream.synchronize()


@contextlib.contextmanager
def running(load, stream, fill=0.0):
    """``load`` (make_load's, or None) queued on ``stream`` by a thread of its own for the block, ``fill`` seconds
    ahead of it; yields {"units": finished units}, final once the block is left."""
    counts, stop = {"units": 0}, threading.Event()
    thread = None
    if load is not None:
        thread = threading.Thread(target=_queue, args=(load[0], stream, stop, counts))
        thread.start()
        time.sleep(fill)
    try:
        yield counts
    finally:
        stop.set()
        if thread is not None:
            thread.join()


def engines(hw, batches, out, seconds, stream):
    """The engines' loop: (img/s, call ms list, batch-to-end ms list) over ``seconds``."""
    calls, ends, n, i = [], [], 0, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        files, windows = batches[i % len(batches)]
        t = time.perf_counter()
        hw.decode(files, windows, out, stream)
        calls.append(time.perf_counter() - t)
        stream.synchronize()
        ends.append(time.perf_counter() - t)
        n += len(files)
        i += 1
    return n / (time.perf_counter() - t0), calls, ends


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a JPEG folder (bench.corpus imagenet)")
    p.add_argument("--size", type=int, default=160)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seconds", type=float, default=4.0, help="per load and round")
    p.add_argument("--loads", nargs="+", default=list(LOADS), choices=LOADS)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args(argv)
    ds = fl.FolderDataset(a.data)
    rrc = fl.RandomResizedCrop(a.size, dct_downscale=False)
    batches = []
    for epoch in range(8):  # the windows the loader would plan: eight batches of different crops
        idx = np.random.default_rng(epoch).choice(len(ds), a.batch, replace=False)
        files = [open(ds.paths[i], "rb").read() for i in idx]
        batches.append((files, rrc.plan(ds.heights[idx], ds.widths[idx], 0, epoch, idx).windows))
    room = max(int((w[:, 2] * w[:, 3] * 3).sum()) for _, w in batches)
    out = torch.empty(room, dtype=torch.uint8, device="cuda")
    hw = nvjpeg.HardwareDecoder(a.batch)
    engine_stream, load_stream = torch.cuda.Stream(), torch.cuda.Stream()
    loads = {name: make_load(name, a.size, a.batch) for name in a.loads}
    engines(hw, batches, out, 1.0, engine_stream)  # warm-up

    alone = {}
    for name, load in loads.items():  # each load's own rate, the engines idle
        if load is not None:
            with running(load, load_stream) as counts:
                time.sleep(a.seconds / 2)
            alone[name] = counts["units"] / (a.seconds / 2)

    rows = []
    for r in range(a.rounds):
        for name, load in loads.items():
            with running(load, load_stream, fill=0.2) as counts:  # 0.2 s: the load's queue filled
                rate, calls, ends = engines(hw, batches, out, a.seconds, engine_stream)
            ms = lambda v, q: float(np.percentile(v, q)) * 1e3
            rows.append((r, name, rate, ms(calls, 50), ms(calls, 90), ms(ends, 50),
                         counts["units"] / (a.seconds + 0.2) if load else None, alone.get(name),
                         load[1] if load else ""))
            print(f"round {r} {name:<9} {rate:>9,.0f} img/s", flush=True)

    print(f"\n{torch.cuda.get_device_name()} | batch {a.batch} | {a.size} px crops (full-resolution windows) | "
          f"{a.seconds:g} s per load and round | {fl.cuda_queues.queues()} hardware queues "
          f"({fl.cuda_queues.VARIABLE}={os.environ.get(fl.cuda_queues.VARIABLE)}"
          f"{', set by fastload' if fl.cuda_queues.set_by_fastload else ''})")
    print("| round | load | engines img/s | decode call p50 / p90 ms | batch to its end p50 ms | load's rate beside / "
          "alone |")
    print("|---|---|---:|---|---:|---|")
    for r, name, rate, c50, c90, e50, beside, al, unit in rows:
        load = f"{beside:,.1f} / {al:,.1f} {unit}/s" if beside is not None else ""
        print(f"| {r} | {name} | {rate:,.0f} | {c50:.1f} / {c90:.1f} | {e50:.1f} | {load} |")
    hw.close()


if __name__ == "__main__":
    main()
