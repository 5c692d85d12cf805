"""The list of native sources and their hash, shared by setup.py (baked into the build) and the runtime
check in fastload/native/__init__.py (which says so when the compiled module no longer matches them).
Standard library only: setup.py imports it before anything is built."""
import hashlib
import os

NATIVE_DIR = os.path.dirname(os.path.abspath(__file__))
SOURCES = ("bindings.cpp", "check.h", "cpu_build.h", "crc32.cpp", "crc32.h", "exit_guard.h", "jpeg_decoder.cpp",
           "jpeg_decoder.h", "jpeg_errors.h", "jpeg_regions.cpp", "jpeg_regions.h", "jpeg_transcode.cpp",
           "jpeg_transcode.h", "warp.h", "warp_op.h", "warp_cpu.cpp", "warp_cuda.cu", "augment.h", "augment_cpu.cpp",
           "augment_cuda.cu", "batch_ops.h", "batch_ops_cpu.cpp", "batch_ops_cuda.cu", "affine_nearest.h",
           "affine_nearest_cpu.cpp", "affine_nearest_cuda.cu", "nvjpeg_api.h", "nvjpeg_decoder.h",
           "nvjpeg_decoder.cpp")


def source_hash():
    """sha256 over the native sources' names and bytes, or None when they are not shipped."""
    digest = hashlib.sha256()
    for name in SOURCES:
        path = os.path.join(NATIVE_DIR, name)
        if not os.path.exists(path):
            return None
        digest.update(name.encode())
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]
