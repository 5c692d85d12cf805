"""Diagnostic (GPU machine): what nvJPEG's batched hardware call costs for the bytes it is given, whole files or
region JPEGs (the window's restart segments behind a copy of the header, ``ops.C.jpeg_region``), in pageable or
page-locked memory. The call blocks its thread and holds the engines for its host-side work, so its time is the
engines' limit inside the loader (bench/RESULTS.md, "The JPEG engines from page-locked copies of a store's
records"). Also checks that a region's sub-window decodes to the whole file's window, pixel for pixel.

    python -m bench.engine_bitstreams [--data data/imagenet-like] [--images 1024] [--rounds 4] [--repeats 5]

The photos are given restart markers first (``ops.add_restart_markers``, as ``fastload pack --seekable`` does),
one RandomResizedCrop window each (bench.decode.plan's) at full resolution (the engines have no DCT downscale),
batches of 256. Each round times every variant's calls, in turn (the order reversed every other round), the stream
synchronised after each call; the table gives the median ms of the call per round and the images per second of
call + sync.
"""
import argparse
import time

import numpy as np
import torch

from bench import decode as bench_decode
from fastload import nvjpeg, ops
from fastload.native import C


def batches(jpegs, batch, seed=0):
    """[(whole files, their windows [B, 5], region JPEGs, their sub-windows [B, 5])], whole batches only: each file's
    RandomResizedCrop window as bench.decode draws it, at full resolution (the engines have no DCT downscale). A
    file that does not slice keeps its whole bytes and window in the region batch."""
    planned = bench_decode.plan(jpegs, seed)
    planned[:, 4] = 1
    out = []
    for start in range(0, len(jpegs) - batch + 1, batch):
        whole, windows = jpegs[start:start + batch], planned[start:start + batch]
        regions, sub_windows = [], []
        for data, window in zip(whole, windows.tolist()):
            region = C.jpeg_region(data, *window)
            regions.append(data if region is None else region[0])
            sub_windows.append(window if region is None else region[1])
        out.append((whole, windows, regions, torch.tensor(sub_windows)))
    return out


def page_locked(buffers):
    """The buffers copied back to back into page-locked memory: views of it (the tensor kept alive by them)."""
    block = torch.empty(sum(len(b) for b in buffers), dtype=torch.uint8, pin_memory=True)
    view, views, at = memoryview(block.numpy()), [], 0
    for b in buffers:
        view[at:at + len(b)] = b
        views.append(view[at:at + len(b)])
        at += len(b)
    return views


def mismatches(decoder, data, out, other, stream):
    """Samples whose region sub-window decodes to other pixels than the whole file's window."""
    bad = 0
    for whole, windows, regions, sub_windows in data:
        offsets, shapes = decoder.decode(whole, windows, out, stream)
        sub_offsets, sub_shapes = decoder.decode(regions, sub_windows, other, stream)
        stream.synchronize()
        assert torch.equal(shapes, sub_shapes)
        for i in range(len(whole)):
            n = int(shapes[i].prod())
            bad += not torch.equal(out[offsets[i]:offsets[i] + n], other[sub_offsets[i]:sub_offsets[i] + n])
    return bad


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="data/imagenet-like")
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5, help="passes over the batches per variant and round")
    a = p.parse_args()
    jpegs = [ops.add_restart_markers(data) for data in bench_decode.load(a.data, a.images)]
    if len(jpegs) < a.batch:
        raise SystemExit(f"need {a.batch} JPEGs under {a.data}, found {len(jpegs)} (python -m bench.corpus imagenet "
                         f"{a.data})")
    data = batches(jpegs, a.batch)
    whole_bytes = sum(len(b) for d in data for b in d[0]) / len(data)
    region_bytes = sum(len(b) for d in data for b in d[2]) / len(data)
    print(f"{len(data)} batches of {a.batch}: whole files {whole_bytes / 1e6:.2f} MB a batch, region JPEGs "
          f"{region_bytes / 1e6:.2f} MB ({region_bytes / whole_bytes:.0%})")
    decoder = nvjpeg.HardwareDecoder(a.batch)
    stream = torch.cuda.Stream()
    room = 3 * max(int(windows[:, 2:4].prod(1).sum()) for _, windows, _, _ in data)  # a batch's decoded windows
    out = torch.empty(room, dtype=torch.uint8, device="cuda")
    print(f"region sub-windows decoding to other pixels than the whole files' windows: "
          f"{mismatches(decoder, data, out, torch.empty_like(out), stream)} of {len(data) * a.batch}")
    locked = [(page_locked(whole), page_locked(regions)) for whole, _, regions, _ in data]
    variants = {
        "whole files, pageable": lambda k: (data[k][0], data[k][1]),
        "whole files, page-locked": lambda k: (locked[k][0], data[k][1]),
        "region JPEGs, pageable": lambda k: (data[k][2], data[k][3]),
        "region JPEGs, page-locked": lambda k: (locked[k][1], data[k][3]),
    }
    results = {name: [] for name in variants}
    for r in range(a.rounds):
        order = list(variants.items())
        for name, get in (order if r % 2 == 0 else order[::-1]):
            calls, start = [], time.perf_counter()
            for _ in range(a.repeats):
                for k in range(len(data)):
                    buffers, windows = get(k)
                    t = time.perf_counter()
                    decoder.decode(buffers, windows, out, stream)
                    calls.append(time.perf_counter() - t)
                    stream.synchronize()
            results[name].append((np.median(calls) * 1e3, len(calls) * a.batch / (time.perf_counter() - start)))
    print(f"nvJPEG's batched call, {torch.cuda.get_device_name()}: median ms a batch of {a.batch} per round "
          f"(img/s of call + sync)")
    print("| bytes | " + " | ".join(f"round {r + 1}" for r in range(a.rounds)) + " |")
    print("|---|" + "---:|" * a.rounds)
    for name, rows in results.items():
        print(f"| {name} | " + " | ".join(f"{ms:.2f} ({rate:,.0f})" for ms, rate in rows) + " |")
    decoder.close()


if __name__ == "__main__":
    main()
