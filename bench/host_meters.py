"""What a training process's threads do to one another, measured from inside it (Linux /proc, torch's allocator
counters): each thread's CPU and scheduling, the loader's Python threads' CPU (ended threads included), the caching
allocators' calls into CUDA, the garbage collector's pauses, GIL pressure (a probe thread) and GIL taken on purpose
(threads holding it in chunks).
Used by bench.train_profile (the loop beside FastLoader) and bench.host_contention (the step beside other work)."""
import collections
import contextlib
import gc
import os
import threading
import time

import numpy as np
import torch


class GilProbe(threading.Thread):
    """Sleeps ``nap`` seconds in a loop and records how late it wakes: waiting for the GIL shows up as lateness."""

    def __init__(self, nap=0.0005):
        super().__init__(daemon=True, name="gil-probe")
        self.nap, self.late, self.stop = nap, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            t = time.perf_counter()
            time.sleep(self.nap)
            self.late.append(time.perf_counter() - t - self.nap)

    FIELDS = ("gil_late_mean_ms", "gil_late_p50_ms", "gil_late_p99_ms", "gil_late_max_ms")

    def summary(self):
        a = np.asarray(self.late) * 1e3
        return {"gil_late_mean_ms": float(a.mean()), "gil_late_p50_ms": float(np.percentile(a, 50)),
                "gil_late_p99_ms": float(np.percentile(a, 99)), "gil_late_max_ms": float(a.max())}


def _cpu_seconds(stat_line):
    """utime + stime of a /proc .../stat line, in seconds."""
    fields = stat_line[stat_line.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu():
    """CPU seconds (user + system) of the whole process (threads that ended included) and of each of its live
    threads, keyed (tid, name) (Linux /proc)."""
    threads = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                text = f.read()
        except OSError:  # the thread ended
            continue
        threads[(int(tid), text[text.index("(") + 1:text.rindex(")")])] = _cpu_seconds(text)
    with open("/proc/self/stat") as f:
        return _cpu_seconds(f.read()), threads


def sched(tid):
    """(ns on a core, ns runnable on a run queue, voluntary switches, involuntary switches) of thread ``tid``."""
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        on_cpu, queued = (int(v) for v in f.read().split()[:2])
    switches = {}
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if "ctxt_switches:" in line:
                key, _, value = line.partition(":")
                switches[key.strip()] = int(value)
    return on_cpu, queued, switches.get("voluntary_ctxt_switches", 0), switches.get("nonvoluntary_ctxt_switches", 0)


def cpu_by_thread(before, after, main_tid, seconds):
    """Cores' worth of CPU used between two thread_cpu() snapshots: the whole process, the training thread alone,
    the other threads summed by name (the decode threads share one)."""
    used = collections.Counter({"whole process": after[0] - before[0]})
    for key, t in after[1].items():
        used["training thread" if key[0] == main_tid else key[1]] += t - before[1].get(key, 0.0)
    return {name: round(t / seconds, 2) for name, t in used.most_common() if t / seconds >= 0.02}


_ALLOCATOR_COUNTS = {  # column: (torch.cuda.memory_stats or host_memory_stats, its counter)
    "cuda_mallocs": ("device", "num_device_alloc"), "cuda_frees": ("device", "num_device_free"),
    "alloc_retries": ("device", "num_alloc_retries"), "sync_all_streams": ("device", "num_sync_all_streams"),
    "host_allocs": ("host", "num_host_alloc"), "host_frees": ("host", "num_host_free")}


def allocator_counts(device):
    """The caching allocators' calls into CUDA so far: cudaMalloc / cudaFree, retries after a failed malloc (which
    free cached blocks, synchronizing), synchronizations of all streams, page-locked blocks made and returned.
    Any of them in the timed epochs stalls the host threads that wait on the allocator's lock. NaN where this
    torch has no such counter."""
    stats = {"device": torch.cuda.memory_stats(device),
             "host": torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}}
    return {col: float(stats[kind].get(key, float("nan"))) for col, (kind, key) in _ALLOCATOR_COUNTS.items()}


class ThreadCpu:
    """CPU seconds of every Python thread that runs while installed, by name, ended threads included: each thread's
    run() adds its thread_time() when it returns, and ``total()`` adds the live ones'. The loader's producers (and,
    before the thirty-fourth session, their planners) start and end every epoch, so a /proc snapshot at the end misses them. Their CPU bounds what they hold
    the GIL: their native work (the cores' decode, on threads of its own) runs elsewhere."""

    def __init__(self):
        self.ended = collections.Counter()
        self.live = {}
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def installed(self):
        library, meter = threading.Thread.run, self

        def run(thread):
            with meter.lock:
                meter.live[threading.get_ident()] = thread.name
            try:
                library(thread)
            finally:
                with meter.lock:
                    meter.ended[thread.name] += time.thread_time()
                    meter.live.pop(threading.get_ident(), None)
        threading.Thread.run = run
        try:
            yield self
        finally:
            threading.Thread.run = library

    def total(self, prefix):
        """CPU seconds so far of the threads whose name starts with ``prefix`` (the live ones from /proc)."""
        with self.lock:
            seconds = sum(t for name, t in self.ended.items() if name.startswith(prefix))
            live = {threading._active[i].native_id for i, name in self.live.items()
                    if name.startswith(prefix) and i in threading._active}
        for tid in live:
            try:
                seconds += sched(tid)[0] / 1e9
            except OSError:  # it ended meanwhile (and was added to ended, or is about to be)
                continue
        return seconds


def training_threads(autograd_only=False):
    """Thread ids of autograd's threads (pt_autograd_*: the backward passes' launches) and, unless
    ``autograd_only``, the calling (training) thread; a thread that ends meanwhile is left out."""
    me = threading.get_native_id()
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read()
        except OSError:
            continue
        if name.startswith("pt_autograd") or (tid == me and not autograd_only):
            yield tid


def autograd_cpu_ns():
    """ns on a core of autograd's threads so far."""
    total = 0
    for tid in training_threads(autograd_only=True):
        try:
            total += sched(tid)[0]
        except OSError:  # the thread ended
            continue
    return total


def physical_cores():
    """The host's CPUs this process may use, grouped by physical core (SMT siblings together, Linux sysfs), in
    order of their first id."""
    groups = {}
    for c in sorted(os.sched_getaffinity(0)):
        try:
            with open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list") as f:
                key = f.read().strip()
        except OSError:
            key = str(c)
        groups.setdefault(key, []).append(c)
    return list(groups.values())


def gil_chunks(stop, hold, duty):
    """Python for ``hold`` seconds (the GIL held), then a sleep (released), ``duty`` of the time holding it (where
    the GIL is free when it wakes): GIL taken in chunks of a known length and share (bench.host_contention --kinds
    gil, --gil-load here)."""
    gap = hold * (1 / duty - 1)
    while not stop.is_set():
        end = time.perf_counter() + hold
        while time.perf_counter() < end:  # bytecode: the GIL held, only a waiting thread's drop request ends it
            continue
        time.sleep(gap)


class GcPauses:
    """The cyclic garbage collector's pauses while installed, from ``gc.callbacks``: count, total and longest ms
    of full (generation 2) collections, and the total ms of the young ones. A collection holds the GIL throughout:
    a full one walks every tracked object of the process (~340,000 with torch and torchvision imported; 187 ms on the
    dev machine's core), so every other Python thread, the training thread's launches included, waits it out."""

    FIELDS = ("gc_full", "gc_full_ms", "gc_full_max_ms", "gc_young_ms")

    def __init__(self):
        self.full, self.full_s, self.full_max_s, self.young_s = 0, 0.0, 0.0, 0.0
        self._start = None

    def _callback(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
            return
        if self._start is None:  # installed mid-collection
            return
        took, self._start = time.perf_counter() - self._start, None
        if info["generation"] == 2:
            self.full += 1
            self.full_s += took
            self.full_max_s = max(self.full_max_s, took)
        else:
            self.young_s += took

    @contextlib.contextmanager
    def installed(self):
        gc.callbacks.append(self._callback)
        try:
            yield self
        finally:
            gc.callbacks.remove(self._callback)

    def summary(self):
        return {"gc_full": self.full, "gc_full_ms": self.full_s * 1e3, "gc_full_max_ms": self.full_max_s * 1e3,
                "gc_young_ms": self.young_s * 1e3}
