"""Whether this machine's driver changes a running context's wait policy (bench.cuda_wait.set_cuda_wait after CUDA
started), and what a synchronize costs the waiting thread's core under each policy.

    python -m bench.cuda_wait_probe
"""
import time

import torch

from bench import cuda_wait


def main():
    torch.zeros(1, device="cuda")  # the primary context is running from here on
    before = cuda_wait.cuda_wait()
    try:
        cuda_wait.set_cuda_wait("sleep")
        verdict = f"changed: {before} -> {cuda_wait.cuda_wait()}"
    except RuntimeError as e:
        verdict = f"refused ({e})"
    print(f"set_cuda_wait on a running context: {verdict}")
    torch.cuda._sleep(1000)
    for policy in ("spin", "sleep"):
        try:
            cuda_wait.set_cuda_wait(policy)
        except RuntimeError:
            break
        torch.cuda._sleep(10 ** 9)
        wall, cpu = time.perf_counter(), time.thread_time()
        torch.cuda.synchronize()
        print(f"{cuda_wait.cuda_wait():>6}: synchronize waited {time.perf_counter() - wall:.3f} s, "
              f"{time.thread_time() - cpu:.3f} s of CPU")


if __name__ == "__main__":
    main()
