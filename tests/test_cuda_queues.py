"""fastload asks the CUDA driver for 32 hardware queues at import (fastload/cuda_queues.py), keeps a user's own
value, and warns when a loader that uses the JPEG engines runs in a process with fewer.

Whether the queues matter is a measurement, not a test: `python -m bench.engine_contention` (bench/RESULTS.md, "Why
the engines slowed down inside training")."""
import os
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

import fastload as fl
from fastload import cuda_queues, decoders, nvjpeg

VAR = cuda_queues.VARIABLE
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code, **env):
    """Runs ``code`` in a fresh interpreter whose environment has VAR only as ``env`` says; its stdout's last line."""
    environment = {k: v for k, v in os.environ.items() if k != VAR}
    environment.update(env)
    out = subprocess.run([sys.executable, "-c", code], env=environment, cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_import_asks_for_32_queues_when_unset():
    assert _python(f"import os, fastload; print(os.environ.get('{VAR}'))") == "32"


def test_a_users_own_value_is_kept():
    assert _python(f"import os, fastload; print(os.environ.get('{VAR}'))", **{VAR: "1"}) == "1"


def test_queues_reads_the_environment(monkeypatch):
    monkeypatch.setattr(cuda_queues, "_started_with", None)
    for text, n in (("16", 16), ("1", 1), ("64", 32), ("0", 8), ("-3", 8), ("", 8), ("many", 8)):
        monkeypatch.setenv(VAR, text)
        assert cuda_queues.queues() == n, text  # as the driver reads it: 1 to 32, else its default
    monkeypatch.delenv(VAR)
    assert cuda_queues.queues() == cuda_queues.DRIVER_DEFAULT


def test_too_late_once_the_driver_is_initialised(monkeypatch):
    # The driver reads the variable at cuInit (torch.cuda.is_available() does it): set later, it changes nothing,
    # so ask() leaves it alone and remembers what the driver got.
    monkeypatch.setattr(cuda_queues, "_started_with", None)
    monkeypatch.setattr(cuda_queues, "set_by_fastload", False)
    monkeypatch.setattr(cuda_queues, "_driver_started", lambda: True)
    monkeypatch.delenv(VAR, raising=False)
    cuda_queues.ask()
    assert VAR not in os.environ and cuda_queues.queues() == 8 and not cuda_queues.set_by_fastload
    monkeypatch.setenv(VAR, "32")  # set after the driver started: still 8
    assert cuda_queues.queues() == 8
    monkeypatch.setattr(cuda_queues, "_warned", False)
    with pytest.warns(UserWarning, match=f"8 hardware queues when CUDA was initialised, before fastload was "
                                         f"imported \\({VAR} unset: the driver's default\\)"):
        cuda_queues.warn_if_few()


def test_few_queues_warn_once_with_the_fix(monkeypatch):
    monkeypatch.setattr(cuda_queues, "_warned", False)
    monkeypatch.setattr(cuda_queues, "_started_with", None)
    monkeypatch.setenv(VAR, "32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cuda_queues.warn_if_few()  # enough: silent
    monkeypatch.setenv(VAR, "1")
    with pytest.warns(UserWarning, match=f"1 hardware queues \\({VAR}=1, your value, kept. If it is deliberate.*"
                                         f"decoder='cpu'.*set {VAR}=32 before anything initialises CUDA"):
        cuda_queues.warn_if_few()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cuda_queues.warn_if_few()  # once per process
    monkeypatch.setattr(cuda_queues, "_warned", False)
    monkeypatch.delenv(VAR)
    with pytest.warns(UserWarning, match=f"8 hardware queues \\({VAR} unset: the driver's default\\)"):
        cuda_queues.warn_if_few()


def _loader_on_engines(monkeypatch, directory, **kwargs):
    """FastLoader with decoder="nvjpeg" resolved as on a GPU with engines (the constructor's path to the warning;
    nothing is decoded)."""
    monkeypatch.setattr(fl.loader.decoders, "resolve", lambda decoder, device, cores: decoders.KINDS["nvjpeg"])
    return fl.FastLoader(fl.FolderDataset(directory), decoder="nvjpeg", **kwargs)


def test_a_loader_on_the_engines_warns_at_the_users_line(imagenet_dir, monkeypatch):
    monkeypatch.setattr(cuda_queues, "_warned", False)
    monkeypatch.setattr(cuda_queues, "_started_with", None)
    monkeypatch.setenv(VAR, "8")
    with pytest.raises(ValueError, match="batch_size"), warnings.catch_warnings():
        warnings.simplefilter("error")
        _loader_on_engines(monkeypatch, imagenet_dir, batch_size=0)  # refused before it warns
    with pytest.warns(UserWarning) as caught:
        _loader_on_engines(monkeypatch, imagenet_dir, batch_size=4).close()
    mine = [w for w in caught if "hardware queues" in str(w.message)]
    assert len(mine) == 1 and mine[0].filename == __file__  # the line that built the loader, in _loader_on_engines


def test_the_cpu_decoder_does_not_warn(imagenet_dir, monkeypatch):
    monkeypatch.setattr(cuda_queues, "_warned", False)
    monkeypatch.setattr(cuda_queues, "_started_with", None)
    monkeypatch.setenv(VAR, "8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for decoder in ("cpu", "auto"):  # "auto" without a GPU is the cores, with nothing to try
            fl.FastLoader(fl.FolderDataset(imagenet_dir), batch_size=4, decoder=decoder).close()


FAKE_DRIVER = """
static int started;
int cuInit(unsigned int flags) { (void)flags; started = 1; return 0; }
int cuDeviceGetCount(int *count) { if (!started) return 3; *count = 0; return 0; }
"""


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    """A libcuda.so.1 that knows cuInit and cuDeviceGetCount only, as the real one answers them: whether fastload
    tells a started driver from one not started, on machines without a GPU."""
    if not shutil.which("cc"):
        pytest.skip("no C compiler")
    folder = tmp_path_factory.mktemp("fake_driver")
    (folder / "fake.c").write_text(FAKE_DRIVER)
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(folder / "libcuda.so.1"),
                    str(folder / "fake.c")], check=True)
    return folder / "libcuda.so.1"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a real driver is loaded with a GPU")
def test_the_driver_state_is_read_from_libcuda(fake_driver):
    load = f"import ctypes; lib = ctypes.CDLL('{fake_driver}'); "
    report = f"import os, fastload; print(os.environ.get('{VAR}'), fastload.cuda_queues.queues())"
    assert _python(load + report) == "32 32"  # loaded, not initialised: fastload sets it
    assert _python(load + "lib.cuInit(0); " + report) == "None 8"  # initialised first: left alone, 8
    assert _python(load + "lib.cuInit(0); " + report, **{VAR: "1"}) == "1 1"


engines = pytest.mark.skipif(not (torch.cuda.is_available() and nvjpeg.available()[0]),
                             reason="needs a GPU with a hardware JPEG decoder")


@pytest.mark.cuda
@engines
@pytest.mark.parametrize("decoder", ["nvjpeg", "hybrid", "auto"])
def test_a_loader_on_the_engines_warns_where_the_process_has_8_queues(imagenet_dir, monkeypatch, decoder):
    monkeypatch.setattr(cuda_queues, "_warned", False)
    monkeypatch.setattr(cuda_queues, "_started_with", None)
    monkeypatch.setenv(VAR, "8")
    with pytest.warns(UserWarning) as caught:
        fl.FastLoader(fl.FolderDataset(imagenet_dir), batch_size=4, device="cuda", decoder=decoder).close()
    mine = [w for w in caught if "8 hardware queues" in str(w.message)]
    assert len(mine) == 1 and mine[0].filename == __file__  # points at the line that built the loader


@pytest.mark.cuda
def test_on_a_gpu_the_driver_initialised_first_is_detected():
    code = (f"import os, torch; torch.cuda.is_available(); import fastload; "
            f"print(os.environ.get('{VAR}'), fastload.cuda_queues.queues())")
    assert _python(code) == "None 8"
    assert _python(f"import os, fastload; print(os.environ.get('{VAR}'), fastload.cuda_queues.queues())") == "32 32"
