"""The CUDA driver's hardware work queues for this process (CUDA_DEVICE_MAX_CONNECTIONS), asked for before CUDA starts.

The driver runs each stream's work through one of N hardware queues. N is CUDA_DEVICE_MAX_CONNECTIONS, read once
when the process initialises the driver (default 8, at most 32). Streams that share a queue run in submission order,
as if one waited for the other. nvJPEG's hardware backend (decoder="nvjpeg", "hybrid", "auto") sends each image
through one of 16 streams of its own. With 8 queues most of them share one with the training loop's stream (and the
loader's own), so each image's copy and colour conversion wait behind whatever kernels were queued before them.

Measured (bench/RESULTS.md, "Why the engines slowed down inside training", H100): beside ResNet-18's training step at
160 px (CUDA graph, one fixed batch) the engines made 779 img/s with 8 queues and 22,986 with 32; training ResNet-18
through FastLoader(decoder="nvjpeg") with the step graphed, 0.54 of its ceiling against 0.78.

The driver reads the variable at initialisation (cuInit), which ``torch.cuda.is_available()`` already does (unless
PYTORCH_NVML_BASED_CUDA_CHECK=1), not only when a context is made: set after that, it changes nothing (measured: 737
img/s with the variable at 32, set after ``is_available()``). So importing fastload sets it to 32 only where it is
unset and the driver is not yet initialised (``set_by_fastload`` then says so). A value of yours is kept: set
CUDA_DEVICE_MAX_CONNECTIONS=8 to keep the driver's default, or 1 as Megatron-LM wants. Being an environment variable,
it is inherited by the processes this one starts. A FastLoader that would use the engines in a process with fewer
queues warns once (``warn_if_few``).

Where the driver was initialised before fastload's import, ``queues()`` takes the variable as it is at the import;
a value set in between (too late for the driver) cannot be told apart from one set before. Linux only (RTLD_NOLOAD).
"""
import ctypes
import os
import sys
import threading
import warnings

VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
WANTED = 32  # the driver's maximum
DRIVER_DEFAULT = 8
NOT_INITIALIZED = 3  # CUDA_ERROR_NOT_INITIALIZED

set_by_fastload = False  # whether fastload's import set the variable
_started_with = None  # the variable's text at fastload's import where the driver had already started; None: it had not
_lock = threading.Lock()
_warned = False


def _driver_started():
    """Whether this process has initialised the CUDA driver: cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED
    until cuInit. A process that has not loaded libcuda has not (RTLD_NOLOAD: nothing is loaded here); a child
    forked from a process that had counts as started (the driver must not be called there)."""
    in_bad_fork = getattr(getattr(sys.modules.get("torch"), "cuda", None), "_is_in_bad_fork", None)
    if in_bad_fork is not None and in_bad_fork():
        return True
    try:
        cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        count_devices = cuda.cuDeviceGetCount
    except (OSError, AttributeError):
        return False
    count = ctypes.c_int()
    return count_devices(ctypes.byref(count)) != NOT_INITIALIZED


def _parse(text):
    """The queues the driver makes of the variable's text: 1 to 32; unset, empty, not a number or below 1: 8."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        return DRIVER_DEFAULT
    return DRIVER_DEFAULT if value < 1 else min(value, WANTED)


def ask():
    """At fastload's import: sets VARIABLE to WANTED where it is unset and the driver not yet initialised; where
    the driver is, records the variable as it is now (what the driver most likely read)."""
    global set_by_fastload, _started_with
    if _driver_started():
        _started_with = os.environ.get(VARIABLE, "")
    elif VARIABLE not in os.environ:
        os.environ[VARIABLE] = str(WANTED)
        set_by_fastload = True


def _text():
    return _started_with if _started_with is not None else os.environ.get(VARIABLE, "")


def queues():
    """The hardware queues this process's CUDA driver has, or gets once initialised: as the variable was at
    fastload's import where the driver had already started, else as the environment holds it now."""
    return _parse(_text())


def warn_if_few():
    """Warns (once per process) that the JPEG engines will wait behind the model's kernels when the process has
    fewer than WANTED queues; called by FastLoader's constructor (stacklevel: the user's line building it)."""
    global _warned
    n = queues()
    with _lock:
        if n >= WANTED or _warned:
            return
        _warned = True
    text = _text()
    if text:
        why = (f"{VARIABLE}={text}, your value, kept. If it is deliberate (Megatron-LM wants 1), decoder='cpu' "
               f"avoids the engines")
    else:
        why = f"{VARIABLE} unset: the driver's default"
    late = " when CUDA was initialised, before fastload was imported" if _started_with is not None else ""
    warnings.warn(
        f"this process's CUDA driver has {n} hardware queues{late} ({why}). The GPU's JPEG engines then share "
        f"queues with the training loop's kernels and wait behind them: training ResNet-18 at 160 px got 0.54 of its "
        f"ceiling from decoder='nvjpeg' with 8 queues against 0.78 with 32. For 32, set {VARIABLE}=32 before anything "
        f"initialises CUDA (torch.cuda.is_available() does), or import fastload first (it sets 32 when unset).",
        UserWarning, stacklevel=3)
