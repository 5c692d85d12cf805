"""FastLoader(device="cpu") against torchvision's ImageFolder + DataLoader, side by side in one run, on the
ImageNet-like and the 1080p real-photo corpora (built by bench/corpus.py if missing; --sets ImageNet-dense adds
the corpus with ImageNet's ~0.6 bytes per pixel). FastLoader runs twice:
on the folder itself and on the store `fastload pack --seekable` makes of it (packed once, kept in --data).

    python -m bench.loader [--data data] [--batch-size 64] [--epochs 2] [--rounds 1] [--transform SPEC] [--json F]

Same batch size, same transforms (RandomResizedCrop 224, flip, normalise; --transform adds a policy to both
loaders: fastload.benchmark.pipelines); torchvision runs --cores workers, and FastLoader its default layout for
--cores cores (2 producers sharing them: one decode thread per core in all). --rounds N measures every loader N times in
alternating order (round r runs them in turn, starting one later each round) and prints each loader's median with
its range: on a shared 2-core machine one run of torchvision's DataLoader varies by up to +-30%, so a ratio of
single runs says little (bench/RESULTS.md, "Machines, corpora and `bench/device_run.sh`").
"""
import argparse
import json
import os
import statistics

from bench import corpus
from fastload import benchmark
from fastload.decoders import KINDS
from fastload.loader import usable_cores
from fastload.datasets import FolderDataset, LMDBDataset


def median_row(label, rates, stats=None):
    """A table row: the median of a loader's rates over the rounds, with every rate kept (and its stats)."""
    row = {"pipeline": label if len(rates) == 1 else f"{label} [{min(rates):,.0f}-{max(rates):,.0f}]",
           "images_per_s": statistics.median(rates), "rounds": rates}
    if stats is not None:
        row["stats"] = stats
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data", help="where the corpora live or are built")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1, help="measure each loader this many times, alternating; report "
                                                           "medians")
    p.add_argument("--cores", type=int, default=usable_cores(),
                   help="the cores FastLoader's default layout shares out, and torchvision's workers (default: this "
                        "process's cores)")
    p.add_argument("--transform", default=None, choices=benchmark.TRANSFORMS,
                   help="the same torchvision v2 pipeline in both loaders (default: the crop= shorthand and "
                        "torchvision's classic transforms)")
    p.add_argument("--sets", default="ImageNet-like,1080p",
                   help="which corpora, comma-separated: ImageNet-like, ImageNet-dense, 1080p")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    makers = {"ImageNet-like": lambda: corpus.make_imagenet_like(os.path.join(args.data, "imagenet-like"),
                                                                 classes=10, per_class=100),
              "ImageNet-dense": lambda: corpus.make_imagenet_dense(os.path.join(args.data, "imagenet-dense"),
                                                                   classes=10, per_class=100),
              "1080p": lambda: corpus.make_hd(os.path.join(args.data, "hd"), count=192)}
    names = args.sets.split(",")
    unknown = [n for n in names if n not in makers]
    if unknown:
        p.error(f"--sets: unknown {', '.join(unknown)} (choose from {', '.join(makers)})")
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    sets = {name: makers[name]() for name in names}
    results = {}
    for name, root in sets.items():
        ds = FolderDataset(root)
        store = LMDBDataset(corpus.seekable_store(root))
        producers = KINDS["cpu"].workers(args.cores, False)
        threads = KINDS["cpu"].threads(args.cores, producers, False)
        loaders = [(f"fastload FastLoader (cpu, {producers} x {threads} threads, {what})",
                    lambda dataset=dataset: benchmark.fastload_rate(
                        dataset, batch_size=args.batch_size, threads=threads, epochs=args.epochs,
                        transform=args.transform))
                   for what, dataset in (("folder", ds), ("pack --seekable", store))]
        loaders.append((f"torchvision DataLoader ({args.cores} workers, folder)",
                        lambda: (benchmark.torchvision_rate(ds, batch_size=args.batch_size, workers=args.cores,
                                                            epochs=args.epochs, transform=args.transform), None)))
        runs = {label: [] for label, _ in loaders}
        stats = {}
        for r in range(args.rounds):
            for k in range(len(loaders)):
                label, measure = loaders[(r + k) % len(loaders)]
                rate, stats[label] = measure()
                runs[label].append(rate)
        results[name] = [median_row(label, runs[label], stats[label]) for label, _ in loaders]
    for name, rows in results.items():
        print()
        n, size, pixels = corpus.density(sets[name])
        print(benchmark.format_table(rows, f"{name}: {n} images ({size / n / 1e3:.0f} KB mean, "
                                           f"{size / pixels:.2f} bytes/pixel), batch {args.batch_size}, "
                                           f"{args.cores} cores, transforms: "
                                           f"{args.transform or 'crop + flip + normalise'}"
                                           + (f", median of {args.rounds} alternating rounds [range]"
                                              if args.rounds > 1 else "")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
