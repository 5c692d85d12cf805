"""The decoders behind BatchMaker (fastload/decoders.py) and the native batch call they use (_C.decode_batch)."""
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastload as fl
from fastload import decoders, ops
from fastload.datasets import LMDBDataset
from fastload.datasets.pack import pack
from fastload.errors import DecodeError
from fastload.loader import LoaderStats
from fastload.producer import BatchMaker, Slot
from pack_corpus import flip_middle_byte, rewrite_record


def _junk_before_sos(jpeg):
    """A harmless defect libjpeg warns about (strict lets it through): two stray bytes before the SOS marker."""
    i = jpeg.index(b"\xff\xda")
    return jpeg[:i] + b"\x00\x01" + jpeg[i:]


@pytest.fixture()
def batch_inputs(imagenet_dir, tmp_path):
    """Sources of every kind decode_batch meets, with windows: files, buffers, a warned JPEG, a truncated one, a
    missing file, a FIFO, a CRC mismatch."""
    files = sorted(str(p) for p in Path(imagenet_dir).rglob("*.jpg"))[:6]
    data = [Path(f).read_bytes() for f in files]
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    sources = [files[0], data[1], _junk_before_sos(data[2]), data[3][:len(data[3]) // 2] + b"\xff\xd9",
               str(tmp_path / "gone.jpg"), str(fifo), data[4], files[5]]
    crcs = [-1] * len(sources)
    crcs[6] = zlib.crc32(data[4]) ^ 1  # the store says other bytes
    crcs[1] = zlib.crc32(data[1])      # and the right ones here
    rng = np.random.default_rng(0)
    windows = []
    for s in sources:
        readable = isinstance(s, bytes) or Path(s).is_file()
        header = ops.C.read_header(s if readable else data[0])  # unreadable ones: any window, never decoded
        h, w = header["height"], header["width"]
        ch, cw = int(rng.integers(8, h // 2)), int(rng.integers(8, w // 2))
        windows.append([int(rng.integers(0, h - ch)), int(rng.integers(0, w - cw)), ch, cw, int(rng.choice([1, 2, 4]))])
    return sources, torch.tensor(windows, dtype=torch.int64), torch.tensor(crcs, dtype=torch.int64)


def test_decode_batch_is_decode_crops_with_only_what_has_something_to_say(batch_inputs):
    sources, windows, crcs = batch_inputs
    out_a, offsets, shapes, status, messages = ops.decode_crops(sources, windows, threads=2, crcs=crcs)
    out_b = torch.full_like(out_a, 7)
    offsets_b, shapes_b, status_b, said, warned = ops.C.decode_batch(sources, windows, out_b, 2, True,
                                                                      ops.MAX_PIXELS, ops.MAX_BYTES, crcs)
    assert torch.equal(offsets_b, offsets) and torch.equal(shapes_b, shapes) and torch.equal(status_b, status)
    assert said == {i: m for i, m in enumerate(messages) if m}
    assert warned == sum(1 for i, m in enumerate(messages) if m and status[i] == ops.OK) == 1
    # The cases it must tell apart: decoded, warned, truncated, missing, not a regular file, checksum.
    assert status.tolist() == [ops.OK, ops.OK, ops.OK, ops.CORRUPT, ops.UNREADABLE, ops.UNREADABLE, ops.CORRUPT,
                               ops.OK]
    assert said[2].startswith(ops.WARNING_PREFIX) and "No such file" in said[4]
    assert said[5] == "cannot read: not a regular file" and said[6].startswith("checksum mismatch")
    for i in np.flatnonzero(status.numpy() == ops.OK).tolist():  # the same pixels, bit for bit
        n = int(shapes[i].prod())
        assert torch.equal(out_b[int(offsets[i]):][:n], out_a[int(offsets[i]):][:n])


def test_decode_batch_refuses_an_image_of_another_size_than_its_index(imagenet_dir):
    """sizes [B, 2]: the index's (height, width) of each image. A JPEG of another size is that sample's CORRUPT
    status naming both (a window planned from the index may still fit it and would crop the wrong part); one of the
    right size decodes as without sizes, through the region slicer too (a file with restart markers)."""
    files = sorted(Path(imagenet_dir).rglob("*.jpg"))[:2]
    plain = files[0].read_bytes()
    sources = [plain, plain, ops.add_restart_markers(plain), ops.add_restart_markers(plain), files[1].read_bytes()]
    h, w = ops.read_header(plain)[:2]
    h1, w1 = ops.read_header(sources[4])[:2]
    windows = torch.tensor([[h // 2, w // 3, 40, 40, 1]] * 4 + [[0, 0, 40, 40, 1]], dtype=torch.int64)
    sizes = torch.tensor([[h, w], [h - 16, w], [h, w], [h, w - 1], [h1, w1]], dtype=torch.int64)
    out = torch.zeros(5 * 40 * 40 * 3, dtype=torch.uint8)
    offsets, shapes, status, said, _ = ops.C.decode_batch(sources, windows, out, 2, True, ops.MAX_PIXELS,
                                                          ops.MAX_BYTES, None, None, sizes)
    assert status.tolist() == [ops.OK, ops.CORRUPT, ops.OK, ops.CORRUPT, ops.OK]
    assert said[1] == (f"its JPEG is {h}x{w} (height x width) but the dataset's heights/widths say {h - 16}x{w}: "
                       f"the index does not describe this file")
    assert said[3].startswith(f"its JPEG is {h}x{w} (height x width)") and f"say {h}x{w - 1}" in said[3]
    ref = ops.decode_crop(plain, h // 2, w // 3, 40, 40)
    for i in (0, 2):
        assert torch.equal(out[int(offsets[i]):][:40 * 40 * 3].view(40, 40, 3), ref)


def test_decode_batch_validates_before_touching_memory(batch_inputs):
    sources, windows, crcs = batch_inputs
    out = torch.empty(10, dtype=torch.uint8)
    with pytest.raises(Exception, match="decode_batch: out holds 10 bytes"):
        ops.C.decode_batch(sources, windows, out, 1, True, 0, 0, None)
    big = torch.empty(1 << 24, dtype=torch.uint8)
    with pytest.raises(Exception, match=r"decode_batch: windows must be an int64 CPU tensor of shape \[8, 5\]"):
        ops.C.decode_batch(sources, windows[:3], big, 1, True, 0, 0, None)
    with pytest.raises(Exception, match="decode_batch: 2 crcs for 8 buffers"):
        ops.C.decode_batch(sources, windows, big, 1, True, 0, 0, crcs[:2])
    with pytest.raises(Exception, match=r"decode_batch: sizes must be an int64 CPU tensor of shape \[8, 2\]"):
        ops.C.decode_batch(sources, windows, big, 1, True, 0, 0, None, None, torch.zeros(3, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="buffer 1 is not C-contiguous"):
        ops.C.decode_batch([b"", np.frombuffer(b"abcd", np.uint8)[::-2]], windows[:2], big, 1, True, 0, 0, None)


def test_decode_batch_start_returns_at_once_and_waits_for_decode_batch_s_result(batch_inputs, imagenet_dir):
    """The producers' call: decode_batch on native threads of their own, its result from wait(); an unwaited job
    dropped waits for its decode first (the buffers it writes and the views it reads stay valid until then)."""
    sources, windows, crcs = batch_inputs
    args = (2, True, ops.MAX_PIXELS, ops.MAX_BYTES, crcs)
    out_a = torch.full((1 << 24,), 7, dtype=torch.uint8)
    expected = ops.C.decode_batch(sources, windows, out_a, *args)
    out_b = torch.full_like(out_a, 7)
    job = ops.C.decode_batch_start(sources, windows, out_b, *args)
    got = job.wait()
    for a, b in zip(expected[:3], got[:3]):
        assert torch.equal(a, b)
    assert got[3:] == expected[3:] and torch.equal(out_a, out_b)
    with pytest.raises(ValueError, match="wait\\(\\) was called already"):
        job.wait()
    out_c = torch.full_like(out_a, 7)
    del job
    job = ops.C.decode_batch_start(sources, windows, out_c, *args)
    del job  # dropped unwaited: joined, so the buffer is complete once it is gone
    assert torch.equal(out_a, out_c)
    # it returns while the decode runs: the native threads are there after it returns (a batch of ~0.3 s)
    files = sorted(str(p) for p in Path(imagenet_dir).rglob("*.jpg")) * 5
    heads = [ops.C.read_header(f) for f in files]
    big = torch.tensor([[0, 0, h["height"], h["width"], 1] for h in heads], dtype=torch.int64)
    room = torch.empty(int((big[:, 2] * big[:, 3] * 3).sum()), dtype=torch.uint8)
    before = len(os.listdir("/proc/self/task"))
    job = ops.C.decode_batch_start(files, big, room, 1, True, ops.MAX_PIXELS, ops.MAX_BYTES, None)
    running = len(os.listdir("/proc/self/task"))
    status = job.wait()[2]
    assert running > before and (status == ops.OK).all()
    assert len(os.listdir("/proc/self/task")) == before
    # the same checks as decode_batch, before any thread starts
    with pytest.raises(Exception, match="decode_batch_start: out holds 10 bytes"):
        ops.C.decode_batch_start(sources, windows, torch.empty(10, dtype=torch.uint8), *args)


def _maker(dataset, decoder="cpu", on_error="raise", threads=2, size=48):
    from fastload.transforms.pipeline import Pipeline
    pipeline = Pipeline.shorthand(fl.RandomResizedCrop(size), None, None, 1.0 / 255, torch.float32)
    pipeline.set_epoch_size(0, (size, size))
    return BatchMaker(dataset, pipeline, 0, threads, on_error, True, ops.MAX_PIXELS, LoaderStats(), decoder=decoder)


def test_a_batch_abandoned_while_it_decodes_waits_for_its_threads_before_its_records_go(imagenet_dir, tmp_path,
                                                                                       monkeypatch):
    """A producer that stops with a batch decoding on its threads (Pending.close) waits for them before the store's
    read transaction ends (the native threads read the records where LMDB keeps them): when close() returns, no
    decode thread is left and the transaction is over; finishing it then is an error, not a batch."""
    pack(imagenet_dir, tmp_path / "s.lmdb", progress=False, log=lambda m: None)
    ds = LMDBDataset(tmp_path / "s.lmdb")
    maker = _maker(ds, threads=2, size=224)
    from fastload.datasets import lmdb as lmdb_module
    closed = []
    real_close = lmdb_module._LMDBReader.close

    def close(reader):
        closed.append(len(os.listdir("/proc/self/task")))  # the threads alive as the transaction ends
        real_close(reader)
    monkeypatch.setattr(lmdb_module._LMDBReader, "close", close)
    before = len(os.listdir("/proc/self/task"))
    indices = np.tile(np.arange(len(ds)), 4)  # ~0.1 s of decoding on 2 threads
    pending = maker.start(indices, 0, Slot(pin=False))
    assert not closed and len(os.listdir("/proc/self/task")) > before  # decoding, the transaction open
    pending.close()
    assert closed == [before] and len(os.listdir("/proc/self/task")) == before
    with pytest.raises(RuntimeError, match="finish"):
        pending.finish()


def test_the_decode_time_of_a_batch_leaves_out_the_producer_s_own_work_meanwhile(imagenet_dir):
    """loader.stats()'s decode_s is the batch's: the producer's planning and hand-over while its threads decode
    (here 0.5 s of sleep between start and finish) are not counted in it, and the batch is the one make() gives."""
    import time
    ds = fl.FolderDataset(imagenet_dir)
    maker = _maker(ds, threads=2)
    indices = np.arange(len(ds))
    expected = maker.make(indices, 0, Slot(pin=False))
    before = maker.stats.summary()["decode_s"]
    pending = maker.start(indices, 0, Slot(pin=False))
    time.sleep(0.5)
    batch = pending.finish()
    assert 0 < maker.stats.summary()["decode_s"] - before < 0.25  # 48 small crops: a few ms
    assert torch.equal(batch.data[:batch.nbytes], expected.data[:expected.nbytes])


@pytest.mark.parametrize("store", [False, True], ids=["folder", "lmdb"])
def test_cores_batch_is_the_native_decode_of_the_plan(imagenet_dir, tmp_path, store):
    """decoder="cpu" makes exactly the pixels ops.decode_crops gives for the planned windows, with the plan's
    matrices and the dataset's labels."""
    ds = fl.FolderDataset(imagenet_dir)
    if store:
        pack(imagenet_dir, tmp_path / "s.lmdb", progress=False, log=lambda m: None)
        ds = LMDBDataset(tmp_path / "s.lmdb")
    maker = _maker(ds)
    assert isinstance(maker.decoder, decoders.Cores)
    indices = np.random.default_rng(1).permutation(len(ds))[:20]
    batch = maker.make(indices, 0, Slot(pin=False), k=2)
    windows, matrices, _ = maker.plan(indices, 0)
    with ds.reader() as reader:
        sources, crcs = decoders.read_sources(reader, indices)
        out, offsets, shapes, status, _ = ops.decode_crops(sources, windows, crcs=crcs)
    assert status.eq(ops.OK).all() and batch.counts == {"fallback": 0, "skipped": 0, "warnings": 0}
    assert torch.equal(batch.offsets, offsets) and torch.equal(batch.shapes, shapes)
    assert torch.equal(batch.matrices, matrices) and batch.nbytes == out.numel()
    assert torch.equal(batch.data[:batch.nbytes], out)
    assert torch.equal(batch.labels, torch.as_tensor(np.asarray(ds.labels)[indices]))


def _mixed_tree(imagenet_dir, tmp_path):
    """A class folder with JPEGs, a PNG (Pillow's), a truncated JPEG and one with a harmless warning."""
    root = tmp_path / "mixed"
    (root / "a").mkdir(parents=True)
    files = sorted(Path(imagenet_dir).rglob("*.jpg"))[:6]
    for i, f in enumerate(files[:4]):
        (root / "a" / f"{i}.jpg").write_bytes(f.read_bytes())
    with Image.open(files[4]) as im:
        im.save(root / "a" / "4.png")
    data = files[5].read_bytes()
    (root / "a" / "5.jpg").write_bytes(_junk_before_sos(data))
    (root / "a" / "6.jpg").write_bytes(data[:len(data) // 2] + b"\xff\xd9")
    return root


def test_cores_route_formats_count_warnings_and_name_the_broken_sample(imagenet_dir, tmp_path):
    ds = fl.FolderDataset(_mixed_tree(imagenet_dir, tmp_path))
    names = [Path(p).name for p in ds.paths]
    broken, png = names.index("6.jpg"), names.index("4.png")
    with pytest.raises(DecodeError) as e:
        _maker(ds).make(np.arange(len(ds)), 0, Slot(pin=False))
    assert e.value.sample.endswith("6.jpg") and str(e.value) == f"{e.value.sample}: {e.value.reason}"
    windows = _maker(ds).plan(np.array([broken]), 0)[0]  # the native decoder's words, not a Python summary
    assert e.value.reason == ops.decode_crops([ds.paths[broken]], windows)[4][0] != ""
    good = np.array([i for i in range(len(ds)) if i != broken])
    batch = _maker(ds).make(good, 0, Slot(pin=False))
    assert batch.counts == {"fallback": 1, "skipped": 0, "warnings": 1}
    # The PNG's window at full resolution, Pillow's pixels, behind the JPEGs.
    p = int(np.flatnonzero(good == png)[0])
    (top, left, h, w, d), = _maker(ds).plan(good[p:p + 1], 0)[0].tolist()
    assert d == 1 and batch.shapes[p].tolist() == [h, w, 3]
    with Image.open(ds.paths[png]) as im:
        want = np.array(im.convert("RGB"))[top:top + h, left:left + w]
    got = batch.data[int(batch.offsets[p]):][:h * w * 3].view(h, w, 3).numpy()
    assert np.array_equal(got, want) and int(batch.offsets[p]) >= int(batch.offsets[np.arange(len(good)) != p].max())
    skipped = _maker(ds, on_error="skip").make(np.arange(len(ds)), 0, Slot(pin=False))
    assert skipped.counts["skipped"] >= 1 and skipped.indices[broken] != broken


def test_hybrid_keeps_todays_assignment_and_auto_resolves_in_one_place():
    made = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def start(self, indices, epoch, slot, k=0, plan=None):
            made.append((self.name, k))
            return decoders.Pending.later(lambda: k)
    hybrid = decoders.Alternating(Recorder("engines"), Recorder("cores"), decoders.HYBRID_PERIOD)
    for k in range(10):
        assert hybrid.make(None, 0, None, k) == k
    assert [name for name, _ in made] == ["engines"] * 4 + ["cores"] + ["engines"] * 4 + ["cores"]
    cpu = torch.device("cpu")
    assert decoders.resolve("auto", cpu) is decoders.KINDS["cpu"] and decoders.resolve("cpu", cpu).name == "cpu"
    # "auto" on CUDA with AUTO_CORES or more cores: the cores, whatever the GPU (no engine check needed)
    assert decoders.resolve("auto", torch.device("cuda"), decoders.AUTO_CORES) is decoders.KINDS["cpu"]
    assert decoders.resolve("auto", torch.device("cuda"), 64) is decoders.KINDS["cpu"]
    for name in ("nvjpeg", "hybrid"):
        with pytest.raises(ValueError, match=f"decoder='{name}' decodes on the GPU"):
            decoders.resolve(name, cpu)
    with pytest.raises(ValueError, match="decoder must be 'cpu', 'nvjpeg', 'hybrid' or 'auto', got 'gpu'"):
        decoders.resolve("gpu", cpu)
    # The loader's defaults come from the kind: today's numbers.
    k = decoders.KINDS
    assert (k["cpu"].workers(16, False), k["cpu"].workers(16, True), k["nvjpeg"].workers(16, True),
            k["hybrid"].workers(16, True)) == (2, 2, 2, 5)
    assert (k["cpu"].threads(16, 2, True), k["cpu"].threads(16, 2, False), k["cpu"].threads(1, 2, False),
            k["nvjpeg"].threads(16, 2, True), k["hybrid"].threads(16, 5, True),
            k["hybrid"].threads(2, 5, True)) == (8, 8, 1, 16, 5, 1)


def test_hybrid_split_follows_its_two_constants(monkeypatch, imagenet_dir):
    """decoder="hybrid": the engines take batch k when k % HYBRID_PERIOD < HYBRID_ENGINE_BATCHES (by index only),
    one producer per batch of the period, each with a third of the cores' threads."""
    made = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def start(self, indices, epoch, slot, k=0, plan=None):
            made.append(self.name)
            return decoders.Pending.later(lambda: k)
    hybrid = decoders.Alternating(Recorder("engines"), Recorder("cores"), 4, 1)
    for k in range(8):
        hybrid.make(None, 0, None, k)
    assert made == ["engines", "cores", "cores", "cores"] * 2
    monkeypatch.setattr(decoders, "HYBRID_PERIOD", 4)
    monkeypatch.setattr(decoders, "HYBRID_ENGINE_BATCHES", 1)
    kind = decoders.KINDS["hybrid"]
    assert (kind.workers(16, True), kind.threads(16, 4, True)) == (4, 16 // 3)
    # Built on one maker, the kinds share its parts: hybrid's engines fall back on its cores, and decoder="auto"
    # switching between kinds keeps one hardware handle and one set of verdicts.
    maker = _maker(fl.FolderDataset(imagenet_dir))
    built = decoders._hybrid(maker)
    assert isinstance(built.first, decoders.Engines) and isinstance(built.second, decoders.Cores)
    assert built.first.cores is built.second is maker.decoder and (built.period, built.first_batches) == (4, 1)
    assert decoders._engines(maker) is built.first and maker._decodable is built.first.decodable
    # the cores decode on the maker's threads at call time (decoder="auto" gives each kind its own count)
    maker.use(decoders.KINDS["nvjpeg"], 7)
    assert maker.decoder is built.first and maker.threads == 7


def test_auto_trial_times_each_decoder_in_the_loop_and_keeps_the_fastest():
    """decoder="auto"'s Trial: each candidate in turn, `warmup` batches untimed after its switch, then `measure`
    timed intervals (an epoch's first batch, interval None, is not one); rates are images / summed intervals; the
    fastest stays, but beats the first candidate (the rule's) only by more than `margin`."""
    def run(trial, pace, epoch_every=None):
        switches, k = [], 0
        while trial.chosen is None:
            first = epoch_every is not None and k % epoch_every == 0
            switch = trial.taken(256, None if first else pace[trial.current])
            if switch is not None:
                switches.append((k, switch))
            k += 1
        return switches, k
    pace = {"cpu": 256 / 20_000, "nvjpeg": 256 / 14_000, "hybrid": 256 / 16_000}
    trial = decoders.Trial(["cpu", "nvjpeg", "hybrid"], warmup=2, measure=3, margin=0.05, settle=0)
    switches, taken = run(trial, pace)
    # 5 batches a candidate; the cores were fastest and were last measured first: switching back to them ends it
    assert switches == [(4, "nvjpeg"), (9, "hybrid"), (14, "cpu")] and taken == 15 and trial.current == "cpu"
    assert trial.summary() == {"rates": {"cpu": 20_000.0, "nvjpeg": 14_000.0, "hybrid": 16_000.0}, "chosen": "cpu"}
    assert trial.taken(256, 1.0) is None and trial.current == "cpu"  # decided: nothing more is timed
    # An epoch's first batch inside a measuring window (k = 4, 8, 16) costs it one more batch; one in a warm-up
    # (k = 12) costs nothing; the engines win by 20%.
    trial = decoders.Trial(["cpu", "nvjpeg", "hybrid"], warmup=2, measure=3, margin=0.05, settle=0)
    switches, _ = run(trial, {"cpu": 256 / 10_000, "nvjpeg": 256 / 12_000, "hybrid": 256 / 11_000}, epoch_every=4)
    assert switches == [(5, "nvjpeg"), (11, "hybrid"), (17, "nvjpeg")] and trial.chosen == "nvjpeg"
    # Within the margin the rule's choice stays (run-to-run noise is not a reason to switch); a decoder chosen
    # last stays without a switch.
    trial = decoders.Trial(["nvjpeg", "cpu", "hybrid"], warmup=0, measure=2, margin=0.05, settle=0)
    switches, _ = run(trial, {"nvjpeg": 256 / 10_000, "cpu": 256 / 10_400, "hybrid": 256 / 9_000})
    assert switches == [(1, "cpu"), (3, "hybrid"), (5, "nvjpeg")] and trial.chosen == "nvjpeg"
    trial = decoders.Trial(["cpu", "nvjpeg", "hybrid"], warmup=0, measure=1, settle=0)
    switches, _ = run(trial, {"cpu": 1.0, "nvjpeg": 1.0, "hybrid": 0.5})
    assert switches == [(0, "nvjpeg"), (1, "hybrid")] and trial.chosen == "hybrid"
    # The margin is against the rule's choice, not the runner-up: 6% and 10% faster, the fastest wins.
    trial = decoders.Trial(["cpu", "nvjpeg", "hybrid"], warmup=0, measure=1, settle=0, margin=0.05)
    switches, _ = run(trial, {"cpu": 1 / 100, "nvjpeg": 1 / 106, "hybrid": 1 / 110})
    assert trial.chosen == "hybrid" and switches[-1] == (1, "hybrid")
    # The loop's first `settle` batches are not timed (its start is slow whatever the decoder): only the first
    # phase waits for them.
    trial = decoders.Trial(["cpu", "nvjpeg", "hybrid"], warmup=1, measure=2, settle=4)
    switches, _ = run(trial, {"cpu": 1.0, "nvjpeg": 1.0, "hybrid": 0.5})
    assert switches == [(6, "nvjpeg"), (9, "hybrid")] and trial.chosen == "hybrid"
    # A one-off stall of the loop (a recompile, a checkpoint: over 10x the mean of the other intervals) does not
    # decide; a decoder's own waits, periodic or bursty, still count in full.
    trial = decoders.Trial(["cpu", "nvjpeg", "hybrid"], warmup=0, measure=32, settle=0)
    for k in range(32):
        trial.taken(256, 256 / 20_000 if k != 7 else 30.0)
    for k in range(32):  # every 4th batch late (a slow producer)
        trial.taken(256, 256 / 30_000 if k % 4 else 256 / 5_000)
    for k in range(32):  # five producers' batches in bursts: a wait, then four at once (a loop that only loads)
        trial.taken(256, 0.0 if k % 5 else 5 * 256 / 40_000)
    assert trial.rates["cpu"] == pytest.approx(20_000) and trial.chosen == "hybrid"
    assert trial.rates["nvjpeg"] == pytest.approx(256 * 32 / (24 * 256 / 30_000 + 8 * 256 / 5_000))
    assert trial.rates["hybrid"] == pytest.approx(256 * 32 / (7 * 5 * 256 / 40_000))
    # A state_dict's choice: no trial; a decoder this loader cannot run is refused by name.
    trial = decoders.Trial(["cpu", "nvjpeg", "hybrid"])
    trial.adopt("hybrid")
    assert trial.current == "hybrid" and trial.taken(256, 0.01) is None
    with pytest.raises(ValueError, match="state chose decoder 'gpu', which this loader cannot run"):
        decoders.Trial(["cpu", "nvjpeg"]).adopt("gpu")


@pytest.mark.parametrize("name", ["batch_size", "prefetch", "workers", "max_pixels"])
def test_loader_sizes_must_be_positive_ints(imagenet_dir, name):
    """batch_size, prefetch and max_pixels have no None default to fall back on (workers=None: the decoder's
    default); max_pixels=0 would refuse every image (it was the native ops' "default", unsaid)."""
    ds = fl.FolderDataset(imagenet_dir)
    for bad in ([None, 0] if name != "workers" else [0]):
        with pytest.raises(ValueError, match=name):
            fl.FastLoader(ds, **{name: bad})


def test_auto_measures_nothing_where_there_is_nothing_to_choose(imagenet_dir):
    """decoder="auto" on the CPU (or a GPU without JPEG engines) is the cores, with no trial: stats() has no
    decoder_trial and state_dict no decoder."""
    assert decoders.trial("auto", decoders.KINDS["cpu"], torch.device("cpu")) is None
    assert decoders.trial("cpu", decoders.KINDS["cpu"], torch.device("cuda")) is None
    loader = fl.FastLoader(fl.FolderDataset(imagenet_dir), batch_size=16, decoder="auto",
                           crop=fl.RandomResizedCrop(32))
    batches = [y for _, y in loader]
    stats = loader.stats()
    assert len(batches) == len(loader) and stats["decoder"] == "cpu" and "decoder_trial" not in stats
    assert "decoder" not in loader.state_dict()


@pytest.mark.cuda
def test_engines_and_hybrid_build_through_the_interface(imagenet_dir):
    """On a GPU: decoder="nvjpeg" is Engines over Cores, "hybrid" alternates them, and a batch from either has
    the same samples and labels as decoder="cpu"'s."""
    if not torch.cuda.is_available() or not fl.nvjpeg.available("cuda")[0]:
        pytest.skip("no hardware JPEG decoder")
    ds = fl.FolderDataset(imagenet_dir)
    common = dict(batch_size=8, shuffle=False, device="cuda", crop=fl.RandomResizedCrop(32))
    cpu = [(x, y) for x, y in fl.FastLoader(ds, **common)]
    for name in ("nvjpeg", "hybrid"):
        loader = fl.FastLoader(ds, decoder=name, **common)
        assert loader.decoder == name
        got = [(x, y) for x, y in loader]
        assert [torch.equal(a[1], b[1]) for a, b in zip(got, cpu)] == [True] * len(cpu)
        gpu = loader.stats()["gpu_decoded"]
        by_engines = sum(len(y) for k, (_, y) in enumerate(cpu)
                         if k % decoders.HYBRID_PERIOD < decoders.HYBRID_ENGINE_BATCHES)
        assert 0 < by_engines < len(ds)  # 6 batches: the hybrid's engines make some, its cores the others
        assert gpu == (len(ds) if name == "nvjpeg" else by_engines), (name, gpu)


@pytest.mark.parametrize("threads, call", [(1, "decode_batch"), (2, "decode_batch_start")])
def test_a_clean_batch_costs_its_producer_one_native_call_and_no_torch_kernels(imagenet_dir, monkeypatch, threads,
                                                                              call):
    """Each torch kernel a producer calls gives the GIL up and must get it back behind the training loop's Python
    (up to the 5 ms switch interval each time): the batch path of decoders.py and producer.py calls none, only
    tensor accessors, and reads + decodes the whole batch in one native call: on the producer's thread with one
    decode thread, on threads of their own with several (the producer's own work overlaps them)."""
    import sys
    from torch.overrides import TorchFunctionMode
    ds = fl.FolderDataset(imagenet_dir)
    maker = _maker(ds, threads=threads)
    calls, ours = [], ("decoders.py", "producer.py")

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            frame = sys._getframe(1)
            while frame is not None and not frame.f_code.co_filename.endswith(ours) \
                    and "fastload" not in frame.f_code.co_filename:
                frame = frame.f_back  # the first frame outside torch: who called it
            if frame is not None and frame.f_code.co_filename.endswith(ours):
                calls.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))
    native = []
    for name in ("decode_batch", "decode_batch_start"):
        monkeypatch.setattr(ops.C, name, lambda *a, name=name, real=getattr(ops.C, name):
                            native.append((name, len(a[0]))) or real(*a))
    slot = Slot(pin=False)
    maker.make(np.arange(len(ds)), 0, slot)  # the slot's buffer allocated once (torch.empty), then reused
    native.clear()
    with Count():
        batch = maker.make(np.arange(len(ds))[::-1].copy(), 1, slot)
    assert batch.counts == {"fallback": 0, "skipped": 0, "warnings": 0}
    assert native == [(call, len(ds))] and set(calls) <= {"numpy", "numel"}, calls


def test_read_batch_reads_files_natively_with_the_readers_rules(batch_inputs, tmp_path):
    """The engines' read: files packed back to back, byte for byte; buffers left where they are; the same
    refusals as the decoders' reader (missing, not a regular file, over max_bytes, checksum)."""
    sources, _, crcs = batch_inputs
    (tmp_path / "dir.jpg").mkdir()
    sources = sources + [str(tmp_path / "dir.jpg"), sources[0]]
    crcs = torch.cat([crcs, torch.tensor([-1, zlib.crc32(Path(sources[0]).read_bytes()) ^ 1])])
    data, lengths, status, failed = ops.C.read_batch(sources, 3, 0, crcs)
    ends = np.cumsum(lengths.numpy())
    for i, s in enumerate(sources):
        if isinstance(s, bytes):
            assert lengths[i] == 0
        elif i not in failed:
            assert bytes(data[ends[i] - lengths[i]:ends[i]].numpy()) == Path(s).read_bytes()
    assert data.numel() >= ends[-1]
    # A buffer given that holds them all is used as it is; one too small is replaced.
    again, lengths2, status2, failed2 = ops.C.read_batch(sources, 2, 0, crcs, out=data)
    assert again.data_ptr() == data.data_ptr() and torch.equal(lengths2, lengths) and failed2 == failed
    small = torch.empty(10, dtype=torch.uint8)
    grown = ops.C.read_batch(sources, 2, 0, crcs, out=small)[0]
    assert grown.data_ptr() != small.data_ptr() and torch.equal(grown[:ends[-1]], data[:ends[-1]])
    assert status.tolist() == [ops.OK, ops.OK, ops.OK, ops.OK, ops.UNREADABLE, ops.UNREADABLE, ops.CORRUPT, ops.OK,
                               ops.UNREADABLE, ops.CORRUPT]
    assert failed[4] == "cannot read: No such file or directory" and failed[5] == failed[8] == \
        "cannot read: not a regular file" and failed[6].startswith("checksum mismatch")
    assert failed[9].startswith("checksum mismatch") and set(failed) == {4, 5, 6, 8, 9}
    # copy_buffers (a store's records for the engines, into page-locked memory): the buffers copied in too, in
    # order, the same verdicts, each CRC-32 checked on the bytes copied (buffer 6's wrong one still caught)
    copied, lengths3, status3, failed3 = ops.C.read_batch(sources, 2, 0, crcs, copy_buffers=True)
    ends3 = np.cumsum(lengths3.numpy())
    assert torch.equal(status3, status) and failed3 == failed and ends3[-1] <= copied.numel()
    for i, s in enumerate(sources):
        if i not in failed:
            want = s if isinstance(s, bytes) else Path(s).read_bytes()
            assert lengths3[i] == len(want) and bytes(copied[ends3[i] - len(want):ends3[i]].numpy()) == want
    size = Path(sources[0]).stat().st_size
    for copy in (False, True):
        _, lengths, status, failed = ops.C.read_batch([sources[0], b"x" * size], 1, size - 1, copy_buffers=copy)
        assert status.tolist() == [ops.UNREADABLE] * 2 and lengths.tolist() == [0, 0]
        assert failed == {0: f"file is {size} bytes, over the per-image limit of {size - 1}",
                          1: f"buffer is {size} bytes, over the per-image limit of {size - 1}"}


def _inside(view, tensor):
    """Whether the bytes-like ``view`` lies in ``tensor``'s memory."""
    address = np.frombuffer(view, dtype=np.uint8).ctypes.data
    return tensor.data_ptr() <= address < tensor.data_ptr() + tensor.numel()


@pytest.mark.parametrize("store", [False, True], ids=["folder", "lmdb"])
@pytest.mark.parametrize("pin", [False, pytest.param(True, marks=pytest.mark.cuda)], ids=["pageable", "pinned"])
def test_engines_get_every_readable_sample_and_none_for_the_rest(imagenet_dir, tmp_path, store, pin):
    """Engines._buffers (CPU work, no GPU needed): the bytes of each sample, None for one that cannot go to the
    engines (a file gone, a record whose bytes changed since packing), for the cores to report. From the second
    read on the files, and where the slot pins a store's records too, land in the slot's buffer, page-locked
    where the slot pins (on CUDA: nvJPEG's batched call then spends less time on them, bench/RESULTS.md)."""
    root = tmp_path / "ds"
    (root / "a").mkdir(parents=True)
    for i, f in enumerate(sorted(Path(imagenet_dir).rglob("*.jpg"))[:8]):
        (root / "a" / f"{i}.jpg").write_bytes(f.read_bytes())
    if store:
        pack(root, tmp_path / "s.lmdb", progress=False, log=lambda m: None)
        rewrite_record(tmp_path / "s.lmdb", 3, flip_middle_byte)  # its bytes no longer match their CRC-32
        ds = LMDBDataset(tmp_path / "s.lmdb")
    else:
        ds = fl.FolderDataset(root)
    with ds.reader() as reader:
        # what the dataset stores, the files as packed (raw: get checks the damaged record's CRC-32 and raises)
        want = {i: bytes(reader.raw(i)[1] if store else reader.get(i)) for i in range(8)}
    if not store:
        os.remove(ds.paths[3])
    broken = {3}
    engines = _maker(ds, decoder=decoders.KINDS["nvjpeg"]).decoder
    assert isinstance(engines, decoders.Engines) and isinstance(engines.cores, decoders.Cores)
    copied = not store or pin  # into the slot's buffer; else the store's own views
    with ds.reader() as reader:
        kept = []
        for slot in (Slot(pin=pin), Slot(pin=pin)):  # the second slot new, as the next epoch's are
            for read in range(2):  # the second time into the slot's buffer from the first
                got = engines._buffers(reader, np.arange(8)[::-1].copy(), slot)[::-1]
                assert [i for i, b in enumerate(got) if b is None] == sorted(broken)
                assert all(bytes(got[i]) == want[i] for i in range(8) if i not in broken)
                kept.append(slot.bitstreams)
                if read:  # the second read: every sample's bytes inside the slot's buffer, or none
                    assert {_inside(got[i], slot.bitstreams) for i in range(8) if i not in broken} == {copied}
            if copied:
                assert slot.bitstreams.numel() >= sum(len(want[i]) for i in range(8) if i not in broken)
                assert slot.bitstreams.is_pinned() == pin
        if copied:  # each slot keeps its buffer; a new slot is page-locked before its first read where it pins
            assert kept[1] is kept[0] and kept[3] is kept[2] and (kept[2].is_pinned() == pin)
            assert 0 < engines.largest_read <= kept[0].numel() if pin else engines.largest_read == 0
        else:  # a store read into a slot that does not pin: its records stay views of the store, nothing read
            assert engines.largest_read == 0 and all(k is None or k.numel() == 0 for k in kept)


def test_stats_say_which_decoder_auto_chose(imagenet_dir):
    loader = fl.FastLoader(fl.FolderDataset(imagenet_dir), batch_size=4, decoder="auto", crop=fl.RandomResizedCrop(16))
    next(iter(loader))
    assert loader.stats()["decoder"] == "cpu"  # no GPU here: auto is the cores
    loader.close()


def test_full_resolution_moves_the_visible_box_with_the_crop(photos):
    """decoders.full_resolution (the plans of the samples Pillow or the engines decode, at full resolution): the same
    output pixels within the DCT approximation, and the fill exactly where the DCT-downscaled plan puts it, box
    included, for a padded pipeline on photos whose sides are not multiples of the scale."""
    import fastload.transforms as T
    from fastload.transforms.pipeline import Pipeline

    odd = -7.5
    for tf in (T.Compose([T.Resize((40, 60)), T.Pad(5)]), T.Compose([T.Resize((36, 56)), T.Pad((3, 1, 2, 4))])):
        pipeline = Pipeline.build(tf)
        for k, (data, full) in enumerate(photos):
            _, h, w = full.shape
            plan = pipeline.plan(np.array([h]), np.array([w]), 0, 0, np.array([k]))
            full_w, full_m = decoders.full_resolution(plan.windows, plan.matrices)
            assert int(full_w[0, 4]) == 1 and full_m.shape == plan.matrices.shape
            outs = []
            for win, m in ((plan.windows[0], plan.matrices[0]), (full_w[0], full_m[0])):
                top, left, hh, ww, d = win.tolist()
                crop = ops.decode_crop(data, top, left, hh, ww, d)
                outs.append(ops.warp_affine(crop[None].float(), m[None], pipeline.out_size, layout="NHWC",
                                            fill=odd)[0])
            assert torch.equal(outs[0] == odd, outs[1] == odd), k
            image = outs[0] != odd
            assert (outs[0] - outs[1]).abs()[image].mean() < 8.0  # DCT downscaling against the full decode
