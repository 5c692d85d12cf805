"""The dataset protocol FastLoader reads, and ``as_source``: what FastLoader accepts as a dataset.

FastLoader never calls ``ds[i]``: it plans every crop from the index arrays, then reads a batch's bytes inside
one reader context. A source therefore implements (FolderDataset and LMDBDataset do; see README.md, "Custom
datasets: the dataset protocol"):

* ``len(ds)``: the number of samples N.
* ``heights``, ``widths``: integer arrays [N], each image's full size in pixels (what its header says).
* ``labels``: array [N], the targets batches carry.
* ``formats``: uint8 array [N]: 0 = JPEG (libjpeg-turbo crop decode), 1 = any other format (decoded by Pillow).
* optionally ``classes``: list of class names (label k is ``classes[k]``), for summaries; the loader does not use it.
* ``reader()``: a context manager giving ``r`` with ``r.get(i) -> bytes-like`` (the encoded file, valid until the
  ``with`` exits) and optionally ``r.sources(indices) -> (buffers or file paths, CRC-32s or None)`` for the
  native batch decoder (without it the loader uses ``get``).
* ``sample_name(i) -> str``: what error messages call sample i (a path, ``store[i]``).
* optionally ``sizes_checked = True``: heights/widths were read from these files' own headers, so the loader need
  not compare each JPEG's header with them on its first read (decoders.SizeChecks).

``transform`` / ``target_transform`` are not part of it: a source that sets them is refused, since FastLoader
would not apply them (its own ``transform=`` does, on whole batches).
"""
import contextlib

import numpy as np
import torch

PROTOCOL = ("__len__", "heights", "widths", "labels", "formats", "reader", "sample_name")
_ARRAYS = ("heights", "widths", "labels", "formats")
_DOCS = 'README.md, "Custom datasets: the dataset protocol"'
_SUPPORTED = ("FastLoader reads fastload.FolderDataset, fastload.LMDBDataset, torch.utils.data.Subset and "
              "random_split of them, or any object implementing the dataset protocol (len, heights, widths, labels, "
              f"formats, reader(), sample_name(i); see {_DOCS})")


def as_source(dataset):
    """``dataset`` as an object implementing the dataset protocol, or TypeError / ValueError saying why not.

    fastload datasets and protocol objects come back as they are; a ``torch.utils.data.Subset`` (nested, or from
    ``random_split``) of one comes back as a ``SubsetSource`` view of the samples it selects.
    """
    if isinstance(dataset, torch.utils.data.Subset):
        base = as_source(dataset.dataset)
        indices = _subset_indices(dataset, len(base))
        if isinstance(base, SubsetSource):  # Subset of a Subset: one view over the innermost source
            base, indices = base.base, base.indices[indices]
        return SubsetSource(base, indices)
    missing = [name for name in PROTOCOL if not hasattr(dataset, name)]
    if missing:
        raise TypeError(f"FastLoader cannot read a {_type_name(dataset)}: it lacks {', '.join(missing)} of the "
                        f"dataset protocol. {_hint(dataset)}{_SUPPORTED}")
    _refuse_transforms(dataset)
    n = len(dataset)
    for name in _ARRAYS:
        size = len(getattr(dataset, name))
        if size != n:
            raise ValueError(f"{_type_name(dataset)}.{name} has {size} entries but the dataset has {n} samples: "
                             f"the index arrays must have one entry per sample")
    for name in ("heights", "widths", "formats"):
        values = np.asarray(getattr(dataset, name))
        lowest = 0 if name == "formats" else 1
        if values.ndim != 1 or (values.size and (not np.issubdtype(values.dtype, np.integer)
                                                 or values.min() < lowest or values.max() > _HIGHEST[name])):
            bad = _first_bad(values, lowest, _HIGHEST[name])
            raise ValueError(f"{_type_name(dataset)}.{name} must hold integers in {lowest}..{_HIGHEST[name]}, one per "
                             f"sample ({_MEANING[name]}); {bad}")
    return dataset


_HIGHEST = {"heights": 1 << 30, "widths": 1 << 30, "formats": 1}
_MEANING = {"heights": "each image's height in pixels", "widths": "each image's width in pixels",
            "formats": "0 JPEG, 1 another format"}


def _first_bad(values, lowest, highest):
    if values.ndim != 1:
        return f"got an array of shape {values.shape}"
    if not np.issubdtype(values.dtype, np.integer):
        return f"got {values.dtype}"
    i = int(np.flatnonzero((values < lowest) | (values > highest))[0])
    return f"sample {i} has {values[i]}"


class SubsetSource:
    """The samples ``indices`` of a source, as a source: index arrays gathered, reads and names mapped through."""

    def __init__(self, base, indices):
        self.base = base
        self.indices = np.asarray(indices, dtype=np.int64)
        self.heights = np.asarray(base.heights)[self.indices]
        self.widths = np.asarray(base.widths)[self.indices]
        self.labels = np.asarray(base.labels)[self.indices]
        self.formats = np.asarray(base.formats)[self.indices]
        self.classes = getattr(base, "classes", None)
        self.scans_checked = getattr(base, "scans_checked", False)  # decoders.ScanChecks
        self.sizes_checked = getattr(base, "sizes_checked", False)  # decoders.SizeChecks

    def __len__(self):
        return len(self.indices)

    def sample_name(self, i):
        return self.base.sample_name(int(self.indices[i]))

    @contextlib.contextmanager
    def reader(self):
        with self.base.reader() as r:
            yield _SubsetReader(r, self.indices)

    def __repr__(self):
        return f"SubsetSource({self.base!r}, {len(self)} of its samples)"


class _SubsetReader:
    def __init__(self, reader, indices):
        self._reader = reader
        self._indices = indices

    def get(self, i):
        return self._reader.get(int(self._indices[i]))

    def sources(self, indices):
        mapped = self._indices[np.asarray(indices, dtype=np.int64)].tolist()
        if hasattr(self._reader, "sources"):
            return self._reader.sources(mapped)
        return [self._reader.get(i) for i in mapped], None


def _subset_indices(subset, n):
    """The Subset's indices as int64 in 0..n-1 (negative ones counted from the end, as Subset's indexing does)."""
    indices = np.asarray(subset.indices).reshape(-1)
    if indices.size and not np.issubdtype(indices.dtype, np.integer):
        raise TypeError(f"Subset indices must be integers, got {indices.dtype} (e.g. {indices[0]!r})")
    indices = indices.astype(np.int64)
    bad = (indices < -n) | (indices >= n)
    if bad.any():
        raise IndexError(f"Subset index {int(indices[bad][0])} is out of range for its dataset of {n} samples")
    return np.where(indices < 0, indices + n, indices)


def _refuse_transforms(dataset):
    set_ = [name for name in ("transform", "target_transform") if getattr(dataset, name, None) is not None]
    if set_:
        which = " and ".join(f"{name}={getattr(dataset, name)!r}" for name in set_)
        raise ValueError(f"{_type_name(dataset)} has {which}: FastLoader would not apply it (it decodes crops "
                         f"natively, never through ds[i]). Build the dataset without it and pass the augmentation "
                         f"as FastLoader(transform=...) (fastload.transforms, torchvision v2 names), or map labels "
                         f"yourself on the batches")


def _hint(dataset):
    """How to adapt the kinds of dataset a new user most often passes."""
    try:
        from torchvision.datasets import DatasetFolder
    except ImportError:
        DatasetFolder = ()
    if DatasetFolder and isinstance(dataset, DatasetFolder):
        root = getattr(dataset, "root", "ROOT")
        return (f"For an image folder use fastload.FolderDataset({str(root)!r}) (same layout, classes and labels) "
                f"and give the transforms to FastLoader(transform=...). ")
    if isinstance(dataset, torch.utils.data.Dataset):
        return ("A Dataset whose ds[i] returns (encoded image bytes, label) adapts by serving those bytes from "
                "reader().get(i), and heights/widths from fastload.ops.read_header(bytes) once. ")
    return ""


def _type_name(obj):
    cls = type(obj)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
