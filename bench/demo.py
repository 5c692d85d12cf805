"""`make demo`: fastload against torchvision on real photos, from nothing to a table and a chart in a few minutes.

1. builds an ImageNet-like ImageFolder of real photos (bench/corpus.py; 10 classes x 100 JPEGs by default),
2. packs it into an LMDB store with `fastload pack --seekable`,
3. runs `fastload bench` on the store against torchvision's DataLoader (on the GPU when there is one),
   prints the table (every number measured in this run) and writes the chart.

    python -m bench.demo [--data data] [--classes 10] [--per-class 100] [--batch-size 64] [--epochs 3]
                         [--device cpu|cuda] [--model resnet18|resnet50]

Each step prints the `fastload` command that does the same, so you can run it on your own data.
"""
import argparse
import os
import sys
import time

import torch

from bench import corpus
from fastload import cli


def _step(n, text):
    print(f"\n[{n}/3] {text}", flush=True)


def _command(argv):
    print("      $ fastload " + " ".join(argv), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.demo", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data", help="where the corpus, the store and the results go (default: data)")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--per-class", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=None, help="default: 64 on CPU, 256 on CUDA")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per pipeline, after one warm-up epoch")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    p.add_argument("--model", choices=["resnet18", "resnet50"], help="also measure training efficiency (CUDA)")
    args = p.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    batch_size = args.batch_size or (256 if device == "cuda" else 64)
    t0 = time.perf_counter()

    src = os.path.join(args.data, f"imagenet-c{args.classes}-p{args.per_class}-s0")
    _step(1, f"real-photo ImageNet-like corpus: {args.classes} classes x {args.per_class} JPEGs in {src}")
    t = time.perf_counter()
    corpus.make_imagenet_like(src, classes=args.classes, per_class=args.per_class, seed=0)  # reused when present
    print(f"      ready in {time.perf_counter() - t:.1f} s", flush=True)

    store = os.path.join(args.data, "demo.lmdb")
    _step(2, f"pack it into an LMDB store: {store}")
    pack = ["pack", src, store, "--seekable", "--force", "--quiet"]
    _command(pack)
    code = cli.main(pack)
    if code != 0:
        return code

    chart, results = os.path.join(args.data, "demo.png"), os.path.join(args.data, "demo.json")
    _step(3, f"fastload vs torchvision on {device}" + (f", training {args.model}" if args.model else ""))
    bench = ["bench", store, "--baseline", "torchvision", "--device", device, "--batch-size", str(batch_size),
             "--epochs", str(args.epochs), "--json", results, "--plot", chart]
    if args.model:
        bench += ["--model", args.model]
    _command(bench)
    print(flush=True)
    code = cli.main(bench)
    if code != 0:
        return code
    sys.stderr.flush()
    print(f"\nchart:   {os.path.abspath(chart)}\nresults: {os.path.abspath(results)}\n"
          f"demo done in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
