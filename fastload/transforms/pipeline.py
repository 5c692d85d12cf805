"""Compose, Normalize, ToDtype and the Pipeline FastLoader runs.

A torchvision v2 pipeline is a list of transforms applied one image at a time. fastload runs the same list per
batch, in three places (CONTRACT.md beside this file):
- before decoding, on the host: every geometric step is composed into one 2x3 matrix per sample, from which the
  decode window and DCT scale follow (``Pipeline.plan``); the policies' rotate/shear/translate too where a policy
  asks for BILINEAR;
- after decoding, in the stage (GPU or CPU): one warp, then the photometric table (``functional.photometric``) on
  the uint8 image, as torchvision's uint8 pipelines do, with the policies' NEAREST rotate/shear/translate (their
  default) at the slots where the samples drew them (affine_nearest_'s maths: each such slot reads its input through
  the sample's map, so they cost no pass of their own), then ToDtype + Normalize, then RandomErasing
  (AugMix, which mixes whole images, splits the table: the ops before it, AugMix itself, then the ops after it
  fused with ToDtype + Normalize);
- in the training loop's hand-off: batch ops (MixUp, CutMix) on the finished batch, fused with the last
  RandomErasing into one native pass (transforms.batch_ops); without batch ops the erase ends the stage.
Every random number is a pure function of (seed, epoch, sample index) (batch index for batch ops), so CPU and CUDA
make the same draws and a resumed loader the same batches.

Resolution schedules: the output size may differ per epoch (``Pipeline.set_epoch_size``, which FastLoader calls
before an epoch's batches are made). Every step that depends on it takes the epoch's size: the geometry
(``GeometryPlanner.with_size`` / the crop planner's ``with_size``: windows, DCT downscale, matrices), the policies'
canvas, RandomErasing's boxes and the stage's output (carried by each batch's SampleParams).
"""
import copy
import functools
import threading
import types
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from .. import ops
from .containers import torchvision_hint
from .policies import composed

__all__ = ["Compose", "Normalize", "ToDtype", "ToImage", "PILToTensor", "Pipeline"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Streams per transform position: a constant apart, so that inserting a transform moves no other draw of the
# same position, and far from the streams fastload uses elsewhere (0: crops of the crop= planners, 1: shuffle).
_STREAM_BASE = 1000


class Compose:
    """torchvision's ``Compose``: the transforms in order. Nested Compose objects are flattened."""

    kind = "compose"

    def __init__(self, transforms):
        if not isinstance(transforms, Sequence):
            raise TypeError("Argument transforms should be a sequence of callables")
        if not transforms:
            raise ValueError("Pass at least one transform")
        self.transforms = list(transforms)

    def flat(self):
        out = []
        for t in self.transforms:
            out.extend(t.flat() if isinstance(t, Compose) else [t])
        return out

    def __repr__(self):
        inner = "".join(f"\n    {t!r}," for t in self.transforms)
        return f"Compose({inner}\n)"


class Normalize:
    """torchvision's ``Normalize(mean, std, inplace=False)`` on the float image (0-1 scale after ToDtype)."""

    kind = "normalize"

    def __init__(self, mean, std, inplace=False):
        self.mean = [float(m) for m in mean]
        self.std = [float(s) for s in std]
        self.inplace = inplace
        if any(s == 0 for s in self.std):  # torchvision raises this at the first image; a loader can at once
            raise ValueError(f"std evaluated to zero after conversion to torch.float32, leading to division by "
                             f"zero. Got std={std}")

    def __repr__(self):
        return f"Normalize(mean={self.mean}, std={self.std}, inplace={self.inplace})"


class ToDtype:
    """torchvision's ``ToDtype(dtype, scale=False)``: the loader's output dtype. Floats need ``scale=True`` (0-1
    values, what Normalize expects), as in torchvision's recipes; ``torch.uint8`` gives the 0-255 pixels."""

    kind = "dtype"

    def __init__(self, dtype, scale=False):
        if not isinstance(dtype, (dict, torch.dtype)):
            raise ValueError(f"dtype must be a dict or a torch.dtype, got {type(dtype)} instead")
        if isinstance(dtype, dict):
            raise ValueError("fastload's ToDtype takes one torch.dtype (the loader's output is one image tensor)")
        if dtype not in _FLOAT_DTYPES + (torch.uint8,):
            raise ValueError(f"fastload outputs float32, float16, bfloat16 or uint8 images, got {dtype}")
        self.dtype = dtype
        self.scale = bool(scale)

    def __repr__(self):
        return f"ToDtype({self.dtype}, scale={self.scale})"


class ToTensor(ToDtype):
    """torchvision's deprecated ``ToTensor()``, as it acts on the PIL images of a torchvision v1 pipeline
    (``[RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize(mean, std)]``): the image as float32
    on the 0-1 scale, ``ToDtype(torch.float32, scale=True)``."""

    def __init__(self):
        warnings.warn("The transform `ToTensor()` is deprecated and will be removed in a future release. Instead, "
                      "please use `v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])`.Output is "
                      "equivalent up to float precision.")  # torchvision's warning, word for word
        super().__init__(torch.float32, scale=True)

    def __repr__(self):
        return "ToTensor()"


class ConvertImageDtype(ToDtype):
    """torchvision's deprecated ``ConvertImageDtype(dtype=torch.float32)``: ``ToDtype(dtype, scale=True)``."""

    def __init__(self, dtype=torch.float32):
        super().__init__(dtype, scale=True)

    def __repr__(self):
        return f"ConvertImageDtype({self.dtype})"


class ToImage:
    """torchvision's ``ToImage``: a no-op here (decoded samples are image tensors already). Accepted so that a
    torchvision pipeline moves over unchanged."""

    kind = "noop"

    def __repr__(self):
        return "ToImage()"


class PILToTensor(ToImage):
    """torchvision's ``PILToTensor``: a no-op here, as ToImage."""

    def __repr__(self):
        return "PILToTensor()"


class Identity(ToImage):
    """torchvision's ``Identity``: a no-op."""

    def __repr__(self):
        return "Identity()"


class RGB(ToImage):
    """torchvision's ``RGB``: a no-op here (the loader decodes every JPEG, grey and CMYK ones included, to RGB),
    but after ``Grayscale()`` it turns the grey image back into three equal channels, as torchvision's does (a
    photometric step of no slots)."""

    slots = 0
    stream = 0

    def table(self, seed, epoch, indices):
        from .functional import PhotometricTable
        return PhotometricTable.identity(len(indices))

    def __repr__(self):
        return "RGB()"


class ToPureTensor(ToImage):
    """torchvision's ``ToPureTensor``: a no-op here (the loader's batches are plain tensors)."""

    def __repr__(self):
        return "ToPureTensor()"


class Lambda:
    """torchvision's ``Lambda(lambd, *types)``, so that a pipeline moves over unchanged up to the loader, which
    refuses it naming it: fastload plans every transform before decoding and cannot call Python on each image."""

    kind = None

    def __init__(self, lambd, *types):
        if not callable(lambd):
            raise TypeError(f"Argument lambd should be callable, got {repr(type(lambd).__name__)}")
        self.lambd, self.types = lambd, types or (object,)

    def __repr__(self):
        return f"Lambda({getattr(self.lambd, '__name__', self.lambd)})"


def _supported_names():
    from . import __all__ as names
    not_transforms = ("CropPlan", "Pipeline", "PhotometricTable", "AutoAugmentPolicy", "InterpolationMode", "Lambda")
    return ", ".join(n for n in names if n[0].isupper() and n not in not_transforms)


def _name(t):
    """What a refusal calls ``t``: a function or partial by its own name (``train.my_aug``), a Lambda with its
    function's, a class (passed instead of an instance) by its repr, anything else by its type."""
    if isinstance(t, type):
        return repr(t)
    if isinstance(t, Lambda):
        return f"Lambda({_name(t.lambd)})"
    if isinstance(t, functools.partial):
        return f"functools.partial({_name(t.func)})"
    if isinstance(t, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        module, name = getattr(t, "__module__", None), getattr(t, "__qualname__", t.__name__)
        return f"{module}.{name}" if module else name
    return type(t).__module__ + "." + type(t).__qualname__


def _refuse(t, why):
    name = _name(t)
    return TypeError(f"FastLoader cannot run {name} ({why}). fastload runs these transforms, with torchvision.transforms"
                     f".v2's names and arguments: {_supported_names()}. Import them from fastload.transforms "
                     f"(`import fastload.transforms as T`).")


def _check_transform(t):
    if isinstance(t, Lambda):
        raise _refuse(t, "a Python function on each image: fastload plans every transform before decoding, so it "
                         "cannot call arbitrary Python on each image")
    kind = getattr(t, "kind", None)
    if kind is None or not type(t).__module__.startswith("fastload."):
        hint = torchvision_hint(t)
        if hint:
            raise _refuse(t, hint)
        raise _refuse(t, "not a fastload transform: fastload plans every transform before decoding, so it cannot "
                         "call arbitrary Python on each image")
    return kind


class NearestMaps(NamedTuple):
    """The policies' rotate/shear/translate (NEAREST) of a batch, one entry per (sample, slot) that drew one,
    ordered by slot: samples int64 [N] and matrices float32 [N, 2, 3] (output -> input pixel index on the output
    canvas), both views of one int32 buffer so that a GPU stage gets them with one copy (``on``), and slots, a
    host list of N ints (the photometric table's slot whose input the map moves)."""
    samples: torch.Tensor
    matrices: torch.Tensor
    packed: torch.Tensor
    slots: list

    @classmethod
    def make(cls, samples, matrices, slots, *, pin=False):
        n = len(samples)
        packed = torch.empty(8 * n, dtype=torch.int32, pin_memory=pin)
        packed[:2 * n].view(torch.int64).copy_(torch.as_tensor(samples, dtype=torch.int64))
        packed[2 * n:].view(torch.float32).copy_(torch.as_tensor(matrices, dtype=torch.float32).reshape(-1))
        return cls._views(packed, [int(s) for s in slots])

    @classmethod
    def _views(cls, packed, slots):
        n = len(packed) // 8
        return cls(packed[:2 * n].view(torch.int64), packed[2 * n:].view(torch.float32).view(n, 2, 3), packed, slots)

    def rows(self, start, stop, *, pin=False):
        """The entries of samples start..stop-1 renumbered from 0, still ordered by slot (what the batch of those
        samples gets when it is planned with others: Pipeline.split_params), or None where none drew a map."""
        samples = self.samples.numpy()
        keep = (samples >= start) & (samples < stop)
        if not keep.any():
            return None
        return NearestMaps.make(samples[keep] - start, self.matrices.numpy()[keep],
                                [s for s, k in zip(self.slots, keep) if k], pin=pin)

    def on(self, device):
        """(samples, matrices, slots), the tensors on ``device`` (one non-blocking copy from pinned memory)."""
        if self.packed.device == torch.device(device):
            return self.samples, self.matrices, self.slots
        return self._views(self.packed.to(device, non_blocking=True), self.slots)[:2] + (self.slots,)


class SampleParams(NamedTuple):
    """What a batch carries to the stage besides pixels and matrices: its photometric table, its erasing boxes,
    and the coordinates of its draws (for RandomErasing's value="random")."""
    table: object  # functional.PhotometricTable or None
    erase: list  # one float32 [B, 4] per RandomErasing
    seed: int
    epoch: int
    indices: np.ndarray
    size: tuple  # (H, W) of the output: the epoch's size
    augmix: tuple = ()  # per AugMix, in order: (table of the photometric transforms before it or None, AugMix,
    # AugMixParams); `table` holds the transforms after the last AugMix
    nearest: NearestMaps = None  # the policies' geometric ops with NEAREST, for the samples that drew one


class Pipeline:
    """What FastLoader runs: a Compose split into geometry (planned before decode), photometric slots, the output
    dtype/normalisation, erasing, and batch ops. Built once per loader by ``Pipeline.build``."""

    def __init__(self, geometry, photometric, dtype, scale, mean, std, erasing, batch_ops, transforms, *,
                 in_scale=1.0 / 255, normalize_inplace=False):
        self.transforms = transforms
        self.in_scale = in_scale
        self.photometric = photometric  # policies and photometric transforms, in order
        self.dtype, self.scale = dtype, scale
        self.mean, self.std = mean, std
        self.erasing = erasing
        self.batch_ops = batch_ops
        self._policies = [t for t in photometric if t.kind == "policy"]
        # Grayscale(num_output_channels=1): the table's slots from it to an RGB() or Grayscale(3) act on one channel
        # (carried in three equal ones, PhotometricTable.on_one_channel); if the image ends grey, the output keeps
        # one channel, or three where Normalize broadcasts it (torchvision's sub(mean) then div_(std)).
        self._one_channel, grey = _one_channel_slots(photometric)
        self.out_channels = 3
        lengths = (1 if mean is None else len(mean), 1 if std is None else len(std))
        if not set(lengths) <= {1, 3}:  # torchvision's broadcast raises this at the first image
            raise RuntimeError(f"Normalize(mean={mean}, std={std}): one value, or one per channel (3), can broadcast "
                               f"to the image; {max(lengths, key=lambda n: n not in (1, 3))} cannot")
        if grey:
            if (lengths[1] == 3 and (lengths[0] == 1 or normalize_inplace)) or (lengths[0] == 3 and normalize_inplace):
                raise RuntimeError(f"Normalize(mean={mean}, std={std}, inplace={normalize_inplace}) on the one-channel "
                                   f"image of Grayscale(): torchvision's sub(mean) then div_(std) cannot broadcast to "
                                   f"it (one value each, or a mean of three values out of place, gives three)")
            self.out_channels = 3 if lengths[0] == 3 else 1
        for e in erasing:
            e.check_channels(self.out_channels)
        # Policies with NEAREST (torchvision's default) rotate/shear/translate the resized crop as torchvision does:
        # a nearest-neighbour gather after the warp (affine_nearest_'s), which keeps every warp axis-aligned and
        # every decode window within the crop's. Otherwise (a BILINEAR policy among them) their ops compose into
        # the warp.
        self._nearest = bool(self._policies) and all(p._interpolation == "nearest" for p in self._policies)
        self._memo = threading.local()  # _once_per_batch: the last batch's plans, per planning thread
        from .geometry import GeometryPlanner, fill_triple, places_fill
        # The crop= shorthand passes a planner (planners.RandomResizedCrop / CenterCrop) as the whole geometry.
        steps = [] if hasattr(geometry, "plan") else geometry
        self.geometry = GeometryPlanner(steps) if steps else geometry
        self.out_size = tuple(self.geometry.out_size if steps else geometry.size)  # the size as built
        self._geometries = {self.out_size: self.geometry}  # (H, W) -> the geometry planning that size
        self._epoch_sizes = {}  # epoch -> (H, W) where it differs from out_size (set_epoch_size)
        # torchvision's defaults: fill=0 for RandomAffine/RandomRotation, None (0) for the policies
        fills = {fill_triple(t.fill, getattr(t, "fill_error", ValueError)) for t in steps + self._policies
                 if places_fill(t)}
        if len(fills) > 1:
            raise ValueError(f"fastload applies one fill value to a pipeline; these transforms ask for {sorted(fills)}")
        self.fill = fills.pop() if fills else (0.0, 0.0, 0.0)  # per channel

    @classmethod
    def build(cls, transform):
        """A Pipeline from a Compose (or a single transform). Refuses, naming it, anything fastload cannot run."""
        items = transform.flat() if isinstance(transform, Compose) else [transform]
        for t in items:
            _check_transform(t)
        # The pipeline's own copies: each gets the random stream of its position, and a transform object shared
        # with another pipeline (at another position) must not change that pipeline's draws.
        items = [copy.deepcopy(t) for t in items]  # one by one: a transform listed twice draws twice
        geometry, photometric, erasing, batch_ops = [], [], [], []
        dtype, scale, mean, std, cast, inplace = None, False, None, None, False, False
        for position, t in enumerate(items):
            kind = _check_transform(t)
            t.stream = _STREAM_BASE + position
            if kind == "geometry":
                if photometric or erasing or mean is not None:
                    # torchvision would resample after those; fastload folds every geometric step into the one
                    # warp before them, which changes what they see (fill pixels, statistics): say so at once.
                    raise ValueError(f"{t!r} comes after a photometric transform, Normalize or RandomErasing: "
                                     f"fastload applies geometry first (one resample before decode). Move it before "
                                     f"them.")
                geometry.append(t)
            elif kind in ("photometric", "policy", "augmix"):
                if kind == "augmix" and any(getattr(p, "num_output_channels", 3) == 1 for p in photometric):
                    raise ValueError(f"{t!r} comes after Grayscale(num_output_channels=1): fastload's AugMix mixes "
                                     f"three-channel images. Put Grayscale after it.")
                if kind == "policy" and any(p.kind == "augmix" for p in photometric):
                    # its geometric ops fold into the warp, which runs before AugMix
                    raise ValueError(f"{t!r} comes after AugMix: fastload runs a policy's geometric ops in the warp "
                                     f"or the photometric table before AugMix. Put it before AugMix.")
                if dtype in _FLOAT_DTYPES or mean is not None or erasing:
                    # torchvision would run it on the float image, where some arguments mean other things (a
                    # solarize threshold on 0-1) and nothing rounds to levels: refused rather than approximated.
                    raise ValueError(f"{t!r} comes after ToDtype/Normalize/RandomErasing: fastload's photometric ops "
                                     f"run on the uint8 image, as torchvision's recipes do. Move it before them.")
                photometric.append(t)
            elif kind == "dtype":
                if dtype in (None, torch.uint8):  # (uint8 to uint8 is a no-op)
                    dtype, scale = t.dtype, t.scale
                elif dtype == torch.float32 and t.dtype in _FLOAT_DTYPES:
                    # float32 to a float: the output's cast (scale is a no-op between floats); torchvision would
                    # normalise narrowed values after it, hence only after Normalize (below)
                    dtype, cast = t.dtype, True
                else:
                    raise ValueError(f"{t!r} after {_dtype_repr(dtype, scale)}: fastload converts the image once, "
                                     f"then may cast float32 to the output's float type; torchvision would carry "
                                     f"the values rounded to {dtype} on")
            elif kind == "normalize":
                if dtype is None or dtype == torch.uint8 or not scale:
                    raise ValueError("Normalize needs a float image on the 0-1 scale first: put "
                                     "ToDtype(torch.float32, scale=True) before it (torchvision raises on uint8 input)")
                if cast:
                    raise ValueError(f"{t!r} after a float-to-float ToDtype: torchvision normalises the values "
                                     f"rounded to that type, fastload in float32; put the cast after Normalize")
                if mean is not None:
                    raise ValueError(f"{t!r} after another Normalize: fastload folds one normalisation into the "
                                     f"warp; combine them into one (mean m1 + m2 * s1, std s1 * s2)")
                if erasing:
                    raise ValueError(f"{t!r} after RandomErasing: fastload erases the normalised batch, so the "
                                     f"erased value would not be normalised as torchvision's would; put RandomErasing "
                                     f"after Normalize (as torchvision's references do)")
                mean, std, inplace = t.mean, t.std, t.inplace
            elif kind == "erasing":
                if dtype is None or dtype == torch.uint8:
                    raise ValueError("RandomErasing needs a float image: put ToDtype(torch.float32, scale=True) "
                                     "(and Normalize) before it")
                erasing.append(t)
            elif kind == "batch":
                batch_ops.append(t)
            elif kind == "noop":
                if isinstance(t, RGB) and _one_channel_slots(photometric)[1]:  # the grey image back to three channels
                    if dtype in _FLOAT_DTYPES or mean is not None or erasing:
                        raise ValueError(f"{t!r} after Grayscale(), ToDtype/Normalize/RandomErasing: fastload turns "
                                         f"the grey image back to three channels on the uint8 image. Move it before "
                                         f"them.")
                    photometric.append(t)
                continue
            else:
                raise _refuse(t, f"unknown kind {kind!r}")
        if batch_ops and items[-len(batch_ops):] != batch_ops:
            raise ValueError("MixUp/CutMix/RandomChoice of them must come last: they act on the finished batch")
        if not geometry:
            raise ValueError("the pipeline must fix the output size: start it with RandomResizedCrop, "
                             "Resize + CenterCrop (or RandomCrop), or CenterCrop")
        if dtype is None:
            dtype = torch.uint8  # torchvision's output without ToDtype: the uint8 image
        if dtype in _FLOAT_DTYPES and not scale:
            raise ValueError(f"ToDtype({dtype}, scale=False) would give float images on the 0-255 scale; fastload "
                             f"supports scale=True (0-1), as torchvision's recipes use")
        return cls(geometry, photometric, dtype, scale, mean, std, erasing, batch_ops, items, normalize_inplace=inplace)

    @classmethod
    def shorthand(cls, planner, mean, std, in_scale, dtype):
        """The pipeline of FastLoader's crop=/flip=/mean=/std=/dtype= arguments: the planner's crop and flip,
        then the fused normalisation (``(x * in_scale - mean) / std``; uint8: the pixels as they are)."""
        return cls(planner, [], dtype, True, mean, std, [], [], [planner], in_scale=in_scale)

    # --- the output size, per epoch (resolution schedules) --------------------------------------------------
    def set_epoch_size(self, epoch, size):
        """Sets the output size (int or (H, W)) of the batches of ``epoch``. FastLoader calls it before it makes
        an epoch's batches; the sizes of epochs more than one behind are forgotten (no epoch that old is in
        flight: the loader runs at most the current epoch and the next)."""
        from .planners import _pair
        size = _pair(size, "size")
        if size not in self._geometries:  # validated and built once per size
            self._geometries[size] = self.geometry.with_size(size)
        self._epoch_sizes = {e: s for e, s in self._epoch_sizes.items() if e >= epoch - 1}
        if size == self.out_size:
            self._epoch_sizes.pop(epoch, None)
        else:
            self._epoch_sizes[epoch] = size
        return size

    def size_at(self, epoch):
        """(H, W) of the batches of ``epoch``."""
        return self._epoch_sizes.get(epoch, self.out_size)

    # --- planning (host, per batch) -------------------------------------------------------------------------
    @property
    def photometric_slots(self):
        return sum(t.slots for t in self.photometric if t.kind != "augmix")

    def plan(self, heights, widths, seed, epoch, indices):
        """Geometry of a batch: GeometryPlan (windows, matrices, fill, flipped). BILINEAR policies' geometric ops
        compose after every geometric step; with NEAREST ones a moved sample's window covers what its first
        gather reads (``_nearest_entries``)."""
        size = self.size_at(epoch)
        geometry = self._geometries[size]
        if not self._policies:
            return geometry.plan(heights, widths, seed, epoch, indices)
        if not self._nearest:
            return geometry.plan(heights, widths, seed, epoch, indices, extra=self._policy_maps(seed, epoch, indices))
        reads = self._nearest_entries(seed, epoch, indices)[3]
        return geometry.plan(heights, widths, seed, epoch, indices, read=_gathered_box(reads, *size))

    def _policy_maps(self, seed, epoch, indices):
        """The policies' geometric ops composed (float64 [B, 3, 3], output -> input pixel index on the epoch's
        canvas): what a BILINEAR pipeline folds into the warp."""
        extra = np.broadcast_to(np.eye(3), (len(indices), 3, 3)).copy()
        h, w = self.size_at(epoch)
        for p in self._policies:
            extra = extra @ composed(self._policy_plan(p, seed, epoch, indices, h, w)[1])  # earlier ones first
        return extra

    def _nearest_entries(self, seed, epoch, indices):
        """The NEAREST policies' maps as the stage runs them: (samples [N], slots [N], matrices [N, 3, 3]) of every
        (sample, slot) with a geometric op, ordered by slot (slots of the photometric table that holds the
        policies: the first segment's, AugMix coming after them), and reads float64 [B, 3, 3]: the map that reads
        each sample's warped crop, where its first gather comes before any op that changes pixels, else the
        identity (the whole crop: an op before the gather may need all of it, equalize's histogram say).
        Computed once per batch (``plan`` wants the reads, ``sample_params`` the entries)."""
        h, w = self.size_at(epoch)
        indices = np.asarray(indices, dtype=np.int64)
        return self._once_per_batch("nearest", (seed, epoch, h, w, indices.tobytes()),
                                    lambda: self._make_nearest_entries(seed, epoch, indices, h, w))

    def _make_nearest_entries(self, seed, epoch, indices, h, w):
        b = len(indices)
        parts, offset = [], 0
        changed = np.zeros(b, dtype=bool)  # a slot before this one changes the sample's pixels
        reads = np.broadcast_to(np.eye(3), (b, 3, 3)).copy()
        for t in self._segments()[0][0]:
            if t.kind != "policy":
                changed |= (t.table(seed, epoch, indices).ops != 0).any(1).numpy()
                offset += t.slots
                continue
            table, maps = self._policy_plan(t, seed, epoch, indices, h, w)
            codes = table.ops.numpy()
            for s in range(maps.shape[1]):
                moved = np.flatnonzero((maps[:, s] != np.eye(3)).any(axis=(1, 2)))
                first = moved[~changed[moved]]
                reads[first] = maps[first, s]
                changed[moved] = True
                changed |= codes[:, s] != 0
                parts.append((moved, np.full(len(moved), offset + s), maps[moved, s]))
            offset += t.slots
        if not parts:  # policies of no slots (RandAugment(num_ops=0))
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 3, 3)), reads
        samples, slots, matrices = (np.concatenate(c) for c in zip(*parts))
        return samples, slots, matrices, reads

    def _nearest_maps(self, seed, epoch, indices, pin):
        """SampleParams.nearest: the NEAREST policies' maps (NearestMaps), or None where no sample drew one."""
        if not self._nearest:
            return None
        samples, slots, matrices, _ = self._nearest_entries(seed, epoch, indices)
        if not len(samples):
            return None
        return NearestMaps.make(samples, matrices[:, :2, :], slots, pin=pin)

    def _policy_plan(self, policy, seed, epoch, indices, h, w):
        """policy.plan, computed once per batch: the thread that plans a batch's geometry (the loader's producer,
        in BatchMaker.prepare) asks for the same draws again for its table (and again only when on_error="skip"
        replaced samples, with other indices: a new key). The last result per policy is kept per
        thread."""
        indices = np.asarray(indices, dtype=np.int64)
        return self._once_per_batch(id(policy), (seed, epoch, h, w, indices.tobytes()),
                                    lambda: policy.plan(seed, epoch, indices, h, w))

    def _once_per_batch(self, name, key, make):
        """make() for this key, kept per planning thread under ``name`` until another key comes: a batch's
        planning asks for the same values from several places (one entry per name, so memory stays flat)."""
        memo = self._memo.__dict__.setdefault("batch", {})
        hit = memo.get(name)
        if hit is None or hit[0] != key:
            hit = memo[name] = (key, make())
        return hit[1]

    def _segments(self):
        """The photometric transforms split at each AugMix: ([segment before each AugMix, ..., segment after the
        last], [AugMix, ...]). AugMix mixes whole images, so it cannot share a table with the others."""
        segments, augmix = [[]], []
        for t in self.photometric:
            if t.kind == "augmix":
                augmix.append(t)
                segments.append([])
            else:
                segments[-1].append(t)
        return segments, augmix

    def table(self, seed, epoch, indices, transforms=None):
        """The photometric table of a batch (PhotometricTable, host tensors) for ``transforms`` (default: those
        after the last AugMix, which run fused with ToDtype + Normalize), or None when there are none."""
        last = transforms is None  # (Grayscale(1) comes after every AugMix: in the last segment)
        transforms = self._segments()[0][-1] if last else transforms
        if not transforms:
            return None
        from .functional import PhotometricTable
        h, w = self.size_at(epoch)
        parts = [self._policy_plan(t, seed, epoch, indices, h, w)[0] if t.kind == "policy"
                 else t.table(seed, epoch, indices) for t in transforms]
        table = PhotometricTable(torch.cat([p.ops for p in parts], 1), torch.cat([p.params for p in parts], 1))
        if last:
            for start, end in self._one_channel:
                table = table.on_one_channel(start, end)
        return table

    def sample_params(self, seed, epoch, indices, *, pin=False):
        """SampleParams of a batch with these (final: after on_error="skip" replacements) sample indices: its
        output size, and what the stage applies per sample after the warp (table None, erase []: nothing).
        Photometric tables come checked (pinned with ``pin``, for a GPU), so the stage runs them as they are."""
        size = self.size_at(epoch)
        indices = np.asarray(indices, dtype=np.int64)
        segments, augmix = self._segments()
        from .functional import checked_table

        def table(transforms=None):
            t = self.table(seed, epoch, indices, transforms)
            return None if t is None else checked_table(t, *size, pin=pin)
        mixes = tuple((table(before), a, a.plan(seed, epoch, indices, *size)) for before, a in zip(segments, augmix))
        return SampleParams(table(),
                            [e.table(seed, epoch, indices, *size) for e in self.erasing], seed, epoch, indices, size,
                            mixes, self._nearest_maps(seed, epoch, indices, pin))

    @property
    def splits_params(self):
        """Whether split_params can cut a concatenation's SampleParams into its batches' (AugMix's execution
        steps group a batch's samples by op: they are planned per batch)."""
        return not self._segments()[1]

    def split_params(self, params, sizes, *, pin=False):
        """The SampleParams of consecutive batches of ``sizes`` samples, from sample_params of their indices
        concatenated: every draw is a pure function of (seed, epoch, sample index), so each is exactly what
        sample_params gives that batch alone (tests/test_pipeline.py checks it). Not with AugMix (splits_params)."""
        if not self.splits_params:
            raise ValueError("split_params: a pipeline with AugMix plans its SampleParams per batch")
        out, start = [], 0
        for n in sizes:
            stop, table = start + n, params.table
            if table is not None:  # views of the rows: still contiguous, and pinned where the whole is
                table = table._replace(ops=table.ops[start:stop], params=table.params[start:stop])
            nearest = None if params.nearest is None else params.nearest.rows(start, stop, pin=pin)
            out.append(params._replace(table=table, erase=[e[start:stop] for e in params.erase],
                                       indices=params.indices[start:stop], nearest=nearest))
            start = stop
        return out

    # --- execution (the stage, on the batch's device) -------------------------------------------------------
    def normalise_params(self):
        """(mean, std, in_scale) of the output: ``(x * in_scale - mean) / std``; uint8 output is not scaled."""
        if self.dtype == torch.uint8:
            return None, None, 1.0
        return self.mean, self.std, self.in_scale

    def run(self, data, offsets, shapes, matrices, params, *, channels_last=False, hwc=True, channels=3):
        """The stage, on the batch's device (CPU or CUDA, same maths): the warp to the batch's size, then
        ``params`` (SampleParams; None: the pipeline's own size, nothing after the warp). Without photometric ops,
        one fused warp + normalise; with them, the warp writes uint8 (rounded, as torchvision's uint8 resize does),
        the ops run on it, then ToDtype + Normalize, then RandomErasing (one native pass each, in the output's
        layout). With batch ops the last RandomErasing is left to ``mix_images``, which fuses it with the
        mixing: pass it the same params."""
        mean, std, in_scale = self.normalise_params()
        photometric = params is not None and (params.table is not None or bool(params.augmix) or
                                              params.nearest is not None)
        x = ops.warp_ragged(data, offsets, shapes, matrices, self.out_size if params is None else params.size,
                            mean=None if photometric else mean, std=None if photometric else std,
                            in_scale=1.0 if photometric else in_scale,
                            out_dtype=torch.uint8 if photometric else self.dtype,
                            channels_last=channels_last and not photometric, fill=list(self.fill), hwc=hwc,
                            channels=channels)
        if params is None:
            return x
        # The policies' rotate/shear/translate: each map moves the input of its slot of the table that holds the
        # policies (the first: before any AugMix), read through by that slot's op (no pass of their own).
        nearest = None
        if params.nearest is not None:
            samples, matrices, slots = params.nearest.on(x.device)
            nearest = (samples, matrices, list(self.fill), slots)
        if photometric:  # every slot, then ToDtype + Normalize, in one native op (two small kernels a slot)
            from .functional import PhotometricTable, photometric as run_table
            for before, augmix, mix in params.augmix:  # on the uint8 image, as torchvision's AugMix
                if before is not None:
                    x = run_table(x, before, out_dtype=torch.uint8, nearest=nearest)
                    nearest = None
                x = augmix.apply(x, mix)
            table = params.table if params.table is not None else PhotometricTable.identity(x.shape[0])  # the cast
            x = run_table(x, table, mean=mean, std=std, in_scale=in_scale, out_dtype=self.dtype,
                          channels_last=channels_last, nearest=nearest)
            if self.out_channels == 1:  # the grey image's one channel (all three are equal)
                layout = torch.channels_last if channels_last else torch.contiguous_format
                x = x[:, :1].contiguous(memory_format=layout)
        erasing = self.erasing[:-1] if self.batch_ops else self.erasing  # the last one: mix_images
        for e, boxes in zip(erasing, params.erase):
            x = e.apply(x, boxes, params.seed, params.epoch, params.indices)
        return x.contiguous(memory_format=torch.channels_last) if channels_last else x

    def batch_plan(self, seed, epoch, batch_index, size):
        """The batch ops' parameters for batch ``batch_index`` of ``epoch`` (host tensors), or None without batch
        ops: drawn where the batch is made, applied on its device right after the stage (mix_images; their targets: mix_targets)."""
        if not self.batch_ops:
            return None
        h, w = self.size_at(epoch)
        return [op.plan(seed, epoch, batch_index, size, h, w) for op in self.batch_ops]

    def apply_batch_ops(self, x, y, plan, params=None):
        """MixUp/CutMix on the finished batch x [B, C, H, W] and its labels y, with ``batch_plan``'s parameters:
        ``mix_images`` and ``mix_targets``."""
        return self.mix_images(x, plan, params), self.mix_targets(y.to(x.device), plan)

    def mix_images(self, x, plan, params=None):
        """The batch ops' images, and the pipeline's last RandomErasing (which ``run`` leaves to them) with
        ``params``, the SampleParams that ``run`` got: erase and mix in one native pass (transforms.batch_ops).
        params None: no erase, as ``run`` with params None erases nothing."""
        erase = None
        if self.erasing and params is not None:
            erase = self.erasing[-1].op_args(x, params.erase[-1], params.seed, params.epoch, params.indices)
        for k, (op, p) in enumerate(zip(self.batch_ops, plan)):
            x = op.mix_images(x, p, erase if k == 0 else None)
        return x

    def mix_targets(self, y, plan):
        """The batch ops' targets (float [B, num_classes]) on y's device: FastLoader's producers compute them on
        the host when they draw ``plan``, and the labels travel mixed."""
        for op, p in zip(self.batch_ops, plan):
            y = op.mix_targets(y, p)
        return y

    def __repr__(self):
        return "Pipeline(" + ", ".join(repr(t) for t in self.transforms) + ")"


def _one_channel_slots(photometric):
    """([(start, end), ...], grey): the slot ranges of the last segment's photometric table (after every AugMix) in
    which the image has one channel (from a Grayscale(num_output_channels=1) to an RGB() or Grayscale(3) after it,
    whose own slot then repeats the channel: identity on three equal ones), and whether the image ends grey.
    Refuses what torchvision would run on one channel and fastload cannot: a policy's fill of three values (torchvision
    raises too), a container that could turn some samples back to three channels."""
    last = photometric[max((i for i, t in enumerate(photometric) if t.kind == "augmix"), default=-1) + 1:]
    ranges, start, slot = [], None, 0
    for t in last:
        n = getattr(t, "num_output_channels", None)
        if start is not None:
            if t.kind == "policy" and isinstance(t.fill, (list, tuple)) and len(t.fill) > 1:
                raise ValueError(f"The number of elements in 'fill' cannot broadcast to match the number of channels "
                                 f"of the image ({len(t.fill)} != 1): {t!r} comes after Grayscale()")
            if _holds(t, lambda c: getattr(c, "num_output_channels", None) == 3):
                raise TypeError(f"{t!r} after Grayscale(): per sample it would turn some grey images back to three "
                                f"channels, and a batch would mix one- and three-channel images")
        if n == 1 and start is None:
            start = slot + t.slots  # the Grayscale slot itself turns RGB grey, as Grayscale(3) does
        elif (n == 3 or isinstance(t, RGB)) and start is not None:
            ranges.append((start, slot + t.slots))
            start = None
        slot += t.slots
    if start is not None:
        ranges.append((start, slot))
    return ranges, start is not None


def _holds(container, test):
    """Whether a container (RandomApply, RandomChoice, RandomOrder), at any depth, holds a transform passing test."""
    return any(test(c) or _holds(c, test) for c in getattr(container, "transforms", ()))


def _gathered_box(extra, h, w):
    """float64 [B, 4] (x0, x1, y0, y1), edge coordinates of an h x w canvas: the pixels that a nearest gather with
    the maps ``extra`` (output -> input pixel index) reads, with a pixel of margin for a rounding tie that the
    kernel's fixed point decides the other way (affine_nearest.h); the whole canvas for samples it does not move."""
    corners = np.array([[0, 0, 1], [w - 1, 0, 1], [0, h - 1, 1], [w - 1, h - 1, 1]], np.float64).T  # [3, 4]
    src = extra[:, :2] @ corners  # [B, 2, 4]: the output corners' sources (x, y), pixel index
    lo, hi = np.floor(src.min(axis=2) + 0.5) - 1, np.floor(src.max(axis=2) + 0.5) + 1
    box = np.stack([lo[:, 0], hi[:, 0] + 1, lo[:, 1], hi[:, 1] + 1], axis=1)  # pixel index -> edge
    box = np.clip(box, 0, [w, w, h, h])
    box[:, 1] = np.maximum(box[:, 1], box[:, 0])  # all outside: an empty box
    box[:, 3] = np.maximum(box[:, 3], box[:, 2])
    return box


def _dtype_repr(dtype, scale):
    return f"ToDtype({dtype}, scale={scale})"

