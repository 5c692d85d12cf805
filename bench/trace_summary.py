"""Summarises torch.profiler chrome traces (bench.train_profile --trace DIR): per CUDA stream, the GPU time of its
kernels and copies and their top names; and the CUDA runtime / driver calls by name (count, total ms), which shows
allocations and synchronisations made by libraries such as nvJPEG.

    python -m bench.trace_summary DIR/trace_*.json
"""
import collections
import json
import sys


def summarise(path, top=8):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    gpu = collections.defaultdict(collections.Counter)  # stream -> name -> us
    calls = collections.Counter()
    call_us = collections.Counter()
    span = [float("inf"), 0.0]
    for e in events:
        cat, dur = e.get("cat", ""), float(e.get("dur", 0) or 0)
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            stream = e.get("args", {}).get("stream", "?")
            gpu[stream][e["name"][:90]] += dur
            span[0], span[1] = min(span[0], e["ts"]), max(span[1], e["ts"] + dur)
        elif cat in ("cuda_runtime", "cuda_driver"):
            calls[e["name"]] += 1
            call_us[e["name"]] += dur
    print(f"== {path}: GPU span {(span[1] - span[0]) / 1e3:.1f} ms")
    for stream, names in sorted(gpu.items(), key=lambda kv: -sum(kv[1].values())):
        print(f"  stream {stream}: {sum(names.values()) / 1e3:.2f} ms busy, {len(names)} names")
        for name, us in names.most_common(top):
            print(f"      {us / 1e3:8.3f} ms  {name}")
    print("  runtime/driver calls (count, total ms):")
    for name, n in calls.most_common(25):
        print(f"    {n:6d} {call_us[name] / 1e3:9.2f}  {name}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        summarise(p)
