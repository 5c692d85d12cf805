"""No fastload op is differentiable (they are data augmentation, run under no gradient in the loader): called on
tensors that require grad, a backward through the result raises, or the call itself does, never a silent wrong
gradient. torchvision's functional ops are differentiable; fastload's said nothing (warp_affine's backward
gave no gradient at all, affine_nearest's that of the identity)."""
import numpy as np
import pytest
import torch

import fastload.ops as ops
import fastload.transforms.functional as F
from fastload.transforms import batch_ops

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
SHIFT = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 0.0]])  # output pixel x reads input x + 2


def _backward_raises(out):
    assert out.requires_grad  # a graph was recorded: the error comes from its node, not from a missing graph
    with pytest.raises(RuntimeError, match="not implemented|no autograd formula"):
        out.float().sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_warp_affine_backward_raises(device):
    x = torch.rand(2, 3, 8, 8, device=device, requires_grad=True)
    _backward_raises(ops.warp_affine(x, SHIFT.to(device), (8, 8), layout="NCHW"))
    m = SHIFT.to(device).requires_grad_()
    _backward_raises(ops.warp_affine(x.detach(), m, (8, 8), layout="NCHW", mean=0.5, std=0.5))
    with torch.no_grad():
        assert not ops.warp_affine(x, SHIFT.to(device), (8, 8), layout="NCHW").requires_grad


@pytest.mark.parametrize("device", DEVICES)
def test_affine_nearest_refuses_tensors_that_require_grad(device):
    x = torch.rand(2, 3, 8, 8, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        ops.affine_nearest(x, SHIFT)
    with pytest.raises(RuntimeError, match="not differentiable"):
        ops.affine_nearest(x.detach(), SHIFT.clone().requires_grad_())
    with torch.no_grad():
        out = ops.affine_nearest(x, SHIFT)
    assert torch.equal(out[..., :6], x.detach()[..., 2:]) and torch.all(out[..., 6:] == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_functional_ops_backward_raises(device):
    x = torch.rand(2, 3, 8, 8, device=device, requires_grad=True)
    for out in (F.adjust_brightness(x, 1.2), F.adjust_contrast(x, 0.8), F.adjust_saturation(x, 0.5),
                F.adjust_hue(x, 0.1), F.adjust_sharpness(x, 2.0), F.posterize(x, 3), F.solarize(x, 0.5),
                F.autocontrast(x), F.equalize(x), F.invert(x), F.rgb_to_grayscale(x), F.gaussian_blur(x, 3, 1.0)):
        _backward_raises(out)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_ops_backward_raises(device):
    x = torch.rand(4, 3, 8, 8, device=device, requires_grad=True)
    columns = np.zeros((4, 5), np.int32)
    columns[:, 2:4] = 3  # a 3x3 box at the corner of each sample
    _backward_raises(batch_ops.run(x, erase=(columns, np.zeros(3, np.float32), np.zeros(0, np.float32))))
