"""torchvision.transforms.v2's ``AugMix``, planned per sample and run on the uint8 batch in the stage.

Per sample (torchvision's ``AugMix.forward``): ``mixture_width`` chains of ``chain_depth`` ops (1-3, uniform, when
``chain_depth <= 0``) drawn uniformly from the AugMix op space, each op at a uniform magnitude bin below
``severity`` with a random sign for signed ops; each chain transforms the original uint8 image; the result is
``uint8(m0 * x + sum_i (d_i * m1) * chain_i)`` with (m0, m1) ~ Dirichlet(alpha, alpha) and d ~ Dirichlet(alpha, ...),
accumulated in float32 in torchvision's order and truncated to uint8 as its ``.to(uint8)`` does.

Unlike the other policies, the geometric ops cannot fold into the loader's one warp: each chain resamples the
already-warped canvas on its own. So the stage runs, per chain and depth step, one ``ops.warp_affine`` for the
samples whose op there is geometric (their output -> input matrices from ``policies.geometric_matrices``) and one
``functional.photometric`` (uint8 out) for the others' photometric ops. Those warps use the warp kernel's bilinear
filter (``interpolation`` is validated and kept, as the other policies do), and a pixel whose centre maps outside
the canvas gets ``fill``; torchvision's grid_sample blends the half-pixel border with the fill instead. Every draw
comes from ``fastload.rng`` on the transform's ``stream``; the Gamma draws behind both Dirichlets are
``mixing._log_gamma`` (Marsaglia & Tsang from uniforms), so nothing outside fastload decides the numbers.
"""
from typing import NamedTuple

import numpy as np
import torch

from .. import ops, rng
from .color import _table
from .functional import OPS, photometric
from .mixing import _GAMMA_COLUMNS, _log_gamma, concentration
from .policies import _PHOTOMETRIC, _check_fill, _check_interpolation, _lin, _none, _posterize, geometric_matrices

__all__ = ["AugMix", "AugMixParams"]

_PARAMETER_MAX = 10  # torchvision's magnitude bins (severity indexes the first `severity` of them)
# torchvision's AugMix._PARTIAL_AUGMENTATION_SPACE, then the four ops all_ops adds, in its dict order
_PARTIAL_SPACE = {
    "ShearX": (_lin(0.0, 0.3), True),
    "ShearY": (_lin(0.0, 0.3), True),
    "TranslateX": (lambda num_bins, height, width: torch.linspace(0.0, width / 3.0, num_bins), True),
    "TranslateY": (lambda num_bins, height, width: torch.linspace(0.0, height / 3.0, num_bins), True),
    "Rotate": (_lin(0.0, 30.0), True),
    "Posterize": (_posterize(4, 4), False),
    "Solarize": (_lin(1.0, 0.0), False),
    "AutoContrast": (_none, False),
    "Equalize": (_none, False),
}
_FULL_SPACE = {
    **_PARTIAL_SPACE,
    "Brightness": (_lin(0.0, 0.9), True),
    "Color": (_lin(0.0, 0.9), True),
    "Contrast": (_lin(0.0, 0.9), True),
    "Sharpness": (_lin(0.0, 0.9), True),
}


class _Step(NamedTuple):
    """One depth step of one chain over the batch: the samples whose op is geometric (host int64 [n]) and their
    output -> input matrices (float32 [n, 2, 3]), and the one-slot photometric table of the others (None if all
    identity)."""
    warp_idx: torch.Tensor
    matrices: torch.Tensor
    table: object


class AugMixParams(NamedTuple):
    """A batch's AugMix draws (host) and the execution steps derived from them."""
    op: np.ndarray  # int64 [B, W, D]: index into AugMix.op_names, -1 past the chain's depth
    magnitude: np.ndarray  # float64 [B, W, D]: the signed magnitude torchvision's op receives (0 for none)
    orig: torch.Tensor  # float32 [B]: m0, the original image's weight
    chain: torch.Tensor  # float32 [B, W]: d_i * m1 (float32 product, as torchvision's combined_weights)
    steps: list  # [W][D] of _Step
    height: int
    width: int


def _softmax_rows(log_g):
    """Normalised Gamma draws g / sum(g) from their logs [B, k] (shifted by the row max: no overflow)."""
    g = np.exp(log_g - log_g.max(axis=1, keepdims=True))
    return g / g.sum(axis=1, keepdims=True)


class AugMix:
    """torchvision's ``AugMix(severity=3, mixture_width=3, chain_depth=-1, alpha=1.0, all_ops=True,
    interpolation=BILINEAR, fill=None)``, each sample with its own chains, ops, magnitudes and weights.

    ``plan(seed, epoch, indices, height, width) -> AugMixParams`` on the host; ``apply(x, params)`` on the uint8
    batch [B, 3, H, W] (CPU or CUDA). In a pipeline it runs on the warped uint8 canvas, after the photometric
    transforms before it and before those after it, then ToDtype + Normalize.
    """

    kind = "augmix"
    stream = 0  # set by Compose

    def __init__(self, severity=3, mixture_width=3, chain_depth=-1, alpha=1.0, all_ops=True,
                 interpolation="bilinear", fill=None):
        self.interpolation = interpolation
        _check_interpolation(interpolation)
        self.fill = _check_fill(fill)
        for name, value in (("severity", severity), ("mixture_width", mixture_width), ("chain_depth", chain_depth)):
            # torchvision raises these TypeErrors at the first image (torch.randint / list * / range); a loader can
            # at once
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if not (1 <= severity <= _PARAMETER_MAX):
            raise ValueError(f"The severity must be between [1, {_PARAMETER_MAX}]. Got {severity} instead.")
        if mixture_width < 0:  # torchvision silently mixes no chain; say so instead
            raise ValueError(f"mixture_width must be >= 0, got {mixture_width}")
        alpha = concentration(alpha, "Dirichlet")
        if not alpha > 0:  # torchvision samples Dirichlet(alpha) with it, which is undefined for alpha <= 0
            raise ValueError(f"alpha must be > 0 (the Dirichlet concentration), got {alpha}")
        self.severity = severity
        self.mixture_width = mixture_width
        self.chain_depth = chain_depth
        self.alpha = alpha
        self.all_ops = all_ops
        self._space = _FULL_SPACE if all_ops else _PARTIAL_SPACE
        self._names = tuple(self._space)
        self._signed = np.array([self._space[k][1] for k in self._names])
        self._depth = chain_depth if chain_depth > 0 else 3  # steps per chain in the plan (the most drawn)
        # columns per sample: the 2 + W Gamma draws, then per chain its depth and (op, bin, sign) per step
        self._chain_columns = 1 + 3 * self._depth
        self.columns = (2 + mixture_width) * _GAMMA_COLUMNS + mixture_width * self._chain_columns

    @property
    def op_names(self):
        return self._names

    def magnitudes(self, height, width):
        """float64 [len(op_names), 10]: each op's magnitude bins as torchvision computes them (0 for none)."""
        out = np.zeros((len(self._names), _PARAMETER_MAX))
        for k, name in enumerate(self._names):
            values = self._space[name][0](_PARAMETER_MAX, height, width)
            if values is not None:
                out[k] = values.double().numpy()  # float(float32 element), as torchvision's float(...)
        return out

    # --- planning (host) ------------------------------------------------------------------------------------
    def draws(self, seed, epoch, indices, height, width):
        """(op int64 [B, W, D] (-1 past the depth), signed magnitude float64 [B, W, D], m float64 [B, 2],
        d float64 [B, W]): what torchvision's forward draws for each sample."""
        u = rng.uniforms(seed, epoch, indices, self.columns, stream=self.stream)
        B, W, D, G = len(u), self.mixture_width, self._depth, _GAMMA_COLUMNS
        log_g = np.stack([_log_gamma(self.alpha, u[:, k * G:(k + 1) * G]) for k in range(2 + W)], axis=1)
        m = _softmax_rows(log_g[:, :2])
        d = _softmax_rows(log_g[:, 2:]) if W else np.zeros((B, 0))
        c = u[:, (2 + W) * G:].reshape(B, W, self._chain_columns)
        depth = np.full((B, W), D) if self.chain_depth > 0 else 1 + _randint(c[:, :, 0], 3)
        op = _randint(c[:, :, 1::3], len(self._names))
        bins = _randint(c[:, :, 2::3], self.severity)
        sign = np.where(self._signed[op] & (c[:, :, 3::3] < 0.5), -1.0, 1.0)  # torchvision: rand() <= 0.5
        magnitude = self.magnitudes(height, width)[op, bins] * sign
        active = np.arange(D) < depth[:, :, None]
        return np.where(active, op, -1), np.where(active, magnitude, 0.0), m, d

    def plan(self, seed, epoch, indices, height, width):
        """AugMixParams of the samples ``indices`` on a height x width canvas."""
        return self.params(*self.draws(seed, epoch, indices, height, width), height, width)

    def params(self, op, magnitude, m, d, height, width):
        """AugMixParams from explicit draws (``draws``' layout; m and d as float32 or float64)."""
        op, magnitude = np.asarray(op, np.int64), np.asarray(magnitude, np.float64)
        B, W, D = op.shape
        orig = torch.as_tensor(np.asarray(m, np.float32)[:, 0].copy())
        # torchvision: dirichlet (float32) * m[:, 1] (float32), one float32 product
        chain = torch.as_tensor(np.asarray(d, np.float32).copy()) * torch.as_tensor(
            np.asarray(m, np.float32)[:, 1:2].copy())
        steps = [[self._step(op[:, i, s], magnitude[:, i, s], height, width) for s in range(D)] for i in range(W)]
        return AugMixParams(op, magnitude, orig, chain, steps, height, width)

    def _step(self, op, magnitude, height, width):
        B = len(op)
        codes, values = np.zeros((B, 1), np.int64), np.zeros((B, 1, 3))
        warp_idx, matrices = [], []
        for k, name in enumerate(self._names):
            sel = op == k
            if not sel.any():
                continue
            if name in _PHOTOMETRIC:
                code, param = _PHOTOMETRIC[name]
                codes[sel, 0] = OPS[code]
                values[sel, 0, 0] = param(magnitude[sel])
            else:
                warp_idx.append(np.nonzero(sel)[0])
                matrices.append(geometric_matrices(name, magnitude[sel], height, width)[:, :2])
        if warp_idx:
            idx = np.concatenate(warp_idx)
            order = np.argsort(idx)  # ascending sample indices: all B of them are the whole batch in order
            warp = (torch.from_numpy(idx[order]), torch.from_numpy(np.concatenate(matrices)[order].astype(np.float32)))
        else:
            warp = (None, None)
        return _Step(*warp, _table(codes, values) if codes.any() else None)

    # --- execution (the batch's device) ---------------------------------------------------------------------
    def apply(self, x, params):
        """The AugMix of every sample of the uint8 batch x [B, 3, H, W] with ``params`` (from ``plan``)."""
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.shape[1] != 3 or x.dtype != torch.uint8:
            raise TypeError(f"AugMix.apply needs a uint8 batch [B, 3, H, W], got "
                            f"{getattr(x, 'dtype', type(x))} {tuple(getattr(x, 'shape', ()))}")
        B, _, H, W = x.shape
        if params.orig.shape[0] != B or (params.height, params.width) != (H, W):
            raise ValueError(f"AugMix.apply: the parameters were planned for {params.orig.shape[0]} samples of "
                             f"{params.height}x{params.width}, the batch is {B} of {H}x{W}")
        dev = x.device
        orig, chain = params.orig, params.chain
        if x.is_cuda:
            orig, chain = orig.pin_memory(), chain.pin_memory()
        orig = orig.to(dev, non_blocking=True).view(B, 1, 1, 1)
        chain = chain.to(dev, non_blocking=True)
        fill = 0.0 if self.fill is None else self.fill  # a number, or one value per channel
        mix = orig * x  # float32, as torchvision's m[:, 0] * batch
        for i, steps in enumerate(params.steps):
            aug = x
            for step in steps:
                if step.warp_idx is not None:
                    aug = self._warp(aug, step, fill)
                if step.table is not None:
                    aug = photometric(aug, step.table, out_dtype=torch.uint8)
            mix.add_(chain[:, i].view(B, 1, 1, 1) * aug)  # torchvision: mix.add_(combined_weights[:, i] * aug)
        return mix.to(torch.uint8)  # truncation, as torchvision's .to(dtype)

    @staticmethod
    def _warp(aug, step, fill):
        B, _, H, W = aug.shape
        idx, m = step.warp_idx, step.matrices
        if aug.is_cuda:
            idx, m = idx.pin_memory(), m.pin_memory()
        idx, m = idx.to(aug.device, non_blocking=True), m.to(aug.device, non_blocking=True)
        if len(step.warp_idx) == B:
            return ops.warp_affine(aug, m, (H, W), fill=fill, layout="NCHW")
        warped = ops.warp_affine(aug.index_select(0, idx), m, (H, W), fill=fill, layout="NCHW")
        return aug.index_copy(0, idx, warped)  # out of place: aug may be the batch itself

    def __repr__(self):
        return (f"AugMix(severity={self.severity}, mixture_width={self.mixture_width}, chain_depth="
                f"{self.chain_depth}, alpha={self.alpha}, all_ops={self.all_ops}, interpolation="
                f"{self.interpolation!r}, fill={self.fill!r})")


def _randint(u, n):
    return np.minimum(np.floor(u * n), n - 1).astype(np.int64)
