"""Host timing shared by the CPU micro-benchmarks (GPU time: bench.gpu.cuda_time)."""
import time


def best_seconds(fn, repeats):
    """The fastest of ``repeats`` timed calls of fn(), in seconds (after one untimed call that warms pools and
    caches): on a shared, noisy machine the minimum is the figure that repeats."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best
