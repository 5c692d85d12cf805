"""fastload: JPEG batches for PyTorch training, decoded only where the crop is and finished on the GPU.

    import fastload as fl
    loader = fl.FastLoader(fl.LMDBDataset("train.lmdb"), batch_size=256, device="cuda")
    for x, y in loader: ...
"""
from . import cuda_queues

cuda_queues.ask()  # before anything initialises the CUDA driver: 32 hardware queues, not 8 (cuda_queues says why)

from . import ops, recipes, transforms  # noqa: E402
from .errors import DecodeError
from .datasets import FolderDataset, LMDBDataset
from .loader import FastLoader
from .prefetch import DataPrefetcher
from .sampler import ShardedSampler
from .transforms.planners import CenterCrop, RandomResizedCrop

__version__ = "0.1.0"
__all__ = ["ops", "recipes", "transforms", "DecodeError", "FolderDataset", "LMDBDataset", "FastLoader",
           "DataPrefetcher", "ShardedSampler", "RandomResizedCrop", "CenterCrop", "__version__"]
