"""Diagnostic (GPU machine): how fast is the GPU's hardware JPEG decoder (nvJPEG's HARDWARE backend, the NVJPG
engines of A100/H100/H200), alone and while the CPU crop-decodes at full speed? Answers whether handing part of
each batch to it could lift FastLoader(device="cuda") past what the CPU cores decode.

    python -m bench.nvjpeg_hw --data data/imagenet-like [--batch 256] [--seconds 5]

Talks to libnvjpeg through ctypes (no header or link-time dependency); full-image decode to interleaved RGB
into one device buffer, as a ragged batch, and (when the library has it) ROI decode of RandomResizedCrop windows.
"""
import argparse
import ctypes
import glob
import os
import threading
import time

import numpy as np
import torch

import fastload as fl
from fastload import ops

BACKEND_HARDWARE, OUTPUT_RGBI = 3, 5


class Image(ctypes.Structure):  # nvjpegImage_t
    _fields_ = [("channel", ctypes.c_void_p * 4), ("pitch", ctypes.c_size_t * 4)]


def load_nvjpeg():
    import torchvision
    names = ["libnvjpeg.so.13", "libnvjpeg.so.12"]
    names += glob.glob(os.path.join(os.path.dirname(torchvision.__file__), "..", "torchvision.libs", "libnvjpeg*"))
    names += glob.glob("/usr/local/cuda*/lib64/libnvjpeg.so*") + glob.glob("/usr/local/cuda*/targets/*/lib/libnvjpeg.so*")
    for name in names:
        try:
            return ctypes.CDLL(name), name
        except OSError:
            continue
    raise OSError("libnvjpeg not found")


class HardwareDecoder:
    def __init__(self, lib, batch):
        self.lib, self.batch = lib, batch
        self.handle, self.state = ctypes.c_void_p(), ctypes.c_void_p()
        self.check(lib.nvjpegCreateEx(BACKEND_HARDWARE, None, None, 0, ctypes.byref(self.handle)), "nvjpegCreateEx")
        self.check(lib.nvjpegJpegStateCreate(self.handle, ctypes.byref(self.state)), "nvjpegJpegStateCreate")
        self.check(lib.nvjpegDecodeBatchedInitialize(self.handle, self.state, batch, 1, OUTPUT_RGBI),
                   "nvjpegDecodeBatchedInitialize")

    @staticmethod
    def check(status, what):
        if status != 0:
            raise RuntimeError(f"{what} failed with nvjpegStatus {status}")

    def decode(self, files, shapes, out, stream, rois=None):
        n = len(files)
        data = (ctypes.c_char_p * n)(*files)
        lengths = (ctypes.c_size_t * n)(*map(len, files))
        images = (Image * n)()
        offset = 0
        for i, (h, w) in enumerate(shapes):
            images[i].channel[0] = out.data_ptr() + offset
            images[i].pitch[0] = w * 3
            offset += h * w * 3
        if rois is None:
            self.check(self.lib.nvjpegDecodeBatched(self.handle, self.state, data, lengths, images,
                                                    ctypes.c_void_p(stream)), "nvjpegDecodeBatched")
        else:
            params = (ctypes.c_void_p * n)()
            for i, (top, left, h, w) in enumerate(rois):
                self.check(self.lib.nvjpegDecodeParamsCreate(self.handle, ctypes.byref(params, i * 8)), "params")
                self.check(self.lib.nvjpegDecodeParamsSetROI(ctypes.c_void_p(params[i]), left, top, w, h), "ROI")
            self.check(self.lib.nvjpegDecodeBatchedEx(self.handle, self.state, data, lengths, images, params,
                                                      ctypes.c_void_p(stream)), "nvjpegDecodeBatchedEx")
            for p in params:
                self.lib.nvjpegDecodeParamsDestroy(ctypes.c_void_p(p))


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
    lib, name = load_nvjpeg()
    print(f"libnvjpeg: {name}")
    ds = fl.FolderDataset(a.data)
    idx = np.arange(a.batch) % len(ds)
    files = [open(ds.paths[i], "rb").read() for i in idx]
    seekable = [ops.add_restart_markers(f) for f in files]
    shapes = [(int(ds.heights[i]), int(ds.widths[i])) for i in idx]
    plan = fl.RandomResizedCrop(224).plan(ds.heights[idx], ds.widths[idx], 0, 0, idx)
    rois = [tuple(int(v) for v in w[:4]) for w in plan.windows]
    out = torch.empty(sum(h * w * 3 for h, w in shapes), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    hw = HardwareDecoder(lib, a.batch)
    results = {}

    class Printing(dict):
        def __setitem__(self, k, v):
            super().__setitem__(k, v)
            print(f"{k:<48} {v:>9,.0f} img/s" if isinstance(v, float) else f"{k:<48} {v}", flush=True)
    results = Printing()
    results["hardware, full decode"] = rate(lambda: (hw.decode(files, shapes, out, stream), a.batch)[1], a.seconds)
    results["hardware, full decode, --seekable bytes"] = rate(
        lambda: (hw.decode(seekable, shapes, out, stream), a.batch)[1], a.seconds)
    try:
        roi_shapes = [(h, w) for _, _, h, w in rois]
        results["hardware, ROI decode of the crop"] = rate(
            lambda: (hw.decode(files, roi_shapes, out, stream, rois), a.batch)[1], a.seconds)
    except (AttributeError, RuntimeError) as e:
        results["hardware, ROI decode of the crop"] = f"n/a ({e})"
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
                hw.decode(seekable, shapes, out, s.cuda_stream)
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
