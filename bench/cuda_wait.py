"""How this process' threads wait for the GPU: the CUDA driver's scheduling policy of a device's primary context
(the one PyTorch uses), through the driver API, which PyTorch does not expose. A benchmarking tool
(bench.train_profile --cuda-wait): the driver changes a running context's policy, so policies can be compared in
turn inside one process.

By default the driver picks "spin" when a process has one context and many cores: a thread waiting on the GPU (a
launch into a full queue, a synchronize) keeps its core busy until the GPU answers; "sleep" blocks it until the
device signals. Measured in one process with alternating rounds, "sleep" did not make ResNet-18 at 160 px train
faster (bench/RESULTS.md, "Waiting for the GPU"); FastLoader's own waits sleep whatever the policy (blocking events).

    from bench.cuda_wait import set_cuda_wait
    set_cuda_wait("sleep")
"""
import ctypes

import torch

POLICIES = {"auto": 0, "spin": 1, "yield": 2, "sleep": 4}  # CU_CTX_SCHED_*: sleep is CU_CTX_SCHED_BLOCKING_SYNC
_SCHED_MASK = 7
_PRIMARY_CONTEXT_ACTIVE = 708  # CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE (drivers before CUDA 11 refuse active contexts)


def _driver():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise RuntimeError(f"no CUDA driver in this process' reach (libcuda.so.1: {e})") from None
    status = lib.cuInit(0)
    if status != 0:
        raise RuntimeError(f"the CUDA driver did not start (cuInit returned {status})")
    return lib


def _device(lib, device):
    """The driver's handle of ``device``: None (device 0), an index, "cuda:N" or a torch.device."""
    index = 0 if device is None else device if isinstance(device, int) else torch.device(device).index or 0
    handle = ctypes.c_int()
    status = lib.cuDeviceGet(ctypes.byref(handle), index)
    if status != 0:
        raise ValueError(f"no CUDA device {index} (cuDeviceGet returned {status})")
    return handle.value


def _flags(lib, dev):
    flags, active = ctypes.c_uint(), ctypes.c_int()
    status = lib.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))
    if status != 0:
        raise RuntimeError(f"cuDevicePrimaryCtxGetState returned {status}")
    return flags.value


def cuda_wait(device=None):
    """The wait policy of ``device``'s primary context (default: device 0, or "cuda:N"): one of POLICIES."""
    lib = _driver()
    code = _flags(lib, _device(lib, device)) & _SCHED_MASK
    return next(name for name, value in POLICIES.items() if value == code)


def set_cuda_wait(policy, device=None):
    """Sets how threads wait for ``device`` (default: device 0, or "cuda:N"): "sleep", "spin", "yield" or "auto"
    (the driver's default), for the whole process. A driver that refuses to change a running context (before
    CUDA 11) raises RuntimeError."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    lib = _driver()
    dev = _device(lib, device)
    setter = getattr(lib, "cuDevicePrimaryCtxSetFlags_v2", None) or lib.cuDevicePrimaryCtxSetFlags
    status = setter(dev, (_flags(lib, dev) & ~_SCHED_MASK) | POLICIES[policy])
    if status == _PRIMARY_CONTEXT_ACTIVE:
        raise RuntimeError(f"set_cuda_wait({policy!r}): CUDA is already running on device {dev} and this driver "
                           "does not change a running context's policy; call it before anything uses CUDA")
    if status != 0:
        raise RuntimeError(f"cuDevicePrimaryCtxSetFlags returned {status}")
