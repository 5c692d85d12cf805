"""The GPU's hardware JPEG decoder (the NVJPG engines of A100, A30, H100, H200) through nvJPEG's HARDWARE backend.

``FastLoader(device="cuda", decoder="nvjpeg")`` hands the decoding of each batch to it: on an H200 it decodes
~35,000 ImageNet-sized JPEGs/s (``python -m bench.nvjpeg_hw``), more than twice what 16 CPU cores crop-decode,
and it leaves the cores to the training loop. It decodes the crop window at full resolution (no DCT downscale;
the warp kernel then antialiases the whole reduction) with nvJPEG's IDCT and chroma upsampling, so its pixels
are close to, not equal to, libjpeg-turbo's.

libnvjpeg is loaded with ctypes when first needed: no header or link-time dependency, so fastload builds and
imports on machines without it. Only the batch decode releases the GIL: the per-image calls around it take
microseconds, and a thread that gave the GIL up would wait for it back behind the training loop's Python, up to
the 5 ms switch interval each time. Search order: $FASTLOAD_NVJPEG_LIB, the loader's default paths
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


class NvjpegError(RuntimeError):
    """libnvjpeg is missing, or it refused: no hardware decoder, an unsupported or broken file, a failed call."""


_lib = None  # ctypes.CDLL: its calls release the GIL (for nvjpegDecodeBatchedEx, which blocks for milliseconds)
_quick = None  # the same library as ctypes.PyDLL: its calls keep the GIL (for the per-image setters)
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


def library(keep_gil=False):
    """The loaded libnvjpeg: a ctypes.CDLL, or with keep_gil a ctypes.PyDLL of it (calls that hold the GIL);
    NvjpegError saying where it looked when there is none."""
    global _lib, _quick, _lib_error
    with _lock:
        if _lib is None and _lib_error is None:
            tried = _candidates()
            for name in tried:
                try:
                    _lib = ctypes.CDLL(name)
                    _quick = ctypes.PyDLL(name)  # dlopen again: the same handle, only the calling convention differs
                    break
                except OSError:
                    continue
            else:
                _lib_error = (f"libnvjpeg not found (tried {', '.join(tried)}); install the CUDA toolkit's nvJPEG "
                              f"or set FASTLOAD_NVJPEG_LIB")
    if _lib is None:
        raise NvjpegError(_lib_error)
    return _quick if keep_gil else _lib


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
        self._quick = library(keep_gil=True)
        self._handle, self._state = ctypes.c_void_p(), ctypes.c_void_p()
        self._params = []
        self._batch = 0
        _check(self._lib.nvjpegCreateEx(_BACKEND_HARDWARE, None, None, 0, ctypes.byref(self._handle)),
               "the hardware decoder is not available (nvjpegCreateEx)")
        _check(self._lib.nvjpegJpegStateCreate(self._handle, ctypes.byref(self._state)), "nvjpegJpegStateCreate")
        self._grow(max_batch)

    def _grow(self, n):
        while len(self._params) < n:
            p = ctypes.c_void_p()
            _check(self._lib.nvjpegDecodeParamsCreate(self._handle, ctypes.byref(p)), "nvjpegDecodeParamsCreate")
            self._params.append(p)
            _check(self._lib.nvjpegDecodeParamsSetOutputFormat(p, _OUTPUT_RGBI), "output format")

    def decode(self, buffers, windows, out, stream):
        """Decodes windows [B, 5] (top, left, height, width, 1) of the JPEGs in ``buffers`` (bytes-like, host)
        into the uint8 CUDA tensor ``out`` on ``stream`` (a torch.cuda.Stream). Asynchronous: the pixels are
        there once the stream gets past this point. Returns (offsets, shapes) as ops.decode_crops would."""
        n = len(buffers)
        win = windows.numpy() if isinstance(windows, torch.Tensor) else np.asarray(windows)
        h, w = win[:, 2].astype(np.int64), win[:, 3].astype(np.int64)
        sizes = h * w * 3
        offsets = np.zeros(n, dtype=np.int64)
        np.cumsum(sizes[:-1], out=offsets[1:])
        if int(sizes.sum()) > out.numel():
            raise ValueError(f"out holds {out.numel()} bytes, the batch needs {int(sizes.sum())}")
        views = [np.frombuffer(b, dtype=np.uint8) for b in buffers]  # read-only views are fine: no copy
        data = (ctypes.c_void_p * n)(*[v.ctypes.data for v in views])
        lengths = (ctypes.c_size_t * n)(*[v.size for v in views])
        images = np.zeros((n, 8), dtype=np.uint64)  # nvjpegImage_t: channel[4] pointers, then pitch[4]
        images[:, 0] = out.data_ptr() + offsets
        images[:, 4] = w * 3
        self._grow(n)
        params = (ctypes.c_void_p * n)(*[p.value for p in self._params[:n]])
        set_roi = self._quick.nvjpegDecodeParamsSetROI
        for p, x, y, pw, ph in zip(self._params[:n], win[:, 1].tolist(), win[:, 0].tolist(), w.tolist(), h.tolist()):
            _check(set_roi(p, x, y, pw, ph), "nvjpegDecodeParamsSetROI")
        if n != self._batch:  # nvJPEG's batched state is sized for one batch size
            _check(self._lib.nvjpegDecodeBatchedInitialize(self._handle, self._state, n, 1, _OUTPUT_RGBI),
                   "nvjpegDecodeBatchedInitialize")
            self._batch = n
        status = self._lib.nvjpegDecodeBatchedEx(self._handle, self._state, data, lengths,
                                                 ctypes.c_void_p(images.ctypes.data), params,
                                                 ctypes.c_void_p(stream.cuda_stream))
        if status != 0:
            self._batch = 0  # "if the batch decoding fails, call nvjpegDecodeBatchedInitialize() again"
            _check(status, "nvjpegDecodeBatchedEx")
        del views
        shapes = np.stack([h, w, np.full(n, 3)], axis=1)
        return torch.from_numpy(offsets), torch.from_numpy(shapes)

    def close(self):
        if self._handle:
            for p in self._params:
                self._lib.nvjpegDecodeParamsDestroy(p)
            self._params = []
            self._lib.nvjpegJpegStateDestroy(self._state)
            self._lib.nvjpegDestroy(self._handle)
            self._handle = ctypes.c_void_p()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass
