"""torchvision.transforms.v2's containers that draw: ``RandomChoice``, ``RandomApply`` and ``RandomOrder``.

torchvision draws once per call, so in a per-image pipeline each image draws for itself; fastload does the same per
sample, from ``fastload.rng`` on the container's stream (its children on ``rng.derived_stream``s of it), and folds
the outcome into the photometric table: the chosen child's slots (padded with identity to the widest child), the
children's slots in order and identity where RandomApply did not apply, or the children's slots in the sample's
RandomOrder. Among batch ops (MixUp, CutMix) RandomChoice picks one per batch instead, keyed by the batch's index,
since they act on the whole batch.

Children must all be photometric transforms (ColorJitter, GaussianBlur, RandomGrayscale, RandomSolarize, ..., a
container of them, or a Compose of them, run in order), or, for RandomChoice, all batch ops. Geometry (folded into
the one warp before decode) and the policies (whose rotations fold into it too) cannot be chosen per sample after
the fact: refused, naming the child.
"""
import copy
import math
from collections.abc import Sequence

import numpy as np
import torch

from .. import rng
from .functional import PhotometricTable
from .geometry import probability

__all__ = ["RandomChoice", "RandomApply", "RandomOrder"]


_PHOTOMETRIC = "photometric transforms (ColorJitter, GaussianBlur, RandomGrayscale, RandomSolarize, ...), per sample"
_BATCH = "batch ops (MixUp, CutMix), per batch"


def torchvision_hint(t):
    """For a torchvision transform object (an import mixed up): what to use instead; else None."""
    if not type(t).__module__.startswith("torchvision."):
        return None
    from . import __all__ as names
    return (f"a torchvision transform object: use fastload.transforms.{type(t).__name__}, which takes the same "
            f"arguments" if type(t).__name__ in names else "a torchvision transform object: fastload has no "
            "equivalent yet")


def _kind_of_children(container, transforms, kinds):
    """The one kind of ``transforms`` among ``kinds``, or a TypeError naming the child that does not fit."""
    offer = _PHOTOMETRIC if kinds == ("photometric",) else f"{_PHOTOMETRIC}, or {_BATCH}"
    found = [getattr(t, "kind", None) for t in transforms]
    for t, kind in zip(transforms, found):
        if kind not in kinds:
            hint = torchvision_hint(t)
            raise TypeError(f"fastload's {container} picks among {offer}; {t!r} is not one"
                            + (f" ({hint})" if hint else ""))
    if len(set(found)) > 1:
        first = {k: t for t, k in reversed(list(zip(transforms, found)))}
        raise TypeError(f"fastload's {container} picks among {offer}, not both: {first['photometric']!r} and "
                        f"{first['batch']!r}")
    return found[0]


class _NoOp:
    """A no-op child (Identity, ToImage, PILToTensor, ToPureTensor) as a photometric step of no slots: a sample that
    picks it, or an order that places it, keeps its pixels, as in torchvision."""

    kind = "photometric"
    slots = 0
    stream = 0

    def __init__(self, of):
        self.of = of

    def table(self, seed, epoch, indices):
        return PhotometricTable.identity(len(indices), 0)

    def __repr__(self):
        return repr(self.of)


def _own_children(transforms):
    """The container's own copies of its children (a transform listed twice draws twice, as torchvision calls it
    twice); a Compose child becomes RandomApply(its transforms, p=1): all of them, in order; a no-op, _NoOp. (RGB
    is not one: after Grayscale() it changes the channel count.)"""
    from .pipeline import RGB, Compose, ToImage

    def own(t):
        if isinstance(t, Compose):
            return RandomApply(t.flat(), p=1.0)
        if isinstance(t, ToImage) and not isinstance(t, RGB):
            return _NoOp(t)
        return copy.deepcopy(t)
    return [own(t) for t in transforms]


def _check_list(transforms, not_a_sequence="Argument transforms should be a sequence of callables"):
    """torchvision's checks of a container's ``transforms`` argument (same exception types and messages)."""
    if not isinstance(transforms, Sequence):
        raise TypeError(not_a_sequence)
    elif not transforms:
        raise ValueError("Pass at least one transform")


class _Container:
    """The children's streams follow the container's (set by Compose before planning)."""

    @staticmethod
    def _slots(transforms):
        return sum(t.slots for t in transforms)  # all the children's, one after another

    def _adopt(self, transforms, kinds=("photometric",)):
        """Takes the container's own copies of ``transforms`` (their kinds checked): their one kind."""
        transforms = _own_children(transforms)
        kind = _kind_of_children(type(self).__name__, transforms, kinds)
        for t in transforms:  # (a container child was checked when it was made)
            if getattr(t, "num_output_channels", 3) == 1:
                raise TypeError(f"fastload's {type(self).__name__} cannot hold {t!r}: the ops after it act on one "
                                f"channel, and inside a container where that starts is drawn per sample (or whether "
                                f"it happens: a batch of one- and three-channel images). Put it outside the "
                                f"container (or use RandomGrayscale, which keeps three channels)")
        self.transforms = transforms
        if kind == "photometric":
            self.slots = self._slots(transforms)
        return kind

    @property
    def stream(self):
        return self._stream

    @stream.setter
    def stream(self, value):
        self._stream = int(value)
        for k, t in enumerate(self.transforms):
            t.stream = rng.derived_stream(self._stream, k)


class RandomChoice(_Container):
    """torchvision's ``RandomChoice(transforms, p=None)``: one of ``transforms``, with probabilities ``p``
    (normalised; equal when None). Photometric children: drawn per sample (``kind = "photometric"``, ``slots``: the
    widest child's). Batch ops (MixUp, CutMix): drawn per batch, keyed by (seed, epoch, batch index)."""

    def __init__(self, transforms, p=None):
        _check_list(transforms)
        if p is None:
            p = [1] * len(transforms)
        elif len(p) != len(transforms):
            raise ValueError(f"Length of p doesn't match the number of transforms: {len(p)} != {len(transforms)}")
        # torchvision divides by sum(p) when built, and its multinomial raises at the first call
        if sum(p) == 0:
            raise ZeroDivisionError(f"RandomChoice: p sums to 0: {list(p)}")
        if not all(0 <= prob < math.inf for prob in p) or not sum(p) > 0:  # torchvision's multinomial refuses
            raise RuntimeError(f"RandomChoice: p must hold finite non-negative weights with a positive sum, got {list(p)}")
        self.kind = self._adopt(transforms, ("photometric", "batch"))
        total = sum(p)
        self.p = [prob / total for prob in p]
        self.stream = 0  # set by Compose

    def __repr__(self):
        return f"RandomChoice({self.transforms!r}, p={self.p})"

    @staticmethod
    def _slots(transforms):
        return max(t.slots for t in transforms)  # the chosen child's, padded with identity to the widest

    def _pick(self, u):
        """The child each uniform picks: torchvision's multinomial draw with p, by inverting its CDF."""
        cdf = np.cumsum(self.p)
        return np.searchsorted(cdf / cdf[-1], u, side="right")  # u < 1 = cdf[-1] / cdf[-1]: never past the last

    # --- photometric children: per sample ---------------------------------------------------------------------
    def choices(self, seed, epoch, indices):
        """int64 [B]: the child each sample uses."""
        return self._pick(rng.uniforms(seed, epoch, indices, 1, stream=self.stream)[:, 0])

    def table(self, seed, epoch, indices):
        chosen = torch.from_numpy(self.choices(seed, epoch, indices))
        out = PhotometricTable.identity(len(chosen), self.slots)
        for k, t in enumerate(self.transforms):
            rows = chosen == k
            if bool(rows.any()):
                part = t.table(seed, epoch, indices)
                out.ops[rows, :t.slots] = part.ops[rows]
                out.params[rows, :t.slots] = part.params[rows]
        return out

    # --- batch ops: per batch ---------------------------------------------------------------------------------
    def choose(self, seed, epoch, batch_index):
        """Index of the transform batch ``batch_index`` uses."""
        return int(self._pick(rng.uniforms(seed, epoch, [batch_index], 1, stream=self.stream)[0, 0]))

    def apply(self, x, y, seed, epoch, batch_index):
        return self.transforms[self.choose(seed, epoch, batch_index)].apply(x, y, seed, epoch, batch_index)

    def plan(self, seed, epoch, batch_index, size, height, width):
        """(the chosen transform's index, its plan)."""
        k = self.choose(seed, epoch, batch_index)
        return k, self.transforms[k].plan(seed, epoch, batch_index, size, height, width)

    def apply_planned(self, x, y, plan, erase=None):
        k, weights = plan
        return self.transforms[k].apply_planned(x, y, weights, erase=erase)

    def mix_images(self, x, plan, erase=None):
        k, weights = plan
        return self.transforms[k].mix_images(x, weights, erase)

    def mix_targets(self, y, plan):
        k, weights = plan
        return self.transforms[k].mix_targets(y, weights)


class RandomApply(_Container):
    """torchvision's ``RandomApply(transforms, p=0.5)``: with probability ``p`` all of ``transforms`` in order,
    else none; drawn per sample. Photometric children only (their slots one after another)."""

    kind = "photometric"

    def __init__(self, transforms, p=0.5):
        _check_list(transforms, "Argument transforms should be a sequence of transforms")
        p = probability(p)
        self._adopt(transforms)
        self.p = p
        self.stream = 0  # set by Compose

    def __repr__(self):
        return f"RandomApply({self.transforms!r}, p={self.p})"

    def applied(self, seed, epoch, indices):
        """bool [B]: the samples the transforms apply to (torchvision: not ``torch.rand(1) >= p``)."""
        return rng.uniforms(seed, epoch, indices, 1, stream=self.stream)[:, 0] < self.p

    def table(self, seed, epoch, indices):
        applied = torch.from_numpy(self.applied(seed, epoch, indices))
        out = PhotometricTable.identity(len(applied), self.slots)
        if bool(applied.any()):
            parts = [t.table(seed, epoch, indices) for t in self.transforms]
            out.ops[applied] = torch.cat([p.ops for p in parts], 1)[applied]
            out.params[applied] = torch.cat([p.params for p in parts], 1)[applied]
        return out


class RandomOrder(_Container):
    """torchvision's ``RandomOrder(transforms)``: all of ``transforms``, in an order drawn per sample (uniform over
    the permutations, as torchvision's randperm). Photometric children only (slots: all of theirs)."""

    kind = "photometric"

    def __init__(self, transforms):
        _check_list(transforms)
        self._adopt(transforms)
        self.stream = 0  # set by Compose

    def __repr__(self):
        return f"RandomOrder({self.transforms!r})"

    def orders(self, seed, epoch, indices):
        """int64 [B, n]: per sample, the children in the order they run (the argsort of n uniforms)."""
        u = rng.uniforms(seed, epoch, indices, len(self.transforms), stream=self.stream)
        return np.argsort(u, axis=1, kind="stable")

    def table(self, seed, epoch, indices):
        order = torch.from_numpy(self.orders(seed, epoch, indices))
        parts = [t.table(seed, epoch, indices) for t in self.transforms]
        slots = torch.tensor([t.slots for t in self.transforms])
        start = torch.cumsum(slots[order], 1) - slots[order]  # [B, n]: where the j-th child of each sample begins
        out = PhotometricTable.identity(len(order), self.slots)
        for j in range(order.shape[1]):
            for k, (t, part) in enumerate(zip(self.transforms, parts)):
                for first in torch.unique(start[order[:, j] == k, j]).tolist():  # rows where child k is j-th
                    rows = (order[:, j] == k) & (start[:, j] == first)
                    out.ops[rows, first:first + t.slots] = part.ops[rows]
                    out.params[rows, first:first + t.slots] = part.params[rows]
        return out

