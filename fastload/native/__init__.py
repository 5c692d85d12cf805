"""Loads the compiled module fastload._C, with a clear message when it is missing or stale.

The C++/CUDA sources beside this file: jpeg_decoder.* (libjpeg-turbo crop decode), bindings.cpp (pybind11:
buffers in, status out), warp_*.{cpp,cu} and warp.h (the torch op fastload::warp_normalize, CPU and CUDA),
nvjpeg_decoder.* (the GPU's hardware JPEG decoder, libnvjpeg opened at run time).
"""
import os

import torch  # noqa: F401  (loads libtorch, which fastload._C links against)

from .sources import source_hash

_BUILD_HINT = "build it with `make setup` (or `pip install --no-build-isolation -e .` in this checkout)"


def _load():
    try:
        from fastload import _C
    except ImportError as e:
        raise ImportError(f"fastload's compiled module fastload._C could not be loaded ({e}); {_BUILD_HINT}") from e
    current = source_hash()
    if current is not None and _C.source_hash != current and os.environ.get("FASTLOAD_ALLOW_STALE") != "1":
        raise ImportError(
            f"fastload._C is stale: it was built from native sources {_C.source_hash}, the checkout has {current}; "
            f"rebuild it ({_BUILD_HINT}), or set FASTLOAD_ALLOW_STALE=1 to use it anyway")
    return _C


C = _load()
