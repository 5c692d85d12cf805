"""bench/engine_bitstreams.py's batches (CPU part; the timing needs the GPU's engines): region JPEGs whose
sub-windows hold the whole files' windows, pixel for pixel on libjpeg-turbo (the script checks the same on the
engines). Its windows are bench.decode.plan's (tests/test_bench_decode.py)."""
import glob

import torch

from bench import engine_bitstreams as eb
from fastload import ops


def test_region_sub_windows_decode_to_the_whole_files_windows(imagenet_dir):
    files = sorted(glob.glob(f"{imagenet_dir}/*/*.jpg"))[:16]
    jpegs = [ops.add_restart_markers(open(f, "rb").read()) for f in files]
    (whole, windows, regions, sub_windows), = eb.batches(jpegs, 16, seed=1)
    assert len(whole) == len(regions) == 16 and windows.shape == sub_windows.shape == (16, 5)
    sliced = 0
    for data, window, region, sub in zip(whole, windows.tolist(), regions, sub_windows.tolist()):
        assert window[2:] == sub[2:]  # the same window, placed in the region's pixels
        sliced += len(region) < len(data)
        assert torch.equal(ops.decode_crop(data, *window[:4]), ops.decode_crop(region, *sub[:4]))
    assert sliced >= 8  # most windows leave part of the file out
    assert whole == jpegs  # the files in order, whole
