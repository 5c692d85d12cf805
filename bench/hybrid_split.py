"""decoder="hybrid" making batches alone on the GPU, per engines/cores split (issue 18: >= 40,000 img/s at 160 px).

A split E/P gives the engines batch k when k % P < E and the cores the others, one producer per batch of the period
(decoders.HYBRID_ENGINE_BATCHES / HYBRID_PERIOD, set here for each run); E/P:T also sets the loader's threads (per
producer: the cores' decode threads, and the engines' producers' read and check threads) to T for that run;
E/P:T@C pins the cores' producers (and their decode threads) to the last C cores this process may use and the
engines' producers to the others, so the crop decoders and the engines' host-side submit do not share cores. "cpu"
and "nvjpeg" run beside them. Every run in turn, the order reversed each round, all in this one process; img/s over
--epochs after a warm-up epoch.

    python -m bench.hybrid_split DATA [--size 160] [--splits 2/3 4/6 2/4 4/5:8 2/3:12@12] [--rounds 2]
        [--threads N] [--nvjpeg-layouts 4:4 3:16]
"""
import argparse
import contextlib
import os
import threading

import fastload as fl
from bench.gpu import fastload_rate
from fastload import benchmark, decoders
from fastload import loader as loader_module


@contextlib.contextmanager
def pinned(engine_batches, period, cores):
    """Producer w of a hybrid loader (one per batch of the period, so w = k % period) on the last
    ``cores`` cores when w makes the cores' batches (w >= engine_batches), else on the others."""
    if not cores:
        yield
        return
    available = sorted(os.sched_getaffinity(0))
    if not 0 < cores < len(available):
        raise SystemExit(f"@{cores}: needs between 1 and {len(available) - 1} cores")
    for_cores, for_engines = set(available[-cores:]), set(available[:-cores])
    original = loader_module._enter_thread

    def enter(cpus, device):
        w = int(threading.current_thread().name.rpartition("-")[2])
        original(for_cores if w % period >= engine_batches else for_engines, device)

    loader_module._enter_thread = enter
    try:
        yield
    finally:
        loader_module._enter_thread = original


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data")
    p.add_argument("--size", type=int, default=160)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--splits", nargs="+", default=["2/3", "4/6", "2/4"], metavar="E/P")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, help="decode threads per producer (default: the decoder's)")
    p.add_argument("--nvjpeg-layouts", nargs="*", default=[], metavar="W:T",
                   help="more runs of decoder=nvjpeg with W producers of T threads each")
    args = p.parse_args(argv)
    ds = benchmark.open_dataset(args.data)
    runs = ["cpu", "nvjpeg"] + [f"nvjpeg {w}" for w in args.nvjpeg_layouts] + args.splits
    default = (decoders.HYBRID_ENGINE_BATCHES, decoders.HYBRID_PERIOD)
    rates = {run: [] for run in runs}
    for r in range(args.rounds):
        for run in (runs if r % 2 == 0 else runs[::-1]):
            workers = None
            if run.startswith("nvjpeg "):  # a layout: "nvjpeg W:T"
                workers, threads = (int(v) for v in run.split()[1].split(":"))
                decoder, split = "nvjpeg", default
            else:
                run_split, _, pin = run.partition("@")
                split, _, threads = run_split.partition(":")
                split = default if "/" not in split else tuple(int(v) for v in split.split("/"))
                decoder = "hybrid" if "/" in run else run
            decoders.HYBRID_ENGINE_BATCHES, decoders.HYBRID_PERIOD = split
            with pinned(*split, int(pin) if decoder == "hybrid" and pin else 0):
                rate, stats = fastload_rate(ds, args.epochs, args.batch_size,
                                            int(threads) if threads else args.threads, decoder,
                                            crop=fl.RandomResizedCrop(args.size), workers=workers)
            rates[run].append(rate)
            print(f"{run:7s} {rate:9,.0f} img/s  "
                  + "  ".join(f"{k} {stats[k]:.2f}" for k in ("read_s", "decode_s", "stage_s", "wait_s", "cores_used")),
                  flush=True)
    decoders.HYBRID_ENGINE_BATCHES, decoders.HYBRID_PERIOD = default
    print(f"| decoder | {' | '.join(f'round {i + 1}' for i in range(args.rounds))} |")
    print("|---|" + "---:|" * args.rounds)
    for run in runs:
        label = f"hybrid, engines {run}" if "/" in run else run.replace(" ", ", workers:threads ")
        print(f"| {label} | " + " | ".join(f"{v:,.0f}" for v in rates[run]) + " |")


if __name__ == "__main__":
    main()
