"""fastload.transforms: torchvision.transforms.v2's vocabulary, planned before decode and run in the loader's stage.

``planners`` holds the crop planners behind FastLoader's ``crop=`` shorthand (``fastload.RandomResizedCrop``,
``fastload.CenterCrop``): from image sizes and per-sample random numbers to decode windows, DCT scales and warp
matrices.
"""
from .planners import CenterCrop, CropPlan, RandomResizedCrop

__all__ = ["CropPlan", "RandomResizedCrop", "CenterCrop"]
