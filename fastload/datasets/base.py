"""What FolderDataset and LMDBDataset share: the interface the loader plans from, and a plain torch Dataset.

The loader never decodes through ``ds[i]``: it reads ``heights``, ``widths``, ``labels``, ``formats`` (numpy
arrays, one entry per sample) to plan crops, then fetches a batch's bytes with ``with ds.reader() as r:
r.get(i)`` and decodes them inside the ``with``. ``ds[i]`` is the slow, simple path (full decode, uint8
[3, H, W]) for torchvision-style pipelines and tests.
"""
import abc
import io
import operator
from collections import namedtuple

import numpy as np
import torch

from .. import ops
from ..errors import DecodeError
from .record import FORMAT_NAMES, JPEG

#: One sample's bytes and what the index says about it. ``data`` is bytes, or a memoryview inside a reader.
Record = namedtuple("Record", "data height width label format")


class DatasetError(ValueError):
    """A path cannot be used as asked: not a dataset, empty, unfinished, or in the way (CLI exit code 2)."""


class DataError(ValueError):
    """The data has problems: files that cannot be read or decoded (CLI exit code 1)."""


def decode_image(data, fmt, sample=None, strict=True):
    """Full decode of one sample's bytes to a uint8 tensor [3, H, W] (RGB). Raises DecodeError naming ``sample``;
    ``strict`` as in ops.decode_crop."""
    if fmt == JPEG:
        info = ops.read_header(data, sample=sample, strict=strict)
        hwc = ops.decode_crop(data, 0, 0, info.height, info.width, sample=sample, strict=strict)
    else:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as im:
                if im.width * im.height > ops.MAX_PIXELS:
                    raise ValueError(f"{im.width}x{im.height} is larger than the pixel limit")
                hwc = torch.from_numpy(np.array(im.convert("RGB")))
        except Exception as e:
            raise DecodeError(f"{sample}: cannot decode with Pillow: {e}", sample=sample, reason="corrupt") from None
    return hwc.permute(2, 0, 1).contiguous()


class ImageDataset(torch.utils.data.Dataset, abc.ABC):
    """Base of FolderDataset and LMDBDataset. Subclasses set ``classes``, ``heights``, ``widths``, ``labels``,
    ``formats`` and implement ``reader()`` and ``sample_name(i)``."""

    classes: list
    heights: np.ndarray
    widths: np.ndarray
    labels: np.ndarray
    formats: np.ndarray

    def __init__(self, transform=None, target_transform=None, strict=True):
        self.strict = strict  # for ds[i]'s decode, as in ops.decode_crop
        self.transform = transform
        self.target_transform = target_transform
        self.skipped = []

    @property
    def class_to_idx(self):
        return {name: i for i, name in enumerate(self.classes)}

    def __len__(self):
        return len(self.labels)

    def _index(self, i):
        n = len(self)
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample index {i} is out of range for a dataset of {n} samples")
        return i

    @abc.abstractmethod
    def sample_name(self, i):
        """What error messages call sample i: its path, or ``store[i]``."""

    @abc.abstractmethod
    def reader(self):
        """A context manager giving an object with ``get(i) -> bytes-like`` (valid until the ``with`` exits) and,
        for the loader's native path, ``sources(indices) -> (buffers or paths, crcs or None)``."""

    def record(self, i):
        """Record(data: bytes, height, width, label, format) of sample i (a copy, usable anywhere)."""
        i = self._index(i)
        with self.reader() as r:
            data = bytes(r.get(i))
        return Record(data, int(self.heights[i]), int(self.widths[i]), int(self.labels[i]), int(self.formats[i]))

    def __getitem__(self, i):
        """(uint8 tensor [3, H, W], int label), by a full decode; then ``transform`` / ``target_transform``."""
        i = self._index(i)
        with self.reader() as r:
            image = decode_image(r.get(i), int(self.formats[i]), sample=self.sample_name(i), strict=self.strict)
        label = int(self.labels[i])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    def class_counts(self):
        return np.bincount(self.labels, minlength=len(self.classes)).tolist() if len(self) else [0] * len(self.classes)

    def summary(self):
        """A JSON-able description: count, classes and their counts, size statistics, formats, skipped."""
        h, w = np.asarray(self.heights), np.asarray(self.widths)
        longer = np.maximum(h, w) if len(self) else np.zeros(0, np.int64)
        edges = [0, 128, 256, 384, 512, 768, 1024, 2048, 4096]
        buckets = {}
        for lo, hi in zip(edges, edges[1:] + [None]):
            n = int(((longer > lo) & (longer <= hi)).sum()) if hi else int((longer > lo).sum())
            if n:
                buckets[f"{lo + 1}-{hi}" if hi else f">{lo}"] = n

        def stats(a):
            if not len(a):
                return None
            return {"min": int(a.min()), "median": float(np.median(a)), "max": int(a.max())}

        formats = np.bincount(np.asarray(self.formats, dtype=np.int64), minlength=2) if len(self) else [0, 0]
        return {
            "count": len(self),
            "classes": list(self.classes),
            "class_counts": self.class_counts(),
            "height": stats(h),
            "width": stats(w),
            "longer_side": buckets,
            "formats": {FORMAT_NAMES[k]: int(formats[k]) for k in FORMAT_NAMES},
            "skipped": [list(s) for s in self.skipped],
        }
