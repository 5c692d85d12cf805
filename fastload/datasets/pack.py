"""`fastload pack`: an image folder -> an LMDB store (record format in record.py), resumable after any kill.

Crash safety: everything goes to DST.partial. The first transaction stores the plan (the file list and
options); each later transaction stores a batch of records together with a progress key (next file, next
record), so what is committed is always a consistent prefix: no duplicates, no gaps, whenever the process dies
(SIGKILL included). The metadata key is written in the last transaction, and only then is DST.partial renamed
to DST. An existing DST replaced with --force is removed only after the new store is complete.

Checking: each file is read once; JPEGs (by magic bytes) get the native header parse plus a marker walk that
finds truncation (check.py), a few microseconds per file, where a full decode costs ~0.6 ms: `--verify-decode`
adds the full decode. Other formats are decoded once by Pillow (they are rare and Pillow decodes them at training
time anyway). Reading and checking run on a thread pool (file reads, the header parse, CRC and re-encoding all
release the GIL); one thread writes.
"""
import contextlib
import errno
import fcntl
import io
import os
import shutil
import signal
import socket
import stat
import sys
import threading
import time
import warnings
import zlib
from collections import deque, namedtuple
from concurrent.futures import ThreadPoolExecutor

import lmdb
import numpy as np

from .. import ops
from ..errors import DecodeError, raise_process_limit
from .base import DataError, DatasetError
from .check import MAX_FILE_BYTES, header_failure, is_jpeg, jpeg_structure_problem, pillow_check
from .folder import list_images
from .lmdb import cover_counted_pages, holds_fastload_keys
from .progress import progress as progress_bar
from .record import (FLAG_CONVERTED, FLAG_REENCODED, FLAG_SEEKABLE, FORMAT_NAME, HEADER_SIZE, JPEG, META_KEY, OTHER, PLAN_KEY,
                     PROGRESS_KEY, SKIP_PREFIX, SOURCES_KEY, VERSION, dumps, encode_index, encode_sources, key_index, loads, parse_header,
                     record_key, skip_key, write_header)

#: ``files``: every file of the source; ``files_this_run``: those this call read (fewer after --resume), and
#: ``seconds`` the time it took, so their ratio is this run's rate.
PackResult = namedtuple("PackResult", "path records files skipped seconds image_bytes reencoded converted seekable "
                                      "files_this_run")

DEFAULT_QUALITY = 90
TURBOJPEG_FALLBACK = "/usr/lib/x86_64-linux-gnu/libturbojpeg.so.0"
_ASIDE = "replaced-by-pack"  # in a store `pack --force` moves aside to DST.old-PID: "HOST PID" of that pack
_STORE_FILES = {"data.mdb", "lock.mdb", "pack.lock", "report.txt", "report.txt.tmp", _ASIDE}
_CHUNK = 64  # files per worker task
_BATCH_BYTES = 64 << 20  # a commit at least this often, whatever --commit-every says
#: Seconds to sleep after each commit; only for tests that kill a pack midway.
_SLOWDOWN_ENV = "FASTLOAD_PACK_SLOWDOWN"

_tj = None
_tj_lock = threading.Lock()


def _turbojpeg():
    """The PyTurboJPEG encoder (libjpeg-turbo), loaded once; DatasetError when it is not installed."""
    global _tj
    with _tj_lock:
        if _tj is None:
            try:
                from turbojpeg import TurboJPEG
            except ImportError:
                raise DatasetError("re-encoding (--max-side, --convert-to-jpeg) needs PyTurboJPEG: "
                                   "pip install 'PyTurboJPEG<2' (and libturbojpeg0)") from None
            try:
                _tj = TurboJPEG()
            except Exception:
                try:
                    _tj = TurboJPEG(lib_path=TURBOJPEG_FALLBACK)
                except Exception as e:
                    raise DatasetError(f"PyTurboJPEG cannot load libturbojpeg ({e}); install libturbojpeg0") from None
        return _tj


def _encode_jpeg(rgb, quality):
    from turbojpeg import TJPF_RGB, TJSAMP_420

    return _turbojpeg().encode(np.ascontiguousarray(rgb), quality=quality, pixel_format=TJPF_RGB,
                               jpeg_subsample=TJSAMP_420)


def _target_size(h, w, max_side):
    scale = max_side / max(h, w)
    return max(1, round(h * scale)), max(1, round(w * scale))


def _resize(rgb, nh, nw):
    from PIL import Image

    if rgb.shape[:2] == (nh, nw):
        return rgb
    return np.asarray(Image.fromarray(rgb).resize((nw, nh), Image.Resampling.LANCZOS))


def _shrink_jpeg(data, h, w, max_side, quality, strict, name=None):
    """Re-encodes a JPEG whose longer side exceeds max_side: DCT-domain downscale in the decoder, then Pillow."""
    nh, nw = _target_size(h, w, max_side)
    d = next(d for d in (8, 4, 2, 1) if -(-h // d) >= nh and -(-w // d) >= nw)
    rgb = ops.decode_crop(data, 0, 0, h, w, downscale=d, strict=strict, sample=name).numpy()
    return _encode_jpeg(_resize(rgb, nh, nw), quality), nh, nw


def _pillow_to_jpeg(data, max_side, quality):
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        rgb = np.asarray(im.convert("RGB"))
    h, w = rgb.shape[:2]
    if max_side and max(h, w) > max_side:
        h, w = _target_size(h, w, max_side)
        rgb = _resize(rgb, h, w)
    return _encode_jpeg(rgb, quality), h, w


def _read(path):
    """The file's bytes in a bytearray after HEADER_SIZE free bytes (room for the record header: no copy later).
    Opened non-blocking and refused unless a regular file: a FIFO put where a listed image was (before a --resume,
    say) blocked the open for good, through Ctrl-C; a device would be read without end."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb", buffering=0) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        size = st.st_size
        if size > MAX_FILE_BYTES:
            raise ValueError(f"file too large ({size / 2**30:.1f} GiB)")
        buf = bytearray(HEADER_SIZE + size)
        with memoryview(buf) as view:
            got = HEADER_SIZE
            while got < len(buf):
                k = f.readinto(view[got:])
                if not k:
                    break
                got += k
        if got < len(buf):  # the file shrank since stat
            del buf[got:]
        else:
            buf += f.read()  # or grew
    return buf


#: What a pack does to each file; --resume requires the same. ``strict``: ops.read_header's (and the decodes').
_Options = namedtuple("_Options", "max_side quality convert_to_jpeg verify_decode seekable strict")


def _with_payload(payload, fmt, flags, h, w, label):
    buf = bytearray(HEADER_SIZE) + payload
    write_header(buf, fmt, h, w, label, zlib.crc32(payload), flags)
    return buf


def _process(src, items, opt):
    """Reads and checks files [(file index, relative path, label)] -> [(file index, record value or reason str)]."""
    out = []
    jpegs = []
    for file_index, rel, label in items:
        try:
            buf = _read(os.path.join(src, rel))
        except FileNotFoundError:
            out.append((file_index, "file not found (removed after the listing?)"))
            continue
        except PermissionError:
            out.append((file_index, "unreadable: permission denied"))
            continue
        except IsADirectoryError:
            out.append((file_index, "a folder, not a file"))
            continue
        except OSError as e:
            raise_process_limit(e, f"{os.path.join(src, rel)}: cannot read")  # stop rather than leave good files out
            out.append((file_index, f"unreadable: {(e.strerror or str(e)).lower()}"))
            continue
        except ValueError as e:
            out.append((file_index, str(e)))
            continue
        if len(buf) == HEADER_SIZE:
            out.append((file_index, "empty file"))
        elif is_jpeg(buf, HEADER_SIZE):
            out.append(None)  # filled below, after one native header call for the chunk
            jpegs.append((len(out) - 1, file_index, label, buf))
        else:
            out.append((file_index, _other(buf, label, opt)))
    if jpegs:
        sizes, status, messages = ops.read_headers([memoryview(j[3])[HEADER_SIZE:] for j in jpegs], 1,
                                                   strict=opt.strict)
        names = {file_index: os.path.join(src, rel) for file_index, rel, _ in items}
        for k, (slot, file_index, label, buf) in enumerate(jpegs):
            if int(status[k]) != 0:
                value = header_failure(buf, messages[k], HEADER_SIZE)
            else:
                value = _jpeg(buf, int(sizes[k, 0]), int(sizes[k, 1]), label, opt, names[file_index])
            out[slot] = (file_index, value)
    return out


def _jpeg(buf, h, w, label, opt, name):
    """The record of a JPEG file (``name``: its path, for the warnings of a file let through), or the reason to
    skip it."""
    problem = jpeg_structure_problem(buf, HEADER_SIZE, strict=opt.strict)
    if problem:
        return problem
    data = memoryview(buf)[HEADER_SIZE:]
    try:
        if opt.verify_decode:
            ops.decode_crop(data, 0, 0, h, w, strict=opt.strict, sample=name)
        flags, payload = 0, None
        if opt.max_side and max(h, w) > opt.max_side:
            payload, h, w = _shrink_jpeg(data, h, w, opt.max_side, opt.quality, opt.strict, name)
            flags = FLAG_REENCODED
        if opt.seekable:
            seekable = ops.add_restart_markers(data if payload is None else payload, strict=opt.strict, sample=name)
            if seekable is not None:  # None: a file it leaves alone (CMYK, RGB, incomplete progressive): as it is
                payload, flags = seekable, flags | FLAG_SEEKABLE
        if opt.strict and payload is None and not opt.verify_decode:
            # Nothing above read the whole scan: entropy-check it (no IDCT), so that every JPEG a strict pack
            # stores has passed a full decode's checks and the store can say so (meta "scans_checked": the
            # loader then skips its own first-decode check, decoders.ScanChecks).
            status, messages = ops.verify_jpegs([data], strict=True)
            if int(status[0]) != ops.OK:
                return _corrupt(messages[0])
        if payload is not None:
            data.release()
            return _with_payload(payload, JPEG, flags, h, w, label)
    except DecodeError as e:  # the skip list names the file
        return _corrupt(e.detail())
    except Exception as e:  # the re-encoder (Pillow, libturbojpeg) on an odd file: skip it, do not stop the pack
        return f"cannot re-encode: {e}"
    write_header(buf, JPEG, h, w, label, zlib.crc32(data))
    data.release()
    return buf


def _corrupt(why):
    """A skip reason for a JPEG the decoder refused (libjpeg's own words often start with "Corrupt JPEG data")."""
    return why if why.lower().startswith("corrupt jpeg data") else f"corrupt JPEG data: {why}"


def _other(buf, label, opt):
    data = memoryview(buf)[HEADER_SIZE:]
    try:
        h, w, _ = pillow_check(data, ops.MAX_PIXELS)
        if opt.convert_to_jpeg:
            payload, h, w = _pillow_to_jpeg(data, opt.max_side, opt.quality)
            seekable = ops.add_restart_markers(payload) if opt.seekable else None
            if seekable is not None:
                return _with_payload(seekable, JPEG, FLAG_CONVERTED | FLAG_SEEKABLE, h, w, label)
            return _with_payload(payload, JPEG, FLAG_CONVERTED, h, w, label)
    except ValueError as e:
        return str(e)
    except Exception as e:  # Pillow's decoders raise what they like; a broken file must not stop the pack
        return f"cannot convert: {e}"
    write_header(buf, OTHER, h, w, label, zlib.crc32(data))
    data.release()
    return buf


def _check_replaceable(path):
    """--force deletes only what fastload made: a store (or partial store) folder, nothing else. Its file names
    are not enough (any LMDB database has a data.mdb): its database must hold fastload's metadata or pack plan."""
    if os.path.isdir(path) and not os.path.islink(path) and set(os.listdir(path)) <= _STORE_FILES:
        if not os.path.exists(os.path.join(path, "data.mdb")) or holds_fastload_keys(path):
            return
    raise DatasetError(f"{path} exists and is not a fastload store; not deleting it even with --force: "
                       f"move it away or pick another destination")


def _lock(partial):
    """An exclusive lock held while this process writes DST.partial; the kernel drops it when the process dies."""
    fd = os.open(os.path.join(partial, "pack.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DatasetError(f"{partial}: another fastload pack is writing it right now") from None
    return fd


def _write(env, puts=(), deletes=()):
    """One transaction; when the map is full, doubles it and retries (nothing of the failed attempt remains).
    Any other failure (a full disk: LMDB reports it as an I/O error) raises OSError naming the store, with the
    way on: the transactions committed before stay, so `--resume` continues once there is room."""
    while True:
        try:
            with env.begin(write=True) as txn:
                for key, value in puts:
                    txn.put(key, value)
                for key in deletes:
                    txn.delete(key)
            cover_counted_pages(env, env.path(), True)
            return
        except lmdb.MapFullError:
            env.set_mapsize(env.info()["map_size"] * 2)
        except lmdb.Error as e:
            path = env.path()
            free = shutil.disk_usage(path).free
            raise OSError(errno.ENOSPC if free < (64 << 20) else errno.EIO,
                          f"cannot write the store ({e}; {free / 1e6:.1f} MB free on its disk). What was packed "
                          f"so far is kept: make room, then run the same command with --resume added",
                          path) from None


def _fsync_dir(path):
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _plan(src, file_list, listing, opt):
    return {"format": FORMAT_NAME, "version": VERSION, "source": src, "file_list": file_list,
            "options": opt._asdict(), "classes": listing.classes,
            # every JPEG stored has passed a strict whole-scan decode (_jpeg); a plan an older pack started
            # lacks it, and a store it finishes does not claim it
            "checks_scans": opt.strict,
            "files": [[p, lab] for p, lab in zip(listing.paths, listing.labels)],
            "listing_skipped": [list(s) for s in listing.skipped], "source_bytes": int(sum(listing.sizes))}


def _read_state(env):
    with env.begin() as txn:
        meta, plan, progress = txn.get(META_KEY), txn.get(PLAN_KEY), txn.get(PROGRESS_KEY)
    return (meta is not None), (loads(plan) if plan else None), (loads(progress) if progress else None)


def pack(src, dst, *, workers=None, max_side=None, quality=None, convert_to_jpeg=False, verify_decode=False,
         seekable=False, strict=True, on_error="skip", resume=False, force=False, map_size=None, commit_every=512, file_list=None,
         classes=None, progress=True, log=None):
    """Packs the image folder ``src`` into the store ``dst``; returns a PackResult. See `fastload pack --help`.

    Raises DatasetError for what cannot be done as asked (existing destination, bad options, empty source) and
    DataError for a broken file with ``on_error="raise"``. Interrupted packs leave ``dst.partial`` for
    ``resume=True``. ``strict`` is ops.read_header's: False keeps the JPEGs libjpeg warns about (--no-strict).
    ``classes`` fixes the label numbers (see ``list_images``), e.g. a validation set's to the training store's.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    t0 = time.perf_counter()
    src = os.path.abspath(os.fspath(src))
    dst = os.path.abspath(os.fspath(dst)).rstrip(os.sep)
    partial = dst + ".partial"
    file_list = file_list and os.path.abspath(os.fspath(file_list))
    workers = workers or min(8, os.cpu_count() or 1)
    if not os.path.basename(dst):
        raise DatasetError(f"{dst or os.sep}: not a store path (name the store's folder, e.g. /data/train.lmdb)")
    if dst.endswith(".partial"):  # readers take that name for an unfinished pack's
        raise DatasetError(f"{dst}: a store's name must not end in .partial (pack's name for an unfinished store)")
    parent = os.path.dirname(dst)
    if not os.path.isdir(parent):
        raise DatasetError(f"{dst}: the folder {parent} " + ("is not a folder" if os.path.lexists(parent) else
                                                             "does not exist"))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DatasetError(f"{dst}: cannot create a store in {parent} (permission denied)")
    if max_side is not None and max_side < 16:
        raise DatasetError(f"--max-side must be at least 16, got {max_side}")
    if quality is not None and not 1 <= quality <= 100:
        raise DatasetError(f"--quality must be within 1..100, got {quality}")
    if quality is not None and not (max_side or convert_to_jpeg):
        raise DatasetError("--quality applies to re-encoded images: use it with --max-side or --convert-to-jpeg")
    if on_error not in ("skip", "raise"):
        raise DatasetError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
    if workers < 1 or commit_every < 1:
        raise DatasetError("--workers and --commit-every must be at least 1")
    opt = _Options(max_side, (quality or DEFAULT_QUALITY) if (max_side or convert_to_jpeg) else None,
                   bool(convert_to_jpeg), bool(verify_decode), bool(seekable), bool(strict))
    if not os.path.isdir(src):
        raise DatasetError(f"{src}: no such folder" if not os.path.exists(src) else f"{src}: not a folder")
    real_src, real_dst = os.path.realpath(src), os.path.join(os.path.realpath(parent), os.path.basename(dst))
    if (real_dst + os.sep).startswith(real_src + os.sep):  # through symlinks too: it would become a class of SRC
        raise DatasetError(f"{dst}: the store must not be inside the source folder {src}")
    if resume and os.path.lexists(dst) and not os.path.lexists(partial):
        return _already_done(src, dst, file_list, opt, log, t0, classes)
    if os.path.lexists(dst):
        _check_replaceable(dst)  # before "pass --force": --force would not replace what fastload did not make
        if not force:
            if resume:  # an interrupted `pack --force` over an existing store
                raise DatasetError(f"{dst} already exists beside {partial}: continue with --resume --force (the old "
                                   f"store is replaced once the new one is complete)")
            raise DatasetError(f"{dst} already exists; pass --force to replace it (the old store is removed only "
                               f"once the new one is complete)")
    if os.path.lexists(partial):
        if force and not resume:
            _check_replaceable(partial)
            os.close(_lock(partial))  # never a pack that is running: its lock says so
            shutil.rmtree(partial)
        elif not resume:
            if os.path.isdir(partial):
                os.close(_lock(partial))  # a pack running right now says so, rather than "interrupted"
            raise DatasetError(f"{partial} exists: an interrupted pack. Continue it with --resume, or discard it "
                               f"and start over with --force")
    elif resume:
        log(f"nothing to resume at {partial}: starting a new pack")
    if opt.max_side or opt.convert_to_jpeg:
        _turbojpeg()  # fail now, not on the first large image

    listing = None
    created = not os.path.isdir(partial)
    if created:
        listing = _listing(src, file_list, classes)  # errors before anything is created
        _raise_listing_skip(listing.skipped, src, on_error, "")
        try:
            os.makedirs(partial)
        except FileExistsError:  # another pack of the same store started a moment ago (every rank of a job, say)
            raise DatasetError(f"{partial}: another fastload pack started writing it just now; let one pack "
                               f"make the store (e.g. rank 0) and the others wait for it") from None
    lock_fd = _lock(partial)
    env = None
    try:
        try:
            env = lmdb.open(partial, subdir=True, map_size=map_size or (64 << 20), lock=False,
                            readahead=False, meminit=False, metasync=True, sync=True)
        except lmdb.Error as e:
            if created:  # nothing in it yet: leave no "interrupted pack" behind (e.g. a --map-size too large)
                shutil.rmtree(partial, ignore_errors=True)
            raise DatasetError(f"{partial}: cannot create the store: {e}") from None
        complete, plan, prog = _read_state(env)
        this_run = 0
        if not complete:
            if plan is None:
                listing = listing or _listing(src, file_list, classes)
                plan = _plan(src, file_list, listing, opt)
                prog = {"next_file": 0, "next_record": 0}
                _grow(env, plan, map_size)
                _write(env, [(PLAN_KEY, dumps(plan)), (PROGRESS_KEY, dumps(prog))])
                log(f"packing {len(plan['files'])} files ({plan['source_bytes'] / 1e6:.1f} MB) from {src} "
                    f"into {partial}")
            else:
                _check_same(plan, src, file_list, opt, partial, classes)
                _raise_listing_skip(plan["listing_skipped"], src, on_error,
                                    f" (the pack being resumed listed its files without it: start over with --force)")
                changed = _source_changes(plan, src, file_list, classes)
                if changed:
                    warnings.warn(f"{src} has changed since this pack started ({changed}): --resume packs the files "
                                  f"listed then; start over with --force to pack the folder as it is now",
                                  stacklevel=2)
                _grow(env, plan, map_size)
                log(f"resuming {partial}: {prog['next_file']} of {len(plan['files'])} files done, "
                    f"{prog['next_record']} records")
            this_run = len(plan["files"]) - prog["next_file"]  # files_seen counts the listing's skipped too
            this_run += len(plan["listing_skipped"]) if prog["next_file"] == 0 else 0
            _pack_files(env, plan, prog, opt, workers, commit_every, on_error, progress, partial)
            try:
                _finalize(env, plan)
            except DataError:
                if _committed_records(env) == 0:  # nothing worth keeping for a resume
                    env.close()
                    env = None
                    shutil.rmtree(partial, ignore_errors=True)
                raise
        env.close()
        env = None
        meta = read_meta_from(partial)
        if complete:  # killed after its final transaction, before the rename
            _check_same(meta, src, file_list, opt, partial, classes)
        _write_report(partial, meta, dst)
    finally:
        if env is not None:
            env.close()
        os.close(lock_fd)
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(partial, "pack.lock"))
    _swap_into_place(partial, dst)
    empty = [c for c, n in zip(meta["classes"], meta.get("class_counts", ())) if n == 0]
    if empty:  # as FolderDataset warns: labels that no sample carries
        warnings.warn(f"{dst}: {len(empty)} classes have no images: {', '.join(empty[:5])}", stacklevel=2)
    skipped = [tuple(s) for s in meta["skipped"]]
    return PackResult(dst, meta["count"], meta["files_seen"], skipped, time.perf_counter() - t0,
                      meta["image_bytes"], meta["reencoded"], meta["converted"], meta.get("seekable", 0), this_run)


def _already_done(src, dst, file_list, opt, log, t0, classes):
    """--resume of a pack that completed (a kill after the rename, a rerun script): fine if it is the same pack."""
    from .lmdb import read_meta

    meta, _ = read_meta(dst)
    _check_same(meta, src, file_list, opt, dst, classes)
    _remove_replaced_stores(dst)
    log(f"{dst} is already complete: nothing to resume")
    return PackResult(dst, meta["count"], meta["files_seen"], [tuple(s) for s in meta["skipped"]],
                      time.perf_counter() - t0, meta["image_bytes"], meta["reencoded"], meta["converted"],
                      meta.get("seekable", 0), 0)


def _committed_records(env):
    with env.begin() as txn:
        raw = txn.get(PROGRESS_KEY)
    return loads(raw)["next_record"] if raw else 0


def _grow(env, plan, map_size):
    """Starts the map at --map-size, else at the source's size + 10%; _write doubles it whenever it is full."""
    need = map_size or int(plan["source_bytes"] * 1.1) + len(plan["files"]) * 256 + (64 << 20)
    if env.info()["map_size"] < need:
        env.set_mapsize(need)


def _listing(src, file_list, classes):
    listing = list_images(src, file_list=file_list, classes=classes)
    if not listing.paths:
        raise DatasetError(f"{src}: none of its image files can be read "
                           f"(e.g. {listing.skipped[0][0]}: {listing.skipped[0][1]})")
    return listing


def _source_changes(plan, src, file_list, classes):
    """How the source's listing now differs from the plan's (what a resume packs); "" where it does not."""
    try:
        now = list_images(src, file_list=file_list, classes=classes)
    except DatasetError as e:
        return f"it cannot be listed now: {e}"
    was, paths = {p for p, _ in plan["files"]}, set(now.paths)
    changes = [f"{n} files {what}" for n, what in ((len(paths - was), "added"), (len(was - paths), "gone")) if n]
    if list(now.classes) != list(plan["classes"]):
        changes.append("other class folders")
    return ", ".join(changes)


def _check_same(started, src, file_list, opt, where, classes=None):
    """--resume must continue the same pack: same source, file list and image options as the plan (or metadata)."""
    if started.get("version", 0) > VERSION:
        raise DatasetError(f"{where} was made by a newer fastload; finish it with that version or use --force")
    was = {"source": started.get("source"), "file_list": started.get("file_list"), "seekable": False, "strict": True,
           **started.get("options", {})}  # stores from before --seekable / --no-strict were packed without them
    now = {"source": src, "file_list": file_list, **opt._asdict()}
    if classes is not None:  # without classes=, the plan's own (sorted folder names) stand
        was["classes"], now["classes"] = started.get("classes"), list(classes)
    if was != now:
        diff = ", ".join(f"{k}: {was.get(k)!r} then, {now.get(k)!r} now" for k in now if was.get(k) != now[k])
        raise DatasetError(f"{where} was started with other settings ({diff}); resume with the same ones, "
                           f"or start over with --force")


def _raise_listing_skip(skipped, src, on_error, hint):
    """With --on-error raise, a file the listing could not use (a dangling symlink, a FIFO, an unreadable folder, a
    listed file that is missing) stops the pack like a broken image does."""
    if on_error == "raise" and skipped:
        rel, reason = skipped[0]
        raise DataError(f"{os.path.join(src, rel)}: {reason} (--on-error raise){hint}")


def _pack_files(env, plan, prog, opt, workers, commit_every, on_error, progress, partial):
    src, files = plan["source"], plan["files"]
    n = len(files)
    start, next_record = prog["next_file"], prog["next_record"]
    slowdown = float(os.environ.get(_SLOWDOWN_ENV) or 0)
    chunk = max(1, min(_CHUNK, commit_every))
    tasks = ((s, min(n, s + chunk)) for s in range(start, n, chunk))
    puts, batch_bytes, batch_start = [], 0, start
    skipped_now = 0
    bar = progress_bar(n, initial=start, desc="pack", unit="file", enabled=progress)
    pool = ThreadPoolExecutor(workers)
    pending = deque()
    try:
        def submit():
            for s, e in tasks:
                pending.append((e, pool.submit(_process, src, [(i, files[i][0], files[i][1]) for i in range(s, e)],
                                               opt)))
                if len(pending) >= 2 * workers:
                    return

        submit()
        while pending:
            end, fut = pending.popleft()
            results = fut.result()
            submit()
            for file_index, value in results:
                if isinstance(value, str):
                    rel = files[file_index][0]
                    if on_error == "raise":
                        raise DataError(f"{os.path.join(src, rel)}: {value} (--on-error raise). {partial} keeps "
                                        f"the records packed so far: fix the file and run again with --resume, or "
                                        f"run with --on-error skip to skip broken files")
                    puts.append((skip_key(file_index), dumps([rel, value])))
                    skipped_now += 1
                else:
                    puts.append((record_key(next_record), value))
                    batch_bytes += len(value)
                    next_record += 1
            bar.update(end - (bar.n))
            if skipped_now:
                bar.set_postfix(skipped=skipped_now, refresh=False)
            if end - batch_start >= commit_every or batch_bytes >= _BATCH_BYTES or end == n:
                puts.append((PROGRESS_KEY, dumps({"next_file": end, "next_record": next_record})))
                _write(env, puts)
                puts, batch_bytes, batch_start = [], 0, end
                if slowdown:
                    time.sleep(slowdown)
    finally:
        _join_workers(pool)
        bar.close()


@contextlib.contextmanager
def _ctrl_c_deferred():
    """Holds a Ctrl-C (SIGINT) off while the block runs and raises it once the block is done (unless the block
    raised: that exception goes on). Main thread only, where Python runs signal handlers; elsewhere a no-op. Yields
    the list a caught Ctrl-C is appended to."""
    caught = []
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, lambda *_: caught.append(1)) if main_thread else None
    try:
        yield caught
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
    if caught and sys.exc_info()[1] is None:
        raise KeyboardInterrupt


def _join_workers(pool):
    """Waits for the worker threads even through more Ctrl-Cs (a double Ctrl-C, or `timeout` signalling the process
    and then its group): a worker is inside a native call with the GIL released, and an interpreter that exits
    under it aborts the process (std::terminate) instead of leaving the partial store to --resume. A Ctrl-C that
    comes meanwhile is raised once they are done."""
    with _ctrl_c_deferred() as caught:
        while True:
            try:
                pool.shutdown(wait=True, cancel_futures=True)
                break
            except KeyboardInterrupt:  # one raised before the handler took over
                caught.append(1)


def _finalize(env, plan):
    """Builds the index from the committed records and writes the metadata: the pack's last transaction."""
    heights, widths, labels, formats = [], [], [], []
    image_bytes = reencoded = converted = seekable = 0
    skipped, deletes, skipped_files = [], [PLAN_KEY, PROGRESS_KEY], set()
    with env.begin(buffers=True) as txn:
        prog = loads(txn.get(PROGRESS_KEY))
        cursor = txn.cursor()
        expected = 0
        for key, value in cursor:
            i = key_index(bytes(key))
            if i is None:
                continue
            if i != expected:
                raise DataError(f"internal error: record {expected} missing from the store")
            fmt, flags, h, w, label, _ = parse_header(value, f"record {i}")
            heights.append(h)
            widths.append(w)
            labels.append(label)
            formats.append(fmt)
            image_bytes += len(value) - HEADER_SIZE
            reencoded += bool(flags & FLAG_REENCODED)
            converted += bool(flags & FLAG_CONVERTED)
            seekable += bool(flags & FLAG_SEEKABLE)
            expected += 1
        if cursor.set_range(SKIP_PREFIX):
            for key, value in cursor:
                key = bytes(key)
                if not key.startswith(SKIP_PREFIX):
                    break
                skipped.append(tuple(loads(value)))
                skipped_files.add(int.from_bytes(key[len(SKIP_PREFIX):], "big"))
                deletes.append(key)
    if expected != prog["next_record"]:
        raise DataError(f"internal error: {expected} records stored, progress says {prog['next_record']}")
    if expected == 0:
        first = skipped[0] if skipped else plan["listing_skipped"][0]
        raise DataError(f"{plan['source']}: none of its {len(plan['files'])} image files can be packed "
                        f"(e.g. {first[0]}: {first[1]}); no store written")
    skipped = sorted(skipped + [tuple(s) for s in plan["listing_skipped"]])
    classes = plan["classes"]
    labels_a = np.asarray(labels, dtype=np.int64)
    formats_a = np.asarray(formats, dtype=np.uint8)
    meta = {
        "format": FORMAT_NAME, "version": VERSION, "count": expected, "classes": classes,
        "class_counts": np.bincount(labels_a, minlength=len(classes)).tolist() if expected else [0] * len(classes),
        "source": plan["source"], "file_list": plan.get("file_list"),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "fastload_version": _version(),
        "options": plan["options"], "files_seen": len(plan["files"]) + len(plan["listing_skipped"]),
        "skipped": [list(s) for s in skipped],
        "formats": {"JPEG": int((formats_a == JPEG).sum()), "other": int((formats_a == OTHER).sum())},
        "image_bytes": image_bytes, "reencoded": reencoded, "converted": converted,
        "seekable": seekable, "scans_checked": bool(plan.get("checks_scans", False)),
        "index": encode_index(heights=heights, widths=widths, labels=labels_a, formats=formats_a),
    }
    # Records are the plan's files in order, less the skipped ones: each record's source, for error messages.
    sources = [f[0] for j, f in enumerate(plan["files"]) if j not in skipped_files]
    if len(sources) != expected:
        raise DataError(f"internal error: {expected} records stored for {len(sources)} files packed")
    _write(env, [(META_KEY, dumps(meta)), (SOURCES_KEY, encode_sources(sources))], deletes)
    env.sync(True)


def _version():
    from .. import __version__

    return __version__


def read_meta_from(partial):
    from .lmdb import open_env

    env = open_env(partial, True)
    try:
        with env.begin() as txn:
            meta = loads(txn.get(META_KEY))
    finally:
        env.close()
    meta.pop("index", None)
    return meta


def _write_report(partial, meta, dst):
    lines = [f"fastload pack report for {dst}",
             f"source: {meta['source']}" + (f" (file list {meta['file_list']})" if meta.get("file_list") else ""),
             f"created: {meta['created']}",
             f"files: {meta['files_seen']}, records: {meta['count']}, skipped: {len(meta['skipped'])}",
             f"formats: {meta['formats']['JPEG']} JPEG, {meta['formats']['other']} other; "
             f"re-encoded {meta['reencoded']}, converted {meta['converted']}, seekable {meta.get('seekable', 0)}",
             f"image bytes: {meta['image_bytes']}", ""]
    if meta["skipped"]:
        lines.append("skipped files (path relative to the source: reason):")
        lines += [f"  {p}: {r}" for p, r in meta["skipped"]]
    path = os.path.join(partial, "report.txt")
    with open(path + ".tmp", "w", encoding="utf-8", errors="surrogateescape") as f:  # non-UTF-8 names: as on disk
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)


def _swap_into_place(partial, dst):
    if os.path.lexists(dst):  # --force: the old store goes only now that the new one is complete
        old = f"{dst}.old-{os.getpid()}"
        # A Ctrl-C between the renames would leave no DST and the old store at DST.old-PID, never cleaned up:
        # it waits until the swap and the clean-up are done (a few seconds for a large store at most).
        with _ctrl_c_deferred():
            with open(os.path.join(dst, _ASIDE), "w") as f:  # a fastload store folder: _check_replaceable said so
                f.write(f"{socket.gethostname()} {os.getpid()}\n")
            os.rename(dst, old)
            os.rename(partial, dst)
            _fsync_dir(os.path.dirname(dst))
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(partial, dst)
        _fsync_dir(os.path.dirname(dst))
    _remove_replaced_stores(dst)


def _remove_replaced_stores(dst):
    """Removes the DST.old-PID stores that a `pack --force` moved aside and did not get to delete (killed by
    SIGTERM or SIGKILL during the swap, which defers only Ctrl-C): called once a store is at DST. Only a folder that
    pack marked when it moved it aside (_ASIDE: this host, that PID, no longer running) and that holds nothing but a
    fastload store's files: never a user's own DST.old-something."""
    parent, name = os.path.split(dst)
    prefix, host = f"{name}.old-", socket.gethostname()
    for entry in os.listdir(parent):
        pid = entry[len(prefix):] if entry.startswith(prefix) else ""
        old = os.path.join(parent, entry)
        if not pid.isdigit() or os.path.islink(old):
            continue
        try:
            with open(os.path.join(old, _ASIDE)) as f:
                marked = f.read().split() == [host, pid]
        except OSError:
            continue
        if not marked or (int(pid) != os.getpid() and _running(int(pid))):
            continue
        try:
            _check_replaceable(old)
            shutil.rmtree(old)
        except (OSError, DatasetError) as e:  # the new store is in place: say so, do not fail the pack
            warnings.warn(f"{old}: a store an interrupted `pack --force` moved aside, not removed: {e}",
                          stacklevel=3)


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True
