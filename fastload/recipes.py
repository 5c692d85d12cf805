"""Whole training recipes: the train pipeline, the matching eval pipeline and the loader options, in one call.

    import fastload as fl
    from fastload import recipes
    r = recipes.torchvision_v2(num_classes=1000)
    train = fl.FastLoader(ds, batch_size=128, device="cuda", drop_last=True, transform=r.train, **r.loader_kwargs)
    val = fl.FastLoader(val_ds, batch_size=256, device="cuda", shuffle=False, pad=False, transform=r.eval)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=r.label_smoothing)   # the loss's job, not the loader's

- ``torchvision_v2``: torchvision's ImageNet recipe of "How to train state-of-the-art models using TorchVision's
  latest primitives" (references/classification: --auto-augment ta_wide --random-erase 0.1 --mixup-alpha 0.2
  --cutmix-alpha 1.0 --ra-sampler --ra-reps 4 --train-crop-size 176 --val-resize-size 232 --label-smoothing 0.1).
- ``ffcv_low_res``: FFCV's ResNet-50 configs (ffcv-imagenet, rn50_88_epochs.yaml): train at 160 px, growing to
  192 px between epochs 65 and 76, RandomResizedCrop + flip; evaluate at 256 px, a 224/256 centre crop.
- ``classic``: RandomResizedCrop(224) + flip; Resize(256) + CenterCrop(224).
"""
from dataclasses import dataclass, field

import numpy as np
import torch

from . import sampler
from .transforms import (Compose, CenterCrop, CutMix, MixUp, Normalize, RandomChoice, RandomErasing,
                         RandomHorizontalFlip, RandomResizedCrop, Resize, ToDtype, TrivialAugmentWide)

__all__ = ["Recipe", "LinearRamp", "linear_ramp", "torchvision_v2", "ffcv_low_res", "classic", "classic_eval", "RECIPES"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class Recipe:
    """train/eval: fastload.transforms.Compose pipelines (FastLoader(transform=...)). loader_kwargs: what the
    training FastLoader takes besides (repeats=, size_schedule=). size_schedule: the train size per epoch (also in
    loader_kwargs) or None. label_smoothing: the recipe's CrossEntropyLoss(label_smoothing=...)."""
    train: Compose
    eval: Compose
    loader_kwargs: dict = field(default_factory=dict)
    size_schedule: object = None
    label_smoothing: float = 0.0


@dataclass(frozen=True)
class LinearRamp:
    """FFCV's ``get_resolution``: ``min_res`` up to epoch ``start_ramp``, ``max_res`` from ``end_ramp``, and in
    between the linear interpolation rounded to the nearest multiple of ``step`` (FFCV's np.round: halves to even).
    A callable(epoch) -> int for FastLoader(size_schedule=)."""
    start_ramp: int
    end_ramp: int
    min_res: int
    max_res: int
    step: int = 32

    def __post_init__(self):
        if self.min_res > self.max_res:  # FFCV asserts it
            raise ValueError(f"min_res must be <= max_res, got {self.min_res} > {self.max_res}")
        if self.start_ramp > self.end_ramp:
            raise ValueError(f"start_ramp must be <= end_ramp, got {self.start_ramp} > {self.end_ramp}")
        if self.min_res <= 0 or self.step <= 0:
            raise ValueError(f"min_res and step must be positive, got {self.min_res} and {self.step}")

    def __call__(self, epoch):
        if epoch <= self.start_ramp:
            return self.min_res
        if epoch >= self.end_ramp:
            return self.max_res
        interp = np.interp([epoch], [self.start_ramp, self.end_ramp], [self.min_res, self.max_res])[0]
        return int(np.round(interp / self.step)) * self.step


def linear_ramp(start_ramp, end_ramp, min_res, max_res, step=32):
    """FFCV's resolution schedule as a FastLoader size_schedule (LinearRamp)."""
    return LinearRamp(start_ramp, end_ramp, min_res, max_res, step)


def _finish(mean, std):
    return [ToDtype(torch.float32, scale=True), Normalize(mean, std)]


def torchvision_v2(size=176, num_classes=1000, *, eval_size=224, eval_resize=232, mean=IMAGENET_MEAN,
                   std=IMAGENET_STD, world_size=None):
    """torchvision's v2 ImageNet recipe: RandomResizedCrop(size) + flip + TrivialAugmentWide + ToDtype + Normalize
    + RandomErasing(0.1) + RandomChoice([MixUp(0.2), CutMix(1.0)]) (targets [B, num_classes] floats), repeated
    augmentation with 4 copies where the run is distributed; eval Resize(eval_resize) + CenterCrop(eval_size);
    label smoothing 0.1 (the loss's, which accepts MixUp/CutMix's soft targets).

    world_size: default torch.distributed's when initialised, else torchrun's WORLD_SIZE, else 1. torchvision's
    train.py builds its RASampler only when distributed (one process samples at random), and so does this recipe:
    with one process the 4 copies would come in a row, four of an image in a batch, which MixUp/CutMix (each
    sample mixed with its neighbour) would then mostly mix with themselves."""
    world_size = sampler.world_size() if world_size is None else world_size
    train = Compose([RandomResizedCrop(size), RandomHorizontalFlip(), TrivialAugmentWide(interpolation="bilinear"),
                     *_finish(mean, std), RandomErasing(0.1),
                     RandomChoice([MixUp(alpha=0.2, num_classes=num_classes),
                                   CutMix(alpha=1.0, num_classes=num_classes)])])
    repeats = 4 if world_size > 1 else 1
    return Recipe(train, classic_eval(eval_size, eval_resize, mean, std), {"repeats": repeats}, None, 0.1)


def ffcv_low_res(min_res=160, max_res=192, start_ramp=65, end_ramp=76, *, eval_size=256, crop_ratio=224 / 256,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """FFCV's ResNet-50 recipe (rn50_88_epochs.yaml; label smoothing 0.1): RandomResizedCrop + flip at a size
    growing from min_res to max_res between start_ramp and end_ramp (linear_ramp); eval at eval_size, FFCV's
    centre crop of crop_ratio of the short side, here Resize(int(eval_size / crop_ratio)) + CenterCrop(eval_size)
    (292 + 256): the same share of the image to within a pixel, not FFCV's pixels (it crops int(0.875 * side) of
    each image, then resizes that with its own filter). For another epoch count, scale start_ramp and end_ramp
    with it."""
    schedule = linear_ramp(start_ramp, end_ramp, min_res, max_res)
    train = Compose([RandomResizedCrop(min_res), RandomHorizontalFlip(), *_finish(mean, std)])
    return Recipe(train, classic_eval(eval_size, int(eval_size / crop_ratio), mean, std),
                  {"size_schedule": schedule}, schedule, 0.1)


def classic(size=224, *, eval_size=224, eval_resize=256, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """The ResNet recipe of torchvision's first references: RandomResizedCrop(size) + flip; Resize(256) +
    CenterCrop(224); label smoothing 0.1 as the other recipes (the original had none)."""
    train = Compose([RandomResizedCrop(size), RandomHorizontalFlip(), *_finish(mean, std)])
    return Recipe(train, classic_eval(eval_size, eval_resize, mean, std), label_smoothing=0.1)


def classic_eval(size=224, resize=256, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """Resize(resize) + CenterCrop(size) + ToDtype + Normalize."""
    return Compose([Resize(resize), CenterCrop(size), *_finish(mean, std)])


RECIPES = {"torchvision_v2": torchvision_v2, "ffcv": ffcv_low_res, "classic": classic}
