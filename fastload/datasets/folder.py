"""FolderDataset: an ImageFolder tree (or a file list) of image files, with sizes scanned once and cached."""
import contextlib
import csv
import hashlib
import json
import os
import stat
import tempfile
import warnings
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import ops
from ..errors import DecodeError, raise_process_limit
from .base import DataError, DatasetError, ImageDataset, Record
from .check import MAX_FILE_BYTES, first_scan_offset, header_failure, is_jpeg, jpeg_structure_problem, pillow_open
from .record import JPEG, OTHER

#: Extensions (lowercase, with the dot) that FolderDataset and `fastload pack` pick up in class folders:
#: torchvision's IMG_EXTENSIONS, so a folder gives ImageFolder's samples (pass extensions= for others).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

_CACHE_VERSION = 2  # 2: a file's stamp is [mtime_ns, ctime_ns] (1: mtime_ns)
_HEAD_BYTES = 64 << 10   # a JPEG's header (EXIF and ICC included) is almost always within its first 64 KiB
_TAIL_BYTES = 4 << 10    # and its end-of-image marker within its last 4 KiB
_WHOLE_BYTES = _HEAD_BYTES + _TAIL_BYTES

#: A source tree's files in sample order: paths relative to ``root``, labels, and os.stat size / stamp.
Listing = namedtuple("Listing", "root classes paths labels sizes stamps skipped")


def _stamp(st):
    """What says a file may have changed since its scan: [mtime_ns, ctime_ns]. The mtime alone can be set back
    (``cp -p``, ``rsync -a``, ``tar x`` keep the source's), and a replaced file of the old byte count would keep
    its cached size; the ctime cannot be set by a user and moves with every write."""
    return [st.st_mtime_ns, st.st_ctime_ns]


def default_threads():
    return min(16, 2 * (os.cpu_count() or 1))


def _walk_class(class_dir, extensions, skipped, root):
    """(relative path, size, stamp) of the images under one class folder, in torchvision ImageFolder order.

    Follows symlinks; a directory reached twice (a symlink loop, or two links to one folder) is walked once.
    """
    seen = set()
    found = []  # (dirpath, [(name, st)])
    stack = [class_dir]
    while stack:
        d = stack.pop()
        try:
            st = os.stat(d)
        except OSError as e:
            raise_process_limit(e, f"{d}: cannot open folder")  # the class must not be dropped for the process's limit
            skipped.append((os.path.relpath(d, root), f"cannot open folder: {e.strerror}"))
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        files = []
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as e:
            raise_process_limit(e, f"{d}: cannot list folder")
            skipped.append((os.path.relpath(d, root), f"cannot list folder: {e.strerror}"))
            continue
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                stack.append(entry.path)
                continue
            if os.path.splitext(entry.name)[1].lower() not in extensions:
                continue
            rel = os.path.relpath(entry.path, root)
            try:
                st = entry.stat()
            except FileNotFoundError:
                skipped.append((rel, "dangling symlink" if entry.is_symlink() else "file disappeared"))
                continue
            except OSError as e:
                skipped.append((rel, f"cannot stat: {e.strerror}"))
                continue
            if not stat.S_ISREG(st.st_mode):  # a FIFO or device named .jpg would block or never end
                skipped.append((rel, "not a regular file"))
                continue
            files.append((rel, st.st_size, _stamp(st)))
        found.append((d, files))
    found.sort(key=lambda t: t[0])
    return [f for _, files in found for f in files]


def list_images(root, *, file_list=None, extensions=IMAGE_EXTENSIONS, classes=None):
    """The image files of ``root`` as a Listing. Raises DatasetError for a missing, class-less or empty folder.

    ImageFolder layout: one sub-folder per class, classes sorted by name -> 0..C-1, files found recursively,
    extensions matched case-insensitively: ImageFolder's classes, samples and order (hidden files and folders
    included, as ImageFolder includes them; a hidden folder with no images, such as .ipynb_checkpoints, is no class,
    where ImageFolder refuses the tree). With ``file_list``, exactly the listed files, in that order (see
    ``read_file_list`` for its two formats). ``classes`` (names; label k is classes[k]) fixes the label numbers
    instead: a validation set missing a class keeps the training set's numbers (pass ``classes=train.classes``); a
    class folder or list label that is not among them is an error.
    """
    root = os.path.abspath(os.fspath(root))
    if not os.path.isdir(root):
        raise DatasetError(f"{root}: no such folder" if not os.path.exists(root) else f"{root}: not a folder")
    classes = _check_classes(classes)
    if file_list is not None:
        return _list_from_file(root, os.fspath(file_list), classes)
    extensions = {e.lower() if e.startswith(".") else "." + e.lower() for e in extensions}
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as e:
        raise_process_limit(e, f"{root}: cannot list the folder")
        raise DatasetError(f"{root}: cannot list the folder: {e.strerror}") from None
    skipped = []
    walked = {e.name: _walk_class(e.path, extensions, skipped, root) for e in entries if e.is_dir()}
    found = [name for name, files in walked.items() if files or not name.startswith(".")]
    if not found:
        loose = sum(os.path.splitext(e.name)[1].lower() in extensions for e in entries)
        hint = f"; it has {loose} images directly inside: move them into class folders" if loose else ""
        raise DatasetError(f"{root}: no class folders (expected one sub-folder per class, ImageFolder layout{hint})")
    if classes is None:
        classes = found
    else:
        unknown = [c for c in found if c not in set(classes)]
        if unknown:
            raise DatasetError(f"{root}: class folder(s) {', '.join(unknown[:5])} not among the {len(classes)} "
                               f"classes given (classes=): add them there, or remove the folders")
    paths, labels, sizes, stamps = [], [], [], []
    index = {c: i for i, c in enumerate(classes)}
    for name in found:  # sorted folder names, as ImageFolder: the order of samples does not depend on classes=
        label = index[name]
        for rel, size, stamp in walked[name]:
            paths.append(rel)
            labels.append(label)
            sizes.append(size)
            stamps.append(stamp)
    if not paths and not skipped:
        raise DatasetError(f"{root}: no images in its {len(found)} class folders "
                           f"(looked for {', '.join(sorted(extensions))})")
    return Listing(root, classes, paths, labels, sizes, stamps, skipped)


def _check_classes(classes):
    if classes is None:
        return None
    if isinstance(classes, (str, bytes)) or not all(isinstance(c, str) for c in classes):
        raise DatasetError(f"classes must be a list of class names (str), got {classes!r:.80}")
    classes = list(classes)
    dup = sorted({c for c in classes if classes.count(c) > 1})
    if dup:
        raise DatasetError(f"classes names {', '.join(dup[:5])} more than once: each class needs one label")
    return classes


def read_text_lines(path, what):
    """The lines of a UTF-8 text file (a byte-order mark, as spreadsheet programs write, is dropped); DatasetError
    naming the file, what it is for, and the line of anything that is not UTF-8."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read the {what}: {e.strerror}") from None
    try:
        return data.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise DatasetError(f"{path}:{line}: the {what} is not UTF-8 text (byte 0x{data[e.start]:02x}); save it as "
                           f"UTF-8") from None


def read_file_list(file_list):
    """[(line number, relative path, label text)] of a file list, in order. Two formats:

    * text: ``relative/path label`` per line (the path may hold spaces: the label is the last field), blank lines
      and ``#`` comments ignored;
    * CSV: a first line naming the columns, with ``path`` and ``label`` among them (others are ignored), then one
      row per file (quote paths that hold commas).
    """
    lines = read_text_lines(file_list, "file list")
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip() and not line.lstrip().startswith("#")]
    if not numbered:
        raise DatasetError(f"{file_list}: the file list names no files")
    header = [c.strip() for c in next(csv.reader([numbered[0][1]]))]
    if "path" in header and "label" in header:
        p, lab = header.index("path"), header.index("label")
        rows = []
        for n, line in numbered[1:]:
            fields = next(csv.reader([line]))
            if len(fields) <= max(p, lab) or not fields[p].strip() or not fields[lab].strip():
                raise DatasetError(f"{file_list}:{n}: expected the columns {','.join(header)}, got {line!r}")
            rows.append((n, fields[p].strip(), fields[lab].strip()))
        if not rows:
            raise DatasetError(f"{file_list}: the file list names no files (only its header)")
        return rows
    rows = []
    for n, line in numbered:
        parts = line.strip().rsplit(None, 1)  # the path may contain spaces; the label is the last field
        if len(parts) != 2:
            hint = " (a CSV file list starts with a header line naming its path and label columns)" \
                if "," in line else ""
            raise DatasetError(f"{file_list}:{n}: expected 'relative/path label', got {line!r}{hint}")
        rows.append((n, parts[0], parts[1]))
    return rows


def _labels(file_list, rows, classes):
    """(classes, int labels) of a file list's label texts: class names, or integers."""
    texts = [r[2] for r in rows]
    numeric = all(t.lstrip("-").isdigit() for t in texts)
    if classes is not None:
        index = {c: i for i, c in enumerate(classes)}
        if all(t in index for t in texts):
            return classes, [index[t] for t in texts]
        if numeric:
            out = [(n, t) for n, _, t in rows if not 0 <= int(t) < len(classes)]
            if not out:
                return classes, [int(t) for t in texts]
            raise DatasetError(f"{file_list}:{out[0][0]}: label {out[0][1]} is out of range for the "
                               f"{len(classes)} classes given (classes=)")
        n, _, t = next(r for r in rows if r[2] not in index)
        raise DatasetError(f"{file_list}:{n}: label {t!r} is not among the {len(classes)} classes given (classes=)")
    if numeric:
        ints = [int(t) for t in texts]
        if min(ints) < 0:
            n = next(r[0] for r in rows if int(r[2]) < 0)
            raise DatasetError(f"{file_list}:{n}: labels must be >= 0 (found {min(ints)})")
        return [str(i) for i in range(max(ints) + 1)], ints
    # Class names (some may look like numbers: "444"), sorted -> 0..C-1. A list missing a class shifts the
    # numbers of the classes after it: classes= (e.g. the training set's) keeps them.
    classes = sorted(set(texts))
    index = {c: i for i, c in enumerate(classes)}
    return classes, [index[t] for t in texts]


def _list_from_file(root, file_list, classes=None):
    rows = read_file_list(file_list)
    classes, ints = _labels(file_list, rows, classes)
    paths, labels, sizes, stamps, skipped = [], [], [], [], []
    for (_, rel, _), label in zip(rows, ints):
        try:
            st = os.stat(os.path.join(root, rel))
        except OSError as e:
            skipped.append((rel, f"listed in {os.path.basename(file_list)} but cannot be found: {e.strerror}"))
            continue
        if not stat.S_ISREG(st.st_mode):
            skipped.append((rel, "not a regular file"))
            continue
        paths.append(rel)
        labels.append(label)
        sizes.append(st.st_size)
        stamps.append(_stamp(st))
    return Listing(root, classes, paths, labels, sizes, stamps, skipped)


def _read_head_tail(path, size):
    """(bytes, whole): the whole file when small, else its first 64 KiB + last 4 KiB (whole=False)."""
    with open(path, "rb") as f:
        if size <= _WHOLE_BYTES:
            return f.read(), True
        head = f.read(_HEAD_BYTES)
        f.seek(-_TAIL_BYTES, os.SEEK_END)
        return head + f.read(_TAIL_BYTES), False


def _scan_one_slow(path, strict):
    """Fallback for odd files: read it whole, parse and check it. Returns (h, w, fmt) or raises ValueError."""
    with open(path, "rb") as f:
        data = f.read()
    return _check_whole(data, strict)


def _check_whole(data, strict):
    if not data:
        raise ValueError("empty file")
    if is_jpeg(data):
        sizes, status, messages = ops.read_headers([data], 1, strict=strict)
        if int(status[0]) != 0:
            raise ValueError(header_failure(data, messages[0]))
        problem = jpeg_structure_problem(data, strict=strict)
        if problem:
            raise ValueError(problem)
        return int(sizes[0, 0]), int(sizes[0, 1]), JPEG
    with pillow_open(data) as im:
        return im.height, im.width, OTHER


def _scan_chunk(root, paths, sizes, strict):
    """Sizes and formats of some files: [(h, w, fmt) or reason str]. JPEG headers parsed natively (no GIL),
    ``strict`` as in ops.read_headers."""
    results = [None] * len(paths)
    jpeg_idx, jpeg_bufs = [], []
    for k, (rel, size) in enumerate(zip(paths, sizes)):
        path = os.path.join(root, rel)
        if size == 0:
            results[k] = "empty file"
            continue
        if size > MAX_FILE_BYTES:
            results[k] = f"file too large ({size / 2**30:.1f} GiB)"
            continue
        try:
            data, whole = _read_head_tail(path, size)
        except OSError as e:
            raise_process_limit(e, f"{path}: cannot read")  # not the file's fault: the scan must not drop it
            results[k] = f"unreadable: {(e.strerror or str(e)).lower()}"
            continue
        if is_jpeg(data):
            jpeg_idx.append((k, whole))
            jpeg_bufs.append(data)
            continue
        try:
            results[k] = _check_whole(data, strict) if whole else _scan_one_slow(path, strict)
        except (OSError, ValueError) as e:
            raise_process_limit(e, f"{path}: cannot read")
            results[k] = str(e)
    if jpeg_bufs:
        hw, status, messages = ops.read_headers(jpeg_bufs, 1, strict=strict)
        for j, (k, whole) in enumerate(jpeg_idx):
            data = jpeg_bufs[j]
            try:
                if int(status[j]) == 0:
                    problem = _head_tail_problem(data, whole, strict)
                    if problem is None:
                        results[k] = (int(hw[j, 0]), int(hw[j, 1]), JPEG)
                        continue
                    if whole:
                        results[k] = problem
                        continue
                elif whole:
                    results[k] = header_failure(data, messages[j])
                    continue
                # The head/tail did not settle it (huge metadata, trailing data): read the whole file.
                results[k] = _scan_one_slow(os.path.join(root, paths[k]), strict)
            except (OSError, ValueError) as e:
                raise_process_limit(e, f"{os.path.join(root, paths[k])}: cannot read")
                results[k] = str(e)
    return results


def _head_tail_problem(data, whole, strict):
    if whole:
        return jpeg_structure_problem(data, strict=strict)
    try:
        scan = first_scan_offset(data[:_HEAD_BYTES])
    except ValueError as e:
        return f"corrupt JPEG: {e}"
    if scan < 0:
        return "need the whole file"
    return None if not strict or data.rfind(b"\xff\xd9", _HEAD_BYTES) >= 0 else "need the whole file"


def cache_dir():
    """Where scan caches live: $FASTLOAD_CACHE_DIR, else $XDG_CACHE_HOME/fastload, else ~/.cache/fastload."""
    if os.environ.get("FASTLOAD_CACHE_DIR"):
        return os.environ["FASTLOAD_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastload")


def _cache_path(root, file_list, extensions, strict=True):
    # strict is part of the key: a file a strict=False scan accepted must be checked again by a strict one.
    ident = json.dumps([os.path.realpath(root), file_list and os.path.realpath(file_list), sorted(extensions)]
                       + ([] if strict else ["not strict"]))
    return os.path.join(cache_dir(), "scan-" + hashlib.sha256(ident.encode()).hexdigest()[:32] + ".json")


def _load_cache(path, root):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("version") != _CACHE_VERSION or data.get("root") != root:
            return {}
        return {rel: tuple(v) for rel, v in data["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}  # missing or unusable: rescan


def _save_cache(path, root, files):
    """Writes the cache atomically; a cache that cannot be written only costs a rescan next time."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".scan-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"version": _CACHE_VERSION, "root": root, "files": files}, f, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp)


def scan(listing, *, threads=None, cache=True, cache_key=None, chunk=128, strict=True):
    """Heights, widths, formats of a Listing's files and the ones that failed: (h, w, fmt arrays, {i: reason}).

    Reuses cached results of files whose (path, size, mtime, ctime) are unchanged; scans the rest on ``threads``
    threads (file reads and the native header parse release the GIL).
    """
    n = len(listing.paths)
    h = np.zeros(n, np.int64)
    w = np.zeros(n, np.int64)
    fmt = np.zeros(n, np.uint8)
    failed = {}
    cached = _load_cache(cache_key, listing.root) if cache else {}
    todo = []
    for i, (rel, size, stamp) in enumerate(zip(listing.paths, listing.sizes, listing.stamps)):
        c = cached.get(rel)
        if c is not None and c[0] == size and c[1] == stamp:
            h[i], w[i], fmt[i] = c[2], c[3], c[4]
        else:
            todo.append(i)
    if todo:
        chunks = [todo[s:s + chunk] for s in range(0, len(todo), chunk)]
        with ThreadPoolExecutor(max(1, threads or default_threads())) as pool:
            futures = [pool.submit(_scan_chunk, listing.root, [listing.paths[i] for i in c],
                                   [listing.sizes[i] for i in c], strict) for c in chunks]
            for c, fut in zip(chunks, futures):
                for i, res in zip(c, fut.result()):
                    if isinstance(res, str):
                        failed[i] = res  # never cached: a permission or a file may be fixed without a new mtime
                    else:
                        h[i], w[i], fmt[i] = res
        if cache:
            files = {rel: [listing.sizes[i], listing.stamps[i], int(h[i]), int(w[i]), int(fmt[i])]
                     for i, rel in enumerate(listing.paths) if i not in failed}
            _save_cache(cache_key, listing.root, files)
    return h, w, fmt, failed


class _FolderReader:
    def __init__(self, ds):
        self._ds = ds

    def get(self, i):
        path = self._ds.paths[i]
        try:
            # O_NONBLOCK: a FIFO put where the image was since the scan must not block the open (a hang).
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise DecodeError(f"{path}: cannot read: not a regular file", sample=path, reason="unreadable")
                return f.read()
        except OSError as e:
            raise_process_limit(e, f"{path}: cannot read")
            raise DecodeError(f"{path}: cannot read: {e.strerror or e}", sample=path, reason="unreadable") from None

    def record(self, i):
        return self._ds._record_with(self.get(i), i)

    def sources(self, indices):
        """What the native batch decoder reads: file paths, opened and read by its own threads (no GIL), and no
        checksums."""
        paths = self._ds.paths
        return [paths[i] for i in indices], None  # a folder keeps no checksums


class FolderDataset(ImageDataset):
    """Images in an ImageFolder tree (one sub-folder per class, sorted names -> labels 0..C-1), or a file list.

    Sizes come from a parallel header scan, cached under ``cache_dir()`` (never in ``root``) keyed by the files'
    path, size, mtime and ctime. Files that cannot be read or are not valid images are left out and listed in
    ``skipped`` as (path, reason), with a warning; ``on_error="raise"`` raises DataError instead. The scan checks
    headers and JPEG structure (truncation); `fastload verify` decodes every file. ``strict`` as everywhere (README,
    "What strict means"): False also keeps the JPEGs whose header libjpeg warns about and those cut short inside
    their image data, which libjpeg decodes with a warning (use it with ``FastLoader(strict=False)``).

    ``file_list``: exactly the files listed (``read_file_list``: text or CSV); ``classes``: the class names that
    fix the label numbers (e.g. ``classes=train.classes`` for a validation set missing a class).
    ``transform`` / ``target_transform`` apply to ``ds[i]`` only; FastLoader refuses a dataset that has them (it
    would not apply them): give it ``FastLoader(transform=...)``.
    """

    #: heights/widths come from these files' own headers, rescanned when a file's size, mtime or ctime changes: the
    #: loader need not compare them before sizing from them (decoders.SizeChecks); every decode still does (a file
    #: replaced since the scan)
    sizes_checked = True

    def __init__(self, root, *, file_list=None, classes=None, extensions=IMAGE_EXTENSIONS, cache=True, threads=None,
                 on_error="skip", strict=True, transform=None, target_transform=None):
        if on_error not in ("skip", "raise"):
            raise ValueError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
        super().__init__(transform, target_transform, strict=strict)
        listing = list_images(root, file_list=file_list, extensions=extensions, classes=classes)
        self.root = listing.root
        self.classes = list(listing.classes)
        key = _cache_path(self.root, file_list and os.fspath(file_list), extensions, strict)
        h, w, fmt, failed = scan(listing, threads=threads, cache=cache, cache_key=key, strict=strict)
        keep = np.array([i not in failed for i in range(len(listing.paths))], dtype=bool)
        self.skipped = sorted(listing.skipped + [(listing.paths[i], r) for i, r in failed.items()])
        self.skipped = [(os.path.join(self.root, p), r) for p, r in self.skipped]
        self.paths = [os.path.join(self.root, p) for p, k in zip(listing.paths, keep) if k]
        self.heights, self.widths, self.formats = h[keep], w[keep], fmt[keep]
        self.labels = np.asarray(listing.labels, dtype=np.int64)[keep]
        self.sizes = np.asarray(listing.sizes, dtype=np.int64)[keep]
        if self.skipped:
            msg = (f"{self.root}: {len(self.skipped)} of {len(listing.paths) + len(listing.skipped)} files "
                   f"cannot be used: " + "; ".join(f"{p}: {r}" for p, r in self.skipped[:3])
                   + (" ..." if len(self.skipped) > 3 else ""))
            if on_error == "raise":
                raise DataError(msg)
            warnings.warn(msg + " (left out; see .skipped)", stacklevel=2)
        if not self.paths:
            error = DatasetError(f"{self.root}: none of its {len(self.skipped)} image files can be read")
            error.skipped = list(self.skipped)  # `fastload verify` lists them as failures
            raise error
        empty = [c for c, n in zip(self.classes, self.class_counts()) if n == 0]
        if empty:
            warnings.warn(f"{self.root}: {len(empty)} classes have no images: {', '.join(empty[:5])}", stacklevel=2)

    @property
    def samples(self):
        """(path, label) pairs, as torchvision's ImageFolder has them."""
        return list(zip(self.paths, self.labels.tolist()))

    def sample_name(self, i):
        return self.paths[i]

    @contextlib.contextmanager
    def reader(self):
        yield _FolderReader(self)

    def _record_with(self, data, i):
        return Record(data, int(self.heights[i]), int(self.widths[i]), int(self.labels[i]), int(self.formats[i]))

    def __repr__(self):
        return f"FolderDataset({self.root!r}, {len(self)} samples, {len(self.classes)} classes)"
