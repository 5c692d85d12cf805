"""The GPU's hardware JPEG decoder (the NVJPG engines of A100, A30, H100, H200) through nvJPEG's HARDWARE backend.

``FastLoader(device="cuda", decoder="nvjpeg")`` hands the decoding of each batch to it: on an H200 it decodes
~35,000 ImageNet-sized JPEGs/s (``python -m bench.nvjpeg_hw``), more than twice what 16 CPU cores crop-decode,
and it leaves the cores to the training loop. It decodes the crop window at full resolution (no DCT downscale;
the warp kernel then antialiases the whole reduction) with nvJPEG's IDCT and chroma upsampling, so its pixels
are close to, not equal to, libjpeg-turbo's.

What runs where: this module finds libnvjpeg (``library_path``); the native class ``fastload._C.NvjpegDecoder``
(fastload/native/nvjpeg_decoder.cpp) opens it with dlopen (no header or link-time dependency, so fastload builds
and imports on machines without it) and does the rest. Per batch it takes the buffers' addresses and checks the
windows and ``out`` with the GIL held (microseconds), then releases the GIL for the whole nvJPEG part: the
per-image ROI parameters, the batch state's initialisation when the batch size changes, and the one
nvjpegDecodeBatchedEx, which blocks for milliseconds. Search order: $FASTLOAD_NVJPEG_LIB (alone when set), the
loader's default paths (libnvjpeg.so.13, .12), $CUDA_HOME/lib64, the copy inside torchvision's wheel.
"""
import glob
import os
import threading

import numpy as np
import torch

from .native import C

NvjpegError = C.NvjpegError  # a RuntimeError: libnvjpeg missing or refusing, a failed nvJPEG or CUDA call

_path = None
_path_error = None
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


def library_path():
    """The libnvjpeg the decoders use: the first candidate that loads and has every entry point they call (it is
    then loaded, for the process's life). NvjpegError saying where it looked, and why each failed, when none does;
    the answer is found once per process."""
    global _path, _path_error
    with _lock:
        if _path is None and _path_error is None:
            reasons = []
            for name in _candidates():
                try:
                    C.NvjpegDecoder.load_library(name)
                    _path = name
                    break
                except NvjpegError as e:
                    reasons.append(str(e))
            else:
                _path_error = (f"libnvjpeg not found (tried: {'; '.join(reasons)}); install the CUDA toolkit's "
                               f"nvJPEG or set FASTLOAD_NVJPEG_LIB")
    if _path is None:
        raise NvjpegError(_path_error)
    return _path


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
    """One nvJPEG handle + state on the current CUDA device: one batch at a time (the native class serialises
    calls). Decodes a batch of windows into one device buffer, laid out like ``ops.decode_crops`` at downscale 1
    (sample i is HWC uint8 at offsets[i])."""

    def __init__(self, max_batch):
        self._native = C.NvjpegDecoder(library_path(), max_batch)

    def decode(self, buffers, windows, out, stream):
        """Decodes windows [B, 5] (top, left, height, width, 1; an int64 or int32 tensor or array) of the JPEGs in
        ``buffers`` (bytes-like, host) into the contiguous uint8 CUDA tensor ``out`` on ``stream`` (a
        torch.cuda.Stream of out's device). Asynchronous: the pixels are there once the stream gets past this
        point. Returns (offsets, shapes) as ops.decode_crops would. ValueError for inputs that do not fit (checked
        before anything is decoded), NvjpegError when nvJPEG refuses."""
        if not isinstance(windows, torch.Tensor):
            windows = torch.from_numpy(np.ascontiguousarray(windows))
        if out.is_cuda and stream.device != out.device:
            raise ValueError(f"HardwareDecoder.decode: the stream is on {stream.device}, out on {out.device}")
        return self._native.decode(buffers, windows, out, stream.cuda_stream)

    def close(self):
        """Frees the nvJPEG objects (idempotent; also done when the decoder is garbage-collected)."""
        self._native.close()
