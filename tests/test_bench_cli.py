"""`fastload bench` on a tiny real-photo corpus (CPU): the table, --json (file and stdout), --plot, the progress bar,
and clear usage errors (exit code 2, a message on stderr, no traceback)."""
import gc
import json
import types

import numpy as np
import pytest
import torch
from PIL import Image

from fastload import benchmark
from fastload.cli import main

# Small and quick: 48 images, batches of 8, 64x64 crops, one warm-up + one timed epoch, no worker processes.
QUICK = ["--device", "cpu", "--batch-size", "8", "--epochs", "1", "--size", "64", "--threads", "2"]


@pytest.fixture(scope="module")
def store(imagenet_dir, tmp_path_factory):
    dst = tmp_path_factory.mktemp("bench") / "train.lmdb"
    assert main(["pack", str(imagenet_dir), str(dst), "-q"]) == 0
    return dst


def test_folder_against_torchvision_table_json_and_plot(imagenet_dir, tmp_path, capsys):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    code = main(["bench", str(imagenet_dir), "--baseline", "torchvision", "--workers", "0", *QUICK,
                 "--json", str(out_json), "--plot", str(out_png)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    table = captured.out
    assert "48 images (image folder)" in table and "img/s" in table and "vs torchvision" in table
    assert "fastload FastLoader (2 x 2 threads)" in table and "torchvision DataLoader (0 workers)" in table
    assert "\r" not in captured.err  # stderr is no terminal: progress lines (every 5 s), never bar frames

    result = json.loads(out_json.read_text())
    assert {"config", "rows"} <= set(result)
    config = result["config"]
    assert config["images"] == 48 and config["classes"] == 4 and config["data_kind"] == "folder"
    assert config["device"] == "cpu" and config["batch_size"] == 8 and config["size"] == 64
    assert config["epochs"] == 1 and config["threads"] == 2 and config["workers"] == 0
    assert {"fastload", "torch"} <= set(config["versions"])
    rows = {r["kind"]: r for r in result["rows"]}
    assert set(rows) == {"fastload", "torchvision"}
    for row in rows.values():
        assert row["images_per_s"] > 0 and row["pipeline"] in table
    assert rows["torchvision"]["speedup"] == 1.0
    assert rows["fastload"]["speedup"] == pytest.approx(rows["fastload"]["images_per_s"] /
                                                        rows["torchvision"]["images_per_s"])
    assert rows["fastload"]["stats"]["images"] == 2 * 48  # warm-up + timed epoch, batches of 8: none dropped
    assert "efficiency" not in rows["fastload"]  # only with --model

    with Image.open(out_png) as im:
        assert im.format == "PNG"
        assert 800 <= im.width <= 2400 and 200 <= im.height <= 1200
        pixels = np.asarray(im.convert("RGB")).reshape(-1, 3)
    fastload_colour = np.array([0xE8, 0x59, 0x0C])  # the highlighted bar
    assert (np.abs(pixels.astype(int) - fastload_colour).sum(axis=1) < 10).mean() > 0.01


def test_store_json_on_stdout_without_progress(store, capsys):
    code = main(["bench", str(store), "--baseline", "torchvision", "--workers", "1", *QUICK, "--json", "-", "-q"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)  # stdout is pure JSON; the table went to stderr
    assert result["config"]["data_kind"] == "store" and result["config"]["images"] == 48
    assert all(r["images_per_s"] > 0 for r in result["rows"])
    assert "(LMDB store)" in captured.err and "torchvision DataLoader (1 workers)" in captured.err
    assert "img/s]" not in captured.err  # -q: no progress bar


def test_fastload_alone(store, capsys):
    assert main(["bench", str(store), *QUICK, "-q"]) == 0
    out = capsys.readouterr().out
    assert "fastload FastLoader" in out and "torchvision" not in out


def test_library_api_and_plot_with_a_model_row(tmp_path):
    """The chart and table for a --model run (CUDA numbers faked here): ceiling, efficiency, highlighted fastload."""
    rows = [{"pipeline": "resnet50 on a fixed GPU batch (ceiling)", "kind": "ceiling", "images_per_s": 4700.0},
            {"pipeline": "resnet50 fed by fastload FastLoader (16 threads)", "kind": "fastload",
             "images_per_s": 4650.0},
            {"pipeline": "resnet50 fed by torchvision DataLoader (16 workers)", "kind": "torchvision",
             "images_per_s": 2500.0}]
    for r in rows:
        r["efficiency"] = r["images_per_s"] / 4700.0
    table = benchmark.format_table(rows, "title")
    assert "efficiency" in table and "0.989" in table and "1.86x" in table
    path = benchmark.plot(rows, tmp_path / "model.png", subtitle="resnet50, batch 256")
    with Image.open(path) as im:
        assert im.format == "PNG" and im.width >= 800


def _error(capsys, argv, fragment):
    code = main(["bench", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "fastload: error:" in err or "usage:" in err
    assert fragment in err and "Traceback" not in err


def test_usage_errors(imagenet_dir, tmp_path, capsys, monkeypatch):
    _error(capsys, [str(tmp_path / "missing")], "no such folder or store")
    (tmp_path / "empty").mkdir()
    _error(capsys, [str(tmp_path / "empty"), "--device", "cpu"], "no class folders")
    _error(capsys, [str(imagenet_dir), "--device", "cpu", "--batch-size", "64"], "fewer than one batch of 64")
    _error(capsys, [str(imagenet_dir), "--epochs", "0"], "must be at least 1")
    _error(capsys, [str(imagenet_dir), "--model", "vgg"], "invalid choice")
    _error(capsys, [str(imagenet_dir), "--device", "cpu", "--workers", "-1"], "--workers must be 0 or more")
    _error(capsys, [str(imagenet_dir), "--device", "cpu", "--cuda-graph"], "--cuda-graph captures a model's "
           "training step: it needs --model")
    _error(capsys, [str(imagenet_dir), "--device", "cpu", "--json", str(tmp_path / "no" / "out.json")],
           "does not exist")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _error(capsys, [str(imagenet_dir), "--device", "cuda"], "CUDA is not available")
    _error(capsys, [str(imagenet_dir), "--model", "resnet18"], "CUDA is not available")
    _error(capsys, [str(imagenet_dir), "--model", "resnet50", "--device", "cpu"], "CUDA is not available")


def test_cuda_graph_needs_a_model_on_a_gpu():
    with pytest.raises(ValueError, match="captures the step on a GPU"):
        benchmark.training_step("resnet18", "cpu", 8, cuda_graph=True)
    with pytest.raises(ValueError, match="needs a model"):
        benchmark.run("unused", device="cpu", cuda_graph=True)


def test_the_ceiling_meets_the_targets_the_loaders_deliver(imagenet_dir, monkeypatch):
    """With torchvision_v2 (MixUp/CutMix last) both loaders deliver soft targets: the ceiling's fixed batch has
    them too (the same loss; with --cuda-graph the graph for them is captured before any loader runs)."""
    seen = []
    benchmark.ceiling_rate(lambda x, y: seen.append((tuple(y.shape), y.dtype)), 8, 32, "cpu", steps=1,
                           soft_targets=1000)
    assert set(seen) == {((8, 1000), torch.float32)}
    asked = []  # what run() asks of the ceiling, per spec (the step and the loaders stubbed: no GPU needed)
    monkeypatch.setattr(benchmark, "training_step", lambda *a, **k: lambda x, y: None)
    monkeypatch.setattr(benchmark, "_device_name", lambda device: "a GPU")
    monkeypatch.setattr(benchmark, "ceiling_rate", lambda *a, soft_targets=None, **k: asked.append(soft_targets) or 1.0)
    monkeypatch.setattr(benchmark, "fastload_rate", lambda *a, **k: (1.0, {"threads": 1, "workers": 1,
                                                                         "decoder": "cpu"}))
    for spec in ("torchvision_v2", "trivialaugment", None):
        benchmark.run(str(imagenet_dir), device="cuda", batch_size=8, epochs=1, size=32, progress=False,
                      transform=spec, model="resnet18")
    assert asked == [1000, None, None]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_graphed_step_trains_as_the_eager_one():
    """--cuda-graph: the step captured in a CUDA graph makes the same SGD updates as the eager step, one per call
    (the first call of a batch shape trains once and captures), for class indices and for soft targets
    (MixUp/CutMix batches: a second graph), from pinned host memory or from the GPU."""
    def params(cuda_graph, steps=6):
        torch.manual_seed(0)
        step = benchmark.training_step("resnet18", "cuda", 8, num_classes=10, cuda_graph=cuda_graph)
        gen = torch.Generator().manual_seed(1)
        for i in range(steps):
            x = torch.randn(8, 3, 32, 32, generator=gen).contiguous(memory_format=torch.channels_last)
            y = torch.randint(0, 10, (8,), generator=gen)
            if i % 2:
                y = torch.nn.functional.one_hot(y, 10).float() * 0.8 + 0.02  # soft targets
                x, y = x.pin_memory(), y.pin_memory()
            else:
                x, y = x.cuda(), y.cuda()
            step(x, y)
        torch.cuda.synchronize()
        return [t.detach().clone() for t in (*step.model.parameters(), *step.model.buffers())]
    torch.backends.cudnn.deterministic = True
    try:
        eager, graphed, untrained = params(False), params(True), params(False, steps=0)
    finally:
        torch.backends.cudnn.deterministic = False
    assert len(eager) == len(graphed)
    assert sum(not torch.equal(a, b) for a, b in zip(eager, untrained)) > len(eager) // 2  # it did train
    for a, b in zip(eager, graphed):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_argument_checks_before_the_run_and_a_damaged_sample(imagenet_dir, tmp_path, capsys):
    """What would only fail after minutes of measuring, or with a traceback, is an error line at once: a --size no
    batch fits in memory, a --json/--plot path that is a folder; a damaged image met while measuring is one error
    line naming it (exit 1); --plot without an extension says the file it wrote."""
    _error(capsys, [str(imagenet_dir), *QUICK[:-4], "--size", "100000"], "larger than fastload bench measures")
    _error(capsys, [str(imagenet_dir), *QUICK, "--json", str(tmp_path)], "is a folder")
    _error(capsys, [str(imagenet_dir), *QUICK, "--plot", str(tmp_path)], "is a folder")
    # found before the run, not by matplotlib after it (a traceback, exit 1)
    _error(capsys, [str(imagenet_dir), *QUICK, "--plot", str(tmp_path / "chart.txt")], "cannot write .txt files")
    # torchvision's workers without torchvision: was accepted and ignored
    _error(capsys, [str(imagenet_dir), *QUICK, "--workers", "3"], "--workers sets torchvision's DataLoader workers")
    assert main(["bench", str(imagenet_dir), *QUICK, "-q", "--plot", str(tmp_path / "chart")]) == 0
    assert f"wrote {tmp_path / 'chart.png'}" in capsys.readouterr().err and (tmp_path / "chart.png").is_file()
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(imagenet_dir, broken)
    victim = sorted(broken.rglob("*.jpg"))[5]
    data = victim.read_bytes()
    start = data.index(b"\xff\xda") + 20  # garbage (no 0xff) for its image data, its end marker kept: the scan
    victim.write_bytes(data[:start] + bytes((i * 37 + 11) % 255 for i in range(len(data) - start - 2)) + data[-2:])
    code = main(["bench", str(broken), *QUICK, "-q"])
    err = capsys.readouterr().err
    assert code == 1 and "fastload: error:" in err and victim.name in err and "Traceback" not in err, err


def test_warm_up_lasts_until_ready_and_only_the_epochs_after_it_are_timed(monkeypatch):
    """decoder="auto": the benchmark warms up until the loader's trial has chosen (ready()), then times `epochs`
    epochs; a trial that cannot finish stops the warm-up after _MAX_WARMUP_BATCHES batches."""
    seen = []

    def make_iter(epoch):
        seen.append(epoch)
        return [(None, torch.zeros(4))] * 2  # two batches of 4 an epoch

    calls = iter([False, False, True])
    benchmark._timed_epochs(make_iter, 2, 8, "x", False, "cpu", ready=lambda: next(calls))
    assert seen == [0, 1, 2, 3, 4]  # three warm-up epochs (ready after the third), then two timed
    seen.clear()
    monkeypatch.setattr(benchmark, "_MAX_WARMUP_BATCHES", 6)
    benchmark._timed_epochs(make_iter, 1, 8, "x", False, "cpu", ready=lambda: False)
    assert seen == [0, 1, 2, 3]  # 6 warm-up batches, then one timed epoch
    seen.clear()
    benchmark._timed_epochs(make_iter, 1, 8, "x", False, "cpu")
    assert seen == [0, 1]


def test_the_clock_starts_with_nothing_made_ahead(imagenet_dir, monkeypatch):
    """FastLoader starts the next epoch's producers as one ends: batches they made before the clock started would
    count as made in no time (a review measured 2,603 img/s where the loader made ~500, on 3 batches an epoch).
    fastload_rate stops the loader's producers between the warm-up and the timed epochs, so no producer runs at the
    start; it keeps the pool of CPU batch outputs (close() frees it), as between a training loop's epochs."""
    import threading

    from fastload import ops

    def producers():
        return [t for t in threading.enumerate() if t.name.startswith("fastload") and t.is_alive()]

    at_start = []
    sync = benchmark._sync

    def synced(device):  # called last before the timed epochs' clock starts
        at_start.append(len(set(producers()) - before))  # this loader's (other tests' loaders may linger)
        sync(device)

    released = []
    release = ops.C.release_cpu_outputs
    monkeypatch.setattr(benchmark, "_sync", synced)
    monkeypatch.setattr(ops.C, "release_cpu_outputs", lambda: released.append(len(at_start)) or release())
    ds = benchmark.open_dataset(imagenet_dir)
    before = set(producers())
    benchmark.fastload_rate(ds, batch_size=8, threads=1, epochs=1, size=32, progress=False)
    assert at_start[0] == 0 and released == [len(at_start)]  # freed once, by the close() after the timing
    events = []
    benchmark._timed_epochs(lambda e: events.append(e) or [(None, torch.zeros(4))], 1, 4, "x", False, "cpu",
                            settle=lambda: events.append("settle"))
    assert events == [0, "settle", 1]


def test_baseline_takes_empty_classes_and_mixing_covers_every_label(imagenet_dir, tmp_path):
    """An empty class folder (accepted by FolderDataset, with a warning) no longer stops the torchvision baseline
    after fastload was measured; MixUp/CutMix of --transform torchvision_v2 cover labels past 1000."""
    import shutil
    root = tmp_path / "tree"
    shutil.copytree(imagenet_dir, root)
    (root / "zz_empty").mkdir()
    with pytest.warns(UserWarning, match="classes have no images"):
        result = benchmark.run(str(root), baseline="torchvision", batch_size=8, epochs=1, size=32, workers=0,
                               progress=False)
    assert [row["kind"] for row in result["rows"]] == ["fastload", "torchvision"]
    ds = benchmark.open_dataset(imagenet_dir)
    ds.labels = ds.labels + 1005  # a dataset of 1,010 classes or so
    ds.classes = [f"c{i}" for i in range(int(ds.labels.max()) + 1)]
    result = benchmark.run(ds, batch_size=8, epochs=1, size=32, progress=False, transform="torchvision_v2")
    assert result["rows"][0]["images_per_s"] > 0


def _full_collections_while_timed(run, timed):
    """Full (generation 2) collections made while ``timed()`` is true during ``run()``, started with a start-up's
    debt: 300,000 surviving container objects made with the collector off, as importing torch leaves them, so the
    first full collection falls due once enough new objects have come and gone through the young generations."""
    gc.collect()
    full = []

    def seen(phase, info):
        if phase == "start" and info["generation"] == 2 and timed():
            full.append(info)
    gc.disable()
    debt = [[i] for i in range(300_000)]
    gc.enable()
    gc.callbacks.append(seen)
    try:
        run()
    finally:
        gc.callbacks.remove(seen)
        del debt
    return len(full)


def _cyclic_garbage(n=60_000):
    """Objects only the collector frees (a training loop's and a loader's churn, concentrated)."""
    for _ in range(n):
        a = []
        a.append(a)


@pytest.mark.parametrize("paid", [False, True])
def test_the_start_up_debt_of_the_collector_is_paid_before_the_clock(monkeypatch, paid):
    """Importing torch leaves ~340,000 objects that the first full collection walks, 0.1-0.2 s holding the GIL: in a
    few seconds' timing, a loss of several percent for whichever loader sets it off. Every clock of the benchmark (the
    loaders' timed epochs, the ceiling's timed steps) starts after a full collection, as timeit's does. Unpaid (the
    collection made a no-op), the same debt falls due inside the timing, so the test sees what it guards."""
    if not paid:
        monkeypatch.setattr(benchmark, "gc", types.SimpleNamespace(collect=lambda: None))
    epoch = [None]

    def make_iter(e):
        epoch[0] = e
        if e >= 1:  # the timed epochs: one warm-up before them
            _cyclic_garbage()
        yield None, torch.zeros(4)
    runs = _full_collections_while_timed(
        lambda: benchmark._timed_epochs(make_iter, 2, 4, "x", False, "cpu"), lambda: (epoch[0] or 0) >= 1)
    steps = [0]

    def step(x, y):
        steps[0] += 1
        if steps[0] > 10:  # ceiling_rate's 10 warm-up steps, then the timed ones
            _cyclic_garbage(20_000)
    ceiling = _full_collections_while_timed(lambda: benchmark.ceiling_rate(step, 2, 8, "cpu", steps=6),
                                            lambda: steps[0] > 10)
    assert ((runs, ceiling) == (0, 0)) if paid else (runs >= 1 and ceiling >= 1), (runs, ceiling)
