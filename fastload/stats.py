"""Counters a loader keeps so users can see where time goes (``loader.stats()``)."""
import threading
import time


class LoaderStats:
    _TIMES = ("read", "decode", "stage", "wait")
    _COUNTS = ("images", "batches", "skipped", "fallback", "gpu_decoded", "warnings")

    def __init__(self):
        self._lock = threading.Lock()
        self._values = dict.fromkeys(self._TIMES + self._COUNTS, 0)
        self._start = None

    def start(self):
        """Starts the clock of images/s, once (the first iteration's start)."""
        with self._lock:
            if self._start is None:
                self._start = time.perf_counter()

    def add(self, **values):
        with self._lock:
            if self._start is None:
                self._start = time.perf_counter()
            for key, value in values.items():
                self._values[key] += value

    def summary(self):
        """images/s since the first iteration started (or the first recorded event); *_s: seconds summed over
        producer threads (read, decode, stage) or spent by the training loop waiting for a batch (wait_s); and over
        the batches handed out, the samples skipped (replaced), decoded by Pillow (fallback), by the hardware decoder
        (gpu_decoded), and decoded with a harmless libjpeg warning (warnings: e.g. junk bytes between header
        markers; strict mode lets these through, ops.WARNING_PREFIX)."""
        with self._lock:
            v = dict(self._values)
            elapsed = time.perf_counter() - self._start if self._start is not None else 0.0
        out = {"images": v["images"], "batches": v["batches"], "seconds": elapsed,
               "images_per_s": v["images"] / elapsed if elapsed > 0 else 0.0}
        out.update({f"{k}_s": v[k] for k in self._TIMES})
        out.update({k: v[k] for k in ("skipped", "fallback", "gpu_decoded", "warnings")})
        return out
