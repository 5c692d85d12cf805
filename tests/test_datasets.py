"""FolderDataset and LMDBDataset on real photos: indexes, decoding, caching, broken files, errors, DataLoader."""
import io
import mmap
import os
import pickle
import shutil
import time
import zlib
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

import fastload
from fastload.datasets import DataError, DatasetError, FolderDataset, LMDBDataset, pack
from fastload.datasets import folder as folder_mod
from fastload.datasets import lmdb as lmdb_reader
from fastload.datasets.record import HEADER_SIZE, META_KEY, dumps, loads, record_key
from pack_corpus import add_broken, jpeg_files, photo_tree


@pytest.fixture(scope="module")
def ds_tree(imagenet_dir, tmp_path_factory):
    """The real-photo corpus (4 classes x 12 JPEGs) plus one PNG, in a folder of this module's own."""
    return photo_tree(imagenet_dir, tmp_path_factory.mktemp("ds") / "photos")


@pytest.fixture(scope="module")
def ds_store(ds_tree, tmp_path_factory):
    return pack(ds_tree, tmp_path_factory.mktemp("store") / "photos.lmdb", progress=False, log=lambda m: None).path


def pillow_rgb(path_or_bytes):
    src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, (bytes, memoryview)) else path_or_bytes
    with Image.open(src) as im:
        return torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1)


def test_folder_index_matches_files_and_imagefolder(ds_tree):
    from torchvision.datasets import ImageFolder

    ds = FolderDataset(ds_tree)
    ref = ImageFolder(ds_tree)
    assert ds.classes == ref.classes == ["class_00", "class_01", "class_02", "class_03"]
    assert ds.class_to_idx == ref.class_to_idx
    assert ds.samples == [(p, t) for p, t in ref.samples]  # same order, same labels
    assert len(ds) == 49 and ds.skipped == []
    for arr, dtype in ((ds.heights, np.int64), (ds.widths, np.int64), (ds.labels, np.int64), (ds.formats, np.uint8)):
        assert arr.dtype == dtype and arr.shape == (49,)
    for i, path in enumerate(ds.paths):
        with Image.open(path) as im:
            assert (ds.heights[i], ds.widths[i]) == (im.height, im.width)
            assert ds.formats[i] == (0 if im.format == "JPEG" else 1)
    assert ds.formats.sum() == 1  # the PNG
    assert ds.sample_name(3) == ds.paths[3]


def test_getitem_equals_pillow_and_works_with_torchvision(ds_tree):
    from torchvision.transforms import v2

    ds = FolderDataset(ds_tree)
    for i in range(len(ds)):
        img, label = ds[i]
        assert img.dtype == torch.uint8 and img.shape == (3, ds.heights[i], ds.widths[i])
        assert torch.equal(img, pillow_rgb(ds.paths[i])), ds.paths[i]
        assert label == ds.labels[i]
    assert torch.equal(ds[-1][0], ds[len(ds) - 1][0])
    with pytest.raises(IndexError):
        ds[len(ds)]
    tds = FolderDataset(ds_tree, transform=v2.Compose([v2.RandomResizedCrop(64), v2.ToDtype(torch.float32, scale=True)]))
    x, y = tds[0]
    assert x.shape == (3, 64, 64) and x.dtype == torch.float32 and y == 0


def test_folder_record_and_reader(ds_tree):
    ds = FolderDataset(ds_tree)
    rec = ds.record(5)
    assert isinstance(rec, fastload.datasets.Record)
    assert rec.data == Path(ds.paths[5]).read_bytes()
    assert (rec.height, rec.width, rec.label, rec.format) == (ds.heights[5], ds.widths[5], ds.labels[5], 0)
    with ds.reader() as r:
        assert bytes(r.get(7)) == Path(ds.paths[7]).read_bytes()


def test_scan_cache_lives_outside_the_data_and_is_reused(imagenet_dir, tmp_path, monkeypatch):
    tree = photo_tree(imagenet_dir, tmp_path / "t", png=False)
    before = sorted(p for p in tree.rglob("*"))
    first = FolderDataset(tree)
    assert sorted(p for p in tree.rglob("*")) == before  # nothing written into the user's folder
    caches = list((tmp_path / "scan-cache").glob("*.json"))
    assert len(caches) == 1

    scanned = []
    real = folder_mod._scan_chunk

    def spy(root, paths, sizes, strict):
        scanned.extend(paths)
        return real(root, paths, sizes, strict)

    monkeypatch.setattr(folder_mod, "_scan_chunk", spy)
    second = FolderDataset(tree)
    assert scanned == [] and np.array_equal(second.heights, first.heights)
    # A changed file is rescanned, alone.
    changed = jpeg_files(tree)[3]
    with Image.open(changed) as im:
        im.resize((123, 77)).save(changed, quality=90)
    os.utime(changed, ns=(time.time_ns(), time.time_ns() + 10**9))
    third = FolderDataset(tree)
    assert scanned == [str(changed.relative_to(tree))]
    i = third.paths.index(str(changed))
    assert (third.heights[i], third.widths[i]) == (77, 123)
    # Replaced by another image of the same byte count, its mtime set back (as cp -p, rsync -a, tar x do): the
    # ctime still moved, so it is rescanned, not given its old cached size.
    scanned.clear()
    other = jpeg_files(tree)[5]
    old, st = other.read_bytes(), other.stat()
    buf = io.BytesIO()
    with Image.open(other) as im:
        im.resize((64, 48)).save(buf, "JPEG", quality=90)
    new = buf.getvalue()
    assert len(new) < len(old)
    other.write_bytes(new + b"\0" * (len(old) - len(new)))  # padding after EOI: the same size on disk
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    fourth = FolderDataset(tree)
    assert scanned == [str(other.relative_to(tree))]
    i = fourth.paths.index(str(other))
    assert (fourth.heights[i], fourth.widths[i]) == (48, 64)
    scanned.clear()
    FolderDataset(tree, cache=False)
    assert len(scanned) == len(first)


def test_extensions_hidden_symlinks_and_magic(ds_tree, tmp_path):
    jpgs = jpeg_files(ds_tree)
    root = tmp_path / "tree"
    (root / "a" / "sub").mkdir(parents=True)
    (root / "b").mkdir()
    (root / ".hidden_class").mkdir()
    (root / ".ipynb_checkpoints").mkdir()  # a hidden folder without images: no class
    shutil.copy(jpgs[0], root / "a" / "UPPER.JPG")
    shutil.copy(jpgs[1], root / "a" / "sub" / "x.jpeg")
    shutil.copy(jpgs[2], root / "a" / "really_a_jpeg.png")  # named .png, detected as JPEG by its bytes
    shutil.copy(jpgs[3], root / "a" / ".hidden.jpg")
    shutil.copy(jpgs[4], root / ".hidden_class" / "y.jpg")
    shutil.copy(jpgs[6], root / "b" / "not_an_imagefolder_extension.jfif")
    (root / "a" / "readme.txt").write_text("not an image extension: ignored")
    os.symlink(root / "a", root / "a" / "sub" / "loop")  # a cycle: must not be walked forever
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(jpgs[5], outside / "z.jpg")
    os.symlink(outside, root / "b" / "linked")  # symlinked folders are followed
    ds = FolderDataset(root)
    rel = [os.path.relpath(p, root) for p in ds.paths]
    assert rel == [".hidden_class/y.jpg", "a/.hidden.jpg", "a/UPPER.JPG", "a/really_a_jpeg.png", "a/sub/x.jpeg",
                   "b/linked/z.jpg"]
    assert ds.classes == [".hidden_class", "a", "b"]
    assert ds.labels.tolist() == [0, 1, 1, 1, 1, 2]
    assert ds.formats.tolist() == [0] * 6
    assert all(torch.equal(ds[i][0], pillow_rgb(ds.paths[i])) for i in range(len(ds)))
    os.remove(root / "a" / "sub" / "loop")  # torchvision's walk does not stop at a cycle
    shutil.rmtree(root / ".ipynb_checkpoints")  # ImageFolder refuses a class folder without images
    tv = torchvision.datasets.ImageFolder(str(root))
    ds = FolderDataset(root, cache=False)
    assert ds.classes == tv.classes
    assert [(os.path.relpath(p, root), y) for p, y in zip(ds.paths, ds.labels.tolist())] == \
        [(os.path.relpath(p, root), y) for p, y in tv.samples]


def test_broken_files_are_left_out_and_reported(imagenet_dir, tmp_path):
    tree = photo_tree(imagenet_dir, tmp_path / "t", png=False)
    expected = add_broken(tree, jpeg_files(tree)[0])
    with pytest.warns(UserWarning, match="cannot be used"):
        ds = FolderDataset(tree)
    assert len(ds) == 48
    got = {os.path.relpath(p, tree): reason for p, reason in ds.skipped}
    assert set(got) == set(expected)
    for rel, fragment in expected.items():
        assert fragment.lower() in got[rel].lower(), (rel, got[rel])
    assert not any(p.endswith(tuple(expected)) for p in ds.paths)
    with pytest.raises(DataError, match="empty.jpg: empty file"):
        FolderDataset(tree, on_error="raise")


def test_unreadable_file_is_reported(imagenet_dir, tmp_path, monkeypatch):
    tree = photo_tree(imagenet_dir, tmp_path / "t", png=False)
    locked = tree / "class_00" / "locked.jpg"
    shutil.copy(jpeg_files(tree)[0], locked)
    os.chmod(locked, 0)
    if os.geteuid() == 0:  # root reads a chmod 000 file anyway: make opening it fail the way it would for a user
        import builtins
        import importlib

        pack_mod = importlib.import_module("fastload.datasets.pack")  # the module (the package exports the function)

        def guarded_open(path, *args, **kwargs):
            if os.fspath(path) == str(locked):
                raise PermissionError(13, "Permission denied", str(path))
            return builtins.open(path, *args, **kwargs)

        real_os_open = os.open

        def guarded_os_open(path, flags, *args, **kwargs):  # pack opens files non-blocking, through os.open
            if os.fspath(path) == str(locked):
                raise PermissionError(13, "Permission denied", str(path))
            return real_os_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(folder_mod, "open", guarded_open, raising=False)
        monkeypatch.setattr(pack_mod.os, "open", guarded_os_open)
    with pytest.warns(UserWarning, match="locked.jpg: unreadable: permission denied"):
        ds = FolderDataset(tree)
    assert len(ds) == 48
    result = pack(tree, tmp_path / "s.lmdb", progress=False, log=lambda m: None)
    assert result.records == 48 and result.skipped == [("class_00/locked.jpg", "unreadable: permission denied")]


def test_folder_errors_name_the_folder(tmp_path, ds_tree):
    with pytest.raises(DatasetError, match=f"{tmp_path / 'missing'}: no such folder"):
        FolderDataset(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match=f"{empty}: no class folders"):
        FolderDataset(empty)
    loose = tmp_path / "loose"
    loose.mkdir()
    shutil.copy(jpeg_files(ds_tree)[0], loose / "a.jpg")
    with pytest.raises(DatasetError, match="1 images directly inside"):
        FolderDataset(loose)
    no_images = tmp_path / "no_images"
    (no_images / "cat").mkdir(parents=True)
    (no_images / "cat" / "notes.txt").write_text("x")
    with pytest.raises(DatasetError, match=f"{no_images}: no images in its 1 class folders"):
        FolderDataset(no_images)
    assert issubclass(DatasetError, ValueError)


def test_file_list(ds_tree, tmp_path):
    jpgs = jpeg_files(ds_tree)
    spaced = tmp_path / "with space.jpg"
    shutil.copy(jpgs[0], spaced)
    shutil.copy(jpgs[1], tmp_path / "b.jpg")
    lst = tmp_path / "list.txt"
    lst.write_text(f"# comment\nwith space.jpg 2\nb.jpg 0\n\nmissing.jpg 1\n")
    with pytest.warns(UserWarning):
        ds = FolderDataset(tmp_path, file_list=lst)
    assert ds.paths == [str(spaced), str(tmp_path / "b.jpg")]
    assert ds.labels.tolist() == [2, 0] and ds.classes == ["0", "1", "2"]
    assert "missing.jpg" in ds.skipped[0][0]
    lst.write_text("with space.jpg dog\nb.jpg cat\n")
    ds = FolderDataset(tmp_path, file_list=lst)
    assert ds.classes == ["cat", "dog"] and ds.labels.tolist() == [1, 0]
    lst.write_text("b.jpg\n")
    with pytest.raises(DatasetError, match="list.txt:1: expected 'relative/path label'"):
        FolderDataset(tmp_path, file_list=lst)


def test_csv_file_list_with_header(ds_tree, tmp_path):
    jpgs = jpeg_files(ds_tree)
    shutil.copy(jpgs[0], tmp_path / "a, b.jpg")  # a comma in a path: quoted in CSV
    shutil.copy(jpgs[1], tmp_path / "c.jpg")
    lst = tmp_path / "val.csv"
    lst.write_text('id,label,path\n7,dog,"a, b.jpg"\n8,cat,c.jpg\n')  # columns found by name, others ignored
    ds = FolderDataset(tmp_path, file_list=lst)
    assert ds.paths == [str(tmp_path / "a, b.jpg"), str(tmp_path / "c.jpg")]
    assert ds.classes == ["cat", "dog"] and ds.labels.tolist() == [1, 0]
    assert ds[0][0].shape[1:] == Image.open(jpgs[0]).size[::-1]
    lst.write_text("path,label\nc.jpg\n")
    with pytest.raises(DatasetError, match=r"val.csv:2: expected the columns path,label, got 'c.jpg'"):
        FolderDataset(tmp_path, file_list=lst)
    lst.write_text("c.jpg,1\n")  # CSV without its header: the message says what is missing
    with pytest.raises(DatasetError, match="val.csv:1: .*a CSV file list starts with a header line"):
        FolderDataset(tmp_path, file_list=lst)
    lst.write_bytes(b"\xef\xbb\xbfpath,label\nc.jpg,cat\n")  # spreadsheets' "CSV UTF-8" starts with a BOM
    assert FolderDataset(tmp_path, file_list=lst).paths == [str(tmp_path / "c.jpg")]
    lst.write_bytes("path,label\nc.jpg,cat\nd\u00e9j\u00e0.jpg,dog\n".encode("latin-1"))  # not UTF-8: named
    with pytest.raises(DatasetError, match=r"val.csv:3: the file list is not UTF-8 text \(byte 0xe9\)"):
        FolderDataset(tmp_path, file_list=lst)


def test_classes_keep_label_numbers_when_a_class_is_missing(ds_tree, tmp_path):
    """A validation set without one of the training classes: without classes= its labels shift silently (the
    sorted names it has), with classes=train.classes they are the training numbers."""
    train = FolderDataset(ds_tree)
    val = tmp_path / "val"
    for name in ("class_00", "class_02", "class_03"):  # no class_01
        shutil.copytree(ds_tree / name, val / name)
    shifted = FolderDataset(val)
    assert shifted.classes == ["class_00", "class_02", "class_03"] and shifted.labels.max() == 2
    with pytest.warns(UserWarning, match="1 classes have no images: class_01"):
        kept = FolderDataset(val, classes=train.classes)
    assert kept.classes == train.classes
    for path, label in kept.samples:
        assert train.classes[label] == Path(path).parent.name
    # The same with a file list of class names.
    lst = tmp_path / "val.csv"
    lst.write_text("path,label\n" + "".join(f"{p},{Path(p).parent.name}\n" for p, _ in shifted.samples))
    assert FolderDataset(val, file_list=lst).labels.tolist() == shifted.labels.tolist()
    listed = FolderDataset(val, file_list=lst, classes=train.classes)
    assert listed.labels.tolist() == kept.labels.tolist()
    # Integer labels are checked against the classes given.
    lst.write_text("class_00/img_0000.jpg 4\n")
    with pytest.raises(DatasetError, match="val.csv:1: label 4 is out of range for the 4 classes given"):
        FolderDataset(val, file_list=lst, classes=train.classes)
    lst.write_text("class_00/img_0000.jpg 3\n")
    assert FolderDataset(val, file_list=lst, classes=train.classes).labels.tolist() == [3]
    # What the classes given do not name is an error, not a new label.
    lst.write_text("class_00/img_0000.jpg class_09\n")
    with pytest.raises(DatasetError, match="val.csv:1: label 'class_09' is not among the 4 classes given"):
        FolderDataset(val, file_list=lst, classes=train.classes)
    with pytest.raises(DatasetError, match="class folder.s. class_03 not among the 3 classes given"):
        FolderDataset(val, classes=train.classes[:3])
    with pytest.raises(DatasetError, match="class_00 more than once"):
        FolderDataset(val, classes=["class_00"] * 2 + train.classes[2:])


def test_lmdb_equals_folder_byte_for_byte(ds_tree, ds_store):
    folder = FolderDataset(ds_tree)
    store = LMDBDataset(ds_store)
    assert len(store) == len(folder) == 49
    assert store.classes == folder.classes and store.class_to_idx == folder.class_to_idx
    for name in ("heights", "widths", "labels", "formats"):
        a, b = getattr(store, name), getattr(folder, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    with store.reader() as r:
        for i in range(len(store)):
            view = r.get(i)
            assert isinstance(view, memoryview)
            assert bytes(view) == Path(folder.paths[i]).read_bytes()
            rec = r.record(i)
            assert (rec.height, rec.width, rec.label, rec.format) == folder.record(i)[1:]
    rec = store.record(4)
    assert isinstance(rec.data, bytes) and rec.data == Path(folder.paths[4]).read_bytes()
    for i in (0, 13, len(store) - 1):
        img, label = store[i]
        assert torch.equal(img, folder[i][0]) and label == folder.labels[i]
    png = int(np.flatnonzero(store.formats == 1)[0])
    assert torch.equal(store[png][0], pillow_rgb(folder.paths[png]))
    assert store.sample_name(7) == f"{ds_store}[7] (from {folder.paths[7]})"  # names the file packed
    assert store.skipped == [] and store.meta["count"] == 49 and store.meta["class_counts"] == [12, 13, 12, 12]


class _Pair:  # picklable collate: samples have different sizes
    def __call__(self, batch):
        return [b[0].shape for b in batch], torch.tensor([b[1] for b in batch])


def test_lmdb_with_dataloader_workers(ds_store):
    ds = LMDBDataset(ds_store)
    ds[0]  # the parent opens its environment before the fork: each worker must open its own
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, collate_fn=_Pair())
    shapes, labels = [], []
    for s, y in loader:
        shapes += s
        labels.append(y)
    assert torch.cat(labels).tolist() == ds.labels.tolist()
    assert [tuple(s[1:]) for s in shapes] == list(zip(ds.heights.tolist(), ds.widths.tolist()))
    clone = pickle.loads(pickle.dumps(ds))  # spawn-started workers get a pickled copy
    assert torch.equal(clone[3][0], ds[3][0])


def _write_meta(path, change):
    env = lmdb.open(str(path), lock=False)
    with env.begin(write=True) as txn:
        meta = loads(txn.get(META_KEY))
        change(meta)
        txn.put(META_KEY, dumps(meta))
    env.close()


def test_lmdb_refuses_what_is_not_a_finished_store(ds_store, tmp_path):
    with pytest.raises(DatasetError, match="no such store"):
        LMDBDataset(tmp_path / "nothing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(DatasetError, match="not a fastload store"):
        LMDBDataset(tmp_path / "plain")
    (tmp_path / "file.mdb").write_bytes(b"x" * 100)
    with pytest.raises(DatasetError, match="not a fastload store"):
        LMDBDataset(tmp_path / "file.mdb")
    other = lmdb.open(str(tmp_path / "other"))
    with other.begin(write=True) as txn:
        txn.put(b"key", b"value")
    other.close()
    with pytest.raises(DatasetError, match="without fastload metadata"):
        LMDBDataset(tmp_path / "other")
    newer = tmp_path / "newer.lmdb"
    shutil.copytree(ds_store, newer)
    _write_meta(newer, lambda m: m.update(version=99))
    with pytest.raises(DatasetError, match="newer fastload .*version 99"):
        LMDBDataset(newer)
    unfinished = tmp_path / "u.lmdb"
    shutil.copytree(ds_store, str(unfinished) + ".partial")
    with pytest.raises(DatasetError, match="did not finish.*--resume"):
        LMDBDataset(unfinished)
    with pytest.raises(DatasetError, match="unfinished pack.*--resume"):
        LMDBDataset(str(unfinished) + ".partial")


def test_damaged_record_raises_decode_error_naming_it(ds_store, tmp_path):
    damaged = tmp_path / "damaged.lmdb"
    shutil.copytree(ds_store, damaged)
    env = lmdb.open(str(damaged), lock=False)
    with env.begin(write=True) as txn:
        value = bytearray(txn.get(record_key(2)))
        value[0:4] = b"XXXX"
        txn.put(record_key(2), bytes(value))
        txn.delete(record_key(3))
    env.close()
    ds = LMDBDataset(damaged)
    folder = FolderDataset(ds.meta["source"])  # the store's record i was packed from the folder's file i
    with pytest.raises(fastload.DecodeError) as e:
        ds[2]
    assert str(e.value).startswith(f"{damaged}[2] (from {folder.paths[2]}): ") and "damaged store" in str(e.value)
    assert e.value.sample == f"{damaged}[2] (from {folder.paths[2]})"
    with pytest.raises(fastload.DecodeError, match=rf"damaged\.lmdb\[3\] \(from .*img_0003.jpg\): record missing"):
        ds[3]
    with ds.reader() as r, pytest.raises(fastload.DecodeError, match=r"img_0003.jpg\): record missing"):
        r.sources([1, 3])  # the loader's path
    with ds.reader() as r, pytest.raises(fastload.DecodeError) as e:
        r.sources([1, 2])  # the damaged header named on the loader's path too
    assert e.value.sample == f"{damaged}[2] (from {folder.paths[2]})" and "damaged store" in str(e.value)
    assert ds[4][0].shape[0] == 3
    assert HEADER_SIZE == 24


def _lookups(monkeypatch):
    """The record indices the store's readers look up in LMDB from now on."""
    looked_up = []
    real = lmdb_reader._LMDBReader._value
    monkeypatch.setattr(lmdb_reader._LMDBReader, "_value", lambda self, i: looked_up.append(i) or real(self, i))
    return looked_up


def test_the_loaders_second_read_of_a_record_is_the_same_bytes_without_a_lookup(ds_store, monkeypatch):
    """The loader's path (reader.sources) locates each record in the mapped data file at its first read: later
    reads give the same bytes and CRC-32s, those LMDB gives (raw), without looking the record up again."""
    ds = LMDBDataset(ds_store)
    n = len(ds)
    with ds.reader() as r:
        first, first_crcs = r.sources(list(range(n)))
        first = [bytes(v) for v in first]
    looked_up = _lookups(monkeypatch)
    order = list(range(n))[::-1]
    with ds.reader() as r:
        again, crcs = r.sources(order)
    assert looked_up == []
    assert [bytes(v) for v in again] == [first[i] for i in order] and crcs == [first_crcs[i] for i in order]
    with ds.reader() as r:
        for i in range(n):
            (_, _, _, _, _, crc), data = r.raw(i)
            assert bytes(data) == first[i] and crc == first_crcs[i] == zlib.crc32(data)


def _small_store(tmp_path, imagenet_dir, tiny=3, big=1):
    """A store of ``tiny`` 8x8 JPEGs (values LMDB keeps inside a B-tree page, read first) and ``big`` photos;
    (dataset, each record's file bytes)."""
    tree = tmp_path / "photos" / "a"
    tree.mkdir(parents=True)
    for k in range(tiny):
        Image.new("RGB", (8, 8), (200, 30 * k, 90)).save(tree / f"0_tiny_{k}.jpg", quality=50)
        assert (tree / f"0_tiny_{k}.jpg").stat().st_size < 1000  # under ~2 KB: inside the page (4 KB pages)
    for k, path in enumerate(jpeg_files(imagenet_dir)[:big]):
        shutil.copy(path, tree / f"big_{k}.jpg")
    ds = LMDBDataset(pack(tmp_path / "photos", tmp_path / "s.lmdb", progress=False, log=lambda m: None).path)
    return ds, [(tree / os.path.basename(ds.source_path(i))).read_bytes() for i in range(len(ds))]


def _read_checked(ds, files, indices):
    with ds.reader() as r:
        views, crcs = r.sources(indices)
    assert [bytes(v) for v in views] == [files[i] for i in indices]
    assert crcs == [zlib.crc32(files[i]) for i in indices]


def test_records_lmdb_keeps_inside_its_pages_are_located_too(tmp_path, imagenet_dir, monkeypatch):
    """Values small enough to sit inside a B-tree page (tiny JPEGs) are located from their page's number as the
    large ones are: the second read looks nothing up, and every read gives the files' bytes."""
    ds, files = _small_store(tmp_path, imagenet_dir)
    everything = list(range(len(ds)))
    _read_checked(ds, files, everything)
    looked_up = _lookups(monkeypatch)
    _read_checked(ds, files, everything[::-1])
    assert looked_up == []


def test_a_store_whose_records_cannot_be_located_is_read_through_lmdb_and_stops_trying(ds_store, monkeypatch):
    """Where no record's place in the file can be confirmed (here every check made to fail), every read goes
    through LMDB with the right bytes, and after a bounded number of tries the reads stop trying to locate."""
    tries = []
    monkeypatch.setattr(lmdb_reader._Table, "_from_page", lambda self, address, value: tries.append(1))  # None
    ds = LMDBDataset(ds_store)
    everything = list(range(len(ds)))
    with ds.reader() as r:
        expected = [bytes(r.raw(i)[1]) for i in everything]
        # a table of its own (other tests located this store's records), theirs back after this test
        monkeypatch.setattr(r._locations, "current", None)
    counts = []
    for _ in range(4):
        with ds.reader() as r:
            assert [bytes(v) for v in r.sources(everything)[0]] == expected
        counts.append(len(tries))
    assert counts[1] == counts[2] == counts[3] <= len(ds) + lmdb_reader._Table.ATTEMPTS
    looked_up = _lookups(monkeypatch)
    with ds.reader() as r:
        r.sources(everything)
    assert looked_up == everything


def test_the_mapped_file_is_read_at_random_like_lmdbs_own_map(ds_store):
    """The store is opened with readahead=False (LMDB advises its map MADV_RANDOM: a store larger than memory must
    not fault in each record's neighbours too); the loader's mapping of the same file is advised the same."""
    smaps = Path("/proc/self/smaps")
    if not smaps.exists() or not hasattr(mmap.mmap, "madvise"):
        pytest.skip("needs /proc/self/smaps and mmap.madvise")
    ds = LMDBDataset(ds_store)
    with ds.reader() as r:
        r.sources([0, 1])
        data_file = os.path.realpath(os.path.join(ds_store, "data.mdb"))
        flags, current = [], None
        for line in smaps.read_text().splitlines():
            if "-" in line.split(" ", 1)[0] and ":" not in line.split(" ", 1)[0]:  # a mapping's first line
                current = line.split()[-1] if len(line.split()) >= 6 else None
            elif line.startswith("VmFlags:") and current == data_file:
                flags.append(line.split()[1:])
    assert len(flags) >= 2  # LMDB's map and the loader's
    assert all("rr" in f for f in flags), flags


def _strict_cases(good):
    """(junk.jpg: harmless junk bytes between two header markers, which libjpeg warns about; cut.jpg: its scan cut
    at half with the end-of-image marker put back, which passes the scan's structure check but decodes wrong)."""
    data = good.read_bytes()
    second = 4 + ((data[4] << 8) | data[5])  # past SOI and the first segment
    junk = data[:second] + b"\x00\x11\x22" + data[second:]
    sos = data.index(b"\xff\xda")
    cut = data[:sos + (len(data) - sos) // 2] + b"\xff\xd9"
    return junk, cut


def test_strict_switch_of_the_scan_and_ds_getitem(ds_tree, tmp_path):
    tree = photo_tree(ds_tree, tmp_path / "t", png=False)
    good = jpeg_files(tree)[0]
    junk, cut = _strict_cases(good)
    (tree / "class_03" / "junk.jpg").write_bytes(junk)
    (tree / "class_03" / "cut.jpg").write_bytes(cut)
    ref = pillow_rgb(good)
    for strict in (True, False):
        ds = FolderDataset(tree, strict=strict)  # the scan keeps both: header warnings are harmless, cut needs a decode
        assert ds.skipped == [] and len(ds) == 49 + 2
        j, c = ds.paths.index(str(tree / "class_03" / "junk.jpg")), ds.paths.index(str(tree / "class_03" / "cut.jpg"))
        with pytest.warns(fastload.ops.JpegWarning, match="extraneous bytes"):
            assert torch.equal(ds[j][0], ref)  # the pixels Pillow gives, with the warning reported
        if strict:
            with pytest.raises(fastload.DecodeError, match=r"cut\.jpg: .*(premature end|Corrupt)"):
                ds[c]
        else:
            with pytest.warns(fastload.ops.JpegWarning):
                assert ds[c][0].shape == ref.shape  # decoded, libjpeg filling in the missing half
    # A strict=False scan is cached apart: what it accepted is checked again by a strict scan.
    assert folder_mod._cache_path(tree, None, (".jpg",), True) != folder_mod._cache_path(tree, None, (".jpg",), False)


def test_truncated_file_is_skipped_by_a_strict_scan_only(ds_tree, tmp_path):
    """A file cut short inside its image data (no end-of-image marker): the strict scan leaves it out, named; with
    strict=False (README, "What strict means": premature end of data is decoded anyway) the dataset, `pack
    --no-strict` and FastLoader keep it and decode it as ops.decode_crop(strict=False) does, warning. A file cut
    inside its header is left out either way. Small files (read whole by the scan) and large ones (head and tail
    read first) alike."""
    tree = photo_tree(ds_tree, tmp_path / "t", png=False)
    good = jpeg_files(tree)[0].read_bytes()
    sos = good.index(b"\xff\xda")
    cut = good[:sos + (len(good) - sos) * 2 // 3]
    big = good[:sos] + b"\xff\xfe\x00\x10" + b"x" * 14 + good[sos:]  # a comment segment: still valid
    big = big[:2] + (b"\xff\xfe\xff\xff" + b"y" * 65533) * 2 + big[2:]  # > 64 KiB of header: not read whole
    cut_big = big[:len(big) - (len(good) - sos) // 3]
    (tree / "class_03" / "cut.jpg").write_bytes(cut)
    (tree / "class_03" / "cut_big.jpg").write_bytes(cut_big)
    (tree / "class_03" / "cut_header.jpg").write_bytes(good[:sos - 20])
    with pytest.warns(UserWarning, match="3 of 52 files cannot be used"):
        strict = FolderDataset(tree)
    assert sorted(os.path.relpath(p, tree) for p, _ in strict.skipped) == [
        "class_03/cut.jpg", "class_03/cut_big.jpg", "class_03/cut_header.jpg"]
    assert all("truncated JPEG" in why for _, why in strict.skipped)
    with pytest.warns(UserWarning, match="1 of 52 files cannot be used"):
        lenient = FolderDataset(tree, strict=False)
    assert [os.path.relpath(p, tree) for p, _ in lenient.skipped] == ["class_03/cut_header.jpg"]
    assert len(lenient) == len(strict) + 2
    i = lenient.paths.index(str(tree / "class_03" / "cut.jpg"))
    with pytest.warns(fastload.ops.JpegWarning, match="[Pp]remature end"):
        img = lenient[i][0]
        ref = fastload.ops.decode_crop(cut, 0, 0, *img.shape[1:], strict=False).permute(2, 0, 1)
    assert torch.equal(img, ref)
    loader = fastload.FastLoader(torch.utils.data.Subset(lenient, [i]), batch_size=1, strict=False, shuffle=False,
                                 crop=fastload.CenterCrop(32, resize=40))
    x, _ = next(iter(loader))
    assert x.shape == (1, 3, 32, 32) and loader.stats()["warnings"] == 1
    assert pack(tree, tmp_path / "lenient.lmdb", strict=False, progress=False).records == len(lenient)
    assert pack(tree, tmp_path / "strict.lmdb", progress=False).records == len(strict)

