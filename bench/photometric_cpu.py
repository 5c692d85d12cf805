"""The CPU photometric op (fastload.transforms.functional.photometric) per sample, one thread, one op in one slot
for the whole batch, on corpus photos resized to the output size: the cost of each op including the output cast
(float32 normalised NCHW as the loader writes it, and uint8), against the cast alone ("identity"). The "map:" rows
are the cast reading every sample through a policy's NEAREST map (the loader's moved samples): a rotation and a
ShearY gather pixel by pixel, a TranslateX copies row runs.

    python -m bench.photometric_cpu [--data data/imagenet-like] [--size 224] [--batch 64] [--repeats 15]
"""
import argparse
import glob

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image

import fastload.transforms.functional as F
from bench.timing import best_seconds
from fastload.transforms.policies import geometric_matrices

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# one parameter per op, inside torchvision's ranges (blur: kernel 5x5, sigma 1)
PARAMS = {"identity": (0, 0, 0), "brightness": (1.3, 0, 0), "contrast": (0.7, 0, 0), "saturation": (1.5, 0, 0),
          "hue": (0.1, 0, 0), "sharpness": (1.8, 0, 0), "posterize": (4, 0, 0), "solarize": (128, 0, 0),
          "autocontrast": (0, 0, 0), "equalize": (0, 0, 0), "invert": (0, 0, 0), "grayscale": (0, 0, 0),
          "gaussian_blur": (5, 5, 1.0)}


def photos(data, size, batch):
    files = sorted(glob.glob(f"{data}/*/*.jpg"))[:batch]
    if not files:
        raise SystemExit(f"no JPEGs under {data}/*/ (python -m bench.corpus imagenet {data})")
    imgs = [TF.resize(torch.from_numpy(np.array(Image.open(f).convert("RGB"))).permute(2, 0, 1), [size, size],
                      antialias=True) for f in files]
    return torch.stack([imgs[i % len(imgs)] for i in range(batch)]).contiguous()


def ms_per_sample(x, name, repeats, **kw):
    ops = torch.full((len(x), 1), F.OPS[name], dtype=torch.int64)
    params = torch.tensor(PARAMS[name], dtype=torch.float32).expand(len(x), 1, 3).contiguous()
    table = F.PhotometricTable(ops, params)
    return 1e3 * best_seconds(lambda: F.photometric(x, table, **kw), repeats) / len(x)


MAPS = {"map: Rotate 17": ("Rotate", 17.0), "map: ShearY 0.3": ("ShearY", 0.3), "map: TranslateX 40": ("TranslateX", 40.0)}


def map_ms_per_sample(x, name, magnitude, repeats, **kw):
    """The identity (the cast) reading every sample through torchvision's op ``name`` as a nearest map."""
    n, h, w = len(x), x.shape[2], x.shape[3]
    m = torch.from_numpy(geometric_matrices(name, np.full(n, magnitude), h, w)[:, :2]).float()
    table = F.PhotometricTable(torch.zeros(n, 1, dtype=torch.int64), torch.zeros(n, 1, 3))
    maps = (torch.arange(n), m, 0.0)
    return 1e3 * best_seconds(lambda: F.photometric(x, table, nearest=maps, **kw), repeats) / n


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/imagenet-like")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=15, help="timed runs per op; the best is reported")
    args = p.parse_args()
    torch.set_num_threads(1)
    x = photos(args.data, args.size, args.batch)
    outs = (("float32", dict(out_dtype=torch.float32, mean=MEAN, std=STD)), ("uint8", dict(out_dtype=torch.uint8)))
    print(f"CPU photometric op, 1 thread, {args.batch} photos at {args.size}x{args.size}, one op a sample, best of "
          f"{args.repeats}, ms per sample")
    print(f"{'op':<16}" + "".join(f"{name:>10}" for name, _ in outs))
    for name in PARAMS:
        print(f"{name:<16}" + "".join(f"{ms_per_sample(x, name, args.repeats, **kw):>10.3f}" for _, kw in outs))
    for label, (name, magnitude) in MAPS.items():
        print(f"{label:<19}" + "".join(f"{map_ms_per_sample(x, name, magnitude, args.repeats, **kw):>7.3f}"
                                       for _, kw in outs))


if __name__ == "__main__":
    main()
