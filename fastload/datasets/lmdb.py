"""LMDBDataset: a store written by `fastload pack`, read zero-copy, safe to use from forked DataLoader workers."""
import contextlib
import ctypes
import mmap
import os
import struct
import sys
import threading
import weakref
import zlib
from typing import NamedTuple

import lmdb
import numpy as np

from ..errors import DecodeError, process_limit_error
from .base import DatasetError, ImageDataset, Record
from .record import (FORMAT_NAME, HEADER_SIZE, META_KEY, PLAN_KEY, SOURCES_KEY, VERSION, decode_index, loads,
                     parse_header, record_key, source_at)

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


# One read-only environment per store file per process, shared by every LMDBDataset on it: py-lmdb refuses a
# second open of the same files in one process, and LMDB handles must not be used after a fork. Keyed by the
# data file's (device, inode), so a store replaced on disk is never mistaken for the one a dataset indexed.
_envs = {}  # key -> _Shared
_envs_pid = None
_envs_lock = threading.Lock()


def _reset_after_fork():
    global _envs_lock
    _envs_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_reset_after_fork)


def _file_key(where, subdir):
    st = os.stat(os.path.join(where, "data.mdb") if subdir else where)
    return st.st_dev, st.st_ino


class _Locations:
    """Where each record's image bytes lie in the store's data file, learnt from the record's first read through
    LMDB: the loader's later reads of it slice a read-only memory map of the file. A B-tree lookup under the GIL
    costs ~1 us a record with the pages in cache and ~6 us amid decoding, when the decoders have evicted them (py-spy
    on 2 cores: a quarter of the producers' GIL time); the table costs a gather a batch. The table holds for one
    snapshot of the store (LMDB's transaction id): a store written since is located afresh (_Table: how)."""

    def __init__(self, path, key, page_size):
        self.path, self.key, self.page_size = path, key, page_size
        self.lock = threading.Lock()
        self.current = None  # _Table

    def table(self, n, snapshot):
        """The _Table of the store's n records as of transaction ``snapshot``, or None where there is none to use
        (the file cannot be mapped, or its records cannot be located)."""
        table = self.current
        if table is None or table.snapshot != snapshot or table.n != n:
            with self.lock:
                table = self.current
                if table is None or table.snapshot != snapshot or table.n != n:
                    table = self.current = _Table(self._map(), n, snapshot, self.page_size)
        return table if table.usable() else None

    def _map(self):
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if (st.st_dev, st.st_ino) != self.key:  # replaced on disk since the environment opened
                    return None
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return None  # read through LMDB alone
        if hasattr(mapped, "madvise"):  # random reads, as LMDB's own map (open_env's readahead=False): a store
            mapped.madvise(mmap.MADV_RANDOM)  # larger than memory must not fault in its neighbours' pages too
        return memoryview(mapped)


class _Table:
    """_Locations' table for one snapshot: record i's image bytes are file[offsets[i]:offsets[i] + lengths[i]].

    LMDB maps the whole data file at one address (its base), so a value's offset in the file is its address less the
    base. The base is learnt from the pages values lie in: a page starts at a multiple of the page size from the
    base, with its own page number (LMDB's MDB_page header), which gives a value's offset in the file; two records
    whose offsets found so check byte for byte against LMDB's views and agree on the base fix it. After that a
    record's offset is arithmetic, its header's bytes compared. A record that fails any check is read through LMDB;
    a table whose base cannot be learnt gives up (``usable``), so the loader reads through LMDB alone."""

    PAGE_NUMBER = struct.calcsize("P")  # bytes: an MDB_page header starts with its page number (pgno_t, a size_t)
    ATTEMPTS = 64  # records tried without a base before giving up

    def __init__(self, file, n, snapshot, page_size):
        self.file, self.n, self.snapshot, self.page_size = file, n, snapshot, page_size
        self.base = None  # the address LMDB maps the file at, once two records agree on it
        self.seen = {}  # candidate base -> the record that gave it
        self.failed = 0  # records not located while the base is unknown
        if file is not None:
            self.offsets = np.full(n, -1, dtype=np.int64)  # -1: not located (yet)
            self.lengths = np.zeros(n, dtype=np.uint32)  # 16 bytes a record in all: 20 MB for ImageNet's 1.28M
            self.crcs = np.zeros(n, dtype=np.uint32)  # the CRC-32 the record's header holds

    def usable(self):
        return self.file is not None and (self.base is not None or self.failed < self.ATTEMPTS)

    def learn(self, i, value, crc):
        """Locates record i, given its value as LMDB returned it in this table's snapshot (its header checked)."""
        image = len(value) - HEADER_SIZE
        if not 0 < image < 1 << 32:
            return
        address = np.frombuffer(value, dtype=np.uint8).ctypes.data
        if self.base is None:
            offset = self._from_page(address, value)
            if offset is None:
                self.failed += 1
                return
            if self.seen.setdefault(address - offset, i) != i:
                self.base = address - offset
        else:
            offset = address - self.base
            if not 0 <= offset <= len(self.file) - len(value) or \
                    self.file[offset:offset + HEADER_SIZE] != value[:HEADER_SIZE]:
                return
        self.lengths[i], self.crcs[i] = image, crc
        self.offsets[i] = offset + HEADER_SIZE  # last: a located record's length and CRC are there before it

    def _from_page(self, address, value):
        """The value's offset in the file from the number of the page it lies in, where the bytes there are the
        value's; else None. (The map starts at a multiple of the system's page size: where LMDB's page size is
        larger, the page found may be the wrong one, and the comparison says so; it still lies inside the map,
        since values are never in the first two pages, LMDB's meta pages.)"""
        page = address & ~(self.page_size - 1)
        number = int.from_bytes(ctypes.string_at(page, self.PAGE_NUMBER), sys.byteorder)
        offset = number * self.page_size + (address - page)
        if offset + len(value) > len(self.file) or not np.array_equal(
                np.frombuffer(self.file, dtype=np.uint8, count=len(value), offset=offset),
                np.frombuffer(value, dtype=np.uint8)):
            return None
        return offset


class _Shared(NamedTuple):
    env: lmdb.Environment
    where: str  # where the store was when opened
    subdir: bool
    users: weakref.WeakSet  # the LMDBDatasets that read through it: an environment in use is never closed
    locations: _Locations


def _close_replaced(keep):
    """Closes the environments of stores replaced or removed on disk that no dataset reads any more: a store
    packed again at the same path, many times in one process, kept every old data file open and mapped (its disk
    space too). A store still where it was stays open, for the next dataset of it."""
    for key, shared in list(_envs.items()):
        if key == keep or shared.users:
            continue
        try:
            current = _file_key(shared.where, shared.subdir)
        except OSError:
            current = None
        if current != key:
            del _envs[key]
            with contextlib.suppress(lmdb.Error):
                shared.env.close()


def shared_env(where, subdir, key=None, user=None):
    """(environment, key) of the store at ``where`` for this process; ``key`` pins it to the file it was.
    ``user``: the dataset reading through it, which keeps it open (_close_replaced)."""
    shared, key = _shared(where, subdir, key, user)
    return shared.env, key


def _shared(where, subdir, key=None, user=None):
    """(_Shared, key): shared_env's, with the store's record locations."""
    global _envs_pid
    with _envs_lock:
        if _envs_pid != os.getpid():
            for shared in _envs.values():  # inherited from the parent: close (lock=False: nothing shared to disturb)
                with contextlib.suppress(lmdb.Error):
                    shared.env.close()
            _envs.clear()
            _envs_pid = os.getpid()
        try:
            actual = _file_key(where, subdir)
        except OSError as e:
            raise DatasetError(f"{where}: cannot open the store: {e.strerror}") from None
        key = key or actual
        shared = _envs.get(key)
        if shared is None:
            if actual != key:
                raise DatasetError(f"{where}: the store was replaced on disk since this dataset was opened")
            _close_replaced(key)
            try:
                env = open_env(where, subdir)
            except lmdb.Error as e:
                raise DatasetError(f"{where}: not a fastload store (LMDB cannot open it: {e})") from None
            _check_length(env, where, subdir)
            locations = _Locations(os.path.join(where, "data.mdb") if subdir else where, key, env.stat()["psize"])
            shared = _envs[key] = _Shared(env, where, subdir, weakref.WeakSet(), locations)
        if user is not None:
            shared.users.add(user)
        return shared, key


def holds_fastload_keys(where):
    """Whether the LMDB database in folder ``where`` holds fastload's metadata or a pack's plan, or nothing at all:
    what `pack --force` may delete. False for anything LMDB cannot open. An environment this process already has
    open is used as it is (py-lmdb refuses a second open); otherwise one is opened for the look and closed."""
    try:
        key = _file_key(where, True)
    except OSError:
        return False
    with _envs_lock:
        shared = _envs.get(key) if _envs_pid == os.getpid() else None
        env = shared.env if shared is not None else None
    own = None
    try:
        if env is None:
            env = own = open_env(where, True)
            if _short_by(env, where, True):  # reading past its end: SIGBUS
                raise DatasetError(f"{where}: a truncated LMDB database; fastload cannot tell whether it made it, so "
                                   f"--force leaves it: remove it yourself if it is a store you want replaced")
        with env.begin() as txn:
            return txn.stat()["entries"] == 0 or txn.get(META_KEY) is not None or txn.get(PLAN_KEY) is not None
    except lmdb.Error:
        return False
    finally:
        if own is not None:
            own.close()


def _short_by(env, where, subdir):
    """(file size, bytes its pages need) when the data file is shorter than its metadata says, else None."""
    need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    size = os.path.getsize(os.path.join(where, "data.mdb") if subdir else where)
    return (size, need) if size < need else None


def cover_counted_pages(env, where, subdir):
    """For writers, after a commit: grows the data file to every page LMDB's metadata counts. LMDB never writes a
    page freed in the transaction that allocated it (a loose page), so a sound store may end before its last
    counted page, and readers' truncation check (_check_length) would refuse it. The added pages are zeros that
    nothing references."""
    short = _short_by(env, where, subdir)
    if short:
        os.truncate(os.path.join(where, "data.mdb") if subdir else where, short[1])


def _check_length(env, where, subdir):
    """DatasetError (env closed) for a data file shorter than the pages its metadata says it has: reading a page
    past the end of a memory-mapped file kills the process with SIGBUS (a copy cut short, a full disk)."""
    short = _short_by(env, where, subdir)
    if short:
        size, need = short
        env.close()
        raise DatasetError(f"{where}: truncated store: its data file is {size} bytes, its pages need {need} "
                           f"(copied or written incompletely?); copy it again or re-pack it")


def read_meta(path, user=None):
    """(metadata dict with the index, environment key) of the store at ``path``. DatasetError for anything else.
    ``user``: the dataset that will read through the environment (shared_env)."""
    path = os.path.abspath(os.fspath(path))
    where, subdir = _locate(path)
    env, key = shared_env(where, subdir, user=user)
    with env.begin() as txn:
        raw = txn.get(META_KEY)
        unfinished = raw is None and txn.get(PLAN_KEY) is not None
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
    return meta, key


class _LMDBReader:
    """Inside one read transaction: views of record values, valid until the transaction ends."""

    def __init__(self, ds, env, locations):
        self._ds = ds
        self._env = env
        self._locations = locations
        self._txn = env.begin(buffers=True)
        self._snapshot = None  # the transaction's id: which _Locations table holds
        self._spent = []  # transactions LMDB failed in: kept open, so the views they gave stay valid
        self._n = len(ds)

    def close(self):
        for txn in self._spent + [self._txn]:
            txn.abort()

    def raw(self, i):
        """(format, flags, height, width, label, crc) and a memoryview of the image bytes of record i."""
        header, value = self._value(i)
        return header, value[HEADER_SIZE:]

    def _value(self, i):
        """raw()'s header, and the record's whole value (header and image bytes)."""
        if not 0 <= i < self._n:
            raise IndexError(f"record {i} is out of range for a store of {self._n} records")
        try:
            value = self._txn.get(record_key(i))
        except lmdb.Error as e:  # a damaged B-tree page: LMDB fails the transaction, so the next reads get a new one
            self._spent.append(self._txn)
            self._txn = self._env.begin(buffers=True)
            self._snapshot = None  # the new transaction's, for the records located from now on
            name = self._ds.sample_name(i)
            if isinstance(e, lmdb.MemoryError):  # ENOMEM: the process's limit, not a damaged store
                raise process_limit_error(f"{name}: cannot read the record: {e}") from None
            raise DecodeError(f"{name}: cannot read the record: {e} (damaged store)", sample=name,
                              reason="damaged store") from None
        if value is None:
            name = self._ds.sample_name(i, self._txn)
            raise DecodeError(f"{name}: record missing (damaged store)", sample=name, reason="missing record")
        try:
            return parse_header(value, ""), value
        except DecodeError as e:  # named only now: the name costs a lookup of the record's source file
            name = self._ds.sample_name(i, self._txn)
            raise DecodeError(f"{name}{e}", sample=name, reason=e.reason) from None

    def get(self, i):
        """The image bytes of record i, checked against the CRC-32 they had when packed (as the loader's native
        reads are): damaged bytes raise DecodeError naming the sample, even where they would still decode."""
        (fmt, _, h, w, label, crc), view = self.raw(i)
        self._check_index([i], [(fmt, h, w, label)])
        actual = zlib.crc32(view)
        if actual != crc:
            name = self._ds.sample_name(i, self._txn)
            raise DecodeError(f"{name}: checksum mismatch: CRC-32 {actual:08x}, the store recorded {crc:08x} (bytes "
                              f"changed since packing)", sample=name, reason="corrupt")
        return view

    def sources(self, indices):
        """Zero-copy views of the image bytes for the native decoder, and the CRC-32 each had when packed: the
        decoder checks them, so bytes damaged on disk fail loudly even where they would still decode. A record read
        before in this snapshot of the store (its header checked then) is a slice of the mapped file (_Locations);
        the others are read through LMDB, checked, and located for the next time."""
        table = self._table()
        idx = np.asarray(indices)
        if table is None or not len(idx) or idx.dtype.kind not in "iu" or idx.min() < 0 or idx.max() >= self._n:
            return self._read(indices)  # (its reads raise for an index out of range)
        start = table.offsets[idx]
        if (start >= 0).all():
            file = table.file
            return ([file[a:b] for a, b in zip(start.tolist(), (start + table.lengths[idx]).tolist())],
                    table.crcs[idx].tolist())
        return self._read(indices, table, learn=start < 0)

    def _table(self):
        if self._snapshot is None:
            self._snapshot = self._txn.id()
        return self._locations.table(self._n, self._snapshot)

    def _read(self, indices, table=None, learn=None):
        """sources() through LMDB; ``learn``: which of them to locate in ``table`` once their headers passed the
        index check."""
        views, crcs, headers, values = [], [], [], []
        for i in indices:
            (fmt, _, h, w, label, crc), value = self._value(i)
            views.append(value[HEADER_SIZE:])
            crcs.append(crc)
            headers.append((fmt, h, w, label))
            values.append(value)
        self._check_index(indices, headers)
        if learn is not None:
            for k in np.flatnonzero(learn).tolist():
                table.learn(indices[k], values[k], crcs[k])
        return views, crcs

    def _check_index(self, indices, headers):
        """The loader plans crops and labels from the metadata's index without reading records; each record read
        is checked against it (one vectorised compare a batch), so a damaged index fails here, naming the sample,
        instead of cropping at the wrong size or carrying the wrong label."""
        index, idx = self._ds._packed, np.asarray(indices, dtype=np.int64)
        got = np.asarray(headers, dtype=np.int64).reshape(-1, 4)
        want = index[idx]
        ok = (got == want).all(axis=1)
        if not ok.all():
            k = int(np.flatnonzero(~ok)[0])
            name = self._ds.sample_name(int(idx[k]), self._txn)
            (fmt, h, w, label), (f0, h0, w0, l0) = got[k].tolist(), want[k].tolist()
            why = (f"record header disagrees with the store's index (format {fmt}, {w}x{h}, label {label} against "
                   f"{f0}, {w0}x{h0}, label {l0}): damaged metadata")
            raise DecodeError(f"{name}: {why}", sample=name, reason=why)

    def record(self, i):
        (fmt, _, h, w, label, _), data = self.raw(i)
        self._check_index([i], [(fmt, h, w, label)])
        return Record(data, h, w, label, fmt)


class LMDBDataset(ImageDataset):
    """A store made by `fastload pack SRC DST`: read-only, zero-copy, opened lazily in each process (one
    environment per store per process, shared; reopened after a fork, so DataLoader workers just work).

    ``with ds.reader() as r: r.get(i)`` gives memoryviews into the memory map, valid until the ``with`` ends.
    The index (heights, widths, labels, formats) and classes come from the metadata, no record is read for them.
    ``strict`` applies to ``ds[i]``'s decode (as in ops.decode_crop; the loader has its own).
    """

    #: heights/widths are each record's own, taken from its image when packed (decoders.SizeChecks)
    sizes_checked = True

    def __init__(self, path, *, strict=True, transform=None, target_transform=None):
        super().__init__(transform, target_transform, strict=strict)
        self.path = os.path.abspath(os.fspath(path))
        meta, self._key = read_meta(self.path, user=self)  # the dataset keeps its environment open
        self._where, self._subdir = _locate(self.path)
        try:
            count, classes = int(meta["count"]), [str(c) for c in meta["classes"]]
            arrays = decode_index(meta.pop("index"), count)
        except (ValueError, KeyError, TypeError) as e:
            raise DatasetError(f"{self.path}: damaged fastload metadata ({type(e).__name__}: {e}); the records "
                               f"may be intact: pack the source folder again") from None
        self.heights, self.widths = arrays["heights"], arrays["widths"]
        self.labels, self.formats = arrays["labels"], arrays["formats"]
        # [N, 4] (format, height, width, label) as packed, which each record read is checked against: its own
        # copy, so a user who relabels the dataset (ds.labels = ...) changes what batches carry, not the check
        self._packed = np.stack([arrays[k].astype(np.int64) for k in ("formats", "heights", "widths", "labels")], 1)
        self.classes = classes
        self.skipped = [tuple(s) for s in meta.get("skipped", [])]
        # Every JPEG record passed a strict whole-scan decode when packed, and each read checks its CRC-32: the
        # loader needs no first-decode check of its own (decoders.ScanChecks). Stores packed before it: False.
        self.scans_checked = bool(meta.get("scans_checked", False))
        self.meta = meta

    @contextlib.contextmanager
    def reader(self):
        shared, _ = _shared(self._where, self._subdir, self._key, user=self)
        reader = _LMDBReader(self, shared.env, shared.locations)
        try:
            yield reader
        finally:
            reader.close()

    def sample_name(self, i, txn=None):
        """``store[i]``, and the file it was packed from where the store records it: ``store[i] (from path)``."""
        source = self.source_path(i, txn)
        return f"{self.path}[{i}]" + (f" (from {source})" if source else "")

    def source_path(self, i, txn=None):
        """The path of the file record i was packed from, or None (a store packed before fastload kept it)."""
        try:
            if txn is None:
                env, _ = shared_env(self._where, self._subdir, self._key)
                with env.begin(buffers=True) as txn:
                    return self.source_path(i, txn)
            value = txn.get(SOURCES_KEY)
            rel = source_at(value, int(i)) if value is not None else None
        except (DatasetError, lmdb.Error, ValueError, struct.error):
            return None  # only for a message: never fail the error being reported
        return os.path.join(self.meta.get("source") or "", rel) if rel is not None else None

    def __repr__(self):
        return f"LMDBDataset({self.path!r}, {len(self)} samples, {len(self.classes)} classes)"
