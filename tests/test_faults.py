"""Fault injection: what breaks under a training run, and how fastload answers (issue 8).

Each fault gets a clear error naming the sample or store, or a documented recovery:
damaged records, files deleted / replaced / unreadable between scan and read, truncated and newer-format stores,
a store opened while `fastload pack` writes it, a full disk during pack (then `pack --resume`), hostile inputs
against the limits (pixels, bytes, threads), and reads that would hang. Anything that could kill or hang the
process runs in a child process with a timeout.
"""
import errno
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch

import fastload as fl
from fastload import ops
from fastload.cli import main
from fastload.datasets import DatasetError, pack
from fastload.datasets.lmdb import shared_env
from fastload.datasets.record import HEADER, HEADER_SIZE, META_KEY, dumps, key_index, loads
from pack_corpus import flip_middle_byte, photo_tree, rewrite_record

ROOT = Path(__file__).resolve().parents[1]
CROP = dict(batch_size=16, crop=fl.CenterCrop(64, resize=72), shuffle=False, threads=2, workers=1)


@pytest.fixture(scope="module")
def tree(imagenet_dir, tmp_path_factory):
    """Real photos, 4 classes x 12 JPEGs (no PNG): a private copy the tests may damage copies of."""
    return photo_tree(imagenet_dir, tmp_path_factory.mktemp("faults") / "photos", png=False)


@pytest.fixture(scope="module")
def store(tree, tmp_path_factory):
    return pack(tree, tmp_path_factory.mktemp("faults-store") / "s.lmdb", progress=False, log=lambda m: None).path


def fresh_tree(tree, tmp_path):
    dst = tmp_path / "photos"
    shutil.copytree(tree, dst)
    return dst


def copy_store(store, tmp_path, name="copy.lmdb"):
    dst = tmp_path / name
    shutil.copytree(store, dst)
    return dst


def run_epoch(ds, **kw):
    loader = fl.FastLoader(ds, **{**CROP, **kw})
    n = sum(len(y) for _, y in loader)
    return n, loader.stats()


def child(code, timeout=60, **kw):
    """Runs ``code`` in a fresh interpreter; returns the CompletedProcess (a crash is a return code, not pytest's)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env, **kw)


# ---- damaged store records ------------------------------------------------------------------------------------

def test_damaged_record_header_is_named_or_skipped(store, tmp_path):
    """A record whose header bytes changed on disk: the loader names it (store[i]); on_error="skip" replaces it.
    (Before: the reader's DecodeError escaped the decode status path, so "skip" raised too.)"""
    damaged = copy_store(store, tmp_path)
    rewrite_record(damaged, 3, lambda v: v.__setitem__(slice(0, 4), b"XXXX"))
    ds = fl.LMDBDataset(damaged)
    with pytest.raises(fl.DecodeError, match=r"copy\.lmdb\[3\]( \(from \S*img_0003\.jpg\))?: record does not start with the fastload magic"):
        run_epoch(ds)
    n, stats = run_epoch(ds, on_error="skip")
    assert n == len(ds) and stats["skipped"] >= 1


def _flip_in_scan(value):
    data = value[HEADER_SIZE:]
    sos = data.index(b"\xff\xda")
    start = HEADER_SIZE + sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")
    value[start + (len(value) - start) // 3] ^= 0x5A


def test_damaged_image_bytes_are_found_by_verify(store, tmp_path, capsys):
    """Bytes changed inside a record's JPEG: `fastload verify` checks each record's CRC-32 and reports it. (The
    loader checks it too, before decoding: see the next test.)"""
    damaged = copy_store(store, tmp_path)
    rewrite_record(damaged, 5, _flip_in_scan)
    assert main(["verify", str(damaged), "-q"]) == 1
    out = capsys.readouterr().out
    assert f"FAILED {damaged}[5]" in out and "checksum mismatch" in out  # "(from <source file>)" may sit between


def test_damage_that_still_decodes_is_noticed_by_the_loader(store, tmp_path):
    """The loader checks each record's packed CRC-32 in the native decode threads, before decoding: damage that
    would still decode (here a quantisation table) fails loudly, names the record, and skip mode replaces it."""
    damaged = copy_store(store, tmp_path)

    def change_dqt(value):
        dqt = value.index(b"\xff\xdb", HEADER_SIZE)
        value[dqt + 5 + 10] ^= 0x20  # a quantisation step: every block decodes, with other pixels

    rewrite_record(damaged, 7, change_dqt)
    ds = fl.LMDBDataset(damaged)
    with ds.reader() as r:
        (_, _, _, _, _, crc), data = r.raw(7)
        assert zlib.crc32(data) != crc  # the store knows
    with pytest.raises(fl.DecodeError, match=r"\[7\]( \(from [^)]*\))?: checksum mismatch"):
        run_epoch(ds)
    n, stats = run_epoch(ds, on_error="skip")
    assert n == len(ds) and stats["skipped"] == 1
    # and so do ds[i], record(i) and the reader's get(i), the plain Dataset path (they returned other pixels)
    for read in (lambda: ds[7], lambda: ds.record(7)):
        with pytest.raises(fl.DecodeError, match=r"\[7\]( \(from [^)]*\))?: checksum mismatch: CRC-32 [0-9a-f]{8}, "
                                                 r"the store recorded [0-9a-f]{8}"):
            read()
    assert ds[6][0].shape[0] == 3


# ---- records located in the mapped data file (datasets/lmdb.py, _Locations) --------------------------------------

def _dqt_step(value):
    """A byte of record ``value``'s first quantisation table (the image still decodes, with other pixels)."""
    return value.index(b"\xff\xdb", HEADER_SIZE) + 5 + 10


def test_bytes_damaged_on_disk_after_the_first_read_still_fail_their_checksum(store, tmp_path):
    """The loader's later reads of a record slice the mapped data file: a byte changed there after the first
    epoch (in place, as a failing disk would) fails the CRC-32 check naming the record, as on the first read."""
    damaged = copy_store(store, tmp_path)
    ds = fl.LMDBDataset(damaged)
    assert run_epoch(ds)[0] == len(ds)  # every record read (and located) once
    with ds.reader() as r:
        value = bytes(r._value(7)[1])
        assert r._locations.current.offsets[7] >= 0  # the next reads of record 7 slice the mapped file
    data_file = damaged / "data.mdb"
    content = data_file.read_bytes()
    at = content.index(value) + _dqt_step(bytearray(value))
    assert content.count(value) == 1
    with open(data_file, "r+b") as f:
        f.seek(at)
        f.write(bytes([content[at] ^ 0x20]))
    with pytest.raises(fl.DecodeError, match=r"\[7\]( \(from [^)]*\))?: checksum mismatch"):
        run_epoch(ds)
    n, stats = run_epoch(ds, on_error="skip")
    assert n == len(ds) and stats["skipped"] == 1


def test_a_store_written_after_its_records_were_read_gives_the_new_bytes(store, tmp_path):
    """A finished store is not written; if something writes it anyway (here another process, through LMDB), the
    next reads follow LMDB's new snapshot, not where the records were before: record 7 with a changed
    quantisation step and a matching CRC-32 reads as the new bytes, the other records as before."""
    copy = copy_store(store, tmp_path)
    ds = fl.LMDBDataset(copy)
    n = len(ds)
    with ds.reader() as r:
        before = [bytes(v) for v in r.sources(list(range(n)))[0]]
    result = child(f"""
        import lmdb, zlib
        from fastload.datasets.record import HEADER, HEADER_SIZE, record_key
        env = lmdb.open({str(copy)!r})
        with env.begin(write=True) as txn:
            value = bytearray(txn.get(record_key(7)))
            at = value.index(b"\\xff\\xdb", HEADER_SIZE) + 5 + 10
            value[at] ^= 0x20
            fields = list(HEADER.unpack_from(value, 0))
            fields[-1] = zlib.crc32(value[HEADER_SIZE:])
            HEADER.pack_into(value, 0, *fields)
            txn.put(record_key(7), bytes(value))
        env.close()
    """)
    assert result.returncode == 0, result.stderr
    with ds.reader() as r:
        after, crcs = r.sources(list(range(n)))
        after = [bytes(v) for v in after]
    changed = bytearray(before[7])
    changed[_dqt_step(bytearray(HEADER_SIZE) + changed) - HEADER_SIZE] ^= 0x20
    assert after[7] == bytes(changed) and crcs[7] == zlib.crc32(changed)
    assert after[:7] + after[8:] == before[:7] + before[8:]
    assert run_epoch(ds)[0] == n  # and the loader decodes them all (the new CRC-32 matches)


def test_a_record_whose_header_disagrees_with_the_index_is_refused_at_every_read(store, tmp_path):
    """Only records whose header passed the index check are located: one that fails it raises on every read of
    the loader's path, alone or after the batch's other records were located."""
    damaged = copy_store(store, tmp_path)

    def relabel(value):
        fields = list(HEADER.unpack_from(value, 0))
        fields[6] += 1  # the label
        HEADER.pack_into(value, 0, *fields)

    rewrite_record(damaged, 2, relabel)
    ds = fl.LMDBDataset(damaged)
    for batch in ([2], [0, 1, 2], [0, 1, 2]):
        with ds.reader() as r, pytest.raises(fl.DecodeError, match=r"\[2\]( \(from [^)]*\))?: record header disagrees"):
            r.sources(batch)
    with ds.reader() as r:
        assert len(r.sources([0, 1])[0]) == 2


# ---- files that change between the scan and the read ----------------------------------------------------------

@pytest.mark.parametrize("fault", ["deleted", "directory"])
def test_file_gone_between_scan_and_read(tree, tmp_path, fault):
    root = fresh_tree(tree, tmp_path)
    ds = fl.FolderDataset(root)
    victim = ds.paths[5]
    os.unlink(victim)
    if fault == "directory":  # what a permission problem looks like to a root process: the read fails
        os.mkdir(victim)
    why = "No such file or directory" if fault == "deleted" else "not a regular file"
    with pytest.raises(fl.DecodeError, match=rf"{victim}: cannot read: {why}") as e:
        run_epoch(ds)
    assert e.value.sample == victim
    n, stats = run_epoch(ds, on_error="skip")
    assert n == len(ds) and stats["skipped"] == 1
    with pytest.raises(fl.DecodeError, match=rf"{victim}: cannot read"):
        ds[5]


def test_skipped_counts_replaced_samples_once(tree, tmp_path):
    """A broken sample among four: its replacement is drawn from all four, so a pick can be the broken one again
    (then drawn anew). "skipped" counts the replaced sample once, whatever the picks (it counted each failed pick)."""
    root = fresh_tree(tree, tmp_path)
    ds = fl.FolderDataset(root)
    open(ds.paths[5], "wb").close()  # empty: cannot decode
    four = torch.utils.data.Subset(ds, [4, 5, 6, 7])
    for seed in range(6):
        loader = fl.FastLoader(four, batch_size=4, crop=fl.CenterCrop(32), seed=seed, on_error="skip")
        assert sum(len(y) for _, y in loader) == 4 and loader.stats()["skipped"] == 1, seed


def _can_drop_root_read_rights():
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


@pytest.mark.skipif(not _can_drop_root_read_rights(), reason="needs root and setpriv (util-linux)")
def test_permission_denied(tree, tmp_path):
    """A real EACCES: the child runs as root without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH, so file modes apply.
    Unreadable at scan time: left out and listed. Made unreadable after the scan: DecodeError naming the path."""
    root = fresh_tree(tree, tmp_path)
    early = sorted((root / "class_01").iterdir())[0]
    os.chmod(early, 0)
    code = f"""
        import os, warnings, fastload as fl
        warnings.simplefilter("ignore")
        ds = fl.FolderDataset({str(root)!r}, cache=False)
        print("skipped", ds.skipped)
        late = ds.paths[2]
        os.chmod(late, 0)
        loader = fl.FastLoader(ds, batch_size=16, crop=fl.CenterCrop(64, resize=72), shuffle=False)
        try:
            sum(len(y) for _, y in loader)
        except fl.DecodeError as e:
            print("error", e.sample == late, e)
        print("skip", sum(len(y) for _, y in fl.FastLoader(ds, batch_size=16, crop=fl.CenterCrop(64, resize=72),
                                                           on_error="skip")), len(ds))
    """
    cmd = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", sys.executable, "-c", textwrap.dedent(code)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert f"skipped [('{early}', 'unreadable: permission denied')]" in out, out
    assert "error True" in out and "cannot read: Permission denied" in out, out
    assert "skip 47 47" in out, out


def test_fifo_in_a_class_folder_is_skipped_at_scan(tree, tmp_path):
    """A FIFO named .jpg would block any reader forever: the scan stats it and leaves it out, never opens it."""
    root = fresh_tree(tree, tmp_path)
    os.mkfifo(root / "class_00" / "pipe.jpg")
    proc = child(f"""
        import warnings, fastload as fl
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ds = fl.FolderDataset({str(root)!r})
        print(len(ds), ds.skipped)
    """, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("48 [(") and "pipe.jpg', 'not a regular file')]" in proc.stdout


def test_fifo_swapped_in_after_the_scan_does_not_hang(tree, tmp_path):
    """The file becomes a FIFO after the scan: the native reader and ds[i] open it non-blocking and refuse it.
    (Before: open() blocked forever, in a native decode thread, and the loader hung.)"""
    root = fresh_tree(tree, tmp_path)
    proc = child(f"""
        import os, fastload as fl
        ds = fl.FolderDataset({str(root)!r})
        victim = ds.paths[9]
        os.unlink(victim)
        os.mkfifo(victim)
        try:
            sum(len(y) for _, y in fl.FastLoader(ds, batch_size=16, crop=fl.CenterCrop(64, resize=72)))
        except fl.DecodeError as e:
            print("loader:", e)
        try:
            ds[9]
        except fl.DecodeError as e:
            print("getitem:", e)
    """, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "loader: " in proc.stdout and "cannot read: not a regular file" in proc.stdout
    assert proc.stdout.count("not a regular file") == 2, proc.stdout


def test_pack_refuses_a_fifo_without_blocking(tree, tmp_path):
    """A listed file that became a FIFO before it is read (between an interrupted pack and --resume, which keeps
    the old listing): pack opens it non-blocking and skips it as not a regular file. (Before: open() blocked for
    good, through Ctrl-C.)"""
    import importlib
    pack_module = importlib.import_module("fastload.datasets.pack")  # the package exports a function of that name
    fifo = tmp_path / "x.jpg"
    os.mkfifo(fifo)
    result = []
    t = threading.Thread(target=lambda: result.append(pack_module._process(str(tmp_path), [(0, "x.jpg", 0)], None)),
                         daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive(), "pack blocked opening a FIFO"
    assert result == [[(0, "not a regular file")]]


class _StuckReader:
    def __init__(self, ds, gate):
        self._ds, self._gate = ds, gate

    def get(self, i):
        if i == 3:
            self._gate.wait()  # a read that never returns (a hung network file system)
        with self._ds.reader() as r:
            return bytes(r.get(i))


class _StuckDataset:
    """A dataset whose read of sample 3 blocks until ``gate`` is set."""

    def __init__(self, ds, gate):
        self.ds, self.gate = ds, gate
        self.heights, self.widths, self.labels, self.formats = ds.heights, ds.widths, ds.labels, ds.formats

    def __len__(self):
        return len(self.ds)

    def sample_name(self, i):
        return self.ds.sample_name(i)

    def reader(self):
        import contextlib
        return contextlib.nullcontext(_StuckReader(self.ds, self.gate))


def test_a_stuck_read_becomes_an_error(store):
    """A read blocked in the kernel cannot be interrupted, but FastLoader(timeout=) turns it into an error in the
    training loop instead of a hang."""
    gate = threading.Event()
    ds = _StuckDataset(fl.LMDBDataset(store), gate)
    outcome = []

    def consume():
        t = time.monotonic()
        try:
            outcome.append(run_epoch(ds, timeout=2))
        except Exception as e:  # noqa: BLE001 -- the error a timeout would raise is what we want
            outcome.append(e)
        outcome.append(time.monotonic() - t)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    t.join(timeout=5)
    gate.set()  # release the stuck producer, whatever happened
    t.join(timeout=30)
    assert outcome and isinstance(outcome[0], TimeoutError), "the loader waited on the stuck read for 5 s"
    assert "stuck" in str(outcome[0])
    # raised at its timeout, not after waiting for the stuck threads to stop as well (they cannot: 2 + 5 s); the
    # margin covers the loader's start on a loaded CI machine
    assert outcome[1] < 4.5, f"TimeoutError after {outcome[1]:.1f} s with timeout=2"


def test_the_process_exits_cleanly_while_a_producer_is_still_decoding(tmp_path):
    """The script ends while a producer is inside native work longer than the exit's waits: its batch's decode,
    or (on a faster machine) the CPU stage after it. The thread that took the GIL back during the interpreter's
    finalisation was ended by pthread_exit, whose unwinding through native frames aborted the process (exit 134,
    'terminate called without an active exception': in 16 of 24 runs while decoding; in 8 of 8 on the
    thirty-second session's dev machine, where the decode ended in time and the stage, a torch op, did not). It
    now stays in native code until the process is gone."""
    (tmp_path / "c").mkdir()
    noise = np.random.default_rng(0).integers(0, 256, (4000, 6000, 3), dtype=np.uint8)  # slow to decode: ~0.6 s
    from PIL import Image
    Image.fromarray(noise).save(tmp_path / "c" / "0.jpg", quality=95)
    proc = child(f"""
        import time, torch, fastload as fl
        ds = torch.utils.data.Subset(fl.FolderDataset({str(tmp_path)!r}), [0] * 64)
        loader = fl.FastLoader(ds, batch_size=32, threads=1, workers=1, dtype=torch.uint8,
                               crop=fl.CenterCrop(3000, resize=4000, dct_downscale=False))
        it = iter(loader)  # its producer enters one native call for the batch's 32 decodes (~20 s)
        time.sleep(1)
        print("script ends", flush=True)
    """, timeout=120)
    assert proc.returncode == 0 and "script ends" in proc.stdout, (proc.returncode, proc.stderr[-2000:])
    assert "terminate called" not in proc.stderr


def test_a_cpu_op_that_returns_during_the_exit_does_not_abort_it():
    """A thread inside one of fastload's CPU ops (warp_normalize, called through torch's dispatcher, which releases
    the GIL around it) when the script ends, and the op returns during the finalisation while the main thread has
    let go of the GIL (here a __del__ that sleeps, as a close() waiting on threads does): the thread used to take
    the GIL back and be ended by pthread_exit through torch's C++ frames, aborting the process (exit 134). The op
    now stays in native code once the interpreter is exiting (native/exit_guard.h).
    How the script makes that happen on busy cores too (thirty-fifth session; without the guard it aborts 5 of 5,
    idle and beside two busy loops): the thread calls the op with arguments made beforehand and the script ends
    once it is inside, since torch's own calls on the way (ops.warp_ragged's Tensor.to) take the GIL inside C++ as
    well, and a thread the finalisation catches there aborts through torch alone (a core dump showed it); the op
    takes ~1-2 s, so it is still running when the finalisation begins; and the sleeping object hangs off a module
    of its own, cleared by the finalisation (one in __main__'s globals was not while the thread lived)."""
    proc = child("""
        import sys, threading, time, types, torch
        from fastload import ops
        torch.set_num_threads(1)
        B, S, O = 128, 3000, 100
        data = torch.zeros(S * S * 3, dtype=torch.uint8)
        offsets = torch.zeros(B, dtype=torch.int64)
        shapes = torch.tensor([[S, S, 3]] * B, dtype=torch.int64)
        k = S / O  # sheared and 30x smaller: the general path, many taps a pixel, 15 MB out
        mats = torch.tensor([[[k, 0.3 * k, 0.0], [0.2 * k, k, 0.0]]] * B)
        args = (data, offsets, shapes, mats, torch.ones(3), torch.zeros(3), 3, O, O, True, torch.float32, False,
                ops.fill_values(0.0))
        t = time.monotonic()
        torch.ops.fastload.warp_normalize(*args)
        took = time.monotonic() - t

        class Linger:  # cleared with its module, after the finalisation began
            def __del__(self, sleep=time.sleep, took=took):
                sleep(took + 1.0)  # the GIL let go of while the other thread's op returns
        holder = types.ModuleType("linger")
        holder.keep = Linger()
        sys.modules["linger"] = holder
        del holder
        started = threading.Event()

        def work():
            started.set()
            torch.ops.fastload.warp_normalize(*args)
        threading.Thread(target=work, daemon=True).start()
        started.wait()
        time.sleep(0.2)  # the thread into the op (GIL released there)
        print("script ends", flush=True)
    """, timeout=120)
    assert proc.returncode == 0 and "script ends" in proc.stdout, (proc.returncode, proc.stderr[-2000:])
    assert "terminate called" not in proc.stderr


# ---- stores: truncated, newer, unfinished -------------------------------------------------------------------------

def _damage_big_node(store, tmp_path, name, change):
    """A copy of the store with LMDB's own node of its first large (overflow) record changed in data.mdb:
    ``change(data, offset)`` edits the node at ``offset`` of the latest B-tree (found from the meta pages, as
    LMDB's format lays them out). Returns (copy, the record's index)."""
    damaged = copy_store(store, tmp_path, name)
    path, page = damaged / "data.mdb", 4096
    data = bytearray(path.read_bytes())

    def meta(k):  # (txnid, main DB root page) of meta page k
        m = memoryview(data)[k * page + 16:]
        return struct.unpack_from("<Q", m, 128)[0], struct.unpack_from("<Q", m, 72 + 40)[0]

    root = max(meta(0), meta(1))[1]
    stack = [root]
    while stack:
        p = stack.pop()
        flags, lower = struct.unpack_from("<HH", data, p * page + 10)
        offsets = struct.unpack_from(f"<{(lower - 16) // 2}H", data, p * page + 16)
        if flags & 1:  # a branch page: its children
            stack += [lo | hi << 16 | fl << 32 for lo, hi, fl in
                      (struct.unpack_from("<HHH", data, p * page + o) for o in offsets)]
            continue
        for o in offsets:  # a leaf page: its first F_BIGDATA node holding a record
            base = p * page + o
            flags_n, ksize = struct.unpack_from("<HH", data, base + 4)
            key = bytes(data[base + 8:base + 8 + ksize])
            if flags_n & 1 and key != META_KEY:
                change(data, base, ksize)
                path.write_bytes(data)
                return damaged, key_index(key)
    raise AssertionError("no overflow record found")


def test_a_damaged_btree_page_is_named_and_the_rest_is_read(store, tmp_path):
    """A record whose node points at a page LMDB cannot find (MDB_PAGE_NOTFOUND): that sample is named (it was a
    bare LMDB error, and LMDB fails the whole read transaction, so verify stopped there and the loader raised
    lmdb's own exception); the other samples read on in a new transaction."""
    def elsewhere(data, base, ksize):
        struct.pack_into("<Q", data, base + 8 + ksize, 1 << 40)  # the overflow page number
    damaged, i = _damage_big_node(store, tmp_path, "page.lmdb", elsewhere)
    ds = fl.LMDBDataset(damaged)
    failures = fl.datasets.verify(ds, progress=False)
    assert [name for name, _ in failures] == [ds.sample_name(i)]
    assert "damaged store" in failures[0][1]
    with pytest.raises(fl.DecodeError, match=rf"\[{i}\].*cannot read the record"):
        run_epoch(ds)
    n, stats = run_epoch(ds, on_error="skip")
    assert n == len(ds) and stats["skipped"] == 1


def test_damaged_metadata_is_an_error_not_a_traceback(store, tmp_path):
    """The metadata lost a key (one byte: "classes" -> "classer"): a DatasetError naming the store (KeyError)."""
    damaged = copy_store(store, tmp_path, "meta.lmdb")
    with lmdb.open(str(damaged), subdir=True, lock=False) as env, env.begin(write=True) as txn:
        meta = loads(txn.get(META_KEY))
        meta["classer"] = meta.pop("classes")
        txn.put(META_KEY, dumps(meta))
    with pytest.raises(DatasetError, match=r"damaged fastload metadata \(KeyError: 'classes'\)"):
        fl.LMDBDataset(damaged)
    assert main(["verify", "-q", str(damaged)]) == 2


def test_truncated_store_is_refused_not_a_crash(store, tmp_path):
    """data.mdb cut short (a copy that stopped, a full disk): opening it must not touch pages past the end of the
    mapped file (SIGBUS kills the process). LMDBDataset compares the file with its last page and refuses it."""
    size = os.path.getsize(Path(store) / "data.mdb")
    cuts = []
    for cut in (8192, size // 2, size - 100):
        cuts.append(str(copy_store(store, tmp_path, f"cut-{cut}.lmdb")))
        os.truncate(Path(cuts[-1]) / "data.mdb", cut)
    proc = child(f"""
        import fastload as fl
        for path in {cuts!r}:
            try:
                ds = fl.LMDBDataset(path)
                print("opened", sum(ds[i][0].shape[0] for i in range(len(ds))), flush=True)
            except fl.datasets.DatasetError as e:
                print("refused:", e, flush=True)
    """)
    assert proc.returncode == 0, f"rc {proc.returncode} after {proc.stdout!r}: {proc.stderr[-2000:]}"
    assert proc.stdout.count("truncated store") == 3, proc.stdout
    t = copy_store(store, tmp_path, "cut-tiny.lmdb")
    os.truncate(t / "data.mdb", 100)
    with pytest.raises(DatasetError, match="not a fastload store"):
        fl.LMDBDataset(t)
    assert main(["verify", str(t), "-q"]) == 2


def test_store_from_a_newer_format_version(store, tmp_path):
    """Metadata version above ours: refused at open. A record whose header says a newer version: named."""
    newer = copy_store(store, tmp_path, "newer.lmdb")
    env = lmdb.open(str(newer), lock=False)
    with env.begin(write=True) as txn:
        meta = loads(txn.get(META_KEY))
        meta["version"] = 2
        txn.put(META_KEY, dumps(meta))
    env.close()
    with pytest.raises(DatasetError, match="newer fastload .*version 2.*upgrade"):
        fl.LMDBDataset(newer)

    record = copy_store(store, tmp_path, "record.lmdb")

    def bump(value):
        fields = list(HEADER.unpack_from(value, 0))
        fields[1] = 2
        HEADER.pack_into(value, 0, *fields)

    rewrite_record(record, 4, bump)
    ds = fl.LMDBDataset(record)
    with pytest.raises(fl.DecodeError, match=r"record\.lmdb\[4\]( \(from [^)]*\))?: record format version 2 is newer"):
        run_epoch(ds)
    assert run_epoch(ds, on_error="skip")[0] == len(ds)


def test_store_opened_while_pack_is_writing(tree, tmp_path):
    """A live `fastload pack` (slowed down): DST is not there yet and DST.partial is refused with the way on; a
    second pack of the same DST is refused while the first holds its lock; the finished store opens."""
    dst = tmp_path / "live.lmdb"
    env = {**os.environ, "FASTLOAD_PACK_SLOWDOWN": "0.1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "fastload", "pack", str(tree), str(dst), "--commit-every", "4", "--workers", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if line.startswith("packing "):  # not under -q, which prints nothing until the end
                break
        with pytest.raises(DatasetError, match="did not finish.*--resume"):
            fl.LMDBDataset(dst)
        with pytest.raises(DatasetError, match="unfinished pack"):
            fl.LMDBDataset(f"{dst}.partial")
        with pytest.raises(DatasetError, match="another fastload pack is writing it right now"):
            pack(tree, dst, resume=True, progress=False, log=lambda m: None)
        assert proc.poll() is None, "the pack finished before the checks: slow it down more"
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert len(fl.LMDBDataset(dst)) == 48


def _records(path):
    try:
        env = lmdb.open(str(path), readonly=True, lock=False)
    except lmdb.Error:  # an LMDBDataset of this process has it open: py-lmdb allows one handle per process
        env, _ = shared_env(str(path), True)
        with env.begin() as txn:
            return {key_index(k): bytes(v) for k, v in txn.cursor() if key_index(k) is not None}
    try:
        with env.begin() as txn:
            return {key_index(k): bytes(v) for k, v in txn.cursor() if key_index(k) is not None}
    finally:
        env.close()


def _mount_tmpfs(where, size):
    where.mkdir(exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    return r.returncode == 0


def test_disk_full_during_pack_then_resume(tree, store, tmp_path, capsys):
    """Pack onto a 1.5 MB tmpfs (the photos are ~3 MB): the commit that does not fit fails with a clear error and
    the committed prefix stays; with room made, `pack --resume` finishes: same records as an uninterrupted pack,
    no duplicates, no gaps."""
    disk = tmp_path / "disk"
    if os.geteuid() != 0 or not _mount_tmpfs(disk, "1500k"):
        pytest.skip("needs root and tmpfs mounts")
    try:
        dst = disk / "full.lmdb"
        args = ["pack", str(tree), str(dst), "-q", "--commit-every", "8", "--workers", "1"]
        assert main(args) == 1
        err = capsys.readouterr().err
        assert f"{dst}.partial: cannot write the store" in err and "--resume" in err, err
        assert not dst.exists()
        with pytest.raises(DatasetError, match="did not finish"):
            fl.LMDBDataset(dst)
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
        assert main(args + ["--resume"]) == 0
        got, want = _records(dst), _records(store)
        assert sorted(got) == list(range(48)) and got == want
        assert len(fl.LMDBDataset(dst)) == 48
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# ---- hostile inputs against the limits ------------------------------------------------------------------------------

def _jpeg(tree):
    return sorted(Path(tree).rglob("*.jpg"))[0].read_bytes()


def _claim_size(data, height, width):
    for i in range(2, len(data) - 8):
        if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC1, 0xC2):
            return data[:i + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[i + 9:]
    raise ValueError("no SOF")


def test_pixel_limit_cannot_be_bypassed(tree, tmp_path):
    """A header claiming 65000 x 65000 (4.2 Gpx): refused before any allocation, by every entry point."""
    bomb = _claim_size(_jpeg(tree), 65000, 65000)
    with pytest.raises(fl.DecodeError, match="over the limit") as e:
        ops.read_header(bomb)
    assert e.value.reason == "too large"
    with pytest.raises(fl.DecodeError, match="over the limit"):
        ops.decode_crop(bomb, 0, 0, 64, 64)
    assert ops.decode_crops([bomb], [[0, 0, 64, 64, 1]])[3].tolist() == [ops.TOO_LARGE]
    assert ops.read_headers([bomb], threads=2)[1].tolist() == [ops.TOO_LARGE]
    # A window no image under the limit could hold is refused before its buffer is allocated.
    with pytest.raises(fl.DecodeError, match="larger than the pixel limit"):
        ops.decode_crop(_jpeg(tree), 0, 0, 60000, 60000, max_pixels=1 << 20)
    # A lower limit is a limit too; and the scan of a folder leaves the bomb out.
    good = _jpeg(tree)
    with pytest.raises(fl.DecodeError, match="over the limit of 1000"):
        ops.decode_crop(good, 0, 0, 8, 8, max_pixels=1000)
    root = fresh_tree(tree, tmp_path)
    (root / "class_00" / "bomb.jpg").write_bytes(bomb)
    with pytest.warns(UserWarning, match="bomb.jpg"):
        ds = fl.FolderDataset(root)
    assert len(ds) == 48 and "over the limit" in dict(ds.skipped)[str(root / "class_00" / "bomb.jpg")]


def test_byte_limit_applies_to_buffers_and_files(tree):
    good = _jpeg(tree)
    path = str(sorted(Path(tree).rglob("*.jpg"))[0])
    win = [[0, 0, 8, 8, 1]] * 3
    _, _, _, status, messages = ops.decode_crops([good, path, memoryview(good)], win, max_bytes=1000)
    assert status.tolist() == [ops.UNREADABLE] * 3
    assert all("over the per-image limit of 1000" in m for m in messages), messages
    assert ops.decode_crops([good, path], win[:2], max_bytes=len(good))[3].tolist() == [ops.OK, ops.OK]
    # the one-image ops take the same limit
    for data in (good, path):
        with pytest.raises(fl.DecodeError, match="over the per-image limit of 1000"):
            ops.decode_crop(data, 0, 0, 8, 8, max_bytes=1000)
        with pytest.raises(fl.DecodeError, match="over the per-image limit of 1000"):
            ops.read_header(data, max_bytes=1000)
    size = os.path.getsize(path)
    assert ops.decode_crop(path, 0, 0, 8, 8, max_bytes=size).shape == (8, 8, 3)


def _threads_now():
    return len(os.listdir("/proc/self/task"))


def test_thread_count_is_bounded(tree):
    """threads=10**6 asks for a million native threads: run_parallel caps them at 256 (and at the batch size)."""
    good = _jpeg(tree)
    peak, stop = [_threads_now()], threading.Event()
    base = peak[0] + 1  # the sampler thread itself

    def sample():
        while not stop.is_set():
            peak.append(_threads_now())

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        t0 = time.perf_counter()
        n = 600
        status = ops.decode_crops([good] * n, [[0, 0, 64, 64, 1]] * n, threads=10**6)[3]
        sizes, hstatus, _ = ops.read_headers([good] * n, threads=10**6)
        seconds = time.perf_counter() - t0
    finally:
        stop.set()
        sampler.join()
    assert bool((status == ops.OK).all()) and bool((hstatus == ops.OK).all())
    assert max(peak) - base <= 256, f"{max(peak) - base} threads at once"
    assert seconds < 30
    small = ops.decode_crops([good] * 3, [[0, 0, 8, 8, 1]] * 3, threads=10**6)[3]
    assert small.tolist() == [ops.OK] * 3  # and never more threads than samples


def test_loader_with_absurd_thread_count(store):
    n, _ = run_epoch(fl.LMDBDataset(store), threads=10**6)
    assert n == 48


def test_a_damaged_png_record_is_named_not_decoded(imagenet_dir, tmp_path):
    """Records Pillow decodes (PNG and the other non-JPEG formats) are read through reader.get, which checks their
    CRC-32 as the native JPEG reads do: a damaged one is that sample's DecodeError, named (it was decoded, or
    failed with Pillow's own words), and skip mode replaces it."""
    src = photo_tree(imagenet_dir, tmp_path / "src")  # one PNG among the JPEGs
    store = pack(src, tmp_path / "p.lmdb", progress=False, log=lambda m: None).path
    png = int(np.flatnonzero(np.asarray(fl.FolderDataset(src).formats) != 0)[0])  # the store keeps folder order
    rewrite_record(store, png, flip_middle_byte)
    ds = fl.LMDBDataset(store)
    with pytest.raises(fl.DecodeError, match=rf"\[{png}\]( \(from [^)]*coffee\.png\))?: checksum mismatch"):
        run_epoch(ds)
    n, stats = run_epoch(ds, on_error="skip")
    assert n == len(ds) and stats["skipped"] == 1


# ---- the process's limits: out of descriptors, exits after timeouts, the output pool, replaced stores ----------

def test_out_of_file_descriptors_raises_and_never_skips(tree, tmp_path, monkeypatch):
    """A read refused for want of descriptors (EMFILE) is the process's limit, not the sample's fault: the loader
    raises OSError saying so even with on_error="skip" (it replaced good samples without a word: 177-445 of 1,000
    per epoch in a review), and so do the folder scan and pack (which dropped the files as unreadable)."""
    proc = child(f"""
        import contextlib, os, resource, fastload as fl
        ds = fl.FolderDataset({str(tree)!r})
        loader = fl.FastLoader(ds, batch_size=8, threads=1, workers=1, on_error="skip", crop=fl.CenterCrop(32))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        held = []
        with contextlib.suppress(OSError):  # open until no descriptor is left
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        try:
            next(iter(loader))
            print("no error", loader.stats()["skipped"])
        except Exception as e:
            print(type(e).__name__, e)
    """)
    assert proc.stdout.startswith("OSError") and "Too many open files" in proc.stdout, (proc.stdout, proc.stderr)
    assert "limit of the process" in proc.stdout
    # The scan and pack read with Python's open (the folder's listing itself fails first when no descriptor is
    # left, a DatasetError): the same refusal, made by one file's read.
    import importlib

    from fastload.datasets import folder
    pack_module = importlib.import_module("fastload.datasets.pack")  # the package exports a function of that name

    def no_descriptor(*args):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(folder, "_read_head_tail", no_descriptor)
    with pytest.raises(OSError, match="Too many open files.*limit of the process"):
        fl.FolderDataset(tree, cache=False)
    monkeypatch.undo()
    scandir = os.scandir
    second_class = sorted(p for p in tree.iterdir() if p.is_dir())[1]
    monkeypatch.setattr(folder.os, "scandir", lambda d: no_descriptor() if str(d) == str(second_class) else scandir(d))
    with pytest.raises(OSError, match="Too many open files.*limit of the process"):  # the class was left out
        fl.FolderDataset(tree, cache=False)
    monkeypatch.undo()
    monkeypatch.setattr(pack_module, "_read", no_descriptor)
    with pytest.raises(OSError, match="Too many open files.*limit of the process"):
        pack(tree, tmp_path / "s.lmdb", progress=False, log=lambda m: None)


class _NoDescriptorReader:
    def __init__(self, ds):
        self._ds = ds

    def get(self, i):
        if i % 4 == 1:
            raise OSError(errno.EMFILE, "Too many open files")
        with self._ds.reader() as r:
            return bytes(r.get(i))


def test_a_custom_readers_process_limit_is_not_skipped(store):
    """A protocol dataset's reader that runs out of descriptors: OSError, even with on_error="skip" (its sample was
    replaced as a broken one)."""
    base = fl.LMDBDataset(store)

    class Dataset(_StuckDataset):
        def reader(self):
            import contextlib
            return contextlib.nullcontext(_NoDescriptorReader(self.ds))

    with pytest.raises(OSError, match="Too many open files.*limit of the process"):
        run_epoch(Dataset(base, None), on_error="skip")


def test_exit_after_timeouts_waits_once(store):
    """Producers left stuck by timeout= errors are waited for once at exit, not 5 s each (31 s after 6 retries)."""
    proc = child(f"""
        import collections, contextlib, threading, time, fastload as fl, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_faults import _StuckDataset, CROP
        ds = _StuckDataset(fl.LMDBDataset({str(store)!r}), threading.Event())  # sample 3 never returns
        for attempt in range(3):  # each loader times out on the stuck read, its producer left stuck
            with contextlib.suppress(TimeoutError):
                collections.deque(fl.FastLoader(ds, timeout=0.5, **CROP), maxlen=0)
        print("exiting", time.monotonic(), flush=True)
    """, timeout=120)
    end = time.monotonic()
    assert proc.returncode == 0 and "exiting" in proc.stdout, proc.stderr[-2000:]
    # one 5 s wait plus the interpreter's teardown (6.2-6.7 s on a loaded 2-core machine); in turn: 15 s and more
    assert end - float(proc.stdout.split()[-1]) < 12.0, "each stuck group was waited for in turn"


def test_close_frees_the_pooled_batch_outputs(tree):
    """CPU batches of 4 MiB or more come from a host pool (no page faults on reuse) that kept up to 1 GiB for the
    process's life, old sizes too (610 MiB resident after a 160 -> 224 ramp, still after close and del):
    close() gives back the blocks no batch holds."""
    loader = fl.FastLoader(fl.FolderDataset(tree), batch_size=24, crop=fl.RandomResizedCrop(224), threads=2,
                           workers=1)
    for x, _ in loader:
        assert x.nbytes >= 4 << 20
    del x
    loader.close()
    assert fl.ops.C.release_cpu_outputs() == 0
    out = fl.ops.warp_affine(torch.zeros(2, 3, 8, 8), torch.eye(2, 3) * 0.01, (512, 512), layout="NCHW")
    nbytes = out.nbytes
    del out  # back to the pool
    assert fl.ops.C.release_cpu_outputs() == nbytes and fl.ops.C.release_cpu_outputs() == 0


def test_stores_replaced_on_disk_are_closed(store, tmp_path):
    """A store packed again at the same path: the environment of the old file is closed once no dataset reads it
    (every old data.mdb stayed open and mapped, its disk space held, until the process ended)."""
    import gc

    def deleted_maps():
        return sum("data.mdb (deleted)" in os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                   if os.path.exists(f"/proc/self/fd/{fd}"))

    path = tmp_path / "again.lmdb"
    before = deleted_maps()
    for _ in range(4):
        shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(store, path)
        ds = fl.LMDBDataset(path)
        with ds.reader() as r:
            assert len(bytes(r.get(0)))
        del ds, r
        gc.collect()
    fl.LMDBDataset(path)  # opening the current one closes the replaced ones no dataset holds
    assert deleted_maps() == before
    kept = fl.LMDBDataset(path)
    shutil.rmtree(path)
    shutil.copytree(store, path)
    fl.LMDBDataset(path)
    with kept.reader() as r:  # a dataset still reading the old file keeps it open
        assert len(bytes(r.get(1)))
