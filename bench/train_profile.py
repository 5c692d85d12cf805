"""Where the time goes when FastLoader feeds a fast model (issue 18: ResNet-18 at 160 px on one GPU).

Trains for a few epochs and reports, per decoder:
- the training thread: time waiting for the next batch (``next()``), time launching the step (Python + kernel
  launches, the GPU running asynchronously), and the GPU's busy time per step (CUDA events around the step);
- the producers' summed read / decode / stage seconds (``loader.stats()``);
- with ``--gil-probe on``, GIL pressure: the excess wake-up latency of a probe thread that sleeps 0.5 ms in a loop
  (the time it waits for the GIL after its sleep, plus scheduling), as mean / p50 / p99 / max (the probe itself
  competes for the GIL: off by default);
- CPU used over the timed epochs, in cores: the whole process, the training thread, and the other threads by name;
- the training thread's and autograd's CPU per step, in the loop and alone on a fixed batch: inside one step
  launched on an idle GPU (``alone``), and over steps run back to back as the ceiling runs them (``free``);
- the training thread's time off a core, per step, split (Linux schedstat) into waiting runnable on a run queue
  (cores busy) and blocked (the GIL, a CUDA sync, a lock), with its voluntary / involuntary context switches;
- with ``--py-spy DIR`` (py-spy installed): two sampling profiles of the whole process (all threads, and only the
  thread holding the GIL: ``--gil``), summarised as samples per thread and the top self-time frames.
``--train-stream default side`` runs the loop on the legacy default stream or a stream of its own; ``--cuda-graph``
the step in a CUDA graph; ``--loader-only`` takes the batches without the step (the loader alone, efficiency then
against the ceiling all the same); ``--engine-priority`` the JPEG engines' streams at another priority; ``--trace DIR`` writes
a torch.profiler trace of timed steps 20-29 (summarised by bench.trace_summary; that run's rates are not figures).
``--producer-times``: each producer thread's time per batch by phase (waiting for a slot, its plan, the GPU, the
engines' lock; reading, submitting, syncing, queueing) and how busy the JPEG engines were (bench/producer_timeline.py).
``--feed fixed`` takes the loader's batches and trains on a fixed one (the loader's activity without its data path),
``--feed none`` trains as many steps with the loader idle (the control); ``--loader-device cpu`` runs the loader on
the host (its work without CUDA); ``--gil-load N:MS:SHARE`` adds N threads taking the GIL in chunks (how the loop
answers more of it taken). Columns producer_cpu_ms / loader_py_share: the loader's Python threads' CPU per step
(ended threads included), which bounds the GIL they hold (until the thirty-fourth session planner threads had a
column of their own, planner_cpu_ms; the producers plan now).
``--train-cores N`` pins the training thread (and autograd's) to the first N physical cores and the loader to the
others; ``--switch-interval`` sets Python's GIL switch interval for a run. ``--cuda-wait auto sleep --rounds 2``
compares the CUDA driver's wait policies inside this one process (bench.cuda_wait), each (policy, decoder) run in
turn, the order reversed every round. Options that take several values run each in turn.

    python -m bench.train_profile DATA --model resnet18 --size 160 --decoder cpu nvjpeg hybrid [--py-spy OUT]
"""
import argparse
import collections
import contextlib
import gc
import itertools
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import torch

from bench.cuda_wait import set_cuda_wait
from bench.host_meters import (_ALLOCATOR_COUNTS, GcPauses, GilProbe, ThreadCpu, allocator_counts,
                               autograd_cpu_ns, cpu_by_thread, gil_chunks, physical_cores, sched, thread_cpu,
                               training_threads)
from bench.producer_timeline import Timeline
import fastload.loader
from fastload import FastLoader, decoders, nvjpeg
from fastload.benchmark import (TRANSFORMS, ceiling_rate, fixed_batch, loader_shape, open_dataset,
                                training_step)


def _spy(pid, seconds, path, gil):
    exe = shutil.which("py-spy")
    if exe is None:
        return None
    cmd = [exe, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "200", "--format", "raw",
           "--threads", "--nonblocking", "-o", path] + (["--gil"] if gil else [])
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(path + ".err", "w"))


def _summarise_spy(path, top=12):
    """Samples per thread and the frames with the most self samples (collapsed stacks: 'a;b;c count')."""
    if not os.path.exists(path):
        return f"  (no profile: {open(path + '.err').read().strip()[-300:] if os.path.exists(path + '.err') else '?'})"
    threads, leaves = collections.Counter(), collections.Counter()
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            n = int(count)
            threads[frames[0]] += n
            leaves[(frames[0].split(" ")[0] if frames else "?", frames[-1])] += n
    total = sum(threads.values()) or 1
    out = [f"  {n:6d} samples ({n / total:5.1%})  {t}" for t, n in threads.most_common(8)]
    out.append("  top self frames:")
    out += [f"  {n:6d} ({n / total:5.1%})  [{t[:24]}] {leaf[:110]}" for (t, leaf), n in leaves.most_common(top)]
    return "\n".join(out)


def ceiling_launch(step, batch_size, size, device, steps=30):
    """(median ms the training thread takes to launch one step on a fixed batch with nothing else running, and per
    step inside step() (not the synchronize after it, which spins): the training thread's ms on a core and
    voluntary context switches, and autograd's threads' ms on a core: what the loop's figures compare with)."""
    x, y = fixed_batch(batch_size, size, device)
    times = []
    tid = threading.get_native_id()
    on_cpu = vol = autograd = 0
    for _ in range(steps):
        torch.cuda.synchronize()
        # this thread's CPU from thread_time (exact; schedstat lags by up to a tick for a running thread)
        before, cpu_before, grad_before = sched(tid), time.thread_time_ns(), autograd_cpu_ns()
        t = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t)
        on_cpu += time.thread_time_ns() - cpu_before
        autograd += autograd_cpu_ns() - grad_before
        vol += sched(tid)[2] - before[2]
    torch.cuda.synchronize()
    return float(np.median(times)) * 1e3, on_cpu / 1e6 / steps, vol / steps, autograd / 1e6 / steps


def free_running_cpu(step, batch_size, size, device, steps=30):
    """Per step of ``steps`` steps run back to back on a fixed batch (as the ceiling runs them: the host ahead of the
    GPU, its launches held back when the launch queue is full): ms on a core of the training thread and of
    autograd's threads. What the loop's CPU figures compare with when its host also runs ahead."""
    x, y = fixed_batch(batch_size, size, device)
    step(x, y)
    torch.cuda.synchronize()
    tid = threading.get_native_id()
    before, grad_before = sched(tid)[0], autograd_cpu_ns()
    for _ in range(steps):
        step(x, y)
    on_cpu, autograd = sched(tid)[0] - before, autograd_cpu_ns() - grad_before
    torch.cuda.synchronize()
    return on_cpu / 1e6 / steps, autograd / 1e6 / steps


def _split_cores(cores):
    """(the first ``cores`` physical cores' CPUs, the others')."""
    groups = physical_cores()
    if not 0 < cores < len(groups):
        raise SystemExit(f"--train-cores must be between 1 and {len(groups) - 1}, got {cores}")
    return {c for g in groups[:cores] for c in g}, sorted(c for g in groups[cores:] for c in g)


def loader_cores(cores):
    """--train-cores N: the loader's CPUs (FastLoader(cpus=)), those of the physical cores after the first N."""
    return _split_cores(cores)[1]


def pin_training(cores):
    """--train-cores N: the training thread and autograd's threads on the first N physical cores (all their
    hardware threads). After the loader is built: it checks its cpus= against the building thread's."""
    _set_training_cpus(_split_cores(cores)[0])


def _set_training_cpus(cpus):
    """The training thread and autograd's threads on ``cpus``."""
    for tid in training_threads():
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # the thread ended meanwhile
            continue


_TRACE_FROM, _TRACE_STEPS = 20, 10  # --trace: the timed steps it covers


def _write_trace(tracer, directory, name):
    """Stops ``tracer`` and writes its chrome trace and two tables into ``directory``; returns the trace's path."""
    torch.cuda.synchronize()
    tracer.__exit__(None, None, None)
    name = f"{name}_{time.time_ns()}"
    path = os.path.join(directory, f"trace_{name}.json")
    tracer.export_chrome_trace(path)
    with open(os.path.join(directory, f"table_{name}.txt"), "w") as f:
        f.write(tracer.key_averages().table(sort_by="self_cuda_time_total", row_limit=40))
        f.write(tracer.key_averages().table(sort_by="cpu_time_total", row_limit=40))
    return path


@contextlib.contextmanager
def _engine_streams(device, priority):
    """The JPEG engines' decode and copy streams made at ``priority`` instead of the library's -1, for the block."""
    library = decoders.Engines._handles

    def handles(self, batch):
        if self.handles is None:
            self.handles = (nvjpeg.HardwareDecoder(batch), torch.cuda.Stream(device, priority=priority),
                            torch.cuda.Stream(device, priority=priority))
        return self.handles
    decoders.Engines._handles = handles
    try:
        yield
    finally:
        decoders.Engines._handles = library


def profile(data, model, size, decoder, batch_size, epochs, spy_dir=None, switch_interval=None, threads=None,
            workers=None, reserve=0, warmup_epochs=1, transform=None, side_priority=None, train_stream="default",
            cuda_graph=False, engine_priority=None, trace=None, producer_times=False, loader_only=False,
            planning="live", plan_batches=None, train_cores=0, gil_probe=False, feed="loader", loader_device="cuda",
            gil_load=None, gc_mode="default"):
    device = torch.device("cuda")
    with contextlib.ExitStack() as stack:
        if train_cores:  # the training thread and autograd's back on every core after the run
            stack.callback(_set_training_cpus, os.sched_getaffinity(0))
        if switch_interval is not None:  # Python's GIL switch interval for this run only
            stack.callback(sys.setswitchinterval, sys.getswitchinterval())
            sys.setswitchinterval(switch_interval)
        if gc_mode == "freeze":  # every object alive now out of the collector's reach: full collections walk only
            stack.callback(gc.unfreeze)  # what the loop makes (gc.freeze, as long-running servers do)
            gc.freeze()
        if plan_batches is not None:  # batches a producer plans in one pass (the library's: loader.PLAN_BATCHES)
            stack.callback(setattr, fastload.loader, "PLAN_BATCHES", fastload.loader.PLAN_BATCHES)
            fastload.loader.PLAN_BATCHES = plan_batches
        if train_stream == "side":  # the whole loop on a non-default (non-blocking) stream instead of the legacy one
            stack.enter_context(torch.cuda.stream(torch.cuda.Stream(device)))
        if engine_priority is not None:
            stack.enter_context(_engine_streams(device, engine_priority))
        return _profile(data, model, size, decoder, batch_size, epochs, spy_dir, threads, workers, reserve,
                        warmup_epochs, transform, side_priority, train_stream, cuda_graph, engine_priority, trace,
                        producer_times, loader_only, planning, device, train_cores, gil_probe, feed,
                        loader_device, gil_load, gc_mode)


def _gil_load(text):
    """--gil-load's N:MS:SHARE as (threads, ms a chunk, share), or None for 0 (none)."""
    parts = text.split(":")
    try:
        if parts == ["0"]:
            return None
        n, hold, duty = int(parts[0]), float(parts[1]), float(parts[2])
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"expected N:MS:SHARE (e.g. 4:0.5:0.03) or 0, got {text!r}") from None
    if n < 1 or hold <= 0 or not 0 < duty < 1:
        raise argparse.ArgumentTypeError(f"N >= 1, MS > 0 and 0 < SHARE < 1, got {text!r}")
    return n, hold, duty


def _plan_ahead(loader, epochs):
    """--planning ahead: every batch of ``epochs`` prepared now (BatchMaker.prepare, its pure function of seed,
    epoch, indices and k), so that the producers only look them up while timed: what the loop would gain
    if planning cost the process no GIL at all."""
    maker, live = loader._maker, loader._maker.prepare
    ready = {(e, k): live(b, e, k) for e in epochs for k, b in enumerate(loader._epoch_batches(e))}

    def prepare(indices, epoch, k=0):
        found = ready.pop((epoch, k), None)
        return found if found is not None else live(indices, epoch, k)
    maker.prepare = prepare
    maker.prepare_many = lambda batches, epoch, ks: [prepare(b, epoch, k) for b, k in zip(batches, ks)]


def _profile(data, model, size, decoder, batch_size, epochs, spy_dir, threads, workers, reserve,
             warmup_epochs, transform, side_priority, train_stream, cuda_graph, engine_priority, trace, producer_times,
             loader_only, planning, device, train_cores, gil_probe, feed, loader_device, gil_load, gc_mode):
    cpus = sorted(os.sched_getaffinity(0))[reserve:] if reserve else None
    dataset = open_dataset(data)
    step = training_step(model, device, batch_size, cuda_graph=cuda_graph)
    ceiling = ceiling_rate(step, batch_size, size, device)
    cpus = loader_cores(train_cores) if train_cores else cpus
    if loader_device != device.type and feed == "loader":
        raise SystemExit("--loader-device cpu: the loop cannot train on its host batches; use --feed fixed or none")
    loader = FastLoader(dataset, batch_size=batch_size, device=loader_device, drop_last=True, channels_last=True,
                        decoder=decoder, threads=threads, workers=workers, cpus=cpus,
                        **loader_shape(transform, size))  # as fastload bench builds it
    if train_cores:  # after the ceiling's steps (autograd's thread exists) and the loader's check of its cpus=
        pin_training(train_cores)
        ceiling = ceiling_rate(step, batch_size, size, device)  # pinned, as the loop will run
    launch_alone, cpu_alone, vcsw_alone, autograd_alone = ceiling_launch(step, batch_size, size, device)
    cpu_free, autograd_free = free_running_cpu(step, batch_size, size, device)
    # the loader's side stream (copy + stage) at another priority than its -1 (high)
    if side_priority is not None and loader_device == "cuda":
        loader._device_pipe().stream = torch.cuda.Stream(device, priority=side_priority)
    probe = GilProbe() if gil_probe else None
    gil_threads, gil_stop = [], threading.Event()  # --gil-load: threads taking the GIL beside the loader's
    if gil_load:
        n, hold, duty = gil_load
        gil_threads = [threading.Thread(target=gil_chunks, args=(gil_stop, hold / 1e3, duty), daemon=True,
                                        name="gil-load") for _ in range(n)]
    fixed = fixed_batch(batch_size, size, device) if feed != "loader" else None
    waits, launches, gpu_ms = [], [], []
    tracer = traced = None  # --trace: the profiler, then the trace file it wrote
    events = []
    spies = []
    images, start = 0, None
    meter, pauses = ThreadCpu(), GcPauses()
    with contextlib.ExitStack() as timeline:  # --producer-times: the producers' phases over the timed epochs
        # from the warm-up on: the first timed epoch's threads start during the warm-up's last batches
        timeline.enter_context(meter.installed())
        if gc_mode == "collect":  # the start-up's debt paid before the loop (fastload bench: before its clock)
            gc.collect()
        for epoch in range(epochs + warmup_epochs):
            loader.set_epoch(epoch)
            if epoch == warmup_epochs:
                if planning == "ahead":
                    _plan_ahead(loader, range(warmup_epochs, warmup_epochs + epochs))
                torch.cuda.synchronize()
                if probe is not None:
                    probe.start()
                for t in gil_threads:
                    t.start()
                if spy_dir:  # sample the timed epochs only (duration: a guess from the ceiling, capped)
                    seconds = max(2, min(20, int(epochs * len(loader) * batch_size / ceiling) + 1))
                    run = f"{decoder}_{decoders.HYBRID_ENGINE_BATCHES}of{decoders.HYBRID_PERIOD}_{time.time_ns()}"
                    spies = [(p, _spy(os.getpid(), seconds, p, gil)) for p, gil in
                             ((os.path.join(spy_dir, f"spy_{run}_all.txt"), False),
                              (os.path.join(spy_dir, f"spy_{run}_gil.txt"), True))]
                start = time.perf_counter()
                cpu_before = thread_cpu()
                sched_before = sched(threading.get_native_id())
                autograd_before = autograd_cpu_ns()
                loader_py_before = meter.total("fastload-")
                timeline.enter_context(pauses.installed())  # the timed epochs' collections
                allocator_before = allocator_counts(device)
                if producer_times:
                    phases = timeline.enter_context(Timeline().installed(loader._maker))
            # --feed none: as many steps as the loader has batches, the loader never iterated (the loop's control)
            it = iter(loader) if feed != "none" else iter([fixed] * len(loader))
            while True:
                t0 = time.perf_counter()
                try:
                    x, y = next(it)
                except StopIteration:
                    break
                t1 = time.perf_counter()
                if epoch >= warmup_epochs:
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                if trace and epoch >= warmup_epochs and len(waits) == _TRACE_FROM and tracer is None:
                    tracer = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                                torch.profiler.ProfilerActivity.CUDA])
                    tracer.__enter__()
                if feed != "loader":  # the loader's batch taken (fixed) or none: a fixed one trained on, no data path
                    x, y = fixed
                if not loader_only:
                    step(x, y)
                if tracer is not None and traced is None and len(waits) == _TRACE_FROM + _TRACE_STEPS - 1:
                    traced = _write_trace(tracer, trace, f"{decoder}_{train_stream}_{int(cuda_graph)}")
                if epoch >= warmup_epochs:
                    e1.record()
                    events.append((e0, e1))
                    waits.append(t1 - t0)
                    launches.append(time.perf_counter() - t1)
                    images += len(y)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        # (the epoch after the last starts early too: its first batches count here, a few of the timed epochs')
        producer_s = meter.total("fastload-") - loader_py_before
        allocator = {k: v - allocator_before[k] for k, v in allocator_counts(device).items()}
    if tracer is not None and traced is None:  # fewer timed steps than the window: what there was
        traced = _write_trace(tracer, trace, f"{decoder}_{train_stream}_{int(cuda_graph)}")
    cores = cpu_by_thread(cpu_before, thread_cpu(), threading.get_native_id(), seconds)
    # the training thread per step: on a core, runnable but queued, and the rest of the step (blocked)
    on_cpu, queued, vol, invol = (b - a for a, b in zip(sched_before, sched(threading.get_native_id())))
    autograd = autograd_cpu_ns() - autograd_before
    steps = max(1, len(waits))
    train = {"train_cpu_ms": on_cpu / 1e6 / steps, "train_runq_ms": queued / 1e6 / steps,
             "train_blocked_ms": seconds * 1e3 / steps - (on_cpu + queued) / 1e6 / steps,
             "train_vcsw": vol / steps, "train_ivcsw": invol / steps, "train_cpu_alone_ms": cpu_alone,
             "train_vcsw_alone": vcsw_alone, "autograd_cpu_ms": autograd / 1e6 / steps,
             "autograd_cpu_alone_ms": autograd_alone, "train_cpu_free_ms": cpu_free,
             "autograd_cpu_free_ms": autograd_free,
             # the loader's Python threads' CPU per step (an upper bound on the GIL they hold) and its share of the wall
             "producer_cpu_ms": producer_s * 1e3 / steps, "loader_py_share": producer_s / seconds,
             **allocator,  # the allocators' CUDA calls over the timed epochs
             **pauses.summary(), "gc": gc_mode}
    if probe is not None:
        probe.stop.set()
        probe.join()
    gil_stop.set()
    for t in gil_threads:
        t.join()
    gpu_ms = [a.elapsed_time(b) for a, b in events]
    stats = loader.stats()
    loader.close()
    # the ceiling again, after the GPU has trained for the timed epochs: a sustained run may clock lower
    ceiling_after = ceiling_rate(step, batch_size, size, device)
    for _, p in spies:
        if p is not None:
            p.wait(timeout=60)
    rate = images / seconds
    if "decoder_trial" in stats:  # decoder="auto": what it measured while warming up, and what it chose
        trial = stats["decoder_trial"]
        decoder = f"auto: {trial['chosen'] or 'still measuring'} (" + ", ".join(
            f"{name} {rate:,.0f}" for name, rate in trial["rates"].items()) + " img/s)"
    row = {"decoder": decoder, "transform": transform or "plain", "reserve": reserve, "model": model, "size": size,
           "ceiling": ceiling, "ceiling_after": ceiling_after, "side_priority": side_priority,
           "train_stream": train_stream, "cuda_graph": cuda_graph,
           "engine_priority": engine_priority if decoder != "cpu" else None,
           "traced": traced is not None,  # the profiler slows the timed epochs: no rate to compare
           "loader_only": loader_only, "planning": planning, "switch_interval": sys.getswitchinterval(),
           "train_cores": train_cores, "feed": feed, "loader_device": loader_device,
           "gil_load": ":".join(f"{v:g}" for v in gil_load) if gil_load else None,
           "plan_batches": fastload.loader.PLAN_BATCHES, "images_per_s": rate,
           "efficiency": rate / ceiling, "steps": len(waits), "wall_per_step_ms": seconds / len(waits) * 1e3,
           "wait_ms": float(np.mean(waits)) * 1e3, "wait_p90_ms": float(np.percentile(waits, 90)) * 1e3,
           "launch_ms": float(np.mean(launches)) * 1e3, "launch_alone_ms": launch_alone, "gpu_ms": float(np.mean(gpu_ms)),
           "read_s": stats["read_s"], "decode_s": stats["decode_s"], "stage_s": stats["stage_s"],
           "threads": loader.threads, "workers": loader.workers, "cores": os.cpu_count(), "gil_probe": gil_probe,
           **(probe.summary() if probe is not None else dict.fromkeys(GilProbe.FIELDS, float("nan"))),
           **train, "cpu_by_thread": cores}
    if producer_times:
        row["producer_ms_per_batch"] = phases.summary()
    return row, [(p, _summarise_spy(p)) for p, _ in spies]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--size", type=int, default=160)
    p.add_argument("--decoder", nargs="+", default=["cpu"])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--transform", choices=TRANSFORMS, help="a fastload bench --transform spec (default: "
                   "RandomResizedCrop + flip + normalise, the crop= shorthand)")
    p.add_argument("--epochs", type=int, default=4, help="timed epochs after the warm-up epochs")
    p.add_argument("--warmup-epochs", type=int, default=1,
                   help="untimed epochs first (decoder=auto: enough for its trial, ~150 batches)")
    p.add_argument("--py-spy", metavar="DIR", help="write py-spy profiles (raw collapsed stacks) here")
    p.add_argument("--threads", type=int, nargs="+", default=[None], help="FastLoader(threads=), each in turn")
    p.add_argument("--workers", type=int, nargs="+", default=[None], help="FastLoader(workers=), each in turn")
    p.add_argument("--feed", nargs="+", choices=("loader", "fixed", "none"), default=["loader"],
                   help="train on the loader's batches, or take them and train on a fixed batch (the loader's "
                        "activity beside the step without its data path), or train on a fixed batch as many steps "
                        "with the loader idle (none: the loop's control); each in turn")
    p.add_argument("--gil-probe", nargs="+", choices=("on", "off"), default=["off"],
                   help="the GIL probe thread on or off, each in turn (default off: its wake-ups compete for the GIL "
                        "too, and cost the eager loop up to 0.03 of its efficiency)")
    p.add_argument("--train-cores", type=int, nargs="+", default=[0],
                   help="the training thread and autograd's on the first N physical cores (their SMT siblings "
                        "too), the loader on the others; 0: no pinning; each in turn")
    p.add_argument("--reserve", type=int, default=0,
                   help="FastLoader(cpus=) without the first N cores: left to the training loop's threads")
    p.add_argument("--cuda-wait", nargs="+", choices=("auto", "spin", "yield", "sleep"), default=["auto"],
                   help="the CUDA driver's wait policies to compare (bench.cuda_wait), each set in turn in "
                        "this one process")
    p.add_argument("--side-priority", type=int, nargs="+", default=[None],
                   help="the loader's side stream priority (default: its own, -1), each in turn")
    p.add_argument("--gil-load", nargs="+", default=[None], type=_gil_load, metavar="N:MS:SHARE",
                   help="N threads beside the loader each holding the GIL in chunks of MS ms, SHARE of their time "
                        "(bench.host_contention --kinds gil) over the timed epochs, each setting in turn; 0: none. "
                        "How the loop answers more GIL taken than the loader's own")
    p.add_argument("--gc", nargs="+", choices=("default", "collect", "freeze"), default=["default"],
                   help="Python's garbage collector as it is, a full collection before the run (the start-up's "
                        "debt paid off the clock), or gc.freeze() before it (the objects alive then never walked "
                        "again), each in turn")
    p.add_argument("--loader-device", nargs="+", choices=("cuda", "cpu"), default=["cuda"],
                   help="FastLoader(device=) each in turn; cpu (its stage on the host, no CUDA call) only with "
                        "--feed fixed/none: the loader's host work beside the step without its GPU work")
    p.add_argument("--train-stream", nargs="+", choices=("default", "side"), default=["default"],
                   help="the training loop on the legacy default stream, or on a stream of its own; each in turn")
    p.add_argument("--cuda-graph", action="store_true", help="the step in a CUDA graph (fastload bench --cuda-graph)")
    p.add_argument("--engine-priority", type=int, help="the JPEG engines' streams' priority (default: -1, high)")
    p.add_argument("--trace", metavar="DIR", help="a torch.profiler trace of timed steps 20-29 of each run, here")
    p.add_argument("--rounds", type=int, default=1, help="runs of every (policy, decoder), in alternating order")
    p.add_argument("--switch-interval", type=float, nargs="+", default=[None],
                   help="sys.setswitchinterval (s) for a run, each in turn (default: the process's, 0.005)")
    p.add_argument("--loader-only", action="store_true",
                   help="take the batches without training on them: the loader alone, in the same harness")
    p.add_argument("--bitstreams", nargs="+", choices=("pageable", "pinned"), default=[None],
                   help="the JPEG engines' files in pageable or page-locked host memory, each in turn (default: the "
                        "library's, decoders.Engines.pinned_bitstreams)")
    p.add_argument("--producer-times", action="store_true",
                   help="each producer's time per batch by phase over the timed epochs (bench/producer_timeline.py)")
    p.add_argument("--planning", nargs="+", choices=("live", "ahead"), default=["live"],
                   help="live: the producers plan each batch while the loop runs (the library); ahead: "
                        "every timed batch prepared before the timed epochs (what planning's GIL time costs), "
                        "each in turn")
    p.add_argument("--plan-batches", type=int, nargs="+", default=[None],
                   help="batches a producer plans in one pass (default: the library's loader.PLAN_BATCHES), each "
                        "in turn")
    p.add_argument("--hybrid", nargs="+", default=[None], metavar="E/P",
                   help="decoder=hybrid's split: the engines take E of every P batches (decoders.HYBRID_*), each "
                        "in turn in this one process (default: the library's)")
    args = p.parse_args(argv)
    if args.reserve and any(args.train_cores):
        p.error("--train-cores sets the loader's cores itself: not with --reserve")
    for d in (args.py_spy, args.trace):
        if d:
            os.makedirs(d, exist_ok=True)
    rows = []
    runs = [(w, d, h, ts, b, th, pl, pb, si, settings)
            for w in args.cuda_wait for d in args.decoder
            for h in (args.hybrid if d == "hybrid" else [None]) for ts in args.train_stream
            for b in (args.bitstreams if d != "cpu" else [None]) for th in args.threads for pl in args.planning
            for pb in args.plan_batches for si in args.switch_interval for settings in _swept_settings(args)]
    default_split = (decoders.HYBRID_ENGINE_BATCHES, decoders.HYBRID_PERIOD)
    library_pinned = decoders.Engines.pinned_bitstreams
    try:
        _run_all(args, runs, rows, default_split, library_pinned)
    finally:  # the library's settings back, whatever happened
        decoders.HYBRID_ENGINE_BATCHES, decoders.HYBRID_PERIOD = default_split
        decoders.Engines.pinned_bitstreams = library_pinned
    _print(rows)


# Options that profile() takes by keyword, each run with one of their values: (its keyword, the argparse attribute,
# the value as profile() takes it). A new such option is a line here and its argparse line.
_SWEPT = (("train_cores", "train_cores", None), ("gil_probe", "gil_probe", lambda v: v == "on"),
          ("feed", "feed", None), ("side_priority", "side_priority", None), ("loader_device", "loader_device", None),
          ("gil_load", "gil_load", None), ("gc_mode", "gc", None), ("workers", "workers", None))


def _swept_settings(args):
    """Every combination of the _SWEPT options' values, each as profile()'s keywords."""
    values = [[v if convert is None else convert(v) for v in getattr(args, attr)] for _, attr, convert in _SWEPT]
    return [dict(zip((key for key, _, _ in _SWEPT), combo)) for combo in itertools.product(*values)]


def _run_all(args, runs, rows, default_split, library_pinned):
    for r in range(args.rounds):
        for wait, d, split, ts, bits, threads, planning, plan_batches, interval, settings in (
                runs if r % 2 == 0 else runs[::-1]):
            pinned = library_pinned if bits is None else bits == "pinned"
            decoders.Engines.pinned_bitstreams = pinned
            engines, period = default_split if split is None else (int(v) for v in split.split("/"))
            decoders.HYBRID_ENGINE_BATCHES, decoders.HYBRID_PERIOD = engines, period
            set_cuda_wait(wait)
            row, spies = profile(args.data, args.model, args.size, d, args.batch_size, args.epochs, args.py_spy,
                                 interval, threads, reserve=args.reserve, warmup_epochs=args.warmup_epochs,
                                 transform=args.transform, train_stream=ts, cuda_graph=args.cuda_graph,
                                 engine_priority=args.engine_priority, trace=args.trace,
                                 producer_times=args.producer_times, loader_only=args.loader_only,
                                 planning=planning, plan_batches=plan_batches, **settings)
            row["cuda_wait"] = wait
            row["bitstreams"] = None if d == "cpu" else "pinned" if pinned else "pageable"
            if d == "hybrid":
                row["decoder"] = f"hybrid {engines}/{period}"
            rows.append(row)
            print(f"--- {d}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in row.items()), flush=True)
            for path, text in spies:
                print(f"py-spy {os.path.basename(path)}:\n{text}", flush=True)


def _print(rows):
    for r in rows:
        print(f"cores used by thread, {r['decoder']}, {r['cuda_wait']}: "
              + ", ".join(f"{k} {v}" for k, v in r["cpu_by_thread"].items()))
    cols = ("decoder", "bitstreams", "transform", "planning", "plan_batches", "switch_interval", "train_cores",
            "gil_probe", "feed", "loader_device", "gil_load", "train_stream", "cuda_graph", "engine_priority", "traced",
            "cuda_wait",
            "reserve", "side_priority", "threads", "workers", "ceiling", "ceiling_after", "images_per_s", "efficiency",
            "wall_per_step_ms", "gpu_ms", "wait_ms", "wait_p90_ms", "launch_ms", "launch_alone_ms", "read_s",
            "decode_s", "stage_s", "gil_late_mean_ms", "gil_late_p99_ms", "train_cpu_ms", "train_runq_ms",
            "train_blocked_ms", "train_vcsw", "train_ivcsw", "train_cpu_alone_ms", "train_vcsw_alone",
            "autograd_cpu_ms", "autograd_cpu_alone_ms", "train_cpu_free_ms", "autograd_cpu_free_ms",
            "producer_cpu_ms", "loader_py_share", *_ALLOCATOR_COUNTS, "gc", *GcPauses.FIELDS)
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
