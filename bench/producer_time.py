"""Where a producer thread's time goes per batch: the calling thread's CPU time (time.thread_time: its Python,
and the native work it does itself with or without the GIL) and wall time, split by step. The native decode runs
on its own threads (threads >= 2), so the producer's CPU time inside ``decode`` is the Python and binding work
around it: what competes with the training loop's thread for the GIL.

    python -m bench.producer_time [--data data] [--batch-size 256] [--epochs 2] [--threads 2] [--gil]

Steps: plan (crop plans, Pipeline.plan), read (the reader's sources: paths or LMDB views), decode (the native
batch call, GIL released inside), params (Pipeline.sample_params + batch_plan), stage (the CPU warp/normalise,
which a CUDA loader runs on the GPU instead), other (make() minus the above: reserving, tables, counts, labels).
Then the torch functions one make() calls (each that runs a kernel gives the GIL up and waits to get it back).
--gil: instead, make() beside a busy Python thread, and the GIL handoffs per batch that implies (gil_waits).
Works on older checkouts too (before fastload.decoders), for before/after figures.
"""
import argparse
import collections
import contextlib
import os
import statistics
import sys
import threading
import time

from bench import corpus
from fastload import FastLoader, ops, producer
from fastload.datasets import FolderDataset, LMDBDataset


class _Clock:
    """Per-step (thread CPU, wall) seconds, summed per batch."""

    def __init__(self):
        self.batch = collections.defaultdict(lambda: [0.0, 0.0])
        self.rows = []

    @contextlib.contextmanager
    def step(self, name):
        c, w = time.thread_time(), time.perf_counter()
        try:
            yield
        finally:
            acc = self.batch[name]
            acc[0] += time.thread_time() - c
            acc[1] += time.perf_counter() - w

    def wrap(self, owner, attr, name):
        fn = getattr(owner, attr)

        def timed(*a, **k):
            with self.step(name):
                return fn(*a, **k)
        setattr(owner, attr, timed)

    def end_batch(self):
        self.rows.append(dict(self.batch))
        self.batch.clear()


def _hooks(maker):
    """(object, attribute, step) of the calls that read and decode, wherever this checkout has them."""
    if hasattr(maker, "_sources"):  # before fastload.decoders: the producer reads, ops.decode_crops decodes
        return [(maker, "_sources", "read"), (ops, "decode_crops", "decode")]
    return [(maker.decoder.crops, "read", "read"), (maker.decoder.crops, "decode", "decode")]


def torch_calls(maker, indices, epoch, slot, k):
    """torch functions and tensor methods make() calls (a TorchFunctionMode count): each that runs a kernel gives
    the GIL up and must get it back, behind the training loop's Python."""
    from torch.overrides import TorchFunctionMode
    names = collections.Counter()

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            names[getattr(func, "__name__", str(func))] += 1
            return func(*args, **(kwargs or {}))
    with Count():
        maker.make(indices, epoch, slot, k)
    return names


def profile(dataset, batch_size, epochs, threads):
    loader = FastLoader(dataset, batch_size=batch_size, threads=threads, drop_last=True, shuffle=True)
    maker, pipeline = loader._maker, loader.pipeline
    clock = _Clock()
    clock.wrap(maker, "plan", "plan")
    clock.wrap(pipeline, "sample_params", "params")
    clock.wrap(pipeline, "batch_plan", "params")
    for obj, attr, name in _hooks(maker):
        clock.wrap(obj, attr, name)
    stage = loader._stage_cpu()
    slot = producer.Slot(pin=False)
    for epoch in range(epochs):
        for k, indices in enumerate(loader._epoch_batches(epoch)):
            with clock.step("make"):
                batch = maker.make(indices, epoch, slot, k)
            with clock.step("stage"):
                stage(batch)
            clock.end_batch()
    calls = torch_calls(maker, indices, epoch, slot, k)
    print(f"torch calls in one make(): {sum(calls.values())} ({', '.join(f'{n} x{c}' for n, c in calls.most_common())})")
    loader.close()
    return clock.rows[len(clock.rows) // epochs:]  # after the first epoch: what is cached is not paid for


def gil_waits(dataset, batch_size, epochs, threads, interval=0.02):
    """How many times per batch the producer gives the GIL up and must get it back: make() beside a Python thread
    that never sleeps (a stand-in for the training loop) with a switch interval of ``interval`` s. A thread that
    wants the GIL back waits up to that interval before the holder is made to drop it, so the extra wall time
    over make() alone, divided by the interval, counts the handoffs (each costs up to 5 ms at Python's default
    interval when the training thread runs Python). Returns (median make() ms alone, beside it, handoffs)."""
    loader = FastLoader(dataset, batch_size=batch_size, threads=threads, drop_last=True, shuffle=True)
    maker, slot = loader._maker, producer.Slot(pin=False)
    batches = [(epoch, k, b) for epoch in range(epochs) for k, b in enumerate(loader._epoch_batches(epoch))]
    for epoch, k, b in batches[:2]:  # warm: the reader, caches
        maker.make(b, epoch, slot, k)

    def walls():
        out = []
        for epoch, k, b in batches[2:]:
            w = time.perf_counter()
            maker.make(b, epoch, slot, k)
            out.append(time.perf_counter() - w)
        return statistics.median(out) * 1e3
    alone = walls()
    stop = threading.Event()
    t = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)], daemon=True)
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        t.start()
        beside = walls()
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(before)
    loader.close()
    return alone, beside, (beside - alone) / (interval * 1e3)


def table(rows, title):
    steps = ["plan", "read", "decode", "params", "other", "make", "stage"]
    for r in rows:
        inner = sum(r.get(s, (0, 0))[0] for s in ("plan", "read", "decode", "params"))
        inner_w = sum(r.get(s, (0, 0))[1] for s in ("plan", "read", "decode", "params"))
        r["other"] = (r["make"][0] - inner, r["make"][1] - inner_w)
    print(f"\n{title} ({len(rows)} batches, medians in ms per batch)")
    print("| step | producer CPU (ms) | wall (ms) |\n|---|---:|---:|")
    for s in steps:
        cpu = statistics.median(r.get(s, (0, 0))[0] for r in rows) * 1e3
        wall = statistics.median(r.get(s, (0, 0))[1] for r in rows) * 1e3
        print(f"| {s} | {cpu:.2f} | {wall:.2f} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--gil", action="store_true", help="instead: GIL handoffs per batch (gil_waits)")
    args = p.parse_args(argv)
    root = corpus.make_imagenet_like(os.path.join(args.data, "imagenet-like"), classes=10, per_class=100)
    for what, ds in (("folder", FolderDataset(root)), ("pack --seekable", LMDBDataset(corpus.seekable_store(root)))):
        if args.gil:
            alone, beside, handoffs = gil_waits(ds, args.batch_size, args.epochs, args.threads)
            print(f"{what}: make() {alone:.1f} ms alone, {beside:.1f} ms beside a busy Python thread (switch "
                  f"interval 20 ms): ~{handoffs:.1f} GIL handoffs per batch of {args.batch_size}")
            continue
        rows = profile(ds, args.batch_size, args.epochs, args.threads)
        table(rows, f"ImageNet-like, {what}, batch {args.batch_size}, {args.threads} decode threads")


if __name__ == "__main__":
    main()
