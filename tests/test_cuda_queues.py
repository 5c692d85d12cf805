"""fastload asks the CUDA driver for 32 hardware queues at import (fastload/cuda_queues.py), keeps a user's own
value, and warns when a loader that uses the JPEG engines runs in a process with fewer.

Whether the queues matter is a measurement, not a test: `python -m bench.engine_contention` (bench/RESULTS.md, "Why
the engines slowed down inside training")."""
import os
import subprocess
import sys
import warnings

import pytest
import torch

import fastload as fl
from fastload import cuda_queues, nvjpeg

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
    monkeypatch.setenv(VAR, "16")
    assert cuda_queues.queues() == 16
    monkeypatch.delenv(VAR)
    assert cuda_queues.queues() == cuda_queues.DRIVER_DEFAULT
    monkeypatch.setenv(VAR, "many")
    assert cuda_queues.queues() == cuda_queues.DRIVER_DEFAULT  # the driver ignores what is not a number


def test_too_late_once_the_driver_is_initialised(monkeypatch):
    # The driver reads the variable at cuInit (torch.cuda.is_available() does it): set later, it changes nothing,
    # so ask() leaves it alone and remembers what the driver got.
    monkeypatch.setattr(cuda_queues, "_started_with", None)
    monkeypatch.setattr(cuda_queues, "_driver_started", lambda: True)
    monkeypatch.delenv(VAR, raising=False)
    cuda_queues.ask()
    assert VAR not in os.environ and cuda_queues.queues() == 8
    monkeypatch.setenv(VAR, "32")  # set after the driver started: still 8
    assert cuda_queues.queues() == 8
    monkeypatch.setattr(cuda_queues, "_warned", False)
    with pytest.warns(UserWarning, match="8 hardware queues .*when CUDA was initialised, before fastload was imp"):
        cuda_queues.warn_if_few()


def test_no_driver_loaded_is_not_started():
    # This process has imported torch and fastload; without a GPU nothing has initialised the driver.
    if torch.cuda.is_available():
        pytest.skip("with a GPU: test_on_a_gpu_the_driver_initialised_first_is_detected")
    assert not cuda_queues._driver_started()


def test_few_queues_warn_once_with_the_fix(monkeypatch):
    monkeypatch.setattr(cuda_queues, "_warned", False)
    monkeypatch.setattr(cuda_queues, "_started_with", None)
    monkeypatch.setenv(VAR, "32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cuda_queues.warn_if_few()  # enough: silent
    monkeypatch.setenv(VAR, "8")
    with pytest.warns(UserWarning, match=f"8 hardware queues \\({VAR}=8\\).*Set {VAR}=32 before anything uses CUDA"):
        cuda_queues.warn_if_few()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cuda_queues.warn_if_few()  # once per process
    monkeypatch.setattr(cuda_queues, "_warned", False)
    monkeypatch.delenv(VAR)
    with pytest.warns(UserWarning, match=f"8 hardware queues \\({VAR} unset: the driver default\\)"):
        cuda_queues.warn_if_few()


def test_the_cpu_decoder_does_not_warn(imagenet_dir, monkeypatch):
    monkeypatch.setattr(cuda_queues, "_warned", False)
    monkeypatch.setattr(cuda_queues, "_started_with", None)
    monkeypatch.setenv(VAR, "8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fl.FastLoader(fl.FolderDataset(imagenet_dir), batch_size=4, decoder="cpu").close()


engines = pytest.mark.skipif(not (torch.cuda.is_available() and nvjpeg.available()[0]),
                             reason="needs a GPU with a hardware JPEG decoder")


@pytest.mark.cuda
@engines
@pytest.mark.parametrize("decoder", ["nvjpeg", "hybrid", "auto"])
def test_a_loader_on_the_engines_warns_where_the_process_has_8_queues(imagenet_dir, monkeypatch, decoder):
    monkeypatch.setattr(cuda_queues, "_warned", False)
    monkeypatch.setattr(cuda_queues, "_started_with", None)
    monkeypatch.setenv(VAR, "8")
    with pytest.warns(UserWarning, match="8 hardware queues") as caught:
        fl.FastLoader(fl.FolderDataset(imagenet_dir), batch_size=4, device="cuda", decoder=decoder).close()
    assert caught[0].filename == __file__  # points at the line that built the loader


@pytest.mark.cuda
def test_on_a_gpu_the_driver_initialised_first_is_detected():
    code = (f"import os, torch; torch.cuda.is_available(); import fastload; "
            f"print(os.environ.get('{VAR}'), fastload.cuda_queues.queues())")
    assert _python(code) == "None 8"
    assert _python(f"import os, fastload; print(os.environ.get('{VAR}'), fastload.cuda_queues.queues())") == "32 32"
