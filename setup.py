"""Builds fastload._C: the libjpeg-turbo decoder and the affine/normalise op (CPU, plus CUDA when it can).

CUDA sources are compiled when torch is a CUDA build and a CUDA toolkit is found (CUDA_HOME); otherwise they
are skipped with one line of notice. FASTLOAD_NO_CUDA=1 skips them on purpose.
Build with `pip install --no-build-isolation -e .` (the Makefile does): torch must come from the environment.
"""
import os
import sys

from setuptools import find_packages, setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fastload", "native"))
from sources import NATIVE_DIR, source_hash  # noqa: E402  (stdlib-only helper shared with the runtime check)

from torch.utils import cpp_extension  # noqa: E402


def extension():
    rel = os.path.relpath(NATIVE_DIR, os.path.dirname(os.path.abspath(__file__)))
    names = ("bindings.cpp", "crc32.cpp", "jpeg_decoder.cpp", "jpeg_regions.cpp", "jpeg_transcode.cpp",
             "warp_cpu.cpp", "augment_cpu.cpp", "batch_ops_cpu.cpp", "affine_nearest_cpu.cpp",
             "nvjpeg_decoder.cpp")  # nvJPEG: dlopen'd, in every build
    cpp = [os.path.join(rel, f) for f in names]
    macros = [("FASTLOAD_SOURCE_HASH", f'"{source_hash()}"')]
    cxx, link = ["-O3"], []
    if os.environ.get("FASTLOAD_SANITIZE") == "1":  # `make asan-test`: ASan + UBSan build into build/asan
        link = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"]
        cxx = ["-O1", "-g", "-fno-wrapv"] + link  # -fno-wrapv: Python's -fwrapv would hide signed overflow
    import torch

    want_cuda = os.environ.get("FASTLOAD_NO_CUDA", "0") != "1"
    has_cuda = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if want_cuda and has_cuda:
        macros.append(("FASTLOAD_WITH_CUDA", None))
        nvcc = ["-O3", "--use_fast_math",
                "-gencode=arch=compute_80,code=sm_80",
                "-gencode=arch=compute_90,code=sm_90",
                "-gencode=arch=compute_90,code=compute_90"]
        return cpp_extension.CUDAExtension(
            "fastload._C", cpp + [os.path.join(rel, f) for f in ("warp_cuda.cu", "augment_cuda.cu",
                                                                 "batch_ops_cuda.cu", "affine_nearest_cuda.cu")],
            libraries=["jpeg", "z", "dl"],
            define_macros=macros, extra_compile_args={"cxx": cxx, "nvcc": nvcc}, extra_link_args=link)
    why = "FASTLOAD_NO_CUDA=1" if not want_cuda else (
        "torch is a CPU build" if torch.version.cuda is None else "no CUDA toolkit found (set CUDA_HOME)")
    print(f"fastload: building without CUDA kernels ({why})", file=sys.stderr)
    return cpp_extension.CppExtension("fastload._C", cpp, libraries=["jpeg", "z", "dl"], define_macros=macros,
                                      extra_compile_args={"cxx": cxx}, extra_link_args=link)


setup(
    packages=find_packages(include=["fastload", "fastload.*"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
