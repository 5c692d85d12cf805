"""Diagnostics for the GPU path (not a benchmark table): where FastLoader's time goes and how the warp kernel
behaves in variants. Run on the GPU machine: python -m bench.probe --data data/imagenet-like"""
import argparse
import time

import numpy as np
import torch

import fastload as fl
import fastload.ops as ops
from fastload import producer
from bench.gpu import cuda_time, realistic_batch

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--kernel-only", action="store_true")
    p.add_argument("--decode-scaling", action="store_true", help="only: crop decoding vs thread count, CPU only")
    p.add_argument("--nvjpeg-workers", metavar="STORE", help="only: FastLoader(decoder='nvjpeg') on STORE vs workers")
    a = p.parse_args()
    ds = fl.FolderDataset(a.data)
    if a.decode_scaling:
        return decode_scaling(ds)
    if a.nvjpeg_workers:
        return nvjpeg_workers(fl.LMDBDataset(a.nvjpeg_workers))
    data, offsets, shapes, mats = realistic_batch(ds)
    dev = [t.cuda() for t in (data, offsets, shapes, mats)]
    print(f"batch bytes in {data.numel() / 1e6:.1f} MB, mean crop {shapes[:, 0].float().mean():.0f}x"
          f"{shapes[:, 1].float().mean():.0f}")
    variants = {
        "f32 NCHW": dict(out_dtype=torch.float32),
        "f32 NHWC": dict(out_dtype=torch.float32, channels_last=True),
        "bf16 NCHW": dict(out_dtype=torch.bfloat16),
        "u8 NCHW (no normalise)": dict(out_dtype=torch.uint8),
    }
    for name, kw in variants.items():
        norm = {} if kw.get("out_dtype") == torch.uint8 else dict(mean=MEAN, std=STD)
        ms = cuda_time(lambda: ops.warp_ragged(*dev, 224, **norm, **kw))
        print(f"kernel {name:<24} {ms:.3f} ms")
    ident = torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]).expand(len(mats), 2, 3).contiguous().cuda()
    ms = cuda_time(lambda: ops.warp_ragged(dev[0], dev[1], dev[2], ident, 224, mean=MEAN, std=STD))
    print(f"kernel identity (1 tap)          {ms:.3f} ms")
    for _ in range(3):
        ops.warp_ragged(*dev, 224, mean=MEAN, std=STD)
    torch.cuda.synchronize()
    if a.kernel_only:
        return
    # Decode alone, batch of 256 from paths, various thread counts.
    idx = np.arange(256) % len(ds)
    plan = fl.RandomResizedCrop(224).plan(ds.heights[idx], ds.widths[idx], 0, 0, idx)
    paths = [ds.paths[i] for i in idx]
    out = torch.empty(data.numel() * 2, dtype=torch.uint8)
    for threads in (1, 8, 16):
        ops.decode_crops(paths, plan.windows, out, threads=threads)
        t = time.perf_counter()
        for _ in range(3):
            ops.decode_crops(paths, plan.windows, out, threads=threads)
        dt = (time.perf_counter() - t) / 3
        print(f"decode_crops 256 from paths, {threads:2d} threads: {256 / dt:8.0f} img/s ({dt * 1e3:.1f} ms)")
    # Slot growth during FastLoader epochs.
    grows = [0, 0.0]
    orig = producer.Slot.reserve

    def counting(self, nbytes):
        if self.buffer.numel() < nbytes:
            t = time.perf_counter()
            r = orig(self, nbytes)
            grows[0] += 1
            grows[1] += time.perf_counter() - t
            return r
        return orig(self, nbytes)
    producer.Slot.reserve = counting
    for workers in (2, 3, 4, 6):
        loader = fl.FastLoader(ds, batch_size=256, device="cuda", channels_last=True, drop_last=True, workers=workers)
        for x, y in loader:
            pass
        torch.cuda.synchronize()
        grows[:] = [0, 0.0]
        t, n = time.perf_counter(), 0
        for e in range(3):
            for x, y in loader:
                n += len(y)
        torch.cuda.synchronize()
        rate = n / (time.perf_counter() - t)
        s = loader.stats()
        print(f"FastLoader workers={workers}: {rate:8.0f} img/s | slot grows {grows[0]} ({grows[1]:.3f} s) | "
              f"read {s['read_s']:.2f} decode {s['decode_s']:.2f} stage {s['stage_s']:.2f} wait {s['wait_s']:.2f}")


class _Timed:
    """Wraps a lock or a ctypes function: per-call seconds (waiting for the lock, holding it, running the call)."""

    def __init__(self, inner):
        self.inner, self.wait, self.held, self.calls = inner, 0.0, 0.0, 0

    def __enter__(self):
        t = time.perf_counter()
        self.inner.acquire()
        self._t = time.perf_counter()
        self.wait += self._t - t

    def __exit__(self, *exc):
        self.held += time.perf_counter() - self._t
        self.calls += 1
        self.inner.release()

    def __call__(self, *args):
        t = time.perf_counter()
        try:
            return self.inner(*args)
        finally:
            self.held += time.perf_counter() - t
            self.calls += 1


def nvjpeg_workers(ds):
    """Where decoder="nvjpeg" spends its time, against the number of producer threads: per batch, the wait for
    the shared decoder, the time holding it, and inside that HardwareDecoder.decode (the native call, GIL released
    for its nvJPEG part; its return includes getting the GIL back)."""
    for workers in (1, 2, 3, 4):
        loader = fl.FastLoader(ds, batch_size=256, device="cuda", channels_last=True, drop_last=True,
                               workers=workers, decoder="nvjpeg")
        for x, y in loader:
            pass
        torch.cuda.synchronize()
        loader._stats = type(loader._stats)()
        loader._maker.stats = loader._stats
        lock = loader._maker._hardware_lock = _Timed(loader._maker._hardware_lock)
        decoder = loader._maker.decoder.handles[0]  # the loader's one HardwareDecoder: restored below
        submit = decoder.decode = _Timed(decoder.decode)
        t, n = time.perf_counter(), 0
        for _ in range(3):
            for x, y in loader:
                n += len(y)
        torch.cuda.synchronize()
        s = loader.stats()
        b = max(1, lock.calls)
        print(f"nvjpeg workers={workers:2d}: {n / (time.perf_counter() - t):8.0f} img/s | read {s['read_s']:.2f} "
              f"decode {s['decode_s']:.2f} stage {s['stage_s']:.2f} wait {s['wait_s']:.2f} s "
              f"(gpu_decoded {s['gpu_decoded']} of {s['images']}) | per batch: lock wait "
              f"{1e3 * lock.wait / b:.1f} ms, held {1e3 * lock.held / b:.1f} ms, decode "
              f"{1e3 * submit.held / max(1, submit.calls):.1f} ms", flush=True)
        del decoder.decode


def decode_scaling(ds, n=1024):
    """RandomResizedCrop decodes of in-memory files (original and --seekable bytes) against thread count."""
    import subprocess
    print(subprocess.run("lscpu | grep -E 'Model name|^CPU\\(s\\)|Thread|Core|Socket|MHz|L3'", shell=True,
                         capture_output=True, text=True).stdout)
    idx = np.arange(n) % len(ds)
    plan = fl.RandomResizedCrop(224).plan(ds.heights[idx], ds.widths[idx], 0, 0, idx)
    files = [open(ds.paths[i], "rb").read() for i in idx]
    sets = {"original": files, "seekable": [ops.add_restart_markers(f) for f in files]}
    out = torch.empty(512 << 20, dtype=torch.uint8)
    for name, bufs in sets.items():
        for threads in (1, 2, 4, 8, 12, 16, 32):
            ops.decode_crops(bufs, plan.windows, out, threads=threads)
            t = time.perf_counter()
            for _ in range(3):
                ops.decode_crops(bufs, plan.windows, out, threads=threads)
            dt = (time.perf_counter() - t) / 3
            print(f"decode_crops {name:<9} {threads:2d} threads: {n / dt:8.0f} img/s "
                  f"({dt / n * threads * 1e3:.3f} ms per image per thread)", flush=True)


if __name__ == "__main__":
    main()
