"""How often FastLoader's threads give the GIL up, and where: each time they do, a launch-bound training thread that
waits for the GIL gets it and must later wait for it again (bench/RESULTS.md, "The training thread's switches").

A counting thread loops on ``time.sleep(0)`` (which releases the GIL) with the switch interval so long that it is
never granted the GIL by force: it runs only when some thread gives the GIL up long enough for it to wake. It
counts a turn when another thread has run Python since its last one (a handover to it and back, not its own
loop while the GIL is free). ``sys.setprofile`` / ``threading.setprofile`` hooks mark that Python activity and
count, per thread kind (the thread taking the batches, producers) and call site (the C function and the
Python line calling it), the C calls during which the counter had a turn: the calls that handed the GIL to a
waiting thread. Each such call counts once, however often it gave the GIL up inside (py-lmdb's getmulti does per
key); a release too short for the counter to wake is not counted (nor would it reach a waiting training thread);
where several threads wait, the counter competes with them. So these are lower bounds on the handovers, by site.

    python -m bench.gil_releases DATA [--device cuda] [--transform trivialaugment] [--size 176] [--batches 48]

Prints, per batch, the C calls that handed the GIL over by thread kind, then the call sites that do it most.
"""
import argparse
import collections
import sys
import threading
import time

import torch

from fastload import FastLoader
from fastload.benchmark import loader_shape, open_dataset


class ReleaseCounter:
    """A thread that counts its turns with the GIL after another thread's Python (see the module's docstring).
    Use as a context; other threads' profile hooks call ``ran()``."""

    def __init__(self):
        self.n = 0
        self._seq = 0  # bumped by other threads' Python: what a turn must have seen change
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="release-counter")

    def ran(self):
        self._seq += 1

    def _run(self):
        seen = self._seq
        while not self._stop:
            if self._seq != seen:
                seen = self._seq
                self.n += 1
            time.sleep(0)

    def __enter__(self):
        self._interval = sys.getswitchinterval()
        sys.setswitchinterval(1e3)  # never a forced switch: the counter runs only when the GIL is given up
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join()
        sys.setswitchinterval(self._interval)


def _kind(name):
    if name.startswith("fastload-"):
        return "producer"
    return "training thread" if name == "MainThread" else name


class Attribution:
    """sys.setprofile hooks on every thread: the counter's increments during each C call, by (thread kind, call
    site)."""

    def __init__(self, counter):
        self.counter = counter
        self.by_site = collections.Counter()
        self.by_kind = collections.Counter()
        self._local = threading.local()

    def hook(self, frame, event, arg):
        self.counter.ran()
        stack = self._local.__dict__.setdefault("stack", [])
        if event == "c_call":
            stack.append(self.counter.n)
        elif event in ("c_return", "c_exception") and stack:
            if self.counter.n != stack.pop():  # the counter had a turn during this call: it gave the GIL up
                stack[:] = [self.counter.n] * len(stack)  # not counted again for the calls it ran inside
                kind = _kind(threading.current_thread().name)
                code = frame.f_code
                site = f"{getattr(arg, '__qualname__', arg)} <- {code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
                self.by_site[(kind, site)] += 1
                self.by_kind[kind] += 1

    def __enter__(self):
        threading.setprofile(self.hook)
        sys.setprofile(self.hook)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        threading.setprofile(None)


def measure(loader, batches):
    """(handing calls per batch by thread kind, by (kind, call site)) over ``batches`` batches of ``loader``, after
    one untimed batch (start-up), from a second iterator whose threads start inside the hooks."""
    it = iter(loader)
    next(it)  # the first batch: start-up, not counted
    with ReleaseCounter() as counter, Attribution(counter) as where:
        it = iter(loader)  # the producers started with the hooks installed
        taken = 0
        for _ in it:
            taken += 1
            if taken == batches:
                break
    del it
    per = max(1, taken)
    return ({k: v / per for k, v in where.by_kind.most_common()},
            {k: v / per for k, v in where.by_site.most_common()})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data")
    p.add_argument("--device", default="cpu")
    p.add_argument("--transform", help="a fastload bench --transform spec (default: the crop= shorthand)")
    p.add_argument("--size", type=int, default=176)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=48)
    p.add_argument("--decoder", default="cpu")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    loader = FastLoader(open_dataset(args.data), batch_size=args.batch_size, device=device, drop_last=True,
                        channels_last=device.type == "cuda", decoder=args.decoder,
                        **loader_shape(args.transform, args.size))
    kinds, sites = measure(loader, args.batches)
    loader.close()
    print(f"C calls handing the GIL over, per batch ({args.transform or 'plain'}, {args.device}, {args.decoder}, batch "
          f"{args.batch_size}, {args.batches} batches): " + ", ".join(f"{k} {v:.1f}" for k, v in kinds.items()))
    print("| thread | call site | per batch |\n|---|---|---:|")
    for (kind, site), v in list(sites.items())[:args.top]:
        print(f"| {kind} | {site} | {v:.2f} |")


if __name__ == "__main__":
    main()
