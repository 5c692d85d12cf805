"""The GPU's hardware JPEG decoder (the NVJPG engines of A100, A30, H100, H200) through nvJPEG's HARDWARE backend.

``FastLoader(device="cuda", decoder="nvjpeg")`` hands the decoding of each batch to it: on an H200 it decodes
~35,000 ImageNet-sized JPEGs/s (``python -m bench.nvjpeg_hw``), more than twice what 16 CPU cores crop-decode,
and it leaves the cores to the training loop. It decodes the crop window at full resolution (no DCT downscale;
the warp kernel then antialiases the whole reduction) with nvJPEG's IDCT and chroma upsampling, so its pixels
are close to, not equal to, libjpeg-turbo's.

libnvjpeg is loaded with ctypes when first needed: no header or link-time dependency, so fastload builds and
imports on machines without it. Search order: $FASTLOAD_NVJPEG_LIB, the loader's default paths
(libnvjpeg.so.13, .12), $CUDA_HOME/lib64, the copy inside torchvision's wheel.
"""
import ctypes
import glob
import os
import threading

import numpy as np
import torch

_BACKEND_HARDWARE, _OUTPUT_RGBI = 3, 5  # nvjpegBackend_t, nvjpegOutputFormat_t
_STATUS = {1: "not initialized", 2: "invalid parameter", 3: "bad JPEG", 4: "JPEG not supported",
           5: "allocator failure", 6: "execution failed", 7: "architecture mismatch (no hardware decoder)",
           8: "internal error", 9: "implementation not supported", 10: "incomplete bitstream"}


class _Image(ctypes.Structure):  # nvjpegImage_t
    _fields_ = [("channel", ctypes.c_void_p * 4), ("pitch", ctypes.c_size_t * 4)]


class NvjpegError(RuntimeError):
    pass


_lib = None
_lib_error = None
_lock = threading.Lock()


def _candidates():
    if os.environ.get("FASTLOAD_NVJPEG_LIB"):
        return [os.environ["FASTLOAD_NVJPEG_LIB"]]
    names = ["libnvjpeg.so.13", "libnvjpeg.so.12"]
    for home in filter(None, (os.environ.get("CUDA_HOME"), "/usr/local/cuda")):
        names += sorted(glob.glob(os.path.join(home, "lib64", "libnvjpeg.so.1*")))
    try:
        import torchvision
        names += sorted(glob.glob(os.path.join(os.path.dirname(torchvision.__file__), "..", "torchvision.libs",
                                               "libnvjpeg*.so*")))
    except ImportError:
        pass
    return names


def library():
    """The loaded libnvjpeg (a ctypes.CDLL); NvjpegError saying where it looked when there is none."""
    global _lib, _lib_error
    with _lock:
        if _lib is None and _lib_error is None:
            tried = _candidates()
            for name in tried:
                try:
                    _lib = ctypes.CDLL(name)
                    break
                except OSError:
                    continue
            else:
                _lib_error = (f"libnvjpeg not found (tried {', '.join(tried)}); install the CUDA toolkit's nvJPEG "
                              f"or set FASTLOAD_NVJPEG_LIB")
    if _lib is None:
        raise NvjpegError(_lib_error)
    return _lib


def _check(status, what):
    if status != 0:
        raise NvjpegError(f"{what}: nvJPEG status {status} ({_STATUS.get(status, 'unknown')})")


def available(device="cuda"):
    """(True, "") when the hardware decoder can be used on ``device``, else (False, why)."""
    if not torch.cuda.is_available():
        return False, "CUDA is not available"
    try:
        with torch.cuda.device(torch.device(device)):
            HardwareDecoder(1).close()
        return True, ""
    except NvjpegError as e:
        return False, str(e)


class HardwareDecoder:
    """One nvJPEG handle + state: not thread-safe, so one per producer thread. Decodes a batch of windows into
    one device buffer, laid out like ``ops.decode_crops`` at downscale 1 (sample i is HWC uint8 at offsets[i])."""

    def __init__(self, max_batch):
        self._lib = library()
        self._handle = ctypes.c_void_p()
        _check(self._lib.nvjpegCreateEx(_BACKEND_HARDWARE, None, None, 0, ctypes.byref(self._handle)),
               "the hardware decoder is not available (nvjpegCreateEx)")
        # Two decode states, used in turn: a batch can be submitted while the previous one is still decoding.
        self._states = []
        for _ in range(2):
            state = ctypes.c_void_p()
            _check(self._lib.nvjpegJpegStateCreate(self._handle, ctypes.byref(state)), "nvjpegJpegStateCreate")
            self._states.append([state, 0, None])  # state, batch size it is initialised for, its last batch's event
        self._turn = 0
        self._param_sets = []  # free lists of per-image decode params (ROI), one list per batch being prepared
        self._lock = threading.Lock()
        self._all_params = []
        self._release(self._new_params(max_batch))

    def _new_params(self, n):
        params = []
        for _ in range(n):
            p = ctypes.c_void_p()
            _check(self._lib.nvjpegDecodeParamsCreate(self._handle, ctypes.byref(p)), "nvjpegDecodeParamsCreate")
            params.append(p)
        self._all_params += params
        return params

    def _release(self, params):
        with self._lock:
            self._param_sets.append(params)

    def prepare(self, buffers, windows, out):
        """Everything before the hardware for windows [B, 5] (top, left, height, width, 1) of the JPEGs in
        ``buffers`` (bytes-like, host) into the uint8 CUDA tensor ``out``: a job for ``submit``. Thread-safe."""
        n = len(buffers)
        win = windows.numpy() if isinstance(windows, torch.Tensor) else np.asarray(windows)
        h, w = win[:, 2].astype(np.int64), win[:, 3].astype(np.int64)
        sizes = h * w * 3
        offsets = np.zeros(n, dtype=np.int64)
        np.cumsum(sizes[:-1], out=offsets[1:])
        if int(sizes.sum()) > out.numel():
            raise ValueError(f"out holds {out.numel()} bytes, the batch needs {int(sizes.sum())}")
        views = [np.frombuffer(b, dtype=np.uint8) for b in buffers]  # read-only views are fine: no copy
        with self._lock:
            params = self._param_sets.pop() if self._param_sets else []
        if len(params) < n:
            params = params + self._new_params(n - len(params))
        images = (_Image * n)()
        base = out.data_ptr()
        for i in range(n):
            images[i].channel[0] = base + int(offsets[i])
            images[i].pitch[0] = int(w[i]) * 3
            _check(self._lib.nvjpegDecodeParamsSetOutputFormat(params[i], _OUTPUT_RGBI), "output format")
            _check(self._lib.nvjpegDecodeParamsSetROI(params[i], int(win[i, 1]), int(win[i, 0]), int(w[i]),
                                                      int(h[i])), "nvjpegDecodeParamsSetROI")
        return {"n": n, "views": views, "params": params, "images": images,
                "data": (ctypes.c_void_p * n)(*[v.ctypes.data for v in views]),
                "lengths": (ctypes.c_size_t * n)(*[v.size for v in views]),
                "param_array": (ctypes.c_void_p * n)(*[p.value for p in params[:n]]),
                "offsets": torch.from_numpy(offsets),
                "shapes": torch.from_numpy(np.stack([h, w, np.full(n, 3)], axis=1))}

    def submit(self, job, stream):
        """Queues a prepared job on ``stream``; returns the CUDA event after which its pixels are there and its
        bitstreams are no longer read. Not thread-safe: callers take turns."""
        entry = self._states[self._turn]
        self._turn ^= 1
        state, batch, previous = entry
        if previous is not None:
            previous.synchronize()  # this state's last batch is done with it
        if job["n"] != batch:  # a batched state is sized for one batch size
            _check(self._lib.nvjpegDecodeBatchedInitialize(self._handle, state, job["n"], 1, _OUTPUT_RGBI),
                   "nvjpegDecodeBatchedInitialize")
            entry[1] = job["n"]
        status = self._lib.nvjpegDecodeBatchedEx(self._handle, state, job["data"], job["lengths"], job["images"],
                                                 job["param_array"], ctypes.c_void_p(stream.cuda_stream))
        if status != 0:
            entry[1] = 0  # "if the batch decoding fails, call nvjpegDecodeBatchedInitialize() again"
            _check(status, "nvjpegDecodeBatchedEx")
        done = torch.cuda.Event()
        done.record(stream)
        entry[2] = done
        return done

    def finish(self, job, event):
        """Waits for a submitted job and returns (offsets, shapes) as ops.decode_crops would."""
        event.synchronize()
        self._release(job["params"])
        return job["offsets"], job["shapes"]

    def decode(self, buffers, windows, out, stream):
        """prepare + submit + finish: the pixels are in ``out`` when it returns."""
        job = self.prepare(buffers, windows, out)
        try:
            event = self.submit(job, stream)
        except NvjpegError:
            self._release(job["params"])
            raise
        return self.finish(job, event)

    def close(self):
        if self._handle:
            for entry in self._states:
                if entry[2] is not None:
                    entry[2].synchronize()
            for p in self._all_params:
                self._lib.nvjpegDecodeParamsDestroy(p)
            self._all_params, self._param_sets = [], []
            for entry in self._states:
                self._lib.nvjpegJpegStateDestroy(entry[0])
            self._states = []
            self._lib.nvjpegDestroy(self._handle)
            self._handle = ctypes.c_void_p()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass
