"""For `make asan-test`: every Python process started with this folder on PYTHONPATH and FASTLOAD_ASAN_LIB set
(pytest and the child processes tests start) uses the ASan + UBSan build of fastload._C in $FASTLOAD_ASAN_LIB
(build/asan) instead of the checkout's own build, which stays untouched.

Python runs sitecustomize before anything else: this loads the sanitized extension under the name
``fastload._C``, so ``fastload.native`` finds it in sys.modules. The ASan runtime must be preloaded
(LD_PRELOAD=$(gcc -print-file-name=libasan.so), as the Makefile does): Python itself is not instrumented.
"""
import glob
import importlib.util
import os
import sys


def _load(root):
    found = sorted(glob.glob(os.path.join(root, "fastload", "_C*.so")))
    if not found:
        raise RuntimeError(f"no sanitized build in {root}/fastload: run `make asan-build`")
    with open("/proc/self/maps") as f:
        if "libasan" not in f.read():
            raise RuntimeError("the ASan runtime is not loaded: run with LD_PRELOAD=$(gcc -print-file-name=libasan.so)")
    import torch  # noqa: F401  (libtorch first: the extension links against it)

    spec = importlib.util.spec_from_file_location("fastload._C", found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["fastload._C"] = module


if os.environ.get("FASTLOAD_ASAN_LIB"):
    _load(os.path.abspath(os.environ["FASTLOAD_ASAN_LIB"]))
