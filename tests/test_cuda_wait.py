"""fastload.set_cuda_wait / cuda_wait: the CUDA driver's wait policy for the primary context (fastload/cuda_wait.py).

Checked in a fresh process each time: the policy must be set before CUDA starts, and pytest's process may already
have started it."""
import subprocess
import sys
import textwrap

import pytest
import torch

import fastload as fl


def test_unknown_policy_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="auto, spin, yield, sleep.*'nap'"):
        fl.set_cuda_wait("nap")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where there is no GPU")
def test_without_a_driver_the_error_says_so():
    with pytest.raises(RuntimeError, match="no CUDA driver|did not start"):
        fl.set_cuda_wait("sleep")


def _fresh(code):
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sleep_policy_makes_a_synchronize_sleep():
    """Set before CUDA starts, the policy is the context's, and a thread in torch.cuda.synchronize() while the GPU
    runs a ~0.3 s sleep kernel then uses a small part of that time on its core; with "spin" it uses nearly all."""
    code = """
        import time, torch, fastload as fl
        fl.set_cuda_wait("{policy}")
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); torch.cuda._sleep(10 ** 8); end.record(); end.synchronize()
        rate = 10 ** 8 / (start.elapsed_time(end) / 1e3)
        torch.cuda._sleep(int(0.3 * rate))
        wall, cpu = time.perf_counter(), time.thread_time()
        torch.cuda.synchronize()
        print(fl.cuda_wait(), time.perf_counter() - wall, time.thread_time() - cpu)
    """
    for policy in ("sleep", "spin"):
        name, wall, cpu = _fresh(code.format(policy=policy))
        wall, cpu = float(wall), float(cpu)
        assert name == policy and wall > 0.1, (name, wall)
        if policy == "sleep":
            assert cpu < 0.25 * wall, (wall, cpu)
        else:
            assert cpu > 0.5 * wall, (wall, cpu)  # the default's spin, which "sleep" avoids


def test_bench_title_names_a_chosen_policy():
    from fastload import benchmark
    config = dict(data="/d/train.lmdb", data_kind="store", images=10, batch_size=2, size=8, device="cuda",
                  device_name="GPU", cpu_cores=16, epochs=1)
    assert "waiting" not in benchmark.describe({"config": dict(config, cuda_wait="auto")})
    assert "threads sleep while waiting for the GPU" in benchmark.describe({"config": dict(config, cuda_wait="sleep")})
