"""What planning a batch costs the producer thread (its Python holds the GIL the training loop's thread waits for):
thread CPU time per batch of 256 of ``BatchMaker.prepare_many`` one batch at a time against loader.PLAN_BATCHES
at a time (the library's), per --transform spec, best of --rounds. ``--device cuda cpu`` plans for a loader on
each device in turn: on CUDA the parameter tables are made in page-locked memory (BatchMaker._pins), which the
CPU loader's are not.

    python -m bench.planning [--data data/imagenet-like] [--size 176] [--specs plain,trivialaugment,randaugment]
"""
import argparse
import time

import numpy as np
import torch

from fastload import FastLoader, benchmark, loader
from fastload.datasets import FolderDataset


def cost(maker, batches, together, rounds):
    """Best over ``rounds`` of thread CPU ms per batch, preparing ``together`` batches per call."""
    best = float("inf")
    for _ in range(rounds):
        t = time.thread_time()
        for i in range(0, len(batches), together):
            ks = list(range(i, i + together))
            assert len(maker.prepare_many(batches[i:i + together], 0, ks)) == together
        best = min(best, (time.thread_time() - t) / len(batches) * 1e3)
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/imagenet-like")
    p.add_argument("--size", type=int, default=176)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=48)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--specs", default="plain,trivialaugment,randaugment")
    p.add_argument("--device", nargs="+", default=["cpu"], help="the loader's device(s), each in turn")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    ds = FolderDataset(args.data)
    rs = np.random.RandomState(0)
    batches = [rs.randint(0, len(ds), args.batch_size) for _ in range(args.batches)]
    n = loader.PLAN_BATCHES
    print(f"| --transform | device | one at a time, ms per batch | {n} at a time, ms per batch | ratio |\n"
          "|---|---|---:|---:|---:|")
    for spec in args.specs.split(","):
        for device in args.device:
            maker = FastLoader(ds, transform=benchmark.pipelines(spec, args.size)[0], batch_size=args.batch_size,
                               device=device)._maker
            cost(maker, batches[:8], n, 1)  # warm-up
            alone, together = cost(maker, batches, 1, args.rounds), cost(maker, batches, n, args.rounds)
            print(f"| {spec} | {device} | {alone:.2f} | {together:.2f} | {together / alone:.2f} |", flush=True)


if __name__ == "__main__":
    main()
