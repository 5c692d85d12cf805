"""JPEG decode throughput per core: what users run today against fastload's crop decode.

    python -m bench.decode [--data data] [--imagenet DIR] [--hd DIR] [--json results.json]

On each corpus (ImageNet-like, 1080p), single-threaded, files already in memory, one warm-up pass, best of 3:
  (a) Pillow open + convert("RGB") (ImageFolder's loader) + torchvision v2 RandomResizedCrop(224, antialias=True)
      on the PIL image. No PIL -> tensor conversion: that is on top of this in a real pipeline.
  (b) PyTurboJPEG full decode to RGB (no crop, no resize).
  (c) fastload.ops.decode_crop of the same RandomResizedCrop windows as (a), at the DCT downscale the loader
      picks: the largest d in (1, 2, 4, 8) that keeps the crop >= 224 on both sides. Decode only: the final
      resize runs later, fused with normalisation, on the GPU when there is one.
  (d) the same windows through one fastload.ops.decode_crops call (the loader's batch path) on 1 thread, into
      a reused output buffer as the loader's pinned slot is.
  (e) (d) on the same files re-encoded losslessly with restart markers (`fastload pack --seekable`): the same
      pixels, but only the segments around each window are entropy-decoded.
  (f) the CRC-32 check every read of a store makes of (e)'s bytes (``_C.crc32s``, one call for the files, as the
      batch read runs it), and (g) the same with zlib.crc32, what it ran before: the check's share of a read.
"""
import argparse
import io
import json
import os
import sys
import time
import zlib
from pathlib import Path

import torch
from PIL import Image

from fastload import ops

SIZE = 224
METHODS = {
    "a": "Pillow decode + RandomResizedCrop",
    "b": "PyTurboJPEG full decode",
    "c": "fastload decode_crop (DCT-scaled)",
    "d": "fastload decode_crops batch, 1 thread",
    "e": "(d) on pack --seekable bytes",
    "f": "CRC-32 check of (e)'s bytes, fastload",
    "g": "CRC-32 check of (e)'s bytes, zlib.crc32",
}
DEFAULT_TURBOJPEG = "/usr/lib/x86_64-linux-gnu/libturbojpeg.so.0"


def dct_downscale(height, width, size=SIZE):
    """The loader's choice: the largest d in (1, 2, 4, 8) with floor(h / d) >= size and floor(w / d) >= size."""
    return max(d for d in ops.DOWNSCALES if d == 1 or (height // d >= size and width // d >= size))


def turbojpeg(lib_path=None):
    """A TurboJPEG decoder: ``lib_path``, else $FASTLOAD_TURBOJPEG_LIB (bench/device_run.sh points it at the
    library it unpacks on the GPU machine, which has none installed), else PyTurboJPEG's default search, else
    Debian's library path."""
    from turbojpeg import TurboJPEG
    lib_path = lib_path or os.environ.get("FASTLOAD_TURBOJPEG_LIB")
    if lib_path:
        return TurboJPEG(lib_path=lib_path)
    try:
        return TurboJPEG()
    except (OSError, RuntimeError):
        return TurboJPEG(lib_path=DEFAULT_TURBOJPEG)


def load(folder, count):
    """The first ``count`` JPEGs of an ImageFolder tree (sorted paths), as bytes."""
    paths = sorted(Path(folder).rglob("*.jpg"))[:count]
    if not paths:
        raise FileNotFoundError(f"no .jpg files under {folder}")
    return [p.read_bytes() for p in paths]


def plan(files, seed, size=SIZE):
    """RandomResizedCrop windows (top, left, h, w, d) drawn exactly as (a)'s transform draws them."""
    from torchvision.transforms import RandomResizedCrop
    torch.manual_seed(seed)
    rows = []
    for data in files:
        info = ops.read_header(data)
        # get_params only looks at the size; an expanded 1-element tensor has it without allocating an image
        top, left, h, w = RandomResizedCrop.get_params(torch.empty(1, 1, 1).expand(3, info.height, info.width),
                                                       scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
        rows.append([top, left, h, w, dct_downscale(h, w, size)])
    return torch.tensor(rows, dtype=torch.int64)


def best_of(fns, passes, warmup=True):
    """{name: seconds of its fastest of ``passes`` runs}, after one untimed run each. The passes go round-robin
    over the methods, so a busy neighbour on a shared machine slows all of them alike rather than one."""
    if warmup:
        for fn in fns.values():
            fn()
    best = {name: float("inf") for name in fns}
    for _ in range(passes):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def measure(name, files, seed, tj, passes, warmup=True, size=SIZE):
    """One corpus: rows for (a)-(g) plus a summary dict."""
    from torchvision.transforms import v2
    windows = plan(files, seed, size)
    rrc = v2.RandomResizedCrop(size, antialias=True)

    def pillow():
        torch.manual_seed(seed)  # same windows as plan(), pass after pass
        for data in files:
            rrc(Image.open(io.BytesIO(data)).convert("RGB"))

    def turbo():
        from turbojpeg import TJPF_RGB
        for data in files:
            tj.decode(data, pixel_format=TJPF_RGB)

    def crop():
        for data, (top, left, h, w, d) in zip(files, windows.tolist()):
            ops.decode_crop(data, top, left, h, w, d)

    # The loader decodes into a slot it reuses (pinned when there is a GPU); a fresh buffer per call would
    # mostly measure page faults.
    slot = torch.empty(sum(3 * h * w for h, w in (ops.decoded_shape(*win) for win in windows.tolist())),
                       dtype=torch.uint8)

    def batch():
        ops.decode_crops(files, windows, slot, threads=1)

    seekable = [ops.add_restart_markers(data) or data for data in files]

    def batch_seekable():
        ops.decode_crops(seekable, windows, slot, threads=1)

    from fastload.native import C

    def crc():
        C.crc32s(seekable, 1)

    def crc_zlib():
        for data in seekable:
            zlib.crc32(data)

    runs = {"a": pillow, "b": turbo, "c": crop, "d": batch, "e": batch_seekable, "f": crc, "g": crc_zlib}
    seconds = best_of({k: fn for k, fn in runs.items() if k != "b" or tj is not None}, passes, warmup)
    rows = [{"corpus": name, "method": k, "label": METHODS[k], "images": len(files), "seconds": s,
             "img_per_s": len(files) / s, "speedup": seconds["a"] / s} for k, s in seconds.items()]
    sizes = [ops.read_header(f)[:2] for f in files]
    decoded = sum(ops.decoded_shape(*w)[0] * ops.decoded_shape(*w)[1] for w in windows.tolist())
    summary = {"corpus": name, "images": len(files), "mean_kb": sum(map(len, files)) / len(files) / 1e3,
               "mean_megapixels": sum(h * w for h, w in sizes) / len(files) / 1e6,
               "decoded_fraction": decoded / sum(h * w for h, w in sizes),
               "downscales": {d: int((windows[:, 4] == d).sum()) for d in ops.DOWNSCALES}}
    return rows, summary


def run(imagenet_dir, hd_dir, *, imagenet_count=200, hd_count=32, passes=3, warmup=True, turbojpeg_lib=None,
        seed=0, out=sys.stdout):
    """Measures both corpora side by side, prints the table to ``out`` and returns its rows (dicts)."""
    try:
        tj = turbojpeg(turbojpeg_lib)
    except (ImportError, OSError, RuntimeError) as e:
        print(f"(b) skipped: PyTurboJPEG unavailable ({e})", file=out)
        tj = None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # per core: every method on one thread
    try:
        rows, summaries = [], []
        for name, folder, count in (("imagenet-like", imagenet_dir, imagenet_count), ("1080p", hd_dir, hd_count)):
            r, s = measure(name, load(folder, count), seed, tj, passes, warmup)
            rows += r
            summaries.append(s)
    finally:
        torch.set_num_threads(threads)
    print(format_table(rows, summaries), file=out)
    return rows


def format_table(rows, summaries=()):
    lines = []
    for s in summaries:
        ds = ", ".join(f"1/{d}: {n}" for d, n in s["downscales"].items() if n)
        lines.append(f"{s['corpus']}: {s['images']} images, {s['mean_megapixels']:.2f} MP and {s['mean_kb']:.0f} KB "
                     f"on average; (c) decodes {100 * s['decoded_fraction']:.0f}% of the pixels ({ds})")
    lines.append("")
    lines.append(f"{'corpus':<14} {'method':<42} {'img/s/core':>10} {'ms/img':>8} {'vs (a)':>7}")
    for r in rows:
        lines.append(f"{r['corpus']:<14} ({r['method']}) {r['label']:<38} {r['img_per_s']:>10.0f} "
                     f"{1e3 / r['img_per_s']:>8.3f} {r['speedup']:>6.2f}x")
    lines.append("single thread, files in memory, best of the timed passes. (a) ends with a 224x224 PIL image (no "
                 "tensor conversion); (b) is a full-size decode; (c)-(e) end with the uint8 crop at 1/d, before the "
                 "final resize; (f) and (g) only check bytes.")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path("data"), help="where the default corpora are built")
    p.add_argument("--imagenet", type=Path, help="an ImageFolder of JPEGs (default: DATA/imagenet, generated)")
    p.add_argument("--hd", type=Path, help="an ImageFolder of 1080p JPEGs (default: DATA/hd, generated)")
    p.add_argument("--imagenet-count", type=int, default=200)
    p.add_argument("--hd-count", type=int, default=32)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--turbojpeg-lib", help=f"libturbojpeg path (default: PyTurboJPEG's search, {DEFAULT_TURBOJPEG})")
    p.add_argument("--json", type=Path, help="also write the rows here")
    a = p.parse_args(argv)
    from bench import corpus
    imagenet = a.imagenet or corpus.make_imagenet_like(a.data / "imagenet", classes=8, per_class=32)
    hd = a.hd or corpus.make_hd(a.data / "hd", count=32)
    rows = run(imagenet, hd, imagenet_count=a.imagenet_count, hd_count=a.hd_count, passes=a.passes,
               turbojpeg_lib=a.turbojpeg_lib, seed=a.seed)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
