"""GPU benchmarks, side by side in one run (needs CUDA):

(a) the warp/normalise kernel's achieved bandwidth (bytes read + written over time) against a measured
    device-to-device copy and against the same work composed from torch ops (pad + affine_grid + grid_sample
    + normalise);
(b) finished 224x224 training batches per second on the GPU: FastLoader(device="cuda") against torchvision's
    ImageFolder + DataLoader (RandomResizedCrop, flip, ToTensor, Normalize, pinned, copied to the GPU) and
    against torchvision's nvJPEG batched full decode (decode alone, no crop or normalise).

    FastLoader runs on the folder and on the store `fastload pack --seekable` makes of it (packed once, kept
    beside the folder as DIR.seekable.lmdb).

    python -m bench.gpu --data DIR [--workers 16] [--epochs 3] [--json out.json]
    python -m bench.gpu --data DIR --kernel-only      # (a) alone
"""
import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

import fastload as fl
import fastload.ops as ops
from bench import corpus
from fastload import nvjpeg

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def cuda_time(fn, repeat=20, rounds=5, warmup=3):
    """Median GPU milliseconds per fn() call. A sleep kernel holds the stream while the calls are queued, so
    they run back to back and the host's launch overhead (the Python around the op, which the loader hides
    behind its side stream) is not counted: the time is the kernels' own."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(50_000_000)  # ~25 ms of GPU clock: far longer than queuing `repeat` calls takes
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / repeat)
    return float(np.median(times))


def realistic_batch(ds, batch=256, size=224, seed=0):
    """A batch exactly as FastLoader decodes it: planned RandomResizedCrop windows, DCT-downscaled."""
    crop = fl.RandomResizedCrop(size)
    idx = np.arange(batch) % len(ds)
    plan = crop.plan(np.asarray(ds.heights)[idx], np.asarray(ds.widths)[idx], seed, 0, idx)
    with ds.reader() as r:
        out, offsets, shapes, status, msgs = ops.decode_crops([r.get(int(i)) for i in idx], plan.windows,
                                                              threads=os.cpu_count())
    assert int(status.abs().sum()) == 0, msgs
    return out, offsets, shapes, plan.matrices


def kernel_bench(ds, size=224, batch=256):
    data, offsets, shapes, mats = realistic_batch(ds, batch, size)
    dev = [t.cuda() for t in (data, offsets, shapes, mats)]
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        def run():
            return ops.warp_ragged(*dev, size, mean=MEAN, std=STD, out_dtype=dtype, channels_last=True)
        ms = cuda_time(run)
        out_bytes = batch * 3 * size * size * torch.tensor([], dtype=dtype).element_size()
        moved = data.numel() + out_bytes
        rows.append((f"fastload warp_normalize ({str(dtype)[6:]}, channels_last)", ms, moved / ms / 1e6))
    # Device-to-device copy of a large buffer: the achievable bandwidth ceiling (bytes read + written).
    big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(big)
    ms = cuda_time(lambda: dst.copy_(big))
    rows.append(("device-to-device copy, 1 GiB", ms, 2 * big.numel() / ms / 1e6))
    del big, dst
    # The same work composed from torch ops: pad the ragged crops, affine_grid + grid_sample, normalise.
    hmax, wmax = int(shapes[:, 0].max()), int(shapes[:, 1].max())
    padded = torch.zeros(batch, 3, hmax, wmax, dtype=torch.uint8)
    for i in range(batch):
        h, w = int(shapes[i, 0]), int(shapes[i, 1])
        padded[i, :, :h, :w] = ops.crop_view(data, offsets, shapes, i).permute(2, 0, 1)
    padded = padded.cuda()
    theta = torch.zeros(batch, 2, 3)
    for i in range(batch):  # pixel-index matrix -> grid_sample's normalised coordinates (align_corners=False)
        m = mats[i, :, :3].double()
        a = torch.tensor([[2 / wmax, 0, 1 / wmax - 1], [0, 2 / hmax, 1 / hmax - 1], [0, 0, 1]], dtype=torch.float64)
        o = torch.tensor([[size / 2.0, 0, size / 2.0 - 0.5], [0, size / 2.0, size / 2.0 - 0.5], [0, 0, 1]],
                         dtype=torch.float64)
        full = torch.cat([m, torch.tensor([[0, 0, 1.0]], dtype=torch.float64)])
        theta[i] = (a @ full @ o)[:2].float()
    theta = theta.cuda()
    mean = torch.tensor(MEAN, device="cuda")[:, None, None]
    std = torch.tensor(STD, device="cuda")[:, None, None]

    def composed():
        grid = F.affine_grid(theta, (batch, 3, size, size), align_corners=False)
        x = F.grid_sample(padded.float(), grid, mode="bilinear", align_corners=False)
        return ((x / 255 - mean) / std).contiguous(memory_format=torch.channels_last)
    ms = cuda_time(composed)
    rows.append(("torch ops: pad + affine_grid + grid_sample + normalise (no antialias)", ms,
                 (data.numel() + batch * 3 * size * size * 4) / ms / 1e6))
    return rows


def fastload_rate(ds, epochs, batch, threads, decoder="cpu", **loader_kwargs):
    """(img/s, stats) of FastLoader(device="cuda") over ``epochs`` after a warm-up epoch; loader_kwargs such as
    transform= go to FastLoader (default: the crop= shorthand, float32)."""
    loader = fl.FastLoader(ds, batch_size=batch, device="cuda", threads=threads, channels_last=True, drop_last=True,
                           decoder=decoder, **loader_kwargs)
    for x, y in loader:  # warm-up epoch: page cache, allocator, CUDA context
        pass
    loader.close()  # the next epoch's producers, started as this one ended, must not make batches off the clock
    torch.cuda.synchronize()
    n, t, cpu = 0, time.perf_counter(), _process_cpu()
    for _ in range(epochs):
        for x, y in loader:
            n += len(y)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t
    cores_used = (_process_cpu() - cpu) / wall
    loader.close()  # its next epoch's producers, started early, must not decode during the next rows
    return n / wall, dict(loader.stats(), cores_used=cores_used)


def _process_cpu():
    """CPU seconds of every thread of this process so far (native decode threads included)."""
    t = os.times()
    return t.user + t.system


def torchvision_rate(root, epochs, batch, workers):
    import torchvision
    from torchvision import transforms as T
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = torchvision.datasets.ImageFolder(root, transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, pin_memory=True,
                                         drop_last=True, persistent_workers=True, prefetch_factor=4)
    for x, y in loader:
        x.cuda(non_blocking=True)
    torch.cuda.synchronize()
    n, t = 0, time.perf_counter()
    for _ in range(epochs):
        for x, y in loader:
            x = x.cuda(non_blocking=True)
            n += len(y)
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t)


def nvjpeg_rate(ds, batch, rounds=5):
    from torchvision.io import decode_jpeg
    with ds.reader() as r:
        files = [torch.frombuffer(bytearray(r.get(i)), dtype=torch.uint8) for i in range(min(len(ds), 2048))]
    batches = [files[i:i + batch] for i in range(0, len(files) - batch + 1, batch)]
    for b in batches[:2]:
        decode_jpeg(b, device="cuda")
    torch.cuda.synchronize()
    n, t = 0, time.perf_counter()
    for _ in range(rounds):
        for b in batches:
            decode_jpeg(b, device="cuda")
            n += len(b)
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t)


def print_kernel_table(kernel, batch):
    copy_bw = next(bw for name, _, bw in kernel if name.startswith("device-to-device"))
    print("\n(a) warp/normalise kernel, batch of", batch, "decoded RandomResizedCrop windows -> 224x224")
    print(f"{'variant':<72} {'ms':>8} {'GB/s':>8} {'% copy':>7}")
    for name, ms, bw in kernel:
        print(f"{name:<72} {ms:8.3f} {bw:8.0f} {100 * bw / copy_bw:6.0f}%")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="ImageFolder of JPEGs (e.g. from python -m bench.corpus imagenet)")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="torchvision DataLoader workers")
    p.add_argument("--threads", type=int, default=None,
                   help="fastload decode threads per producer (default: FastLoader's, the cores shared out)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--skip-torchvision", action="store_true")
    p.add_argument("--kernel-only", action="store_true", help="only (a): the kernel against copy and torch ops")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    ds = fl.FolderDataset(args.data)
    print(f"{torch.cuda.get_device_name()} | {os.cpu_count()} cores | {len(ds)} images", flush=True)

    kernel = kernel_bench(ds, batch=args.batch_size)
    if args.kernel_only:
        return print_kernel_table(kernel, args.batch_size)
    store = corpus.seekable_store(args.data)
    hardware, why = nvjpeg.available()
    if not hardware:
        print(f"decoder='nvjpeg' and 'hybrid' skipped: {why}")
    threads = f"{args.threads} threads" if args.threads else "default threads"
    loaders = {}  # json key -> (table label, img/s, stats), per decoder and source
    for decoder in ("cpu", "nvjpeg", "hybrid") if hardware else ("cpu",):
        for source, suffix, where in ((ds, "", "folder"), (fl.LMDBDataset(store), "_seekable", "pack --seekable")):
            key = "fastload" + ("" if decoder == "cpu" else f"_{decoder}") + suffix
            how = f"device=cuda), {threads}" if decoder == "cpu" else f"device=cuda, decoder={decoder})"
            rate, stats = fastload_rate(source, args.epochs, args.batch_size, args.threads, decoder=decoder)
            print(f"fastload stats ({decoder}, {where}): {json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in stats.items()})}",
                  flush=True)
            loaders[key] = f"fastload FastLoader({how}, {where}", rate, stats
    tv_nvjpeg = nvjpeg_rate(ds, args.batch_size)
    tv = None if args.skip_torchvision else torchvision_rate(args.data, args.epochs, args.batch_size, args.workers)

    print_kernel_table(kernel, args.batch_size)
    print("\n(b) finished 224x224 batches on the GPU, images/s")
    print(f"{'pipeline':<60} {'img/s':>9}")
    for label, rate, _ in loaders.values():
        print(f"{label:<60} {rate:9.0f}")
    if tv is not None:
        print(f"{'torchvision ImageFolder + DataLoader, ' + str(args.workers) + ' workers':<60} {tv:9.0f}")
    print(f"{'torchvision nvJPEG batched full decode (decode only)':<60} {tv_nvjpeg:9.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kernel": kernel, **{key: rate for key, (_, rate, _) in loaders.items()}, "torchvision": tv,
                       "nvjpeg": tv_nvjpeg, "stats": loaders["fastload"][2]}, f)


if __name__ == "__main__":
    main()
