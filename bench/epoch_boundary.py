"""What an epoch boundary costs a GPU loader alone: the same decoder over short epochs (the 8,000-sample set, 31
batches) and over long ones (the same JPEGs linked more times), img/s over about the same number of images, and
the loop's wait for each epoch's first batch.

    python -m bench.epoch_boundary SHORT LONG [--decoders hybrid nvjpeg cpu] [--size 160] [--images 64000]
"""
import argparse
import time

import torch

import fastload as fl
from fastload.benchmark import open_dataset


def rate(ds, decoder, size, images, batch_size=256):
    loader = fl.FastLoader(ds, batch_size=batch_size, device="cuda", decoder=decoder, channels_last=True,
                           drop_last=True, crop=fl.RandomResizedCrop(size))
    warm = sum(len(y) for _, y in loader)  # warm-up epoch
    torch.cuda.synchronize()
    assert warm == len(loader) * batch_size
    epochs = max(1, round(images / (len(loader) * batch_size)))
    n, firsts, start = 0, [], time.perf_counter()
    for _ in range(epochs):
        t = time.perf_counter()
        for k, (x, y) in enumerate(loader):
            if k == 0:
                firsts.append((time.perf_counter() - t) * 1e3)
            n += len(y)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    loader.close()
    return n / seconds, epochs, firsts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("short")
    p.add_argument("long")
    p.add_argument("--decoders", nargs="+", default=["hybrid", "nvjpeg", "cpu"])
    p.add_argument("--size", type=int, default=160)
    p.add_argument("--images", type=int, default=64000)
    args = p.parse_args(argv)
    sets = {"short": open_dataset(args.short), "long": open_dataset(args.long)}
    print("| decoder | epochs | batches an epoch | img/s | first batch's wait per epoch, ms (median) |")
    print("|---|---:|---:|---:|---:|")
    for decoder in args.decoders:
        for name, ds in sets.items():
            r, epochs, firsts = rate(ds, decoder, args.size, args.images)
            firsts.sort()
            print(f"| {decoder}, {name} | {epochs} | {len(ds) // 256} | {r:,.0f} | {firsts[len(firsts) // 2]:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
