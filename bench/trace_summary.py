"""Summarises torch.profiler chrome traces (bench.train_profile --trace DIR): per CUDA stream, the GPU time of its
kernels and copies and their top names; how long the GPU kept each kind of work waiting after its launch call
returned (queue delay, by the first words of its name); and the CUDA runtime / driver calls by name (count, total
ms), which shows allocations and synchronisations made by libraries such as nvJPEG. A queue delay counts from the
launch call: for a kernel queued behind other work of its own stream it includes that work (nvJPEG's conversion
kernel follows its image's hardware decode, which CUPTI does not show), and every kernel of a CUDA graph counts
from the graph's launch. The copies are bucketed by kind, whoever made them.

    python -m bench.trace_summary DIR/trace_*.json
"""
import collections
import json
import sys

import numpy as np


def summarise(path, top=8):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    gpu = collections.defaultdict(collections.Counter)  # stream -> name -> us
    calls = collections.Counter()
    call_us = collections.Counter()
    span = [float("inf"), 0.0]
    launched = {}  # correlation id -> when the launch call returned (us)
    started = []   # (correlation id, name, GPU start, duration)
    for e in events:
        cat, dur = e.get("cat", ""), float(e.get("dur", 0) or 0)
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            stream = e.get("args", {}).get("stream", "?")
            gpu[stream][e["name"][:90]] += dur
            span[0], span[1] = min(span[0], e["ts"]), max(span[1], e["ts"] + dur)
            started.append((e.get("args", {}).get("correlation"), e["name"], e["ts"], dur))
        elif cat in ("cuda_runtime", "cuda_driver"):
            calls[e["name"]] += 1
            call_us[e["name"]] += dur
            launched[e.get("args", {}).get("correlation")] = e["ts"] + dur
    print(f"== {path}: GPU span {(span[1] - span[0]) / 1e3:.1f} ms")
    for stream, names in sorted(gpu.items(), key=lambda kv: -sum(kv[1].values())):
        print(f"  stream {stream}: {sum(names.values()) / 1e3:.2f} ms busy, {len(names)} names")
        for name, us in names.most_common(top):
            print(f"      {us / 1e3:8.3f} ms  {name}")
    delays = collections.defaultdict(list)
    for corr, name, ts, dur in started:
        if corr in launched:
            kind = "nvjpeg " + name.split("<")[0].split("::")[-1] if "nvjpeg" in name else \
                "fastload " + name.split("<")[0].split("::")[-1] if "fastload" in name else \
                name if name.startswith("Memcpy") else "torch/cudnn kernels"
            delays[kind].append((ts - launched[corr], dur))
    print("  queue delay after the launch call, us (count, p50, p90, max; mean duration):")
    for kind, v in sorted(delays.items(), key=lambda kv: -len(kv[1])):
        d = np.array([x for x, _ in v])
        print(f"    {len(v):6d} {np.percentile(d, 50):9.1f} {np.percentile(d, 90):9.1f} {d.max():9.1f}; "
              f"{np.mean([y for _, y in v]):8.1f}  {kind}")
    print("  runtime/driver calls (count, total ms):")
    for name, n in calls.most_common(25):
        print(f"    {n:6d} {call_us[name] / 1e3:9.2f}  {name}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        summarise(p)
