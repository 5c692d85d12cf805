"""Where FastLoader's producer threads spend a batch inside a training loop (issue 18): each producer thread's wall
time per batch split by phase, and how busy the JPEG engines were, so that a loop waiting for its loader says
whether the engines (or the cores) are saturated or starved.

Phases (ms per batch, per producer thread (each epoch's are new threads), mean over the batches it made while
installed):
- ``slot``: waiting for a free slot (all its batches queued: the loader is ahead);
- ``plan``: planning its next batches (the crop plans and parameters, PLAN_BATCHES at a time, while a batch
  decodes);
- ``reusable``: waiting for the GPU to be done with the slot's buffers (the stage of the slot's last batch);
- ``read``: the engines' read of the batch's files (``Engines._buffers``), or the cores' read of its records
  (``read_sources``) where it is not part of ``cores``; ``verify``: ``engine_ready``;
- ``lock``: waiting for the JPEG engines (another producer holds them); ``submit``: nvJPEG's batched decode call;
  ``sync``: waiting for the engines' streams to finish the batch;
- ``cores``: ``Cores.start`` (with several decode threads: reading the batch's records and starting the crop
  decoders; inside the engines' path, for the samples they cannot take); ``decode``: waiting for the crop decoders
  (several threads), or the decode itself (one thread, on the producer's own);
- ``stage``: queueing the copy and the stage on the side stream; ``put``: waiting for room in its queue.
``engines busy``: the share of the installed wall time some producer held the engines.

Used by ``bench.train_profile --producer-times``; works on a loader that is not iterating yet.
"""
import collections
import contextlib
import threading
import time

from fastload import decoders, loader as loader_mod, nvjpeg, producer

PHASES = ("slot", "plan", "reusable", "read", "verify", "lock", "submit", "sync", "cores", "decode", "stage", "put")


class _TimedLock:
    """The maker's hardware lock, timing how long acquiring it waits and how long it is held."""

    def __init__(self, lock, timeline):
        self.lock, self.timeline = lock, timeline

    def __enter__(self):
        t = time.perf_counter()
        self.lock.acquire()
        self.held_since = time.perf_counter()
        self.timeline.add("lock", self.held_since - t)

    def __exit__(self, *exc):
        self.timeline.held += time.perf_counter() - self.held_since
        self.lock.release()

    def acquire(self, *a, **k):
        return self.lock.acquire(*a, **k)

    def release(self):
        return self.lock.release()


def _thread():
    """The calling thread's row: its name and id (each epoch's producers are new threads of the same names, and the
    next epoch's start while the current one's end)."""
    t = threading.current_thread()
    return f"{t.name}#{t.native_id}"


class Timeline:
    def __init__(self):
        self.lock = threading.Lock()
        self.times = collections.defaultdict(lambda: collections.defaultdict(float))  # thread -> phase -> s
        self.batches = collections.defaultdict(int)
        self.spans = {}  # thread -> [first timed start, last timed end]: its wall time while installed
        self.held = 0.0
        self.current = threading.local()  # .phase: the timed call a thread is in (a nested one counts once)

    def add(self, phase, seconds, end=None):
        end = time.perf_counter() if end is None else end
        with self.lock:
            row = _thread()
            self.times[row][phase] += seconds
            span = self.spans.setdefault(row, [end - seconds, end])
            span[0], span[1] = min(span[0], end - seconds), max(span[1], end)

    def timed(self, phase, fn):
        def wrapper(*a, **k):
            if getattr(self.current, "phase", None) is not None:  # inside another timed phase: that one has it
                return fn(*a, **k)
            self.current.phase = phase
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.current.phase = None
                end = time.perf_counter()
                self.add(phase, end - t, end)
        return wrapper

    @contextlib.contextmanager
    def installed(self, maker):
        """The phases above timed for the block (module and class attributes patched, then restored)."""
        P = loader_mod._Producers
        patches = [(producer.Slot, "wait_reusable", "reusable"), (decoders.Engines, "_buffers", "read"),
                   (decoders, "read_sources", "read"),
                   (decoders, "engine_ready", "verify"), (nvjpeg.HardwareDecoder, "decode", "submit"),
                   (decoders, "wait_for", "sync"), (decoders.Cores, "start", "cores"),
                   (decoders.JpegCrops, "finish", "decode"), (decoders.JpegCrops, "decode", "decode"),
                   (P, "submit", "stage"), (loader_mod._Plans, "ahead", "plan")]
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
        take, put, start = P.take, P.put, producer.BatchMaker.start
        timeline = self

        def take_slot(self_, q):  # free slots only: the consumer's own takes are not the producers'
            return timeline.timed("slot", take)(self_, q) if q in self_.free else take(self_, q)

        def counted(self_, *a, **k):
            with timeline.lock:
                timeline.batches[_thread()] += 1
            return start(self_, *a, **k)
        lock = maker._hardware_lock
        self.t0 = time.perf_counter()
        try:
            for owner, name, phase in patches:
                setattr(owner, name, self.timed(phase, getattr(owner, name)))
            P.take, P.put, producer.BatchMaker.start = take_slot, self.timed("put", put), counted
            maker._hardware_lock = _TimedLock(lock, self)
            yield self
        finally:
            self.wall = time.perf_counter() - self.t0
            maker._hardware_lock = lock
            for owner, name, fn in saved:
                setattr(owner, name, fn)
            P.take, P.put, producer.BatchMaker.start = take, put, start

    def summary(self):
        """{"NAME#ID" of a producer thread: {phase: ms per batch, "wall": the time from its first timed call to its
        last per batch it made}, "engines_busy": the share of the installed wall time the engines were held}."""
        out = {}
        for thread, phases in sorted(self.times.items()):
            n = max(1, self.batches.get(thread, 0))
            if thread.startswith("fastload-"):
                first, last = self.spans[thread]
                out[thread] = {"batches": self.batches.get(thread, 0), "wall": round((last - first) * 1e3 / n, 2),
                               **{p: round(phases.get(p, 0.0) * 1e3 / n, 2) for p in PHASES}}
        out["engines_busy"] = round(self.held / self.wall, 3) if getattr(self, "wall", 0) else None
        return out
