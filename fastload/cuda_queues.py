"""The CUDA driver's hardware work queues for this process (CUDA_DEVICE_MAX_CONNECTIONS), asked for before CUDA starts.

The driver runs each stream's work through one of N hardware queues. N is CUDA_DEVICE_MAX_CONNECTIONS, read once
when the process creates its CUDA context (default 8, at most 32). Streams that share a queue run in submission
order, as if one waited for the other. nvJPEG's hardware backend (decoder="nvjpeg", "hybrid", "auto") sends each
image through one of 16 streams of its own. With 8 queues most of them share one with the training loop's stream,
so each image's copy and colour conversion wait behind whatever model kernels were queued before them.

Measured (bench/RESULTS.md, "Why the engines slowed down inside training"): the engines beside ResNet-18's training
step at 160 px (CUDA graph, one fixed batch) made 779 img/s with 8 queues and 22,986 with 32; alone ~27,000.

The driver reads the variable when the process initialises it (cuInit), which ``torch.cuda.is_available()``
already does, not only when a context is made: set after that, it changes nothing (measured: 737 img/s beside the
model with the variable at 32, set after ``is_available()``). So importing fastload asks for 32 queues only where
the variable is unset and the driver is not yet initialised; a user's own value (e.g. Megatron-LM's 1) is kept. A
FastLoader that would use the engines in a process with fewer warns once (``warn_if_few``).
"""
import ctypes
import os
import warnings

VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
WANTED = 32  # the driver's maximum
DRIVER_DEFAULT = 8

_warned = False
_started_with = None  # the queues the driver was initialised with before fastload's import; None: it was not


def _driver_started():
    """Whether this process has initialised the CUDA driver: cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED
    (3) until cuInit. A process that has not loaded libcuda has not (RTLD_NOLOAD: nothing is loaded here)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except (OSError, AttributeError):
        return False
    count = ctypes.c_int()
    return cuda.cuDeviceGetCount(ctypes.byref(count)) != 3


def _parse(value):
    try:
        return int(value)
    except (TypeError, ValueError):  # unset, or not a number: the driver's default
        return DRIVER_DEFAULT


def ask():
    """At fastload's import: sets VARIABLE to WANTED where it is unset and the driver not yet initialised; where
    the driver is, records what it was initialised with (the variable as it is now)."""
    global _started_with
    if _driver_started():
        _started_with = _parse(os.environ.get(VARIABLE))
    elif VARIABLE not in os.environ:
        os.environ[VARIABLE] = str(WANTED)


def queues():
    """The hardware queues this process's CUDA driver has, or gets once initialised: what it was initialised with
    before fastload's import, else VARIABLE as the environment holds it now (DRIVER_DEFAULT where it is unset or
    not a number)."""
    return _started_with if _started_with is not None else _parse(os.environ.get(VARIABLE))


def warn_if_few():
    """Warns (once per process) that the JPEG engines will wait behind the model's kernels when the process has
    fewer than WANTED queues."""
    global _warned
    n = queues()
    if n >= WANTED or _warned:
        return
    _warned = True
    warnings.warn(
        f"this process's CUDA driver has {n} hardware queues ({VARIABLE}"
        f"{'=' + os.environ[VARIABLE] if VARIABLE in os.environ else ' unset: the driver default'}"
        f"{' when CUDA was initialised, before fastload was imported' if _started_with is not None else ''}). "
        f"The GPU's JPEG engines then share queues with the training loop's kernels and wait behind them: beside "
        f"ResNet-18 they made 779 img/s with 8 queues, 22,986 with 32. Set {VARIABLE}={WANTED} before anything "
        f"uses CUDA (torch.cuda.is_available() included), or import fastload first (it asks for {WANTED} when it "
        f"is unset).", UserWarning, stacklevel=3)
