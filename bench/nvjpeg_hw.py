"""Diagnostic (GPU machine): how fast is the GPU's hardware JPEG decoder (nvJPEG's HARDWARE backend, the NVJPG
engines of A100/H100/H200), alone and while the CPU crop-decodes at full speed? Answers whether handing part of
each batch to it could lift FastLoader(device="cuda") past what the CPU cores decode.

    python -m bench.nvjpeg_hw --data data/imagenet-like [--batch 256] [--seconds 5]

Uses fastload.nvjpeg's HardwareDecoder (native, over libnvjpeg's HARDWARE backend): whole images and the
RandomResizedCrop windows, as ragged batches in one device buffer, batches queued back to back on one stream.
(bench/RESULTS.md, "The JPEG engines", gives this version's figures, and those of the script's first version,
commit 35398c0, which had its own ctypes calls.)
"""
import argparse
import os
import threading
import time

import numpy as np
import torch

import fastload as fl
from fastload import nvjpeg, ops

def rate(fn, seconds):
    fn()
    torch.cuda.synchronize()
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        n += fn()
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seconds", type=float, default=4)
    a = p.parse_args()
    nvjpeg.library_path()
    ds = fl.FolderDataset(a.data)
    idx = np.arange(a.batch) % len(ds)
    files = [open(ds.paths[i], "rb").read() for i in idx]
    seekable = [ops.add_restart_markers(f) for f in files]
    whole = torch.tensor([[0, 0, int(ds.heights[i]), int(ds.widths[i]), 1] for i in idx])
    plan = fl.RandomResizedCrop(224, dct_downscale=False).plan(ds.heights[idx], ds.widths[idx], 0, 0, idx)
    out = torch.empty(int((whole[:, 2] * whole[:, 3] * 3).sum()), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream()
    hw = nvjpeg.HardwareDecoder(a.batch)
    results = {}

    class Printing(dict):
        def __setitem__(self, k, v):
            super().__setitem__(k, v)
            print(f"{k:<48} {v:>9,.0f} img/s" if isinstance(v, float) else f"{k:<48} {v}", flush=True)
    results = Printing()
    results["hardware, whole images"] = rate(lambda: (hw.decode(files, whole, out, stream), a.batch)[1], a.seconds)
    results["hardware, whole images, --seekable bytes"] = rate(
        lambda: (hw.decode(seekable, whole, out, stream), a.batch)[1], a.seconds)
    results["hardware, the crop windows"] = rate(
        lambda: (hw.decode(files, plan.windows, out, stream), a.batch)[1], a.seconds)
    slot = torch.empty(256 << 20, dtype=torch.uint8)
    cpu = lambda bufs: (ops.decode_crops(bufs, plan.windows, slot, threads=os.cpu_count()), a.batch)[1]
    results["CPU decode_crops, all cores (original)"] = rate(lambda: cpu(files), a.seconds)
    results["CPU decode_crops, all cores (--seekable)"] = rate(lambda: cpu(seekable), a.seconds)

    # Both at once: the CPU crop-decodes on every core while the hardware decodes whole files.
    counts, stop = {"cpu": 0, "hw": 0}, threading.Event()

    def cpu_loop():
        while not stop.is_set():
            counts["cpu"] += cpu(seekable)

    def hw_loop():
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            while not stop.is_set():
                hw.decode(seekable, whole, out, s)
                s.synchronize()
                counts["hw"] += a.batch
    threads = [threading.Thread(target=cpu_loop), threading.Thread(target=hw_loop)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    time.sleep(a.seconds)
    stop.set()
    for th in threads:
        th.join()
    dt = time.perf_counter() - t
    results["together: CPU share"] = counts["cpu"] / dt
    results["together: hardware share"] = counts["hw"] / dt
    results["together: total"] = (counts["cpu"] + counts["hw"]) / dt
    print(f"{torch.cuda.get_device_name()} | {os.cpu_count()} cores | batch {a.batch} of {len(ds)} images")


if __name__ == "__main__":
    main()
