"""The CUDA driver's hardware work queues for this process (CUDA_DEVICE_MAX_CONNECTIONS), asked for before CUDA starts.

The driver runs each stream's work through one of N hardware queues. N is CUDA_DEVICE_MAX_CONNECTIONS, read once
when the process creates its CUDA context (default 8, at most 32). Streams that share a queue run in submission
order, as if one waited for the other. nvJPEG's hardware backend (decoder="nvjpeg", "hybrid", "auto") sends each
image through one of 16 streams of its own. With 8 queues most of them share one with the training loop's stream,
so each image's copy and colour conversion wait behind whatever model kernels were queued before them.

Measured (bench/RESULTS.md, "Why the engines slowed down inside training"): the engines beside ResNet-18's training
step at 160 px (CUDA graph, one fixed batch) made 779 img/s with 8 queues and 22,986 with 32; alone ~27,000.

So importing fastload asks for 32 queues. It does not when the variable is already set (a user's own value, e.g.
Megatron-LM's 1, is kept), or when the process already has its CUDA context (too late to matter). In those cases a
FastLoader that would use the engines warns once (``warn_if_few``).
"""
import os
import warnings

import torch

VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
WANTED = 32  # the driver's maximum
DRIVER_DEFAULT = 8

_warned = False


def ask():
    """At fastload's import: sets VARIABLE to WANTED unless it is set or CUDA is already initialised."""
    if VARIABLE not in os.environ and not torch.cuda.is_initialized():
        os.environ[VARIABLE] = str(WANTED)


def queues():
    """The hardware queues this process's CUDA context has, or gets once created: VARIABLE as the environment holds
    it now (the driver reads it at context creation), DRIVER_DEFAULT where it is unset or not a number."""
    try:
        return int(os.environ[VARIABLE])
    except (KeyError, ValueError):
        return DRIVER_DEFAULT


def warn_if_few():
    """Warns (once per process) that the JPEG engines will wait behind the model's kernels when the process has
    fewer than WANTED queues."""
    global _warned
    n = queues()
    if n >= WANTED or _warned:
        return
    _warned = True
    warnings.warn(
        f"this process's CUDA context has {n} hardware queues ({VARIABLE}"
        f"{'=' + os.environ[VARIABLE] if VARIABLE in os.environ else ' unset: the driver default'}). "
        f"The GPU's JPEG engines then share queues with the training loop's kernels and wait behind them: beside "
        f"ResNet-18 they made 779 img/s with 8 queues, 22,986 with 32. Set {VARIABLE}={WANTED} before anything "
        f"uses CUDA, or import fastload first (it asks for {WANTED} when it is unset).", UserWarning, stacklevel=3)
