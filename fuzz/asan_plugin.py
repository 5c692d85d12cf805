"""pytest plugin for `make asan-test`: runs the tests on the ASan + UBSan build of fastload._C in build/asan
(FASTLOAD_ASAN_LIB) instead of the checkout's own build, which stays untouched.

Loaded with ``-p fuzz.asan_plugin`` before any test module: it loads the sanitized extension under the name
``fastload._C``, so ``fastload.native`` picks it up from sys.modules. The ASan runtime must be preloaded
(LD_PRELOAD, as the Makefile does): Python itself is not instrumented.
"""
import glob
import importlib.util
import os
import sys

import torch  # noqa: F401  (libtorch first: the extension links against it)

_ROOT = os.environ.get("FASTLOAD_ASAN_LIB", "build/asan")


def _load():
    found = sorted(glob.glob(os.path.join(_ROOT, "fastload", "_C*.so")))
    if not found:
        raise RuntimeError(f"no sanitized build in {_ROOT}/fastload: run `make asan-build`")
    with open("/proc/self/maps") as f:
        if "libasan" not in f.read():
            raise RuntimeError("the ASan runtime is not loaded: run with LD_PRELOAD=$(gcc -print-file-name=libasan.so)")
    spec = importlib.util.spec_from_file_location("fastload._C", found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["fastload._C"] = module
    return found[0]


PATH = os.path.abspath(_load())

import fastload.native  # noqa: E402

assert os.path.abspath(fastload.native.C.__file__) == PATH, fastload.native.C.__file__


def pytest_report_header(config):
    return f"fastload._C under test: {PATH} (ASan + UBSan)"
