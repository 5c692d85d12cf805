"""The evaluation crop at full scale (the default: torchvision's pixels) against DCT-downscaled decoding, on large
photos, 2 threads, alternating rounds: `python -m bench.eval_scale [FOLDER]` (default: data/hd-n6, the tests'
1080p corpus, made here when missing: 6 photos, seen 40 times each)."""
import collections
import sys
import time

import torch

import fastload as fl
from bench import corpus


def rate(ds, dct):
    """img/s of two epochs after a warm-up one: CenterCrop(224, resize=256) with or without DCT downscaling."""
    loader = fl.FastLoader(ds, batch_size=24, shuffle=False, threads=2,
                           crop=fl.CenterCrop(224, resize=256, dct_downscale=dct))
    collections.deque(loader, maxlen=0)  # warm-up epoch
    loader.close()  # the next epoch's producers, started as this one ended, must not make batches off the clock
    t = time.perf_counter()
    n = sum(len(y) for _ in range(2) for _, y in loader)
    seconds = time.perf_counter() - t
    loader.close()
    return n / seconds


def main():
    base = fl.FolderDataset(sys.argv[1] if len(sys.argv) > 1 else corpus.make_hd("data/hd-n6", count=6))
    ds = torch.utils.data.Subset(base, [i % len(base) for i in range(240)])
    for r in range(2):
        print(f"round {r}: full scale (default) {rate(ds, False):.0f} img/s | dct_downscale=True "
              f"{rate(ds, True):.0f} img/s", flush=True)


if __name__ == "__main__":
    main()
