"""The CPU kernels' fast paths against the reference code they replace (warp_cpu.cpp, augment_cpu.cpp).

- warp: uint8 RGB samples with a rotation or shear take a padded, SSE, two-pixels-at-a-time path; float32 samples
  of the same values take warp.h's per-pixel loop (warp_pixel_general). Both must give the same bits.
- hue: the CPU op computes hue on whole planes without branches (vectorised); every one of the 2^24 colours must
  equal torchvision's adjust_hue exactly, at the ends of the factor range too.
"""
import math

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF

import fastload.transforms.functional as F
from fastload import ops

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _ragged(images):
    """HWC uint8 images -> (data, offsets, shapes) of a ragged batch, the last sample ending the buffer (so a read
    past its last pixel would leave the tensor)."""
    flat = [im.reshape(-1) for im in images]
    offsets = torch.tensor(np.cumsum([0] + [f.numel() for f in flat[:-1]]), dtype=torch.int64)
    shapes = torch.tensor([list(im.shape) for im in images], dtype=torch.int64)
    return torch.cat(flat), offsets, shapes


def _matrix(angle, shear, scale, tx, ty, out, h, w):
    """An output -> input matrix: rotation by `angle`, shear along x, isotropic shrink `scale`, centred, shifted."""
    a, s = math.radians(angle), math.tan(math.radians(shear))
    rot = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]]) @ np.array([[1, s], [0, 1]]) * scale
    centre_out = (out - 1) / 2
    t = np.array([(w - 1) / 2 + tx, (h - 1) / 2 + ty]) - rot @ np.array([centre_out, centre_out])
    return np.concatenate([rot, t[:, None]], axis=1)


def test_general_warp_uint8_path_equals_reference_loop():
    rng = np.random.default_rng(3)
    sizes = [(97, 131), (64, 64), (300, 181), (33, 250), (224, 224), (5, 7), (180, 120), (150, 260)]
    images = [torch.from_numpy(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    data, offsets, shapes = _ragged(images)
    out = 96
    # rotations, pure shears (x and y), large shrink (support > 2), enlargement, samples that reach the bottom-right
    # corner (the read guard) and samples partly outside the image (fill)
    params = [(30, 0, 1.4, 0, 0), (0, 17, 1.0, 5, -3), (-12, -25, 2.7, 0, 0), (90, 0, 0.6, 0, 0),
              (7, 3, 1.0, 40, 30), (45, 0, 0.05, 0, 0), (-170, 10, 1.9, -20, 15), (3, 0, 2.2, 60, 55)]
    mats = [_matrix(*p, out, h, w) for p, (h, w) in zip(params, sizes)]
    mats[3][0, 0] = 0.0  # a y-shear-like matrix with an exact zero
    matrices = torch.tensor(np.stack(mats), dtype=torch.float32)
    assert bool(((matrices[:, 0, 1] != 0) | (matrices[:, 1, 0] != 0)).all())  # every sample takes the general path
    for dtype, mean, std, in_scale in ((torch.uint8, None, None, 1.0), (torch.float32, MEAN, STD, 1 / 255),
                                       (torch.float16, MEAN, STD, 1 / 255)):
        for fill in (0.0, 127.0):
            for channels_last in (False, True):
                kw = dict(mean=mean, std=std, in_scale=in_scale, out_dtype=dtype, channels_last=channels_last,
                          fill=fill)
                fast = ops.warp_ragged(data, offsets, shapes, matrices, out, **kw)
                reference = ops.warp_ragged(data.float(), offsets, shapes, matrices, out, **kw)
                assert torch.equal(fast, reference), (dtype, fill, channels_last)
    fast = ops.warp_ragged(data, offsets, shapes, matrices, out, out_dtype=torch.uint8, mean=None, std=None,
                           in_scale=1.0)
    assert fast.float().std() > 20  # the samples are not all fill


def test_hue_every_colour_matches_torchvision():
    v = torch.arange(1 << 24, dtype=torch.int64)
    colours = torch.stack([v >> 16, (v >> 8) & 255, v & 255]).to(torch.uint8).view(3, 4096, 4096)
    for factor in (-0.5, -0.1234, 0.3337, 0.5):
        got = F.adjust_hue(colours[None], torch.tensor([factor]))[0]
        ref = TF.adjust_hue(colours, factor)
        assert torch.equal(got, ref), factor
