"""bench.producer_timeline: the producers' time per batch by phase, which bench.train_profile --producer-times
prints inside a training loop (issue 18)."""
import inspect
import os

import numpy as np
import pytest
import torch

import fastload as fl
from bench import host_meters, train_profile
from bench.producer_timeline import PHASES, Timeline
from fastload import decoders, producer
from fastload import loader as loader_mod
from fastload.datasets import FolderDataset


def _others_gone(timeout=10.0):
    """Waits until no earlier test's producer thread is alive: the patches are the classes', and such a thread
    calling them would be timed as another row."""
    import gc
    import threading
    import time
    deadline = time.monotonic() + timeout
    while any(t.name.startswith("fastload") for t in threading.enumerate()) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)


def _timed(loader, batches):
    """The summary over ``batches`` batches, the loader closed inside (no batch half timed)."""
    _others_gone()
    with Timeline().installed(loader._maker) as timeline:
        it = iter(loader)
        for _ in range(batches):
            next(it)
        loader.close()
    return timeline.summary()


def _check(summary, workers, busy_phase):
    threads = {k: v for k, v in summary.items() if k.startswith("fastload-")}
    assert threads, "no producer thread was timed"
    assert len(threads) <= workers  # one epoch, so one thread per producer
    assert sum(t["batches"] for t in threads.values()) >= 4
    for t in threads.values():
        assert set(PHASES) <= set(t) and all(t[p] >= 0 for p in PHASES)
        # a producer's phases follow one another: together they fit in the wall time (nothing counted twice)
        assert t[busy_phase] > 0 and sum(t[p] for p in PHASES) <= t["wall"] * 1.01


_PATCHED = ((producer.Slot, "wait_reusable"), (decoders.Engines, "_buffers"), (decoders, "read_sources"),
            (decoders, "engine_ready"),
            (fl.nvjpeg.HardwareDecoder, "decode"), (decoders, "wait_for"), (decoders.Cores, "start"),
            (decoders.JpegCrops, "finish"), (decoders.JpegCrops, "decode"), (loader_mod._Producers, "submit"),
            (loader_mod._Plans, "ahead"),
            (loader_mod._Producers, "take"), (loader_mod._Producers, "put"), (producer.BatchMaker, "start"))


def _originals():
    return [getattr(owner, name) for owner, name in _PATCHED]


def test_the_cores_phases_are_timed_and_the_patches_are_undone(imagenet_dir):
    originals = _originals()
    loader = fl.FastLoader(FolderDataset(imagenet_dir), batch_size=4, crop=fl.RandomResizedCrop(64), threads=1,
                           workers=2)
    lock = loader._maker._hardware_lock
    summary = _timed(loader, 6)
    _check(summary, 2, "cores")
    assert all(t["decode"] > 0 and t["plan"] > 0 for k, t in summary.items() if k.startswith("fastload-"))
    assert summary["engines_busy"] == 0.0
    assert _originals() == originals and loader._maker._hardware_lock is lock


def test_the_patches_are_undone_when_the_block_raises(imagenet_dir):
    originals = _originals()
    loader = fl.FastLoader(FolderDataset(imagenet_dir), batch_size=4, crop=fl.RandomResizedCrop(64), threads=1)
    with pytest.raises(RuntimeError, match="the loop failed"):
        with Timeline().installed(loader._maker):
            assert _originals() != originals  # installed
            raise RuntimeError("the loop failed")
    assert _originals() == originals
    loader.close()


@pytest.mark.cuda
def test_on_the_engines_the_lock_is_held_and_timed(imagenet_dir):
    if not fl.nvjpeg.available()[0]:
        pytest.skip("needs a GPU with a hardware JPEG decoder")
    loader = fl.FastLoader(FolderDataset(imagenet_dir), batch_size=4, crop=fl.RandomResizedCrop(64),
                           device="cuda", decoder="nvjpeg")
    summary = _timed(loader, 6)
    _check(summary, loader.workers, "submit")
    assert 0 < summary["engines_busy"] <= 1
    assert np.mean([t["sync"] for k, t in summary.items() if k.startswith("fastload-")]) > 0


def test_train_profile_runs_every_combination_in_alternating_rounds(monkeypatch, capsys):
    """bench.train_profile's runs: every (decoder, bitstreams, threads) in turn, the order reversed each round, the
    engines' setting restored after (the harness itself, with the profile of one run faked: it needs a GPU)."""
    calls, planned, intervals, pinned = [], [], [], []

    probes, sides, loads, collectors, producers = [], [], [], [], []

    def fake_profile(data, model, size, decoder, batch_size, epochs, spy, switch, threads, *rest, train_cores,
                     gil_probe, feed, side_priority, loader_device, gil_load, gc_mode, planning, plan_batches,
                     workers, **other):
        assert not rest  # every option past threads by keyword
        producers.append(workers)
        probes.append((gil_probe, feed))
        sides.append((side_priority, loader_device))
        loads.append(gil_load)
        collectors.append(gc_mode)
        calls.append((decoder, decoders.Engines.pinned_bitstreams, threads))
        planned.append((planning, plan_batches))
        intervals.append(switch)
        pinned.append(train_cores)
        row = {c: 0.0 for c in ("ceiling", "ceiling_after", "images_per_s", "efficiency", "wall_per_step_ms",
                                "gpu_ms", "wait_ms", "wait_p90_ms", "launch_ms", "launch_alone_ms", "read_s",
                                "decode_s", "stage_s", "gil_late_mean_ms", "gil_late_p99_ms", "train_cpu_ms",
                                "train_runq_ms", "train_blocked_ms", "train_vcsw", "train_ivcsw",
                                "train_cpu_alone_ms", "train_vcsw_alone", "autograd_cpu_ms",
                                "autograd_cpu_alone_ms", "train_cpu_free_ms", "autograd_cpu_free_ms",
                                "planner_cpu_ms", "producer_cpu_ms", "loader_py_share",
                                *host_meters._ALLOCATOR_COUNTS, *host_meters.GcPauses.FIELDS)}
        row.update(decoder=decoder, transform="plain", train_stream="default", cuda_graph=True, engine_priority=None,
                   traced=False, reserve=0, side_priority=None, threads=threads, workers=2, cpu_by_thread={},
                   planning=planning, plan_batches=plan_batches or 4, switch_interval=switch or 0.005,
                   train_cores=train_cores, gil_probe=gil_probe, feed=feed, loader_device=loader_device,
                   gil_load=gil_load, gc=gc_mode)
        return row, []
    monkeypatch.setattr(train_profile, "profile", fake_profile)
    monkeypatch.setattr(train_profile, "set_cuda_wait", lambda policy: None)
    monkeypatch.setattr(decoders.Engines, "pinned_bitstreams", decoders.Engines.pinned_bitstreams)  # undone after
    library = decoders.Engines.pinned_bitstreams
    train_profile.main(["data", "--decoder", "nvjpeg", "cpu", "--bitstreams", "pageable", "pinned",
                        "--threads", "16", "4", "--rounds", "2"])
    first = [("nvjpeg", False, 16), ("nvjpeg", False, 4), ("nvjpeg", True, 16), ("nvjpeg", True, 4),
             ("cpu", library, 16), ("cpu", library, 4)]
    assert calls == first + first[::-1]
    assert decoders.Engines.pinned_bitstreams == library
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| nvjpeg")]
    assert [line.split(" | ")[1] for line in table] == ["pageable", "pageable", "pinned", "pinned", "pinned", "pinned", "pageable",
                                                      "pageable"]
    assert set(planned) == {("live", None)}  # the library's planning unless asked
    planned.clear()
    train_profile.main(["data", "--planning", "live", "ahead", "--plan-batches", "1", "4", "--rounds", "2"])
    first = [("live", 1), ("live", 4), ("ahead", 1), ("ahead", 4)]
    assert planned == first + first[::-1]
    assert set(intervals) == {None}  # the process's switch interval unless asked
    intervals.clear()
    train_profile.main(["data", "--switch-interval", "0.005", "0.05", "--rounds", "2"])
    assert intervals == [0.005, 0.05, 0.05, 0.005]
    assert set(pinned) == {0}  # no pinning unless asked
    pinned.clear()
    train_profile.main(["data", "--train-cores", "0", "1", "--rounds", "2"])
    assert pinned == [0, 1, 1, 0]
    assert set(probes) == {(False, "loader")}  # no GIL probe, the loader's batches
    probes.clear()
    train_profile.main(["data", "--gil-probe", "on", "off", "--feed", "loader", "fixed", "--rounds", "2"])
    first = [(True, "loader"), (True, "fixed"), (False, "loader"), (False, "fixed")]
    assert probes == first + first[::-1]
    assert set(sides) == {(None, "cuda")}  # the loader's own side stream, on the GPU, unless asked
    sides.clear()
    train_profile.main(["data", "--feed", "fixed", "--side-priority", "-1", "0", "--loader-device", "cuda", "cpu"])
    assert sides == [(-1, "cuda"), (-1, "cpu"), (0, "cuda"), (0, "cpu")]
    assert set(loads) == {None}  # no GIL load unless asked
    loads.clear()
    train_profile.main(["data", "--gil-load", "0", "4:0.5:0.03", "--rounds", "2"])
    assert loads == [None, (4, 0.5, 0.03), (4, 0.5, 0.03), None]
    for bad in ("4:0.5", "4:0.5:1.5", "x"):
        with pytest.raises(SystemExit):
            train_profile.main(["data", "--gil-load", bad])
    assert set(collectors) == {"default"}  # the collector as it is unless asked
    collectors.clear()
    train_profile.main(["data", "--gc", "default", "collect", "freeze", "--rounds", "2"])
    assert collectors == ["default", "collect", "freeze", "freeze", "collect", "default"]
    assert set(producers) == {None}  # the library's producer count unless asked
    producers.clear()
    train_profile.main(["data", "--workers", "4", "2", "--rounds", "2"])
    assert producers == [4, 2, 2, 4]


@pytest.mark.skipif(len(train_profile.physical_cores()) < 2, reason="needs two physical cores")
def test_train_profile_pins_the_training_thread_apart_from_the_loader(imagenet_dir):
    """--train-cores 1: the training thread on the first physical core (with its SMT siblings), the loader's cores
    the others; _set_training_cpus puts it back."""
    everything = os.sched_getaffinity(0)
    groups = train_profile.physical_cores()
    assert sorted(c for g in groups for c in g) == sorted(everything)
    loader_cpus = train_profile.loader_cores(1)
    assert set(loader_cpus) == everything - set(groups[0])
    loader = fl.FastLoader(FolderDataset(imagenet_dir), batch_size=2, cpus=loader_cpus)  # built before the pinning
    try:
        train_profile.pin_training(1)
        assert os.sched_getaffinity(0) == set(groups[0])
        x, _ = next(iter(loader))  # its threads on the other cores, from a pinned thread
        assert x.shape[0] == 2
        loader.close()
    finally:
        train_profile._set_training_cpus(everything)
    assert os.sched_getaffinity(0) == everything
    for bad in (0, len(groups)):
        with pytest.raises(SystemExit, match="--train-cores"):
            train_profile.loader_cores(bad)


def test_train_profile_plans_ahead_what_the_loader_plans(imagenet_dir, monkeypatch):
    """bench.train_profile --planning ahead: every batch of the timed epochs prepared before them, so that while
    they run the producers plan nothing (whatever PLAN_BATCHES), and the batches are those planned live."""
    import fastload.transforms as T
    from bench.train_profile import _plan_ahead
    ds = FolderDataset(imagenet_dir)

    def loader():
        return fl.FastLoader(ds, batch_size=6, seed=1, drop_last=True, transform=T.Compose(
            [T.RandomResizedCrop(32), T.TrivialAugmentWide(), T.ToDtype(torch.float32, scale=True)]))
    live, ahead = loader(), loader()
    _plan_ahead(ahead, [1])
    planned = []
    real = producer.BatchMaker.plan
    monkeypatch.setattr(producer.BatchMaker, "plan",
                        lambda self, indices, epoch: planned.append((self, epoch)) or real(self, indices, epoch))
    for L in (live, ahead):
        L.set_epoch(1)
    pairs = list(zip(live, ahead))
    assert len(pairs) == len(live) >= 4
    for (x, y), (xa, ya) in pairs:
        assert torch.equal(x, xa) and torch.equal(y, ya)
    # (the next epoch's producers start before this one ends: epoch 2 is planned live in both)
    assert {m for m, epoch in planned if epoch == 1} == {live._maker}


def test_gil_releases_counts_what_gives_the_gil_up_and_not_pure_python():
    """bench.gil_releases: a call that sleeps (releasing the GIL) is counted once per call, a pure-Python loop of
    the same thread not at all, and attributed to the thread and the line that called it."""
    import time as _time
    from bench.gil_releases import Attribution, ReleaseCounter

    def python_only():
        return sum(i * i for i in range(20000))
    with ReleaseCounter() as counter, Attribution(counter) as where:
        for _ in range(20):
            _time.sleep(0.002)
        for _ in range(20):
            python_only()
    sleeps = {site: n for (kind, site), n in where.by_site.items() if kind == "training thread" and "sleep" in site}
    assert sum(sleeps.values()) >= 18  # a release of 2 ms: the counter wakes for nearly every one
    assert all("test_producer_timeline.py" in site for site in sleeps)
    assert where.by_kind["training thread"] - sum(sleeps.values()) <= 2  # the loop, sum and range: nothing


def test_gil_releases_of_a_loader_by_thread_kind(imagenet_dir):
    """bench.gil_releases.measure on a real loader: its producers give the GIL up (waiting for the decode,
    queues), counted per batch; no other thread of the loader's does."""
    import fastload.transforms as T
    from bench.gil_releases import measure
    loader = fl.FastLoader(FolderDataset(imagenet_dir), batch_size=4, threads=2, drop_last=True, transform=T.Compose(
        [T.RandomResizedCrop(32), T.TrivialAugmentWide(), T.ToDtype(torch.float32, scale=True)]))
    kinds, sites = measure(loader, 6)
    loader.close()
    assert kinds["producer"] > 0 and set(kinds) <= {"producer", "training thread"}
    assert any(kind == "producer" and ".wait <- decoders.py" in site for kind, site in sites)


def test_host_contention_decode_workers_decode_crops_of_the_corpus(imagenet_dir, monkeypatch):
    """bench.host_contention --kinds decode: each busy process decodes crop windows inside its JPEGs until told to
    stop (run here on this thread, the decode counted and the stop set after some)."""
    import threading as _threading
    from bench import host_contention
    from fastload import ops
    stop, shapes = _threading.Event(), []
    real = ops.decode_crop

    def counted(data, top, left, height, width, *a, **k):
        out = real(data, top, left, height, width, *a, **k)
        shapes.append((tuple(out.shape), height, width))
        if len(shapes) == 12:
            stop.set()
        return out
    monkeypatch.setattr(ops, "decode_crop", counted)
    host_contention._decode(stop, str(imagenet_dir))
    assert len(shapes) >= 12
    assert all(shape == (h, w, 3) for shape, h, w in shapes)  # the windows asked for, decoded


def test_gil_chunks_hold_their_share_of_the_time(monkeypatch):
    """bench.host_meters.gil_chunks (host_contention --kinds gil, train_profile --gil-load): runs Python for
    ``hold`` seconds, then sleeps so that it holds ``duty`` of its time, until told to stop. On a fake clock (a
    timing test would be at the mercy of a busy CI machine; what the chunks cost the step is measured on the GPU
    host, bench/RESULTS.md)."""
    import threading as _threading
    stop, sleeps, busy = _threading.Event(), [], []

    class Clock:
        now = 0.0

        def perf_counter(self):
            self.now += 1e-4  # 0.1 ms a bytecode loop
            return self.now

        def sleep(self, seconds):
            busy.append(self.now)
            sleeps.append(seconds)
            self.now += seconds
            if len(sleeps) == 5:
                stop.set()
    monkeypatch.setattr(host_meters, "time", Clock())
    host_meters.gil_chunks(stop, 0.002, 0.25)
    assert len(sleeps) == 5
    assert sleeps == pytest.approx([0.006] * 5)  # 2 ms held, 6 ms asleep: 25%
    starts = [0.0] + [t + s for t, s in zip(busy, sleeps)][:-1]
    held = [end - start for start, end in zip(starts, busy)]
    assert all(0.002 <= h <= 0.0023 for h in held), held  # each chunk its 2 ms (and the clock's last tick)


def test_train_profile_restores_what_a_run_changes(monkeypatch):
    """bench.train_profile.profile: a run's switch interval, pinned training thread and frozen collector are the
    run's only (the measurement itself, _profile, faked: it needs a GPU)."""
    import gc as _gc
    import sys as _sys
    interval, everything, frozen = _sys.getswitchinterval(), os.sched_getaffinity(0), _gc.get_freeze_count()
    seen = {}

    named = inspect.signature(train_profile._profile)

    def fake(*args):
        train_cores = named.bind(*args).arguments["train_cores"]
        seen.update(interval=_sys.getswitchinterval(), frozen=_gc.get_freeze_count())
        if train_cores and len(train_profile.physical_cores()) > 1:
            train_profile.pin_training(train_cores)
            seen["pinned"] = os.sched_getaffinity(0)
        return {}, []
    monkeypatch.setattr(train_profile, "_profile", fake)
    train_profile.profile("data", "resnet18", 32, "cpu", 8, 1, switch_interval=0.05, train_cores=1, gc_mode="freeze")
    assert seen["interval"] == pytest.approx(0.05)  # the run's setting while it ran
    assert _sys.getswitchinterval() == interval
    assert seen["frozen"] > frozen and _gc.get_freeze_count() == frozen
    if len(train_profile.physical_cores()) > 1:
        assert seen["pinned"] != everything and os.sched_getaffinity(0) == everything


def test_thread_cpu_counts_threads_that_ended_and_those_still_running():
    """bench.host_meters.ThreadCpu: a thread that burned ~0.2 s of CPU and ended is counted by its name, a live
    one by /proc, threads of other names not at all, and Thread.run is the library's again afterwards."""
    import threading as _threading
    import time as _time

    def burn(seconds, then=None):
        end = _time.thread_time() + seconds
        while _time.thread_time() < end:
            continue
        if then is not None:
            then.wait()
    library = _threading.Thread.run
    meter = host_meters.ThreadCpu()
    release = _threading.Event()
    with meter.installed():
        ended = _threading.Thread(target=burn, args=(0.2,), name="fastload-0")
        live = _threading.Thread(target=burn, args=(0.2, release), name="fastload.planner-0")
        other = _threading.Thread(target=burn, args=(0.2,), name="elsewhere")
        for t in (ended, live, other):
            t.start()
        ended.join()
        other.join()
        _time.sleep(0.5)  # the live one done burning, now waiting (schedstat is current for a sleeping thread)
        assert 0.19 < meter.total("fastload-") < 0.3
        assert 0.19 < meter.total("fastload.planner") < 0.3
        release.set()
        live.join()
        assert 0.19 < meter.total("fastload.planner") < 0.3  # ended now: the same, counted once
    assert _threading.Thread.run is library


@pytest.mark.cuda
def test_host_contention_cuda_threads_copy_and_stop():
    """bench.host_contention --kinds cuda: a thread copies its pinned bytes to the GPU at the rate asked, waiting
    on each copy, and stops when told."""
    import threading as _threading
    import time as _time
    from bench import host_contention
    copies = []
    real = torch.Tensor.copy_

    def counted(dst, src, non_blocking=False):
        copies.append((dst.device.type, src.is_pinned(), dst.numel()))
        return real(dst, src, non_blocking=non_blocking)
    for alloc in (False, True):
        copies.clear()
        stop = _threading.Event()
        worker = _threading.Thread(target=host_contention._cuda, args=(stop, 1 << 20, 50, alloc), daemon=True)
        torch.Tensor.copy_ = counted
        try:
            worker.start()
            _time.sleep(0.5)
            stop.set()
            worker.join(timeout=2)
        finally:
            torch.Tensor.copy_ = real
        assert not worker.is_alive()
        assert 10 <= len(copies) <= 30  # 50 a second for 0.5 s
        assert set(copies) == {("cuda", True, 1 << 20)}


@pytest.mark.cuda
def test_allocator_counts_see_a_cuda_malloc_and_a_page_locked_block():
    """bench.host_meters.allocator_counts: a new device segment (after emptying the cache) counts one cudaMalloc,
    and a page-locked tensor larger than any cached block one host allocation."""
    device = torch.device("cuda")
    torch.cuda.empty_cache()
    before = host_meters.allocator_counts(device)
    x = torch.empty(64 << 20, dtype=torch.uint8, device=device)
    h = torch.empty(96 << 20, dtype=torch.uint8, pin_memory=True)
    after = host_meters.allocator_counts(device)
    assert after["cuda_mallocs"] - before["cuda_mallocs"] >= 1
    if after["host_allocs"] == after["host_allocs"]:  # a torch with the host allocator's counters
        assert after["host_allocs"] - before["host_allocs"] >= 1
    del x, h


def test_bench_planning_times_each_spec_on_each_device(imagenet_dir, capsys):
    """bench.planning: a row per (spec, device) with the thread CPU of planning one and four batches at a time."""
    from bench import planning
    planning.main(["--data", str(imagenet_dir), "--specs", "plain,trivialaugment", "--batches", "8", "--rounds", "1",
                   "--batch-size", "16"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert [(r[0], r[1]) for r in rows] == [("| plain", "cpu"), ("| trivialaugment", "cpu")]
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)


def test_gc_pauses_count_a_full_collection_and_young_ones():
    """bench.host_meters.GcPauses: gc.collect() (a full collection) is counted with its time; a young one only in
    the young total; nothing once uninstalled."""
    import gc as _gc
    pauses = host_meters.GcPauses()
    with pauses.installed():
        _gc.collect()
        _gc.collect(0)
    _gc.collect()
    summary = pauses.summary()
    assert summary["gc_full"] == 1
    assert 0 < summary["gc_full_max_ms"] == summary["gc_full_ms"]
    assert summary["gc_young_ms"] > 0


def test_bench_gc_pauses_runs_a_row_per_feed(imagenet_dir, capsys):
    """bench.gc_pauses: one table row per --feed run, with its steps and the collector's counts."""
    from bench import gc_pauses
    gc_pauses.main(["--data", str(imagenet_dir), "--model", "resnet18", "--size", "32", "--batch-size", "16",
                    "--feed", "loader", "none"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert [r[0] for r in rows] == ["| loader", "| none"]
    assert all(int(r[1]) > 0 and int(r[3]) >= 0 for r in rows)
