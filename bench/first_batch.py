"""How long a loop waits for its first batch when a FastLoader starts from nothing (the first epoch, after close(),
a resume), and the next ones: with the producers' relay (each producer's first batch on all the loader's threads,
one after another in batch order) and without it (every producer's first batch on its own threads, side by side).

Per setting and round: the loader is closed (nothing made ahead), then the loop takes the first ``--batches``
batches as fast as it can; on CUDA each batch is waited for on the GPU. Prints ms until batch 1, 2, ... (median
over rounds, the two settings alternating), and the images/s of the whole burst.

With ``--model resnet50`` (CUDA): instead, that model's training efficiency as ``fastload bench`` measures it (a
warm-up epoch, the loader closed, then ``--epochs`` timed epochs from nothing) with and without the relay, the two
alternating in one process, against the ceiling measured before and after.

    python -m bench.first_batch DATA --device cuda --size 176 --transform trivialaugment --rounds 5
    python -m bench.first_batch DATA --device cuda --size 176 --transform trivialaugment --model resnet50
"""
import argparse
import time

import numpy as np
import torch

from fastload import FastLoader
from fastload import loader as loader_module
from fastload.benchmark import TRANSFORMS, ceiling_rate, fastload_rate, open_dataset, pipelines, training_step
from fastload.transforms.planners import RandomResizedCrop


def burst(loader, batches, device, epoch):
    """ms from iter() until each of the first ``batches`` batches of ``epoch`` is usable."""
    loader.close()  # nothing made ahead: producers start at iter()
    loader.set_epoch(epoch)  # from its first batch
    times = []
    start = time.perf_counter()
    for i, (x, y) in enumerate(loader):
        if device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        times.append((time.perf_counter() - start) * 1e3)
        if i + 1 == batches:
            break
    return times


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data")
    p.add_argument("--device", default="cpu")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--transform", choices=TRANSFORMS, help="a fastload bench --transform spec (default: the crop= "
                   "shorthand)")
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int)
    p.add_argument("--workers", type=int)
    p.add_argument("--model", help="time this model's training instead (fastload bench's --model)")
    p.add_argument("--epochs", type=int, default=1, help="with --model: timed epochs")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    dataset = open_dataset(args.data)
    if args.model:
        return train(dataset, args, device)
    shape = {"crop": RandomResizedCrop(args.size)} if args.transform is None else {
        "transform": pipelines(args.transform, args.size)[0]}
    loader = FastLoader(dataset, batch_size=args.batch_size, device=device, drop_last=True,
                        channels_last=device.type == "cuda", threads=args.threads, workers=args.workers, **shape)
    settings = {"relay": True, "side by side": False}
    results = {name: [] for name in settings}
    burst(loader, args.batches, device, 0)  # warm-up: buffers, the JPEGs in the page cache
    for r in range(args.rounds):
        for name in (list(settings) if r % 2 == 0 else list(settings)[::-1]):
            loader_module._RELAY = settings[name]
            results[name].append(burst(loader, args.batches, device, len(results[name]) * 2 + 1 + (name == "relay")))
    loader_module._RELAY = True
    loader.close()
    print(f"{type(dataset).__name__}, {len(dataset):,} images, batch {args.batch_size}, {args.size} px, "
          f"{args.transform or 'plain'}, {device}, {loader.workers} producers x {loader.threads} threads; "
          f"median of {args.rounds} rounds")
    print("| producers' first batches | " + " | ".join(f"batch {i + 1} ms" for i in range(args.batches))
          + " | img/s over the burst |")
    print("|---|" + "---:|" * (args.batches + 1))
    for name, runs in results.items():
        n = min(len(t) for t in runs)
        med = np.median(np.asarray([t[:n] for t in runs]), axis=0)
        print(f"| {name} | " + " | ".join(f"{v:.0f}" for v in med) + f" | {n * args.batch_size / med[-1] * 1e3:,.0f} |")


def train(dataset, args, device):
    step = training_step(args.model, device, args.batch_size)
    ceilings = [ceiling_rate(step, args.batch_size, args.size, device)]
    rates = {True: [], False: []}
    for r in range(args.rounds):
        for relay in ((True, False) if r % 2 == 0 else (False, True)):
            loader_module._RELAY = relay
            rates[relay].append(fastload_rate(dataset, batch_size=args.batch_size, threads=args.threads,
                                              epochs=args.epochs, device=device, size=args.size, progress=False,
                                              step=step, transform=args.transform)[0])
    loader_module._RELAY = True
    ceilings.append(ceiling_rate(step, args.batch_size, args.size, device))
    ceiling = max(ceilings)
    print(f"{args.model} at {args.size} px, {args.transform or 'plain'}, {len(dataset):,} images, {args.epochs} timed "
          f"epoch(s) from nothing; ceiling {ceilings[0]:,.0f} before, {ceilings[1]:,.0f} after (efficiency against "
          f"the higher)")
    print("| producers' first batches | img/s per round | efficiency per round | median efficiency |")
    print("|---|---|---|---:|")
    for relay, name in ((True, "relay"), (False, "side by side")):
        print(f"| {name} | " + ", ".join(f"{v:,.0f}" for v in rates[relay]) + " | "
              + ", ".join(f"{v / ceiling:.3f}" for v in rates[relay]) + f" | {np.median(rates[relay]) / ceiling:.3f} |")


if __name__ == "__main__":
    main()
