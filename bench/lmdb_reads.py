"""A store's batch read in one LMDB call (the library's `_LMDBReader.sources`, Cursor.getmulti) against one get() a
record (what it did before; `_values` returning None), side by side in one process:
- the reader's thread CPU per batch of --batch-size random records (median of --batches);
- FastLoader alone on the CPU (TrivialAugmentWide at --size px, batch 64), img/s over 2 epochs, --rounds rounds in
  alternating order.

    python -m bench.lmdb_reads [--store data/imagenet-like.seekable.lmdb] [--rounds 3]
"""
import argparse
import contextlib
import statistics
import time

import numpy as np

from fastload import FastLoader, benchmark
from fastload.datasets import LMDBDataset
from fastload.datasets.lmdb import _LMDBReader


@contextlib.contextmanager
def reads(kind):
    """'batch' (the library's) or 'record' (one get() a record) while inside."""
    library = _LMDBReader._values
    if kind == "record":
        _LMDBReader._values = lambda self, indices: None
    try:
        yield
    finally:
        _LMDBReader._values = library


def read_cpu_ms(ds, batches):
    """Median thread CPU ms of reader.sources over ``batches``."""
    with ds.reader() as r:
        r.sources(batches[0])  # warm: the map's pages
        times = []
        for b in batches:
            t = time.thread_time()
            r.sources(b)
            times.append(time.thread_time() - t)
    return statistics.median(times) * 1e3


def loader_rate(ds, size):
    loader = FastLoader(ds, batch_size=64, drop_last=True, transform=benchmark.pipelines("trivialaugment", size)[0])
    for _ in loader:  # warm-up epoch
        pass
    n, t = 0, time.perf_counter()
    for epoch in (1, 2):
        loader.set_epoch(epoch)
        n += sum(len(y) for _, y in loader)
    rate = n / (time.perf_counter() - t)
    loader.close()
    return rate


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", default="data/imagenet-like.seekable.lmdb")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=50)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    ds = LMDBDataset(args.store)
    rs = np.random.RandomState(0)
    batches = [rs.randint(0, len(ds), args.batch_size).tolist() for _ in range(args.batches)]
    kinds = ("batch", "record")
    cpu, rates = {k: [] for k in kinds}, {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            with reads(kind):
                cpu[kind].append(read_cpu_ms(ds, batches))
                rates[kind].append(loader_rate(ds, args.size))
    print(f"| reads | reader CPU per batch of {args.batch_size}, ms | FastLoader TrivialAugmentWide img/s, per round |")
    print("|---|---:|---|")
    for kind in kinds:
        print(f"| {kind} | {statistics.median(cpu[kind]):.2f} | {' / '.join(f'{v:,.0f}' for v in rates[kind])} |")


if __name__ == "__main__":
    main()
