"""The affine/normalise stage (fastload::warp_normalize) on the CPU: against a float64 reference of its
definition, against torchvision's antialiased resize, and as a well-formed torch op (opcheck, torch.compile).
CUDA twins of these checks live in test_cuda.py."""
import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from skimage import data as photos

import fastload.ops as ops
from warp_reference import random_boxes, random_matrices, reference_warp


@pytest.fixture(scope="module")
def images():
    # Real photos, downsized so the float64 reference stays fast.
    out = []
    for name in ("astronaut", "chelsea", "coffee"):
        img = torch.from_numpy(getattr(photos, name)()).permute(2, 0, 1)
        out.append(TF.resize(img, [60, 80], antialias=True).permute(1, 2, 0).contiguous())
    return torch.stack(out)  # [3, 60, 80, 3] uint8 HWC


@pytest.mark.parametrize("axis_aligned", [True, False])
def test_warp_matches_float64_reference(images, axis_aligned):
    rng = np.random.default_rng(1 if axis_aligned else 2)
    for trial in range(4):
        mats = random_matrices(rng, len(images), 60, 80, 24, 32, axis_aligned)
        out = ops.warp_affine(images, mats, (24, 32), layout="NHWC", out_dtype=torch.float32, fill=17.0)
        assert not torch.isnan(out).any()
        for i in range(len(images)):
            ref = reference_warp(images[i].numpy(), mats[i].numpy(), 24, 32, fill=17.0)
            got = out[i].permute(1, 2, 0).numpy()
            # float32 accumulation of <= a few hundred taps of 0..255 values: well under 1e-3 absolute.
            np.testing.assert_allclose(got, ref, atol=2e-3, rtol=0)


@pytest.mark.parametrize("axis_aligned", [True, False])
def test_visible_box_matches_float64_reference(images, axis_aligned):
    """[B, 2, 5] maps: a pixel whose centre falls outside the visible box is fill, the others are the [B, 2, 3]
    warp's values bit for bit (the filter still reads the whole input); a box around the whole input (or beyond
    it) changes nothing."""
    rng = np.random.default_rng(5 if axis_aligned else 6)
    for trial in range(4):
        mats = random_matrices(rng, len(images), 60, 80, 24, 32, axis_aligned)
        boxed = torch.cat([mats, random_boxes(rng, len(images), 60, 80)], dim=2)
        kwargs = dict(layout="NHWC", out_dtype=torch.float32, fill=17.0)
        plain = ops.warp_affine(images, mats, (24, 32), **kwargs)
        out = ops.warp_affine(images, boxed, (24, 32), **kwargs)
        for i in range(len(images)):
            ref = reference_warp(images[i].numpy(), boxed[i].numpy(), 24, 32, fill=17.0)
            got = out[i].permute(1, 2, 0).numpy()
            np.testing.assert_allclose(got, ref, atol=2e-3, rtol=0)
            shown = torch.from_numpy(ref[..., 0] != 17.0) | (plain[i, 0] == 17.0)
            assert torch.equal(out[i][:, shown], plain[i][:, shown])
        assert (out == 17.0).sum() > (plain == 17.0).sum()  # the boxes hid something
        whole = torch.tensor([[-3.0, 80.0], [0.0, 90.0]]).expand(len(images), 2, 2)
        assert torch.equal(ops.warp_affine(images, torch.cat([mats, whole], dim=2), (24, 32), **kwargs), plain)


def test_separable_path_equals_general_path(images):
    """Axis-aligned matrices take the separable two-pass path; a tiny shear forces the general one."""
    rng = np.random.default_rng(3)
    mats = random_matrices(rng, len(images), 60, 80, 40, 40, axis_aligned=True)
    sheared = mats.clone()
    sheared[:, 0, 1] = 1e-7  # a different path, the same function up to ~1e-5 pixels of displacement
    a = ops.warp_affine(images, mats, 40, layout="NHWC", out_dtype=torch.float32)
    b = ops.warp_affine(images, sheared, 40, layout="NHWC", out_dtype=torch.float32)
    torch.testing.assert_close(a, b, atol=1e-2, rtol=0)


def test_resize_equals_torchvision_antialias(images):
    """A pure resize is torch's antialiased bilinear resize, down (filter widens) and up."""
    chw = images.permute(0, 3, 1, 2).float()
    for out_h, out_w in [(17, 23), (60, 80), (150, 97), (31, 200)]:
        sx, sy = 80 / out_w, 60 / out_h
        m = torch.tensor([[sx, 0, 0.5 * sx - 0.5], [0, sy, 0.5 * sy - 0.5]])
        got = ops.warp_affine(chw, m, (out_h, out_w))
        ref = TF.resize(chw, [out_h, out_w], antialias=True)
        # Same weights, computed and summed in float32 in another order: 5e-3 on 0..255 is 2e-5 relative.
        torch.testing.assert_close(got, ref, atol=5e-3, rtol=0)


def test_normalise_dtypes_and_layouts(images):
    m = torch.tensor([[80 / 32, 0, 0.5 * 80 / 32 - 0.5], [0, 60 / 24, 0.5 * 60 / 24 - 0.5]])
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    base = ops.warp_affine(images, m, (24, 32), layout="NHWC", out_dtype=torch.float32)  # 0..255 values
    expected = (base / 255 - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    x = ops.warp_affine(images, m, (24, 32), mean=mean, std=std, layout="NHWC")
    assert x.dtype == torch.float32
    torch.testing.assert_close(x, expected, atol=1e-5, rtol=0)
    for dtype, tol in [(torch.float16, 1e-2), (torch.bfloat16, 4e-2)]:  # one rounding to 11 / 8 mantissa bits
        y = ops.warp_affine(images, m, (24, 32), mean=mean, std=std, out_dtype=dtype, layout="NHWC")
        assert y.dtype == dtype
        torch.testing.assert_close(y.float(), expected, atol=tol, rtol=0)
    cl = ops.warp_affine(images, m, (24, 32), mean=mean, std=std, layout="NHWC", channels_last=True)
    assert cl.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(cl, expected, atol=1e-5, rtol=0)
    u8 = ops.warp_affine(images, m, (24, 32), layout="NHWC")
    assert u8.dtype == torch.uint8
    assert (u8.float() - base.round()).abs().max() <= 1  # round-half-up vs round-half-even at .5 ties
    nchw = ops.warp_affine(images.permute(0, 3, 1, 2).contiguous(), m, (24, 32), layout="NCHW",
                           out_dtype=torch.float32)
    torch.testing.assert_close(nchw, base, atol=0, rtol=0)


def test_input_dtypes_and_the_layout_guess(images):
    """Floating images of any precision are warped in float32 and come back in their dtype (float64 and float16
    came back float32); integer images other than uint8 are refused (int16 200 was normalised as 200.0, not as a
    pixel value); a shape that could be either layout must say which (an NHWC batch of 4-pixel-high images was
    read as NCHW with four channels)."""
    m = torch.tensor([[80 / 32, 0, 0.5 * 80 / 32 - 0.5], [0, 60 / 24, 0.5 * 60 / 24 - 0.5]])
    base = ops.warp_affine(images.float(), m, (24, 32), layout="NHWC")
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        out = ops.warp_affine(images.to(dtype), m, (24, 32), layout="NHWC")
        assert out.dtype == dtype
        torch.testing.assert_close(out, base.to(dtype), rtol=0, atol=0)
    assert ops.warp_affine(images.double(), m, (24, 32), mean=0.5, std=0.5, layout="NHWC").dtype == torch.float32
    for dtype in (torch.int16, torch.int32, torch.int64, torch.bool):
        with pytest.raises(TypeError, match="uint8"):
            ops.warp_affine(images.to(dtype), m, (24, 32), layout="NHWC")
        with pytest.raises(TypeError, match="out_dtype must be uint8 or floating"):  # was computed, then truncated
            ops.warp_affine(images, m, (24, 32), layout="NHWC", out_dtype=dtype)
    nhwc = images[:, :4, :4]  # [3, 4, 4, 3]
    with pytest.raises(ValueError, match="layout='NCHW' or layout='NHWC'"):
        ops.warp_affine(nhwc, torch.eye(2, 3), (4, 4))
    assert ops.warp_affine(nhwc, torch.eye(2, 3), (4, 4), layout="NHWC").shape == (3, 3, 4, 4)
    assert ops.warp_affine(images, m, (24, 32)).shape == (3, 3, 24, 32)  # unambiguous: guessed NHWC


def test_fill_outside_and_identity(images):
    ident = torch.tensor([[1.0, 0, 0], [0, 1.0, 0]])
    same = ops.warp_affine(images, ident, (60, 80), layout="NHWC")
    assert torch.equal(same.permute(0, 2, 3, 1), images)  # weights are exactly 1 at pixel centres
    away = torch.tensor([[1.0, 0, 500.0], [0, 1.0, 0]])
    out = ops.warp_affine(images, away, (10, 10), layout="NHWC", out_dtype=torch.float32, fill=42.0)
    assert torch.all(out == 42.0)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_per_channel_fill_is_each_channels_own(images, device):
    """fill=[a, b, c]: channel k is the warp with fill k (on the CUDA tiled path too: uint8 HWC RGB, axis-aligned;
    and the general one: a rotation), normalised or not; a fill of another length is refused."""
    x = images.to(device)
    c, s = np.cos(0.5), np.sin(0.5)
    for m in ([[1.3, 0, 30.0], [0, 0.8, -12.0]], [[c, -s, 20.0], [s, c, -15.0]]):
        m = torch.tensor(m, dtype=torch.float32)
        for norm in ({}, dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))):
            fill = [10.0, 128.5, 250.0]
            got = ops.warp_affine(x, m, (48, 64), layout="NHWC", fill=fill, **norm)
            for k, f in enumerate(fill):
                alone = ops.warp_affine(x, m, (48, 64), layout="NHWC", fill=f, **norm)
                assert torch.equal(got[:, k], alone[:, k]), (m, norm, k)
    with pytest.raises(RuntimeError, match="fill must have 1 value or one per channel"):
        ops.warp_affine(x, m, (48, 64), layout="NHWC", fill=[1.0, 2.0])


def test_ragged_batch_matches_dense(images):
    """The loader's ragged form gives the same result as warping each image alone."""
    crops = [images[0, :50, :70], images[1, 5:45, 10:40], images[2]]
    data = torch.cat([c.reshape(-1) for c in crops])
    sizes = [c.numel() for c in crops]
    offsets = torch.tensor([0, sizes[0], sizes[0] + sizes[1]])
    shapes = torch.tensor([list(c.shape) for c in crops])
    mats = torch.tensor([[[2.0, 0, 0.5], [0, 1.5, 0.25]], [[-1.0, 0, 29.0], [0, 1.0, 0.0]],
                         [[2.5, 0, 0.75], [0, 1.9, 0.45]]])
    got = ops.warp_ragged(data, offsets, shapes, mats, 28, mean=(0.5,) * 3, std=(0.25,) * 3)
    for i, c in enumerate(crops):
        alone = ops.warp_affine(c[None].contiguous(), mats[i], 28, mean=(0.5,) * 3, std=(0.25,) * 3, layout="NHWC")
        torch.testing.assert_close(got[i:i + 1], alone, atol=0, rtol=0)


def test_bad_arguments_raise():
    img = torch.zeros(1, 8, 8, 3, dtype=torch.uint8)
    with pytest.raises(ValueError):
        ops.warp_affine(img[0], torch.eye(2, 3), 4)
    with pytest.raises(ValueError):
        ops.warp_affine(img, torch.eye(2, 3).expand(2, 2, 3), 4, layout="NHWC")
    with pytest.raises(ValueError, match="std"):
        ops.warp_affine(img, torch.eye(2, 3), 4, mean=0.5, std=0.0, layout="NHWC")
    data = torch.zeros(100, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="past the end"):
        ops.warp_ragged(data, torch.tensor([0]), torch.tensor([[10, 10, 3]]), torch.eye(2, 3)[None], 4)
    with pytest.raises(RuntimeError, match="channels"):
        torch.ops.fastload.warp_normalize(data, torch.tensor([0]), torch.tensor([[2, 2, 3]]), torch.eye(2, 3)[None],
                                          torch.ones(5), torch.zeros(5), 5, 4, 4, True, torch.float32, False, [0.0])


def test_affine_from_points_recovers_a_known_transform():
    rng = np.random.default_rng(4)
    true = torch.tensor(rng.normal(size=(6, 2, 3)), dtype=torch.float64)
    src = torch.tensor(rng.uniform(0, 112, size=(6, 5, 2)))
    dst = torch.einsum("bij,bnj->bni", true[:, :, :2], src) + true[:, :, 2][:, None]
    got = ops.affine_from_points(src, dst)
    torch.testing.assert_close(got, true.float(), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError):
        ops.affine_from_points(src[:, :2], dst[:, :2])


def test_registered_op_passes_opcheck_and_compiles(images):
    m = torch.tensor([[[1.5, 0.2, 1.0], [-0.1, 1.4, 2.0]]]).expand(3, 2, 3).contiguous()
    args = (images.reshape(-1), torch.arange(3) * images[0].numel(), torch.tensor([[60, 80, 3]]).expand(3, 3).contiguous(),
            m, torch.full((3,), 1 / 255.0), torch.zeros(3), 3, 20, 30, True, torch.float32, False, [0.0])
    boxed = torch.cat([m, torch.tensor([[[2.0, 70.5], [1.0, 55.25]]]).expand(3, 2, 2)], dim=2).contiguous()
    for maps in (m, boxed):
        torch.library.opcheck(torch.ops.fastload.warp_normalize.default, args[:3] + (maps,) + args[4:],
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))

    def step(x, mats):
        return ops.warp_affine(x, mats, 20, mean=0.5, std=0.5, layout="NHWC").sum(dim=1)

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(images, m), step(images, m))
