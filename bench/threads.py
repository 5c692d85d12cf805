"""Training efficiency by FastLoader producer/thread configuration (the measurements behind FastLoader's default
thread count on CUDA; bench/RESULTS.md): python -m bench.threads resnet18 resnet50, on the GPU machine."""
import sys
import time

import torch

import fastload as fl
from bench.corpus import linked_copies, seekable_store
from fastload.benchmark import ceiling_rate, training_step

store = seekable_store(linked_copies("data/imagenet-like", "data/imagenet-like-x6", 6))

ds = fl.LMDBDataset(store)
CONFIGS = [(4, 16), (4, 4), (4, 3), (3, 4), (2, 7), (2, 6)]


def measure(workers, threads, step=None):
    loader = fl.FastLoader(ds, batch_size=256, device="cuda", threads=threads, workers=workers, drop_last=True,
                           channels_last=True)
    for x, y in loader:
        if step:
            step(x, y)
    torch.cuda.synchronize()
    t, n = time.perf_counter(), 0
    for _ in range(2):
        for x, y in loader:
            if step:
                step(x, y)
            n += len(y)
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t), loader.stats()


for workers, threads in CONFIGS:
    rate, st = measure(workers, threads)
    print(f"loader alone, {workers} workers x {threads} threads: {rate:.0f} img/s", flush=True)
for model in sys.argv[1:]:
    step = training_step(model, "cuda", 256)
    ceiling = ceiling_rate(step, 256, 224, "cuda")
    print(f"{model} ceiling {ceiling:.0f} img/s", flush=True)
    for workers, threads in CONFIGS:
        rate, st = measure(workers, threads, step)
        print(f"{model} {workers} workers x {threads} threads: {rate:.0f} img/s, efficiency {rate / ceiling:.3f}, "
              f"wait_s {st['wait_s']:.2f}", flush=True)
