"""Three launches of the warp kernel on a realistic batch (256 RandomResizedCrop windows decoded as FastLoader
decodes them), for profiling on the GPU machine:

    ncu --kernel-name regex:warp_tiled --launch-skip 2 --launch-count 1 --section SpeedOfLight \
        --section Occupancy --section SchedulerStats python3 -m bench.kernel_probe

(bench.gpu times the kernel; this only gives a profiler something representative to look at.)
"""
import torch

import fastload as fl
import fastload.ops as ops
from bench.gpu import realistic_batch, MEAN, STD

ds = fl.FolderDataset("data/imagenet-like")
dev = [t.cuda() for t in realistic_batch(ds, 256, 224)]
for _ in range(3):
    ops.warp_ragged(*dev, 224, mean=MEAN, std=STD, out_dtype=torch.float32, channels_last=True)
torch.cuda.synchronize()
