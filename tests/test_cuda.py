"""GPU tests: the CUDA kernel against its CPU twin and the float64 reference, FastLoader(device="cuda")
against the CPU path, DataPrefetcher, memory over epochs. Skipped without CUDA (CI has none): run them on
the GPU machine for every change to GPU code (see bench/RESULTS.md)."""
import os
import time

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from skimage import data as photos

import fastload as fl
import fastload.ops as ops
from warp_reference import random_boxes, random_matrices, reference_warp

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def ragged_photo_batch(rng, n=12):
    """Crops of real photos of assorted sizes, laid out as the decoder lays out a batch."""
    sources = [photos.astronaut(), photos.chelsea(), photos.coffee()]
    crops = []
    for i in range(n):
        src = sources[i % 3]
        h, w = rng.integers(20, src.shape[0] // 2), rng.integers(20, src.shape[1] // 2)
        top, left = rng.integers(0, src.shape[0] - h), rng.integers(0, src.shape[1] - w)
        crops.append(torch.from_numpy(np.ascontiguousarray(src[top:top + h, left:left + w])))
    sizes = [c.numel() for c in crops]
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(sizes)[:-1]]), dtype=torch.int64)
    shapes = torch.tensor([list(c.shape) for c in crops], dtype=torch.int64)
    return torch.cat([c.reshape(-1) for c in crops]), offsets, shapes, crops


def poison_allocator(nbytes):
    """Fills a block of the caching allocator with NaN and frees it: an output that reuses it and misses
    an element shows NaN there."""
    junk = torch.full((nbytes // 4 + 1024,), float("nan"), device="cuda")
    del junk


@pytest.mark.parametrize("axis_aligned", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_kernel_matches_cpu_twin(axis_aligned, dtype, channels_last):
    rng = np.random.default_rng(0)
    for trial in range(3):
        data, offsets, shapes, crops = ragged_photo_batch(rng)
        mats = torch.cat([random_matrices(rng, 1, int(s[0]), int(s[1]), 56, 48, axis_aligned) for s in shapes])
        if trial == 2:  # [B, 2, 5]: visible boxes (warp.h)
            mats = torch.cat([mats, torch.cat([random_boxes(rng, 1, int(s[0]), int(s[1])) for s in shapes])], dim=2)
        kwargs = dict(mean=MEAN, std=STD, out_dtype=dtype, channels_last=channels_last, fill=0.0)
        cpu = ops.warp_ragged(data, offsets, shapes, mats, (56, 48), **kwargs)
        poison_allocator(cpu.numel() * 4)
        gpu = ops.warp_ragged(data.cuda(), offsets.cuda(), shapes.cuda(), mats.cuda(), (56, 48), **kwargs)
        torch.cuda.synchronize()
        assert gpu.dtype == dtype and gpu.is_contiguous(
            memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        assert not torch.isnan(gpu.float()).any()
        diff = (gpu.float().cpu() - cpu.float()).abs().max().item()
        # float32: same maths, different rounding order (and fast-math division) -> far below 1e-3 normalised
        # units; 16-bit outputs may round to neighbouring representable values: one ulp at |x| <= 4.
        tol = {torch.float32: 1e-3, torch.float16: 4e-3, torch.bfloat16: 3.2e-2}[dtype]
        assert diff <= tol, (trial, diff)


# (x shrink, y shrink) of the tiled kernel's paths: 32-row bands (up to ~2x down the rows), 16-row bands (up to 3x
# down), every tap count 3-6 along each axis, and the per-pixel fallback beyond 3x; the loader's crops reach 2.67x.
@pytest.mark.parametrize("shrink", [(1.0, 1.0), (0.6, 1.7), (1.9, 1.3), (2.8, 2.0), (1.3, 2.5), (2.7, 2.8),
                                    (3.4, 1.5), (1.2, 3.2)])
def test_tiled_kernel_paths_match_cpu_twin(shrink):
    """Flipped and not, with output tiles and bands cut at the image's edge (70 rows are 64 + 6; 100 and 98
    columns are not multiples of the 32-column tiles, and 98 is not one of the 4 pixels a thread stores at once),
    in both layouts and in float32 and uint8."""
    sx, sy = shrink
    img = photos.astronaut()  # 512 x 512
    for out_h, out_w, channels_last, dtype in ((70, 100, True, torch.float32), (70, 100, False, torch.float32),
                                               (70, 98, True, torch.float32), (70, 98, False, torch.uint8)):
        h, w = min(512, int(out_h * sy) + 3), min(512, int(out_w * sx) + 5)
        crops = [torch.from_numpy(np.ascontiguousarray(img[7:7 + h, 11:11 + w])) for _ in range(4)]
        data = torch.cat([c.reshape(-1) for c in crops])
        offsets = torch.arange(4, dtype=torch.int64) * h * w * 3
        shapes = torch.tensor([[h, w, 3]] * 4, dtype=torch.int64)
        mats = []
        for fx, fy in ((1, 1), (-1, 1), (1, -1), (-1, -1)):  # flips map column u to the mirrored centre
            mats.append([[fx * sx, 0, (w - 1) / 2 - fx * sx * (out_w - 1) / 2],
                         [0, fy * sy, (h - 1) / 2 - fy * sy * (out_h - 1) / 2]])
        mats = torch.tensor(mats, dtype=torch.float32)
        # and with visible boxes (warp.h): the tiled kernel's fill rows and columns
        boxed = torch.cat([mats, random_boxes(np.random.default_rng(out_w), 4, h, w)], dim=2)
        # uint8 output: no normalisation, values rounded to integers (a sum within float error of .5 may round
        # either way on the two backends: at most 1 apart).
        kwargs = dict(out_dtype=dtype, channels_last=channels_last, fill=0.0)
        kwargs.update(dict(mean=MEAN, std=STD) if dtype == torch.float32 else dict(in_scale=1.0))
        for maps in (mats, boxed):
            cpu = ops.warp_ragged(data, offsets, shapes, maps, (out_h, out_w), **kwargs)
            poison_allocator(cpu.numel() * 4)
            gpu = ops.warp_ragged(data.cuda(), offsets.cuda(), shapes.cuda(), maps.cuda(), (out_h, out_w), **kwargs)
            assert gpu.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
            gpu = gpu.cpu()
            assert not torch.isnan(gpu.float()).any()
            diff = (gpu.float() - cpu.float()).abs().max().item()
            assert diff <= (1e-3 if dtype == torch.float32 else 1), (out_w, channels_last, dtype, diff)


def test_warp_affine_cuda_matches_float64_reference():
    rng = np.random.default_rng(1)
    img = torch.from_numpy(photos.astronaut())
    small = TF.resize(img.permute(2, 0, 1), [64, 64], antialias=True).permute(1, 2, 0).contiguous()
    batch = small[None].expand(4, -1, -1, -1).contiguous()
    for trial in range(3):
        mats = random_matrices(rng, 4, 64, 64, 24, 20, axis_aligned=trial == 0)
        poison_allocator(4 * 3 * 24 * 20 * 4)
        out = ops.warp_affine(batch.cuda(), mats.cuda(), (24, 20), layout="NHWC", out_dtype=torch.float32,
                              fill=7.0).cpu()
        assert not torch.isnan(out).any()
        # Axis-aligned uint8 HWC takes the tiled path, whose horizontal pass uses 16-bit weights summing to 2^15
        # (warp_cuda.cu, kWeightOne): their rounding errors sum to zero and to at most K / 2^15, so a sum is
        # within 127.5 * K / 2^15 < 0.024 pixel units (K <= 6) of exact. The general path rounds like the CPU twin.
        atol = 2e-3 + (0.024 if trial == 0 else 0)
        for i in range(4):
            ref = reference_warp(small.numpy(), mats[i].numpy(), 24, 20, fill=7.0)
            np.testing.assert_allclose(out[i].permute(1, 2, 0).numpy(), ref, atol=atol, rtol=0)


def test_dense_nchw_float_input_and_compile():
    x = torch.rand(3, 3, 40, 50, device="cuda") * 255
    m = torch.tensor([[1.3, 0.1, 2.0], [0.0, 0.9, 1.0]], device="cuda")
    cpu = ops.warp_affine(x.cpu(), m.cpu(), (20, 30), mean=100.0, std=50.0)
    gpu = ops.warp_affine(x, m, (20, 30), mean=100.0, std=50.0)
    assert (gpu.cpu() - cpu).abs().max() <= 1e-3

    def step(images, mats):
        return ops.warp_affine(images, mats, (20, 30), mean=100.0, std=50.0).mean()

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, m), step(x, m))


def test_fastload_cuda_equals_cpu_path(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    common = dict(batch_size=8, shuffle=True, seed=3, crop=fl.RandomResizedCrop(64), threads=2)
    cpu = list(fl.FastLoader(ds, device="cpu", **common))
    gpu = list(fl.FastLoader(ds, device="cuda", **common))
    assert len(cpu) == len(gpu)
    for (xc, yc), (xg, yg) in zip(cpu, gpu):
        assert xg.is_cuda and yg.is_cuda
        assert torch.equal(yc, yg.cpu())
        assert (xg.cpu() - xc).abs().max().item() <= 1e-3


def test_default_threads_on_cuda_share_the_cores_among_producers(imagenet_dir, monkeypatch):
    """On CUDA the producers decode at once: the cores are shared out among them, one decode thread per core."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    loader = fl.FastLoader(fl.FolderDataset(imagenet_dir), device="cuda")
    assert loader.threads == max(1, os.cpu_count() // loader.workers)

def test_reserved_memory_flat_over_epochs(imagenet_dir):
    ds = fl.FolderDataset(imagenet_dir)
    loader = fl.FastLoader(ds, batch_size=8, crop=fl.RandomResizedCrop(96), device="cuda", threads=4)
    reserved = []
    for epoch in range(20):
        for x, y in loader:
            x.sum().item()
        reserved.append(torch.cuda.memory_reserved())
    # No growth from epoch to epoch: flat over the last five epochs, and at most one more 2 MB segment than after
    # the first three (how many batches are alive at once varies with thread timing: call 6 of the eleventh
    # session took one more segment at epoch 4, then stayed flat). A leak grows every epoch.
    assert reserved[-1] == reserved[-6], reserved
    assert reserved[-1] - reserved[2] <= 2 * 2 ** 20, reserved


def test_data_prefetcher_over_a_dataloader():
    imgs = torch.stack([torch.from_numpy(photos.astronaut()[:200, :200]), torch.from_numpy(photos.coffee()[:200, :200])])
    chw = imgs.permute(0, 3, 1, 2).contiguous()
    dataset = torch.utils.data.TensorDataset(chw.repeat(8, 1, 1, 1), torch.arange(16))
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=0)
    seen = []
    for x, y in fl.DataPrefetcher(loader, device="cuda"):
        assert x.is_cuda and x.shape == (4, 3, 200, 200) and x.dtype == torch.float32
        expected = (chw[y.cpu() % 2].float() / 255 - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
        assert (x.cpu() - expected).abs().max() <= 1e-4
        seen.extend(y.tolist())
    assert seen == list(range(16))
    # Resizing in the same kernel, channels-last input.
    nhwc = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(imgs, torch.arange(2)), batch_size=2)
    (x, _), = list(fl.DataPrefetcher(nhwc, device="cuda", size=112))
    ref = TF.resize(imgs.permute(0, 3, 1, 2).float(), [112, 112], antialias=True) / 255
    ref = (ref - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    assert (x.cpu() - ref).abs().max() <= 1e-3


@pytest.mark.cuda
def test_uint8_output_and_float_targets_on_cuda_equal_the_cpu_path(imagenet_dir):
    """dtype=torch.uint8 is the resized pixels (0-255) on CUDA as on the CPU, and float / multi-dimensional
    targets travel to the GPU as they are (issue 19, items 2 and 3)."""
    ds = fl.FolderDataset(imagenet_dir)
    ds.labels = np.stack([np.linspace(0, 1, len(ds)), np.linspace(1, 0, len(ds))], axis=1).astype(np.float32)
    common = dict(batch_size=8, shuffle=True, seed=4, crop=fl.RandomResizedCrop(64), threads=2, dtype=torch.uint8)
    cpu = list(fl.FastLoader(ds, device="cpu", **common))
    gpu = list(fl.FastLoader(ds, device="cuda", **common))
    assert len(cpu) == len(gpu)
    for (xc, yc), (xg, yg) in zip(cpu, gpu):
        assert xg.is_cuda and xg.dtype == torch.uint8 and yg.is_cuda and yg.dtype == torch.float32
        assert torch.equal(yg.cpu(), yc) and yc.shape == (len(yc), 2)
        # The CUDA fast path's sums are within 0.024 of the CPU twin's (16-bit row weights): rounding to
        # integers may then differ by one level where a value is that close to .5.
        assert (xg.cpu().int() - xc.int()).abs().max().item() <= 1
    assert max(int(x.max()) for x, _ in cpu) > 200  # 0-255 pixels, not normalised values cast to uint8


@pytest.mark.cuda
def test_data_prefetcher_keeps_float_labels_on_cuda():
    imgs = torch.from_numpy(photos.coffee()[:120, :160]).permute(2, 0, 1).contiguous()
    dataset = torch.utils.data.TensorDataset(imgs.expand(6, 3, 120, 160).contiguous(), torch.linspace(0, 1, 6))
    ys = [y for _, y in fl.DataPrefetcher(torch.utils.data.DataLoader(dataset, batch_size=3), device="cuda")]
    assert all(y.is_cuda and y.dtype == torch.float32 for y in ys)
    assert torch.equal(torch.cat(ys).cpu(), torch.linspace(0, 1, 6))


@pytest.mark.cuda
def test_data_prefetcher_gives_other_labels_back_as_they_went_in_on_cuda():
    imgs = torch.from_numpy(photos.coffee()[:40, :60]).permute(2, 0, 1).contiguous()
    batches = [(imgs.expand(3, 3, 40, 60).contiguous(), [f"img{i}.jpg" for i in range(3 * k, 3 * k + 3)])
               for k in range(2)]
    out = list(fl.DataPrefetcher(batches, device="cuda"))
    assert [y for _, y in out] == [["img0.jpg", "img1.jpg", "img2.jpg"], ["img3.jpg", "img4.jpg", "img5.jpg"]]
    assert all(x.is_cuda and x.shape == (3, 3, 40, 60) for x, _ in out)
    # a tensor that is not [B, ...] (a 0-d one, metadata of the batch) reaches the device too
    (x, y), = list(fl.DataPrefetcher([(imgs.expand(3, 3, 40, 60).contiguous(), torch.tensor(7))], device="cuda"))
    assert y.is_cuda and int(y) == 7
    with pytest.raises(ValueError, match="already: DataPrefetcher copies host batches"):
        list(fl.DataPrefetcher([(imgs.expand(3, 3, 40, 60).cuda(), torch.zeros(3))], device="cuda"))


@pytest.mark.cuda
def test_host_waits_on_the_gpu_sleep_instead_of_spinning():
    """A producer waits on the pipe's events (Slot.wait_reusable) and the engines' streams (decoders.wait_for)
    before it reuses a buffer. Those waits must sleep: a default CUDA event or Stream.synchronize() spins its
    thread on a core while the GPU works (the driver's policy with one context on many cores), a core the decode
    threads could use (bench/RESULTS.md, "Waiting for the GPU").
    The GPU is kept busy ~0.3 s by a sleep kernel queued ahead of the work waited for; the waiting thread's CPU
    time must stay far below that wall time (a spin would use all of it)."""
    from fastload.decoders import wait_for
    from fastload.prefetch.pipe import DevicePipe

    data, offsets, shapes, _ = ragged_photo_batch(np.random.default_rng(0), n=4)
    matrices = torch.tensor([[[1.0, 0, 0], [0, 1.0, 0]]] * 4)
    pipe = DevicePipe("cuda", 16, MEAN, STD, torch.float32, False)
    torch.cuda._sleep(1000)  # loaded before it is timed
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10 ** 8)
    end.record()
    end.synchronize()
    rate = 10 ** 8 / (start.elapsed_time(end) / 1e3)  # the sleep kernel's cycles per second

    def measure(wait, stream):
        with torch.cuda.stream(stream):
            torch.cuda._sleep(int(0.3 * rate))
        result = wait()
        wall, cpu = time.perf_counter(), time.thread_time()
        result()
        return time.perf_counter() - wall, time.thread_time() - cpu

    def submitted(event):
        def wait():
            handle = pipe.submit(data.pin_memory(), offsets, shapes, matrices, torch.arange(4), data.numel())
            return getattr(handle, event).synchronize
        return wait

    side = torch.cuda.Stream()
    cases = {"copied": (submitted("copied"), pipe.stream), "ready": (submitted("ready"), pipe.stream),
             "wait_for": (lambda: (lambda: wait_for(side)), side)}
    for name, (wait, stream) in cases.items():
        wall, cpu = measure(wait, stream)
        assert wall > 0.1, (name, wall, rate)  # the wait did wait for the sleep kernel
        assert cpu < 0.25 * wall, (name, wall, cpu)
