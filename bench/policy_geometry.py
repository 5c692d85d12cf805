"""The policies' rotate/shear/translate two ways, side by side in one process: NEAREST (torchvision's default and
fastload's: a nearest gather from the warped crop, ops.affine_nearest_) against BILINEAR (the same draws composed
into the one warp, the per-pixel 2-D filter for rotated samples). Feeds a training step (ResNet-50 by default) or
runs the loader alone, alternating the two in rounds (each a warm-up epoch and a timed one), and prints images/s
and efficiency against the step's ceiling.

    python -m bench.policy_geometry data/imagenet-like-x4 --model resnet50 --size 176 --rounds 2
"""
import argparse

import numpy as np
import torch

import fastload as fl
import fastload.transforms as T
from fastload import benchmark


def pipeline(policy, interpolation, size):
    policy = {"trivialaugment": T.TrivialAugmentWide, "randaugment": T.RandAugment}[policy](interpolation=interpolation)
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), policy, T.ToDtype(torch.float32, scale=True),
                      T.Normalize(benchmark.IMAGENET_MEAN, benchmark.IMAGENET_STD)])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="an image folder or store")
    p.add_argument("--policy", default="trivialaugment", choices=["trivialaugment", "randaugment"])
    p.add_argument("--model", default="resnet50", help="the training step's model, or 'none' for the loader alone")
    p.add_argument("--size", type=int, default=176)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2, help="timed epochs per way, alternating")
    args = p.parse_args(argv)
    ds = benchmark.open_dataset(args.data)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    step = None if args.model == "none" else benchmark.training_step(args.model, device, args.batch_size)
    ceiling = benchmark.ceiling_rate(step, args.batch_size, args.size, device) if step else None
    rates = {"nearest": [], "bilinear": []}
    for r in range(args.rounds):
        for i in (("nearest", "bilinear") if r % 2 == 0 else ("bilinear", "nearest")):
            # A loader per round, closed after it: an idle loader would start its next epoch beside the other.
            loader = fl.FastLoader(ds, batch_size=args.batch_size, device=device, drop_last=True, channels_last=True,
                                   transform=pipeline(args.policy, i, args.size))

            def epochs(epoch, loader=loader):
                loader.set_epoch(epoch)
                return loader
            rates[i].append(benchmark._timed_epochs(epochs, 1, len(loader) * args.batch_size, i, False, device, step))
            loader.close()
    print(f"{args.policy}, {args.size} px, {len(ds)} images, {args.model}, {device}"
          + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""))
    print(f"{'policy geometry':<40}{'img/s':>10}{'efficiency':>12}  each round")
    if ceiling:
        print(f"{'ceiling (fixed batch on the GPU)':<40}{ceiling:>10,.0f}{1:>12.3f}")
    for i, label in (("nearest", "NEAREST: gather after the warp"), ("bilinear", "BILINEAR: composed into the warp")):
        med = float(np.median(rates[i]))
        eff = f"{med / ceiling:>12.3f}" if ceiling else f"{'':>12}"
        print(f"{label:<40}{med:>10,.0f}{eff}  " + " / ".join(f"{v:,.0f}" for v in rates[i]))


if __name__ == "__main__":
    main()
