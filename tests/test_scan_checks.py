"""Entropy damage that libjpeg notices only where the scan ends early: a crop that stops above that point decodes
to wrong pixels without a word. The loader reads each sample's whole scan on its first decode (decoders.ScanChecks)
and a strict pack checks every JPEG it stores, so such a sample is refused in every epoch, whatever its window."""
import os
import shutil

import lmdb
import numpy as np
import pytest
import torch

import fastload as fl
from fastload import ops
from fastload.cli import main
from fastload.datasets import DatasetError, pack
from pack_corpus import photo_tree


def _class_dirs(root):
    from pathlib import Path
    return sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith("."))


def _scan_start(data):
    sos = data.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")


def _quiet_damage(clean):
    """(damaged bytes, rows) of a one-bit flip near the top of the scan that a strict full decode refuses but a
    crop of the first ``rows`` rows decodes, with other pixels, without a warning: the case this file is about."""
    h, w = ops.read_header(clean).height, ops.read_header(clean).width
    rows = h // 3
    top = ops.decode_crop(clean, 0, 0, rows, w).numpy()
    start = _scan_start(clean)
    for at in range(start + 40, start + 4000, 37):
        for bit in (0x10, 0x04, 0x40):
            bad = bytearray(clean)
            bad[at] ^= bit
            bad = bytes(bad)
            try:
                ops.decode_crop(bad, 0, 0, h, w)
                continue  # a full decode takes it: not the case
            except fl.DecodeError:
                pass
            try:
                crop = ops.decode_crop(bad, 0, 0, rows, w).numpy()
            except fl.DecodeError:
                continue  # noticed inside the window already
            if not np.array_equal(crop, top):
                return bad, rows
    pytest.skip("no quietly damaging flip found in this photo")


@pytest.fixture(scope="module")
def damaged(imagenet_dir):
    """A clean corpus photo and its quietly damaged copy."""
    for folder in _class_dirs(imagenet_dir):
        for f in sorted(os.listdir(folder))[:5]:
            clean = open(os.path.join(folder, f), "rb").read()
            try:
                bad, rows = _quiet_damage(clean)
                return clean, bad, rows
            except pytest.skip.Exception:
                continue
    pytest.skip("no quietly damaging flip found")


def _decode(data, window, whole):
    out = torch.zeros(int(window[2] * window[3] * 3), dtype=torch.uint8)
    _, shapes, status, messages, _ = ops.C.decode_batch([data], torch.tensor([window]), out, 1, True, 0, 0, None,
                                                        torch.tensor([whole]))
    return int(status[0]), messages, out[:int(shapes[0].prod())]


def test_a_whole_scan_decode_refuses_what_a_crop_lets_through(damaged):
    clean, bad, rows = damaged
    w = ops.read_header(clean).width
    window = [0, 0, rows, w, 1]
    status, _, crop = _decode(bad, window, whole=False)
    assert status == ops.OK  # libjpeg's limit: the damage shows only at the scan's end
    _, _, clean_crop = _decode(clean, window, whole=False)
    assert not torch.equal(crop, clean_crop)  # ...and the pixels are wrong
    status, messages, _ = _decode(bad, window, whole=True)
    assert status == ops.CORRUPT and "Corrupt JPEG data" in messages[0]


@pytest.mark.parametrize("window", [[0, 0, 40, 60, 1], [17, 33, 120, 90, 2], [50, 8, 200, 240, 4]])
def test_a_whole_scan_decode_gives_the_crops_pixels(imagenet_dir, window):
    """The same bits with and without the whole-scan read, on a plain file and on its restart-marker copy (whose
    crops otherwise decode only the segments around the window)."""
    path = _class_dirs(imagenet_dir)[0]
    data = open(os.path.join(path, sorted(os.listdir(path))[0]), "rb").read()
    import io
    from PIL import Image
    progressive = io.BytesIO()
    Image.open(io.BytesIO(data)).save(progressive, "JPEG", quality=90, progressive=True)
    for variant in (data, ops.add_restart_markers(data), progressive.getvalue()):
        status_a, _, a = _decode(variant, window, whole=False)
        status_b, _, b = _decode(variant, window, whole=True)
        assert status_a == status_b == ops.OK and torch.equal(a, b)


def _folder(tmp_path, imagenet_dir, bad):
    root = photo_tree(imagenet_dir, tmp_path / "photos", png=False)
    victim = sorted(_class_dirs(root)[0].iterdir())[0]
    victim.write_bytes(bad)
    return root, victim


def test_the_loader_refuses_a_quietly_damaged_file_in_every_epoch(damaged, imagenet_dir, tmp_path):
    """Before: most epochs' crops of it (those above the damage's detection point) came out wrong without a word,
    the others raised. Now its first decode reads the whole scan: refused in every epoch; skipped in every epoch."""
    _, bad, _ = damaged
    root, victim = _folder(tmp_path, imagenet_dir, bad)
    ds = fl.FolderDataset(root)
    loader = fl.FastLoader(ds, batch_size=8, crop=fl.RandomResizedCrop(64), threads=2)
    for epoch in range(4):
        loader.set_epoch(epoch)
        with pytest.raises(fl.DecodeError, match=f"{victim.name}.*Corrupt JPEG data") as e:
            for _ in loader:
                pass
        assert os.path.samefile(e.value.sample, victim)
    skipping = fl.FastLoader(ds, batch_size=8, crop=fl.RandomResizedCrop(64), threads=2, on_error="skip")
    for epoch in range(4):
        skipping.set_epoch(epoch)
        assert sum(len(y) for _, y in skipping) == len(ds) and skipping.stats()["skipped"] >= 1
    # the good samples passed their first decode's check: later epochs crop them without reading the whole scan
    checks = skipping._maker._parts["scan checks"]
    bad_index = [i for i in range(len(ds)) if os.path.samefile(ds.sample_name(i), victim)]
    assert len(bad_index) == 1
    assert checks.passed.sum() == len(ds) - 1 and not checks.passed[bad_index].any()


def test_whole_scans_are_read_once_per_sample(imagenet_dir, tmp_path, monkeypatch):
    root = photo_tree(imagenet_dir, tmp_path / "photos", png=False)
    seen = []
    for name in ("decode_batch", "decode_batch_start"):  # one decode thread: the first; several: the second
        def spy(*args, native=getattr(ops.C, name)):
            seen.append(0 if args[8] is None else int(args[8].sum()))  # whole_scan (sizes follow it)
            return native(*args)
        monkeypatch.setattr(ops.C, name, spy)
    ds = fl.FolderDataset(root)
    loader = fl.FastLoader(ds, batch_size=8, crop=fl.RandomResizedCrop(64), threads=2)

    def epochs(*which):
        seen.clear()
        for epoch in which:
            loader.set_epoch(epoch)
            for _ in loader:
                pass
        return sum(seen)
    # Every sample at least once (the next epoch's first batches, which the loader starts ahead, may decode a
    # sample before its check in this epoch has passed: then it is checked twice), then never again.
    assert epochs(0, 1) >= len(ds)
    assert loader._maker._parts["scan checks"].passed.all()
    assert epochs(2, 3) == 0
    # a non-strict loader lets the warnings through anyway: no whole-scan reads
    seen.clear()
    for _ in fl.FastLoader(ds, batch_size=8, crop=fl.RandomResizedCrop(64), strict=False):
        pass
    assert sum(seen) == 0


def test_a_strict_pack_checks_every_scan_and_its_store_says_so(damaged, imagenet_dir, tmp_path, monkeypatch):
    _, bad, _ = damaged
    root, victim = _folder(tmp_path, imagenet_dir, bad)
    result = pack(root, tmp_path / "s.lmdb", progress=False, log=lambda m: None)
    reasons = dict(result.skipped)
    why = next(r for p, r in reasons.items() if os.path.samefile(os.path.join(root, p), victim))
    assert why.startswith("Corrupt JPEG data") and "corrupt JPEG data: Corrupt" not in why  # said once
    ds = fl.LMDBDataset(result.path)
    assert ds.scans_checked and len(ds) == result.files - 1
    # the loader trusts such a store: no whole-scan reads
    seen = []
    natives = {name: getattr(ops.C, name) for name in ("decode_batch", "decode_batch_start")}
    for name, native in natives.items():  # one decode thread calls the first, several the second
        monkeypatch.setattr(ops.C, name, lambda *a, native=native: seen.append(a[8]) or native(*a))  # whole_scan
    for _ in fl.FastLoader(ds, batch_size=8, crop=fl.RandomResizedCrop(64)):
        pass
    assert seen and all(w is None for w in seen)
    # --no-strict keeps the file, the store does not vouch for its scans, and a strict loader checks them
    loose = pack(root, tmp_path / "loose.lmdb", strict=False, progress=False, log=lambda m: None)
    ds = fl.LMDBDataset(loose.path)
    assert not ds.scans_checked and len(ds) == loose.files
    for name, native in natives.items():
        monkeypatch.setattr(ops.C, name, native)
    for epoch in range(2):
        loader = fl.FastLoader(ds, batch_size=8, crop=fl.RandomResizedCrop(64), seed=epoch)
        with pytest.raises(fl.DecodeError, match="Corrupt JPEG data"):
            for _ in loader:
                pass


def test_a_file_name_that_is_not_utf8_is_read(imagenet_dir, tmp_path):
    """os.scandir lists it as surrogate escapes; the native reader opens the bytes on disk (it failed every batch
    that held it, with a pybind11 cast error naming no sample)."""
    root = photo_tree(imagenet_dir, tmp_path / "photos", png=False)
    folder = _class_dirs(root)[0]
    first = sorted(folder.iterdir())[0]
    os.rename(first, os.path.join(os.fsencode(folder), b"caf\xe9.jpg"))
    ds = fl.FolderDataset(root)
    assert any("caf\udce9.jpg" in ds.sample_name(i) for i in range(len(ds)))
    x, y = next(iter(fl.FastLoader(ds, batch_size=len(ds), crop=fl.CenterCrop(64), shuffle=False)))
    assert x.shape[0] == len(ds)


def test_force_never_deletes_an_lmdb_database_fastload_did_not_make(imagenet_dir, tmp_path):
    root = photo_tree(imagenet_dir, tmp_path / "photos", png=False)
    other = tmp_path / "other.lmdb"
    with lmdb.open(str(other)) as env, env.begin(write=True) as txn:
        txn.put(b"precious", b"data")
    with pytest.raises(DatasetError, match="not a fastload store"):
        pack(root, other, force=True, progress=False, log=lambda m: None)
    assert main(["pack", str(root), str(other), "--force", "-q"]) == 2
    with lmdb.open(str(other), readonly=True) as env, env.begin() as txn:
        assert txn.get(b"precious") == b"data"
    store = pack(root, tmp_path / "s.lmdb", progress=False, log=lambda m: None).path
    pack(root, store, force=True, progress=False, log=lambda m: None)  # a fastload store: replaced
    assert len(fl.LMDBDataset(store)) > 0


def test_force_refuses_a_truncated_lmdb_database_without_reading_past_its_end(imagenet_dir, tmp_path):
    """A truncated data.mdb is read past its end (SIGBUS) by any look at its keys: --force leaves it, saying why."""
    root = photo_tree(imagenet_dir, tmp_path / "photos", png=False)
    store = pack(root, tmp_path / "s.lmdb", progress=False, log=lambda m: None).path
    data = os.path.join(store, "data.mdb")
    os.truncate(data, os.path.getsize(data) // 2)
    with pytest.raises(DatasetError, match="truncated LMDB database"):
        pack(root, store, force=True, progress=False, log=lambda m: None)


@pytest.mark.cuda
def test_the_engines_check_spares_the_cores_a_second_scan(imagenet_dir):
    """decoder="nvjpeg" verifies each JPEG's whole scan (ops.verify_jpegs) before the engines take it: the cores'
    first-decode check counts it as done."""
    ds = fl.FolderDataset(imagenet_dir)
    loader = fl.FastLoader(ds, batch_size=16, crop=fl.RandomResizedCrop(64), device="cuda", decoder="nvjpeg")
    for _ in loader:
        pass
    engines, checks = loader._maker._parts["engines"], loader._maker._parts["scan checks"]
    verified = engines.decodable == 2  # VERIFIED
    assert verified.sum() > len(ds) // 2 and checks.passed[verified].all()


def test_a_damaged_index_is_caught_at_the_read(imagenet_dir, tmp_path):
    """The loader plans crops and labels from the metadata's index; a record that disagrees with it (a damaged
    index: wrong size or label) is refused naming the sample, not cropped at the wrong size or mislabelled."""
    from fastload.datasets.record import META_KEY, decode_index, dumps, encode_index, loads
    root = photo_tree(imagenet_dir, tmp_path / "photos", png=False)
    store = pack(root, tmp_path / "s.lmdb", progress=False, log=lambda m: None).path
    with lmdb.open(store) as env, env.begin(write=True) as txn:
        meta = loads(txn.get(META_KEY))
        arrays = {k: np.array(v) for k, v in decode_index(meta["index"], meta["count"]).items()}
        arrays["labels"][2] = (arrays["labels"][2] + 1) % len(meta["classes"])
        meta["index"] = encode_index(**arrays)
        txn.put(META_KEY, dumps(meta))
    ds = fl.LMDBDataset(store)
    with pytest.raises(fl.DecodeError, match=r"\[2\].*record header disagrees with the store's index"):
        for _ in fl.FastLoader(ds, batch_size=8, crop=fl.CenterCrop(64), shuffle=False):
            pass
    n = sum(len(y) for _, y in fl.FastLoader(ds, batch_size=8, crop=fl.CenterCrop(64), on_error="skip"))
    assert n == len(ds)
    for read in (lambda: ds[2], lambda: ds.record(2)):  # the single-record reads check it too
        with pytest.raises(fl.DecodeError, match="disagrees with the store's index"):
            read()


def test_a_relabelled_store_loads_its_new_labels(imagenet_dir, tmp_path):
    """The check compares records with the index as packed, not with ds.labels, which a user may replace."""
    root = photo_tree(imagenet_dir, tmp_path / "photos", png=False)
    ds = fl.LMDBDataset(pack(root, tmp_path / "s.lmdb", progress=False, log=lambda m: None).path)
    ds.labels = np.asarray(ds.labels) + 10
    y = torch.cat([y for _, y in fl.FastLoader(ds, batch_size=8, crop=fl.CenterCrop(64), shuffle=False)])
    assert torch.equal(y, torch.as_tensor(ds.labels))
