"""What sets Python's garbage collector off in a training loop: an eager step (a torchvision model on the CPU, SGD)
trained on FastLoader's batches, or on one fixed batch for as many steps (the loader idle), each in turn, with the
collections counted and timed (bench.host_meters.GcPauses). A full collection walks every tracked object of the
process and holds the GIL throughout; on a GPU host the training thread's launches wait it out (bench/RESULTS.md,
"Which of the loader's activities costs the eager step").

    python -m bench.gc_pauses [--data data/imagenet-like.seekable.lmdb] [--feed loader none loader none]
"""
import argparse
import gc
import time

import torch
import torchvision

from bench.host_meters import GcPauses
from fastload import FastLoader
from fastload.benchmark import loader_shape, open_dataset


def run(loader, step, feed, fixed):
    """(steps, seconds, GcPauses.summary()) of one epoch of ``step`` on the loader's batches or on ``fixed``."""
    pauses, steps, t = GcPauses(), 0, time.perf_counter()
    with pauses.installed():
        for x, y in (iter(loader) if feed == "loader" else iter([fixed] * len(loader))):
            step(x, y)
            steps += 1
    return steps, time.perf_counter() - t, pauses.summary()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/imagenet-like.seekable.lmdb")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--transform", default="trivialaugment")
    p.add_argument("--feed", nargs="+", choices=("loader", "none"), default=["loader", "none", "loader", "none"],
                   help="each run's batches, in turn: the loader's, or a fixed one with the loader idle")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model = getattr(torchvision.models, args.model)(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y % 10)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dataset = open_dataset(args.data)
    print(f"objects the collector tracks: {len(gc.get_objects()):,}")
    print("| feed | steps | s | full collections | their ms | longest ms | young collections' ms |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    for epoch, feed in enumerate(args.feed):
        loader = FastLoader(dataset, batch_size=args.batch_size, drop_last=True,
                            **loader_shape(args.transform, args.size))
        loader.set_epoch(epoch)
        fixed = next(iter(loader))
        steps, seconds, s = run(loader, step, feed, fixed)
        loader.close()
        print(f"| {feed} | {steps} | {seconds:.1f} | {s['gc_full']} | {s['gc_full_ms']:.0f} | "
              f"{s['gc_full_max_ms']:.0f} | {s['gc_young_ms']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
