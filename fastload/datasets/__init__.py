"""Datasets (image folders and packed LMDB stores), the record format, and the pack writer."""
from .base import DataError, DatasetError, ImageDataset, Record
from .folder import IMAGE_EXTENSIONS, FolderDataset
from .lmdb import LMDBDataset
from .pack import pack
from .verify import verify

__all__ = ["FolderDataset", "LMDBDataset", "ImageDataset", "Record", "DatasetError", "DataError", "pack", "verify",
           "IMAGE_EXTENSIONS"]
