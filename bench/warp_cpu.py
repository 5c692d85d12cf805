"""The CPU warp (fastload.ops.warp_ragged) per sample, one thread, on real decoded crops: axis-aligned matrices
(the separable path) against rotated and sheared ones (the general path), float32 normalised and uint8 output.

Inputs are the loader's own: a TrivialAugmentWide(interpolation=BILINEAR) batch planned and crop-decoded from the
corpus as FastLoader does (RandomResizedCrop windows, the policy's rotate/shear folded into each matrix, as BILINEAR
policies, RandomAffine and RandomRotation have them). Rows:
- "TA axis-aligned" / "TA rotate+shear": that batch's samples split by path;
- "rot +-30, 1.5-2x": the same crops with matrices built by hand, rotating about the centre with a 1.5-2x shrink;
- "shear x/y 0.3": the same with a pure shear (TrivialAugmentWide's ShearX/ShearY at their widest);
- "axis-aligned, fill ends": the axis-aligned samples shifted by 30% of the output width, so the rows' ends fall
  outside the decoded window (what a NEAREST policy's moved sample gets: it decodes only what its gather reads).

    python -m bench.warp_cpu [--data data/imagenet-like] [--size 224] [--batch 256] [--repeats 7]
"""
import argparse
import os

import numpy as np
import torch

import fastload as fl
from bench import policy_geometry
from bench.timing import best_seconds

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def decoded_batch(data_dir, size, batch):
    """A TrivialAugmentWide(interpolation=BILINEAR) batch as the loader decodes it: (data, offsets, shapes,
    matrices). BILINEAR, because with NEAREST (the default) the loader gathers the policy's rotations after an
    axis-aligned warp (bench.policy_geometry compares the two) and no sample would take the general path."""
    ds = fl.FolderDataset(data_dir)
    idx = np.arange(batch) % len(ds)
    pipeline = fl.transforms.Pipeline.build(policy_geometry.pipeline("trivialaugment", "bilinear", size))
    plan = pipeline.plan(np.asarray(ds.heights)[idx], np.asarray(ds.widths)[idx], 0, 0, np.arange(batch))
    with ds.reader() as r:
        data, offsets, shapes, status, msgs = fl.ops.decode_crops([r.get(int(i)) for i in idx], plan.windows,
                                                                  threads=os.cpu_count())
    assert int(status.abs().sum()) == 0, msgs
    return data, offsets, shapes, torch.as_tensor(plan.matrices, dtype=torch.float32)


def about_centre(lin, shapes, size):
    """Matrices [B, 2, 3] applying the 2x2 `lin[i]` about the centres (output centre -> input centre)."""
    h, w = shapes[:, 0].double(), shapes[:, 1].double()
    lin = torch.as_tensor(lin, dtype=torch.float64)
    c = (size - 1) / 2
    t = torch.stack([(w - 1) / 2, (h - 1) / 2], 1) - lin.sum(2) * c
    return torch.cat([lin, t[:, :, None]], 2).float()


def hand_matrices(shapes, size, kind, seed=0):
    rng = np.random.default_rng(seed)
    n = shapes.shape[0]
    # shrink so that the crop's shorter side fills the output, times 1.5-2 (the decoder's DCT scaling leaves crops
    # up to about twice the output)
    base = (shapes[:, :2].min(1).values.double() / size).numpy()
    if kind == "rotate":
        a = np.radians(rng.choice([-1, 1], n) * rng.uniform(10, 30, n))
        scale = np.minimum(base, rng.uniform(1.5, 2.0, n))
        lin = np.stack([np.stack([np.cos(a), -np.sin(a)], 1), np.stack([np.sin(a), np.cos(a)], 1)], 1)
    else:
        s = rng.choice([-0.3, 0.3], n)
        scale = np.minimum(base, rng.uniform(1.5, 2.0, n))
        eye = np.broadcast_to(np.eye(2), (n, 2, 2)).copy()
        eye[:, 0, 1] = s if kind == "shear_x" else 0
        eye[:, 1, 0] = s if kind == "shear_y" else 0
        lin = eye
    return about_centre(lin * scale[:, None, None], shapes, size)


def ms_per_sample(data, offsets, shapes, matrices, size, repeats, **kw):
    run = lambda: fl.ops.warp_ragged(data, offsets, shapes, matrices, size, **kw)  # noqa: E731
    return 1e3 * best_seconds(run, repeats) / offsets.numel()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/imagenet-like")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=7, help="timed runs per case; the best is reported")
    args = p.parse_args()
    torch.set_num_threads(1)
    data, offsets, shapes, matrices = decoded_batch(args.data, args.size, args.batch)
    general = (matrices[:, 0, 1] != 0) | (matrices[:, 1, 0] != 0)
    cases = [("TA axis-aligned", ~general, matrices), ("TA rotate+shear", general, matrices)]
    everyone = torch.ones(len(offsets), dtype=torch.bool)
    shifted = matrices.clone()
    shifted[:, 0, 2] += 0.3 * args.size * shifted[:, 0, 0] * torch.where(torch.arange(len(offsets)) % 2 == 0, 1, -1)
    cases.append(("axis-aligned, fill ends", ~general, shifted))
    for kind, label in (("rotate", "rot +-10-30, 1.5-2x"), ("shear_x", "shear x 0.3, 1.5-2x"),
                        ("shear_y", "shear y 0.3, 1.5-2x")):
        cases.append((label, everyone, hand_matrices(shapes, args.size, kind)))
    outs = (("float32", dict(mean=MEAN, std=STD)),
            ("uint8", dict(out_dtype=torch.uint8, mean=None, std=None, in_scale=1.0)))
    crops = shapes[:, :2].double()
    print(f"CPU warp, 1 thread, {args.size}x{args.size} out, {len(offsets)} TrivialAugmentWide crops from {args.data} "
          f"(median crop {int(crops[:, 0].median())}x{int(crops[:, 1].median())}), best of {args.repeats}")
    print(f"{'case':<22}{'samples':>8}" + "".join(f"{name + ' ms':>12}" for name, _ in outs))
    for label, sel, mats in cases:
        idx = sel.nonzero().flatten()
        row = [ms_per_sample(data, offsets[idx], shapes[idx], mats[idx], args.size, args.repeats, **kw)
               for _, kw in outs]
        print(f"{label:<22}{len(idx):>8}" + "".join(f"{v:>12.3f}" for v in row))


if __name__ == "__main__":
    main()
