"""bench.cuda_wait: the CUDA driver's wait policy for the primary context, which bench.train_profile compares.

The CUDA checks run in a fresh process, where the policy is set before CUDA starts."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bench import cuda_wait


def test_unknown_policy_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="auto, spin, yield, sleep.*'nap'"):
        cuda_wait.set_cuda_wait("nap")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where there is no GPU")
def test_without_a_driver_the_error_says_so():
    with pytest.raises(RuntimeError, match="no CUDA driver|did not start"):
        cuda_wait.set_cuda_wait("sleep")


def _fresh(code):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sleep_policy_makes_a_synchronize_sleep():
    """Set before CUDA starts, the policy is the context's, and a thread in torch.cuda.synchronize() while the GPU
    runs a ~0.3 s sleep kernel then uses a small part of that time on its core; with "spin" it uses nearly all.
    Once CUDA runs, the policy can still be changed."""
    code = """
        import time, torch
        from bench import cuda_wait
        cuda_wait.set_cuda_wait("{policy}")
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); torch.cuda._sleep(10 ** 8); end.record(); end.synchronize()
        rate = 10 ** 8 / (start.elapsed_time(end) / 1e3)
        torch.cuda._sleep(int(0.3 * rate))
        wall, cpu = time.perf_counter(), time.thread_time()
        torch.cuda.synchronize()
        print(cuda_wait.cuda_wait(), time.perf_counter() - wall, time.thread_time() - cpu)
        cuda_wait.set_cuda_wait("yield")  # a running context's policy changes too (CUDA 11 on)
        print(cuda_wait.cuda_wait())
    """
    for policy in ("sleep", "spin"):
        name, wall, cpu, changed = _fresh(code.format(policy=policy))
        wall, cpu = float(wall), float(cpu)
        assert name == policy and wall > 0.1 and changed == "yield", (name, wall, changed)
        if policy == "sleep":
            assert cpu < 0.25 * wall, (wall, cpu)
        else:
            assert cpu > 0.5 * wall, (wall, cpu)  # the default's spin, which "sleep" avoids

