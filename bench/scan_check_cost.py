"""What the loader's first-decode check costs (decoders.ScanChecks: a sample's first decode reads its whole scan, so
damage libjpeg notices only at the scan's end is refused in every epoch): FastLoader on a folder, epoch by epoch,
with strict=True (the check) and strict=False (no check), alternating runs in one process.

    python -m bench.scan_check_cost [--data data/imagenet-like] [--epochs 3] [--rounds 2] [--size 224]
"""
import argparse
import time

import fastload as fl


def epoch_rates(ds, strict, epochs, size, batch_size, threads):
    loader = fl.FastLoader(ds, batch_size=batch_size, crop=fl.RandomResizedCrop(size), threads=threads,
                           strict=strict)
    rates = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        t = time.perf_counter()
        n = sum(len(y) for _, y in loader)
        rates.append(n / (time.perf_counter() - t))
    return rates


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/imagenet-like", help="an image folder (class subfolders)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    ds = fl.FolderDataset(args.data)
    rows = []
    for r in range(args.rounds):
        for strict in (True, False):  # each run a new loader: its first epoch checks every sample again
            rows.append((strict, r, epoch_rates(ds, strict, args.epochs, args.size, args.batch_size, args.threads)))
    print(f"{len(ds)} images, {args.size} px, batch {args.batch_size}; images/s per epoch")
    print("| loader | round | " + " | ".join(f"epoch {e}" for e in range(args.epochs)) + " |")
    print("|---|---:|" + "---:|" * args.epochs)
    for strict, r, rates in rows:
        label = "strict=True (first-decode check)" if strict else "strict=False (none)"
        print(f"| {label} | {r} | " + " | ".join(f"{x:,.0f}" for x in rates) + " |")


if __name__ == "__main__":
    main()
