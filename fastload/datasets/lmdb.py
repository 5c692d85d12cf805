"""LMDBDataset: a store written by `fastload pack`, read zero-copy, safe to use from forked DataLoader workers."""
import contextlib
import os

import lmdb

from ..errors import DecodeError
from .base import DatasetError, ImageDataset, Record
from .record import (FORMAT_NAME, HEADER_SIZE, META_KEY, PLAN_KEY, VERSION, decode_index, loads, parse_header,
                     record_key)

# Environments inherited over fork are kept referenced, never closed: LMDB handles must not be used (nor
# closed) in a child, so each process opens its own and the parent's stays untouched.
_INHERITED = []


def _resume_hint(path):
    return f"finish it with `fastload pack SRC {path} --resume`"


def _locate(path):
    """(path, subdir) to hand to lmdb.open; DatasetError for anything that is not a finished store."""
    if path.endswith(".partial"):
        raise DatasetError(f"{path}: an unfinished pack, not a store; {_resume_hint(path[:-len('.partial')])}")
    if not os.path.exists(path):
        if os.path.exists(path + ".partial"):
            raise DatasetError(f"{path}: the pack that makes it did not finish ({path}.partial is there); "
                               f"{_resume_hint(path)}")
        raise DatasetError(f"{path}: no such store")
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "data.mdb")):
            raise DatasetError(f"{path}: not a fastload store (a folder without data.mdb; to read an image folder "
                               f"use FolderDataset)")
        return path, True
    return path, False  # the data.mdb file itself


def open_env(path, subdir):
    # lock=False: the store is never written once finished, so no reader table is needed (and none is left
    # behind by killed workers); readahead=False: random access, the page cache should hold only what is read.
    return lmdb.open(path, subdir=subdir, readonly=True, lock=False, readahead=False, max_readers=1024,
                     max_spare_txns=4)


def read_meta(path):
    """The metadata of the store at ``path`` (a dict, index included). DatasetError for anything else."""
    path = os.path.abspath(os.fspath(path))
    where, subdir = _locate(path)
    try:
        env = open_env(where, subdir)
    except lmdb.Error as e:
        raise DatasetError(f"{path}: not a fastload store (LMDB cannot open it: {e})") from None
    try:
        with env.begin() as txn:
            raw = txn.get(META_KEY)
            unfinished = raw is None and txn.get(PLAN_KEY) is not None
    finally:
        env.close()
    if raw is None:
        if unfinished:
            raise DatasetError(f"{path}: an unfinished pack (no metadata yet); {_resume_hint(path)}")
        raise DatasetError(f"{path}: not a fastload store (an LMDB database without fastload metadata)")
    try:
        meta = loads(raw)
        fmt, version = meta["format"], int(meta["version"])
    except (ValueError, KeyError, TypeError) as e:
        raise DatasetError(f"{path}: damaged fastload metadata ({e})") from None
    if fmt != FORMAT_NAME:
        raise DatasetError(f"{path}: not a fastload store (metadata format {fmt!r})")
    if version > VERSION:
        raise DatasetError(f"{path}: written by a newer fastload (store format version {version}; this fastload "
                           f"reads up to {VERSION}); upgrade fastload to read it")
    return meta


class _LMDBReader:
    """Inside one read transaction: views of record values, valid until the transaction ends."""

    def __init__(self, ds, txn):
        self._ds = ds
        self._txn = txn
        self._n = len(ds)

    def raw(self, i):
        """(format, flags, height, width, label, crc) and a memoryview of the image bytes of record i."""
        if not 0 <= i < self._n:
            raise IndexError(f"record {i} is out of range for a store of {self._n} records")
        value = self._txn.get(record_key(i))
        name = self._ds.sample_name(i)
        if value is None:
            raise DecodeError(f"{name}: record missing (damaged store)", sample=name, reason="missing record")
        return parse_header(value, name), value[HEADER_SIZE:]

    def get(self, i):
        return self.raw(i)[1]

    def record(self, i):
        (fmt, _, h, w, label, _), data = self.raw(i)
        return Record(data, h, w, label, fmt)


class LMDBDataset(ImageDataset):
    """A store made by `fastload pack SRC DST`: read-only, zero-copy, opened lazily in each process.

    ``with ds.reader() as r: r.get(i)`` gives memoryviews into the memory map, valid until the ``with`` ends.
    The index (heights, widths, labels, formats) and classes come from the metadata, no record is read for them.
    """

    def __init__(self, path, *, transform=None, target_transform=None):
        super().__init__(transform, target_transform)
        self.path = os.path.abspath(os.fspath(path))
        meta = read_meta(self.path)
        self._where, self._subdir = _locate(self.path)
        count = int(meta["count"])
        try:
            arrays = decode_index(meta.pop("index"), count)
        except (ValueError, KeyError, TypeError) as e:
            raise DatasetError(f"{self.path}: damaged fastload metadata index ({e})") from None
        self.heights, self.widths = arrays["heights"], arrays["widths"]
        self.labels, self.formats = arrays["labels"], arrays["formats"]
        self.classes = list(meta["classes"])
        self.skipped = [tuple(s) for s in meta.get("skipped", [])]
        self.meta = meta
        self._env = None
        self._pid = None

    def _get_env(self):
        pid = os.getpid()
        if self._env is None or self._pid != pid:
            if self._env is not None:
                _INHERITED.append(self._env)  # opened by the parent before a fork
            try:
                self._env = open_env(self._where, self._subdir)
            except lmdb.Error as e:
                raise DatasetError(f"{self.path}: cannot open the store: {e}") from None
            self._pid = pid
        return self._env

    @contextlib.contextmanager
    def reader(self):
        txn = self._get_env().begin(buffers=True)
        try:
            yield _LMDBReader(self, txn)
        finally:
            txn.abort()

    def sample_name(self, i):
        return f"{self.path}[{i}]"

    def close(self):
        if self._env is not None and self._pid == os.getpid():
            self._env.close()
        self._env = None

    def __getstate__(self):  # picklable for spawn-started workers: each opens its own environment
        state = self.__dict__.copy()
        state["_env"] = None
        state["_pid"] = None
        return state

    def __repr__(self):
        return f"LMDBDataset({self.path!r}, {len(self)} samples, {len(self.classes)} classes)"
