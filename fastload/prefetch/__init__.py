"""GPU prefetch: the side-stream pipe FastLoader(device="cuda") uses, and DataPrefetcher for other loaders."""
from .prefetcher import DataPrefetcher

__all__ = ["DataPrefetcher"]
