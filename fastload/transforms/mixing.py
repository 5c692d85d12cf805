"""MixUp and CutMix: batch ops on the finished float batch, on the batch's device (RandomChoice of them:
containers.py).

torchvision.transforms.v2's classes and arguments, plus timm's ``mode``:
- ``"batch"``: one lambda (and one CutMix box) for the whole batch; sample i is mixed with sample i - 1 (the batch
  rolled by one, torchvision's ``x.roll(1, 0)``), so with the same lambda/box the output equals torchvision's.
- ``"pair"``: one lambda/box per pair (i, B-1-i) (timm's flip), both members mixed with each other using it; with an
  odd batch the middle sample is paired with itself (its image and target stay as they are, up to rounding).
- ``"elem"``: one lambda/box per sample, sample i mixed with sample B-1-i (timm's flip).

Lambdas are Beta(alpha, alpha), drawn from fastload.rng keyed by (seed, epoch, batch index) on the transform's
stream, so a batch mixes the same way in every run and after a resume. Per element the draws are laid out element by
element (element i reads columns i*K .. i*K+K-1), so element i's lambda does not depend on the batch size.

Beta from uniforms: X / (X + Y) with X, Y ~ Gamma(alpha) by Marsaglia & Tsang's method (ACM TOMS 26(3), 2000):
Box-Muller normals and an acceptance test, a fixed 12 attempts per draw (each accepts with probability > 0.95, so
all 12 fail with probability < 1e-15; the draw then falls back to the gamma's mode-like value d), and for alpha < 1
their boost Gamma(a) = Gamma(a + 1) * U^(1/a), in logs so tiny alphas do not underflow. It is a pure function of the
uniforms, written with numpy's elementary functions only: unlike numpy's Generator.beta (whose stream numpy may
change between versions) or scipy's beta.ppf (scipy is not a fastload dependency), nothing outside fastload decides
the numbers.

Targets come out as float [B, num_classes] soft labels (one-hot mixed with the same weights). Label smoothing is the
loss's job (``torch.nn.CrossEntropyLoss(label_smoothing=...)`` takes these soft targets), not the loader's.
"""
import math
import numbers
from typing import NamedTuple, Optional

import numpy as np
import torch

from .. import rng

__all__ = ["MixUp", "CutMix", "MixParams", "beta_from_uniforms"]

_GAMMA_ATTEMPTS = 12
_GAMMA_COLUMNS = 3 * _GAMMA_ATTEMPTS + 1  # (normal u1, normal u2, acceptance u) per attempt, then the boost's U
_COLUMNS = 2 * _GAMMA_COLUMNS + 2  # per element: two gammas, then CutMix's box centre (row, column)
_MODES = ("batch", "pair", "elem")


def concentration(alpha, what):
    """A Beta or Dirichlet ``alpha`` as a float, refused as torchvision's torch.tensor([alpha]) sampling refuses it:
    a string (ValueError), a bool (NotImplementedError: no such sampler for bool)."""
    if isinstance(alpha, str):
        raise ValueError(f"alpha must be a number, got {alpha!r}")
    if isinstance(alpha, bool):
        raise NotImplementedError(f"alpha must be a number, not a bool ({alpha!r}): the {what} sampler has no bool "
                                  f"version")
    return float(alpha)


def _log_gamma(alpha, u):
    """log of Gamma(alpha, 1) draws from uniforms u [n, _GAMMA_COLUMNS] (Marsaglia & Tsang). Attempt k is
    evaluated only for the draws that attempts 0..k-1 rejected (~5% each time): the loop is over attempts."""
    a = alpha + 1.0 if alpha < 1.0 else alpha
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    v = np.ones(len(u))  # all attempts rejected (probability < 1e-15): the draw falls back to d
    pending = np.arange(len(u))
    for k in range(_GAMMA_ATTEMPTS):
        if not len(pending):
            break
        u1, u2, u3 = (u[pending, 3 * k + j] for j in range(3))
        z = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * math.pi * u2)  # 1 - u in (0, 1]: finite logs
        vk = (1.0 + c * z) ** 3
        with np.errstate(invalid="ignore", divide="ignore"):  # log(vk) of a rejected vk <= 0
            accept = (vk > 0) & (np.log1p(-u3) < 0.5 * z * z + d - d * vk + d * np.log(vk))
        v[pending[accept]] = vk[accept]
        pending = pending[~accept]
    log_g = math.log(d) + np.log(v)
    if alpha < 1.0:
        log_g = log_g + np.log1p(-u[:, -1]) / alpha
    return log_g


def beta_from_uniforms(alpha, u):
    """float64 [n]: Beta(alpha, alpha) draws from uniforms u [n, >= 2 * _GAMMA_COLUMNS] (X / (X + Y))."""
    log_x = _log_gamma(alpha, u[:, :_GAMMA_COLUMNS])
    log_y = _log_gamma(alpha, u[:, _GAMMA_COLUMNS:2 * _GAMMA_COLUMNS])
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(log_y - log_x))


class MixParams(NamedTuple):
    """What a batch op does to a batch: sample i becomes lam[i] of itself and 1 - lam[i] of sample partner[i]
    (image and target); for CutMix the partner's pixels fill box[i] = (y1, y2, x1, x2) (rows y1..y2-1, columns
    x1..x2-1) and lam[i] is the share of i's own pixels."""
    lam: np.ndarray  # float64 [B]
    partner: np.ndarray  # int64 [B]
    box: Optional[np.ndarray]  # int64 [B, 4], CutMix only


def _labels_getter(labels_getter):
    """torchvision's _parse_labels_getter checks. FastLoader hands the dataset's labels to the op itself, so a
    function to find them would never be called: refused rather than ignored."""
    if labels_getter == "default":
        return labels_getter
    if labels_getter is None:  # torchvision then finds no labels and raises at the first batch
        raise ValueError("labels_getter=None gives MixUp/CutMix no labels to mix (torchvision raises 'The labels must "
                         "be a tensor, but got <class NoneType>' at the first batch); FastLoader mixes the dataset's labels: "
                         "leave labels_getter at 'default'")
    if callable(labels_getter):
        raise ValueError(f"labels_getter={labels_getter!r} would never be called: FastLoader passes the dataset's "
                         f"labels to MixUp/CutMix itself (leave labels_getter at 'default')")
    raise ValueError(f"labels_getter should either be 'default', a callable, or None, but got {labels_getter}.")


class _Mix:
    """What MixUp and CutMix share: arguments, draws, checks, targets, the native pass. Each defines
    ``params(seed, epoch, batch_index, size, height, width) -> MixParams`` and ``_op_kind`` (batch_ops.run's)."""

    kind = "batch"

    def __init__(self, *, alpha=1.0, num_classes=None, labels_getter="default", mode="batch"):
        self.alpha = concentration(alpha, "Beta")
        if not self.alpha > 0:  # torch's Beta refuses it with a ValueError in torchvision's constructor
            raise ValueError(f"alpha must be > 0 (the Beta(alpha, alpha) concentration), got {alpha}")
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES} (timm's meanings), got {mode!r}")
        if num_classes is not None and (not isinstance(num_classes, numbers.Integral)
                                        or isinstance(num_classes, bool)):  # torchvision's one_hot: TypeError
            raise TypeError(f"num_classes must be an int, got {num_classes!r}")
        if num_classes is not None and num_classes < 1:  # torchvision's one_hot would take -1 as "from the batch"
            raise ValueError(f"num_classes must be at least 1, got {num_classes} (the targets' width must not change "
                             f"from batch to batch)")
        self.num_classes = None if num_classes is None else int(num_classes)
        self.labels_getter = _labels_getter(labels_getter)
        self.mode = mode
        self.stream = 0  # set by Compose

    def __repr__(self):
        return f"{type(self).__name__}(alpha={self.alpha}, num_classes={self.num_classes}, mode={self.mode!r})"

    # --- planning (host) --------------------------------------------------------------------------------------
    def _draws(self, seed, epoch, batch_index, size):
        """(lam float64 [size], centre uniforms [size, 2], partner int64 [size]) per the mode."""
        n = 1 if self.mode == "batch" else size
        u = rng.uniforms(seed, epoch, [batch_index], n * _COLUMNS, stream=self.stream).reshape(n, _COLUMNS)
        lam = beta_from_uniforms(self.alpha, u)
        centre = u[:, -2:]
        i = np.arange(size)
        if self.mode == "batch":
            return np.repeat(lam, size), np.repeat(centre, size, axis=0), (i - 1) % size
        flip = size - 1 - i
        if self.mode == "pair":  # both members of a pair use the first member's draws
            first = np.minimum(i, flip)
            lam, centre = lam[first], centre[first]
        return lam, centre, flip

    # --- execution (the batch's device) -----------------------------------------------------------------------
    def _check(self, x, y):
        """torchvision's checks (messages and types) on the batch and the labels."""
        self._check_targets(y)
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            raise ValueError(f"Expected a batched input with 4 dims, but got {getattr(x, 'ndim', type(x))} "
                             f"dimensions instead.")
        if not x.is_floating_point():
            raise TypeError(f"{type(self).__name__} needs a float batch (after ToDtype), got {x.dtype}")
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"The batch size of the image or video does not match the batch size of the labels: "
                             f"{x.shape[0]} != {y.shape[0]}.")

    def _check_targets(self, y):
        if not isinstance(y, torch.Tensor):
            raise ValueError(f"The labels must be a tensor, but got {type(y)} instead.")
        if y.ndim not in (1, 2):
            raise ValueError(f"labels should be index based with shape (batch_size,) or probability based with "
                             f"shape (batch_size, num_classes), but got a tensor of shape {y.shape} instead.")
        if y.ndim == 2 and self.num_classes is not None and y.shape[-1] != self.num_classes:
            raise ValueError(f"When passing 2D labels, the number of elements in last dimension must match "
                             f"num_classes: {y.shape[-1]} != {self.num_classes}. You can Leave num_classes to None.")
        if y.ndim == 1 and self.num_classes is None:
            raise ValueError("num_classes must be passed if the labels are index-based (1D)")
        if y.ndim == 1:
            if y.is_floating_point() or y.dtype == torch.bool:
                raise TypeError(f"1D labels must be integer class indices, got {y.dtype}")
            if y.device.type == "cpu":  # a check of device labels would stall the stream: CPU labels only
                bad = (y < 0) | (y >= self.num_classes)
                if bad.any():
                    s = int(bad.nonzero()[0, 0])
                    raise RuntimeError(f"label {int(y[s])} of sample {s} of the batch is outside [0, num_classes="
                                     f"{self.num_classes})")

    def plan(self, seed, epoch, batch_index, size, height, width):
        """The batch's weights, drawn on the host where the batch is made: float32 [size, 6] (lam, 1 - lam, then
        CutMix's box y1, y2, x1, x2). torchvision multiplies by the Python floats lam and 1.0 - lam: the same
        float32 weights here."""
        p = self.params(seed, epoch, batch_index, size, height, width)
        host = np.zeros((size, 6), dtype=np.float32)
        host[:, 0] = p.lam
        host[:, 1] = 1.0 - p.lam
        if p.box is not None:
            host[:, 2:] = p.box
        return torch.from_numpy(host)

    def apply(self, x, y, seed, epoch, batch_index):
        """(x float [B, C, H, W] on any device, y int64 [B] or soft [B, num_classes]) -> (mixed x, soft targets
        float [B, num_classes] on x's device). x is not modified."""
        self._check(x, y)  # before x.shape is read: torchvision's messages for a batch of the wrong shape
        b, _, height, width = x.shape
        return self.apply_planned(x, y, self.plan(seed, epoch, batch_index, b, height, width))

    def apply_planned(self, x, y, plan, erase=None):
        """apply() with the weights ``plan()`` drew: ``mix_images`` and ``mix_targets``. x is not modified."""
        self._check(x, y)
        return self.mix_images(x, plan, erase), self.mix_targets(y.to(x.device), plan)

    def mix_images(self, x, plan, erase=None):
        """The images of apply_planned, mixed in one native pass (transforms.batch_ops), which also runs a
        RandomErasing first when given ``erase`` (its ``op_args``): Pipeline.mix_images fuses the pipeline's last
        erase with the mixing so."""
        from .batch_ops import run
        return run(x, erase=erase, mix=self.op_args(plan))

    def mix_targets(self, y, plan):
        """The targets of apply_planned, on y's device: [B] class indices or [B, num_classes] targets ->
        float [B, num_classes]. FastLoader computes them on the host where the batch is made (the same bits as on
        a GPU: one rounding per multiply and per add, as torch's kernels), so the GPU only mixes the images."""
        self._check_targets(y)
        b = y.shape[0]
        w = plan.to(y.device, non_blocking=True) if y.is_cuda and not plan.is_cuda else plan.to(y.device)
        if y.ndim == 1:
            y = torch.zeros(b, self.num_classes, dtype=torch.float32, device=y.device).scatter_(
                1, y.to(torch.int64)[:, None], 1.0)
        else:
            y = y if y.is_floating_point() else y.float()
        own, other = w[:, 0:1].to(y.dtype), w[:, 1:2].to(y.dtype)
        return self._partner(y).mul_(other).add_(y.mul(own))  # torchvision's _mixup_label, per sample

    def op_args(self, plan):
        """The mixing's part of transforms.batch_ops.run for a batch's ``plan()``: (kind, partner, columns int32
        [B, 6]: CutMix's box y1, y2, x1, x2, then the float32 weights lam and 1 - lam as bit patterns)."""
        plan = torch.as_tensor(plan, dtype=torch.float32).cpu().numpy()
        columns = np.zeros((len(plan), 6), dtype=np.int32)
        columns[:, :4] = plan[:, 2:]
        columns[:, 4:] = np.ascontiguousarray(plan[:, :2]).view(np.int32)
        return self._op_kind, "roll" if self.mode == "batch" else "flip", columns

    def _partner(self, t):
        """t's rows in partner order: row i of the result is row partner[i] (a new tensor)."""
        return t.roll(1, 0) if self.mode == "batch" else t.flip(0)


class MixUp(_Mix):
    """torchvision.transforms.v2.MixUp (``alpha``, ``num_classes``, ``labels_getter``) with timm's ``mode``: each
    image becomes lam * itself + (1 - lam) * its partner, lam ~ Beta(alpha, alpha); targets mix the same way.
    See the module docstring for the modes and partners. Label smoothing is the loss's job, not MixUp's."""

    def params(self, seed, epoch, batch_index, size, height, width):
        lam, _, partner = self._draws(seed, epoch, batch_index, size)
        return MixParams(lam, partner, None)

    _op_kind = "mixup"  # transforms.batch_ops: x[partner] * (1 - lam) + x * lam, torchvision's order of operations


class CutMix(_Mix):
    """torchvision.transforms.v2.CutMix (``alpha``, ``num_classes``, ``labels_getter``) with timm's ``mode``: a box
    of each image is replaced by the same box of its partner. The box is torchvision's: centre uniform over the
    pixels, half sides int(0.5 * sqrt(1 - lam) * W) and int(0.5 * sqrt(1 - lam) * H), clipped at the border; lam
    is then corrected to the share of the image's own pixels, which weighs the targets. Label smoothing is the
    loss's job, not CutMix's."""

    def params(self, seed, epoch, batch_index, size, height, width):
        lam, centre, partner = self._draws(seed, epoch, batch_index, size)
        r_x = np.minimum(np.floor(centre[:, 1] * width), width - 1)  # torch.randint(W)
        r_y = np.minimum(np.floor(centre[:, 0] * height), height - 1)
        r = 0.5 * np.sqrt(1.0 - lam)
        r_w_half = np.floor(r * width)
        r_h_half = np.floor(r * height)
        x1 = np.maximum(r_x - r_w_half, 0)
        y1 = np.maximum(r_y - r_h_half, 0)
        x2 = np.minimum(r_x + r_w_half, width)
        y2 = np.minimum(r_y + r_h_half, height)
        box = np.stack([y1, y2, x1, x2], axis=1).astype(np.int64)
        lam = 1.0 - (x2 - x1) * (y2 - y1) / (width * height)
        return MixParams(lam, partner, box)

    _op_kind = "cutmix"  # transforms.batch_ops: the partner's pixels inside the box
