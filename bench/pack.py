"""Files per second of `fastload pack` (and the folder scan and `fastload verify`) on an ImageNet-like corpus.

The source files are read once first, so the page cache is warm: this measures fastload, not the disk. The store
is written to --out (default: a temporary folder on the same disk), commits fsync'd as in real use.

    python -m bench.pack [--data data] [--classes 10] [--per-class 200] [--repeats 3] [--markdown]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import corpus  # noqa: E402


def _warm(src):
    total = 0
    for path in Path(src).rglob("*.jpg"):
        total += len(path.read_bytes())
    return total


def _timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)  # best of: the machine is shared, interference only ever adds time


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.pack", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=ROOT / "data", help="where the corpus is built (cached)")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--per-class", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="folder for the stores (default: a temporary one)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    a = p.parse_args(argv)

    from fastload.datasets import FolderDataset, LMDBDataset, pack, verify

    src = corpus.make_imagenet_like(a.data / f"imagenet-c{a.classes}-p{a.per_class}-s0", classes=a.classes,
                                    per_class=a.per_class)
    nbytes = _warm(src)
    n = a.classes * a.per_class
    out = Path(a.out or tempfile.mkdtemp(prefix="fastload-bench-pack-"))
    out.mkdir(parents=True, exist_ok=True)
    dst = out / "bench.lmdb"
    cache = out / "scan-cache"
    os.environ["FASTLOAD_CACHE_DIR"] = str(cache)
    rows = []

    def run_pack(**kw):
        def once():
            shutil.rmtree(dst, ignore_errors=True)
            pack(src, dst, progress=False, log=lambda m: None, **kw)
        return once

    cpus = os.cpu_count()
    configs = [("pack (default: structure check + every scan entropy-decoded)", {}),
               ("pack --workers 1", {"workers": 1}),
               ("pack --workers 2", {"workers": 2}),
               ("pack --verify-decode (full decode of every JPEG)", {"verify_decode": True}),
               ("pack --max-side 256 (re-encode every image)", {"max_side": 256})]
    for name, kw in configs:
        rows.append((name, n, _timed(run_pack(**kw), a.repeats)))

    def cli():
        shutil.rmtree(dst, ignore_errors=True)
        run = subprocess.run([sys.executable, "-m", "fastload", "pack", "-q", str(src), str(dst)],
                             capture_output=True, text=True, cwd=ROOT)
        if run.returncode:
            raise SystemExit(f"fastload pack failed ({run.returncode}):\n{run.stderr}")
    rows.append(("`fastload pack` end to end (includes ~2 s of Python + torch start-up)", n, _timed(cli, 1)))

    def scan():
        shutil.rmtree(cache, ignore_errors=True)
        FolderDataset(src)
    rows.append(("FolderDataset scan, no cache", n, _timed(scan, a.repeats)))
    rows.append(("FolderDataset, scan cached", n, _timed(lambda: FolderDataset(src), a.repeats)))
    shutil.rmtree(dst, ignore_errors=True)
    pack(src, dst, progress=False, log=lambda m: None)
    store = LMDBDataset(dst)
    rows.append(("verify store (full decode, CRC)", n, _timed(lambda: verify(store, progress=False), 1)))
    if a.out is None:
        shutil.rmtree(out, ignore_errors=True)

    title = (f"{n} ImageNet-like JPEGs ({nbytes / 1e6:.0f} MB, {a.classes} classes), page cache warm, "
             f"{cpus} cores, best of {a.repeats}")
    header = ("what", "files/s", "MB/s", "seconds")
    table = [(name, f"{count / t:,.0f}", f"{nbytes / t / 1e6:,.0f}", f"{t:.2f}") for name, count, t in rows]
    if a.markdown:
        print(f"{title}\n\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for row in table:
            print("| " + " | ".join(row) + " |")
    else:
        print(title)
        widths = [max(len(r[i]) for r in table + [header]) for i in range(len(header))]
        for row in [header] + table:
            print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))


if __name__ == "__main__":
    main()
