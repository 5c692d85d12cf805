"""What busy cores cost a training loop that launches its own steps (issue 18; bench/RESULTS.md, "Issue 18").

Inside a FastLoader training loop the training thread takes much longer to launch a step than alone (ResNet-50 at
176 px on an H100 host: 44.8 against 29.3 ms a step; ResNet-18 at 160 px: 16.4 against 8.1), and the GPU waits for
it. This times that same step on one fixed batch already on the GPU (nothing of fastload running) while other
processes keep the host's other cores busy in two ways, to tell which one slows the launches:
- ``spin``: a tight integer loop per process (the cores busy, little memory traffic: only the clocks and the
  cores' sharing can slow the training thread);
- ``stream``: each process copies a 64 MB array over and over (memory bandwidth and the shared cache, as decode
  threads use them);
- ``decode``: each process decodes crop windows of the corpus's JPEGs (``--data``) on one thread, as
  FastLoader's decode threads do, with none of the loader's Python or CUDA work: what the decoding alone does to
  the training thread's CPU time, against what the whole loader does in the loop (bench.train_profile);
- ``gil``: N threads of this process (not processes) that each run Python for ``--gil-hold`` ms (holding the GIL:
  CPython takes it from them only when another thread has waited the switch interval) then sleep, holding it
  ``--gil-duty`` of their time where the GIL is free when they wake (the training thread releases it at every torch
  op): the GIL taken from the training thread in chunks of a known length and share, as the loader's Python threads
  take it, with no decode, no CUDA and little CPU;
- ``cuda``: N threads of this process that each copy ``--cuda-bytes`` from pinned memory to the GPU on a
  high-priority stream of their own, record a blocking event and wait on it, ``--cuda-rate`` times a second: the
  loader's CUDA calls from other threads (small copies: the driver's locks) or its copies' volume (large ones: the
  copy engines and memory), with no decode and little Python; ``--cuda-alloc``: each into new memory from the
  caching allocator, with a kernel and a ``record_stream`` to the default stream, as the loader's batches go.
Per setting: images/s of the step running free (the GPU waiting for the launches shows here), and of steps each
launched on an idle GPU: the launch's wall ms (the training thread and autograd's) and the training thread's ms on
a core (Linux schedstat).

    python -m bench.host_contention --model resnet50 --size 176 --busy 0 7 14 [--kinds spin stream decode]
    python -m bench.host_contention --busy 0 4 --kinds gil --gil-hold 0.05 0.5 2 --gil-duty 0.03
"""
import argparse
import multiprocessing as mp
import os
import threading
import time

import numpy as np
import torch

from bench.host_meters import gil_chunks, sched
from fastload.benchmark import fixed_batch, training_step


def _spin(stop):
    x = 0
    while not stop.is_set():
        for i in range(100000):
            x = (x * 1103515245 + i) & 0xFFFFFFFF


def _stream(stop):
    a = np.ones(8 << 20)  # 64 MB of float64: far past any last-level cache
    b = np.empty_like(a)
    while not stop.is_set():
        np.copyto(b, a)


def _decode(stop, data):
    """Crop decodes of a random window (half to all of each side) of each JPEG in turn, on this one thread."""
    from fastload import ops
    from fastload.datasets import FolderDataset
    ds = FolderDataset(data)
    files = [open(p, "rb").read() for p in ds.paths[:256]]
    rng = np.random.default_rng(os.getpid())
    while not stop.is_set():
        for data, h, w in zip(files, ds.heights, ds.widths):
            ch, cw = int(h * rng.uniform(0.5, 1)), int(w * rng.uniform(0.5, 1))
            ops.decode_crop(data, int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw)


def _cuda(stop, nbytes, rate, alloc=False):
    """Copies ``nbytes`` host -> GPU ``rate`` times a second on a stream of its own, waiting on each (GIL
    released), as a producer's copy and its wait on the copy's event. ``alloc``: as a producer's batch goes, each
    copy into memory newly taken from the caching allocator (whose lock the training thread takes for every op's
    output), a kernel over it, the result handed to the default stream (``record_stream``: its free deferred to an
    event) and dropped."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream(priority=-1)
    period = 1 / rate
    while not stop.is_set():
        t = time.perf_counter()
        with torch.cuda.stream(stream):
            if alloc:
                dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            dst.copy_(src, non_blocking=True)
            if alloc:
                out = dst.add(1)
                out.record_stream(torch.cuda.default_stream())
                del out
            done = torch.cuda.Event(blocking=True)
            done.record(stream)
        done.synchronize()
        time.sleep(max(0.0, period - (time.perf_counter() - t)))


def _on_core_ns():
    return sched(threading.get_native_id())[0]  # the training thread's ns on a core (Linux schedstat)


def measure(step, x, y, steps):
    """(images/s of ``steps`` free-running steps, then over as many steps each launched on an idle GPU: median wall
    ms of the launch, mean ms on a core)."""
    for _ in range(5):
        step(x, y)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step(x, y)
    torch.cuda.synchronize()
    rate = steps * len(y) / (time.perf_counter() - t0)
    launches, on_core = [], 0
    for _ in range(steps):
        torch.cuda.synchronize()
        t, c = time.perf_counter(), _on_core_ns()
        step(x, y)  # the GPU idle at the start: nothing here waits for it, only the host's work is timed
        launches.append(time.perf_counter() - t)
        on_core += _on_core_ns() - c
    torch.cuda.synchronize()
    return rate, float(np.median(launches)) * 1e3, on_core / 1e6 / steps


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--size", type=int, default=176)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--busy", type=int, nargs="+", default=[0, 7, 14], help="processes keeping cores busy")
    p.add_argument("--kinds", nargs="+", choices=("spin", "stream", "decode", "gil", "cuda"),
                   default=["spin", "stream"],
                   help="how they keep them busy (gil, cuda: threads of this process, see above)")
    p.add_argument("--gil-hold", type=float, nargs="+", default=[0.5],
                   help="--kinds gil: ms of Python a thread runs at a time, each in turn")
    p.add_argument("--gil-duty", type=float, default=0.03, help="--kinds gil: share of the time each thread holds it")
    p.add_argument("--cuda-bytes", type=int, nargs="+", default=[1 << 16],
                   help="--kinds cuda: bytes a copy, each in turn")
    p.add_argument("--cuda-rate", type=float, default=200, help="--kinds cuda: copies a second per thread")
    p.add_argument("--cuda-alloc", action="store_true",
                   help="--kinds cuda: each copy into new memory from the caching allocator, a kernel over it, the "
                        "result handed to the default stream (record_stream) and dropped")
    p.add_argument("--data", default="data/imagenet-like", help="the JPEG folder --kinds decode decodes")
    p.add_argument("--rounds", type=int, default=1, help="every setting this many times, the order reversed each round")
    args = p.parse_args(argv)
    device = torch.device("cuda")
    step = training_step(args.model, device, args.batch_size)
    x, y = fixed_batch(args.batch_size, args.size, device)
    ctx = mp.get_context("spawn")
    rows = []
    settings = [(0, "none", None)] if 0 in args.busy else []  # (threads or processes, kind, its ms or bytes)
    settings += [(n, kind, value) for n in args.busy if n for kind in args.kinds
                 for value in (args.gil_hold if kind == "gil" else args.cuda_bytes if kind == "cuda" else [None])]
    for r in range(args.rounds):
        for n, kind, value in (settings if r % 2 == 0 else settings[::-1]):
            if kind == "gil":
                stop = threading.Event()
                procs = [threading.Thread(target=gil_chunks, args=(stop, value / 1e3, args.gil_duty),
                                          daemon=True) for _ in range(n)]
                kind = f"gil {value:g} ms x {args.gil_duty:g}"
            elif kind == "cuda":
                stop = threading.Event()
                procs = [threading.Thread(target=_cuda, args=(stop, value, args.cuda_rate, args.cuda_alloc),
                                          daemon=True) for _ in range(n)]
                kind = f"cuda {value / 1e6:g} MB x {args.cuda_rate:g}/s" + (" alloc" if args.cuda_alloc else "")
            else:
                stop = ctx.Event()
                work = {"spin": (_spin, (stop,)), "stream": (_stream, (stop,)),
                        "decode": (_decode, (stop, args.data))}
                procs = [ctx.Process(target=work[kind][0], args=work[kind][1], daemon=True) for _ in range(n)]
            for q in procs:
                q.start()
            time.sleep((4.0 if kind == "decode" else 1.0) if n else 0)  # spawned interpreters up and busy
            rate, launch, on_core = measure(step, x, y, args.steps)
            stop.set()
            for q in procs:
                q.join()
            rows.append((n, kind, rate, launch, on_core))
            print(f"busy {n} {kind}: {rate:,.0f} img/s, launch {launch:.1f} ms, on a core {on_core:.1f} ms",
                  flush=True)
    alone = [row[2] for row in rows if row[0] == 0]
    alone = float(np.mean(alone)) if alone else float("nan")  # x alone: against the mean of the idle runs
    print(f"| {args.model} at {args.size} px, host {os.cpu_count()} cores | busy processes (gil, cuda: threads) | img/s | "
          "x alone | launch ms | on a core ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for n, kind, rate, launch, on_core in rows:
        print(f"| {kind} | {n} | {rate:,.0f} | {rate / alone:.3f} | {launch:.1f} | {on_core:.1f} |")


if __name__ == "__main__":
    main()
