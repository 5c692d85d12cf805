"""Progress on stderr: a tqdm bar in a terminal; elsewhere (CI logs, a file) one plain line every few seconds,
since a bar's carriage returns pile up there as one unreadable line."""
import sys
import time

#: Seconds between progress lines when stderr is not a terminal.
LINE_INTERVAL = 5.0


def progress(total, *, desc, unit, initial=0, enabled=True, stream=None):
    """An object with tqdm's ``update(n)``, ``n``, ``set_postfix(**kw)`` and ``close()``."""
    stream = stream or sys.stderr
    if enabled and stream.isatty():
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, unit=unit, desc=desc, file=stream, mininterval=0.5,
                    dynamic_ncols=True)
    return _Lines(total, desc, unit, initial, enabled, stream)


class _Lines:
    def __init__(self, total, desc, unit, initial, enabled, stream):
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self._enabled, self._stream = enabled, stream
        self._start = self._last = time.monotonic()
        self._initial, self._postfix, self._printed = initial, "", False

    def update(self, k=1):
        self.n += k
        now = time.monotonic()
        if now - self._last >= LINE_INTERVAL:
            self._last = now
            self._line(now)

    def set_postfix(self, refresh=False, **values):
        self._postfix = ", ".join(f"{k} {v}" for k, v in values.items())

    def _line(self, now):
        if not self._enabled:
            return
        self._printed = True
        rate = (self.n - self._initial) / max(now - self._start, 1e-9)
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        extra = f", {self._postfix}" if self._postfix else ""
        print(f"{self.desc}: {self.n}/{self.total} {self.unit}s{pct}, {rate:,.0f} {self.unit}s/s{extra}",
              file=self._stream, flush=True)

    def close(self):
        if self._printed:  # the final count, when lines were printed along the way
            self._line(time.monotonic())
