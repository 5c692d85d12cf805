"""fastload.transforms: torchvision.transforms.v2's vocabulary, planned before decode and run in the loader's stage.

    import fastload.transforms as T          # instead of: import torchvision.transforms.v2 as T
    loader = fl.FastLoader(ds, transform=T.Compose([
        T.RandomResizedCrop(176), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
        T.ToDtype(torch.float32, scale=True), T.Normalize(mean, std), T.RandomErasing(0.1),
        T.RandomChoice([T.MixUp(alpha=0.2, num_classes=1000), T.CutMix(alpha=1.0, num_classes=1000)])]))

Same class names, arguments and defaults as torchvision; every random parameter is drawn per sample from
fastload's counter RNG (a pure function of seed, epoch and sample index). Where things run: CONTRACT.md.

Modules: ``geometry`` (folded into one warp before decode), ``color`` and ``policies`` (per-sample photometric
tables), ``functional`` (the batched ops that execute them, CPU and CUDA), ``erasing``, ``mixing`` (batch ops),
``containers`` (RandomChoice, RandomApply, RandomOrder: per sample, or per batch among batch ops), ``pipeline`` (Compose and what
FastLoader runs), ``planners`` (the crop= shorthand's planners).
"""
from .augmix import AugMix
from .color import (ColorJitter, GaussianBlur, Grayscale, RandomAdjustSharpness, RandomAutocontrast, RandomEqualize,
                    RandomGrayscale, RandomInvert, RandomPosterize, RandomSolarize)
from .erasing import RandomErasing
from .geometry import (CenterCrop, Pad, RandomAffine, RandomCrop, RandomHorizontalFlip, RandomResizedCrop,
                       RandomRotation, RandomVerticalFlip, Resize)
from .containers import RandomApply, RandomChoice, RandomOrder
from .mixing import CutMix, MixUp
from .pipeline import (RGB, Compose, ConvertImageDtype, Identity, Lambda, Normalize, PILToTensor, Pipeline, ToDtype,
                       ToImage, ToPureTensor, ToTensor)
from .policies import AutoAugment, AutoAugmentPolicy, InterpolationMode, RandAugment, TrivialAugmentWide

__all__ = [
    "Compose", "RandomResizedCrop", "Resize", "CenterCrop", "RandomCrop", "Pad", "RandomHorizontalFlip",
    "RandomVerticalFlip",
    "RandomAffine", "RandomRotation", "ColorJitter", "RandomGrayscale", "Grayscale", "GaussianBlur", "RandomInvert",
    "RandomPosterize", "RandomSolarize", "RandomAdjustSharpness", "RandomAutocontrast", "RandomEqualize",
    "AutoAugment", "AutoAugmentPolicy", "RandAugment", "TrivialAugmentWide", "AugMix", "ToImage", "PILToTensor",
    "ToPureTensor", "RGB", "Identity", "ToDtype", "ToTensor", "ConvertImageDtype", "Normalize", "RandomErasing",
    "MixUp", "CutMix", "RandomChoice", "RandomApply", "RandomOrder", "Pipeline", "InterpolationMode", "Lambda",
]
