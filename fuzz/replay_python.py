"""Replays fuzz inputs through fastload's Python API, to exercise the pybind11 layer (buffer views, file reads on
native threads, the ragged batch layout) that the C++ fuzz target does not reach. Run it on the sanitized build
(`make asan-test` does, over build/fuzz/corpus when there is one).

    python fuzz/replay_python.py DIR_OR_FILE...

Each input is parsed as fuzz/fuzz_decode.cpp does (control bytes, then the JPEG): read_headers on the batch,
decode_crop of its window (and add_restart_markers for inputs with flag bit 7), then decode_crops of 64 inputs at
a time on 2 threads, half of them given as file paths (read by the native threads), with every 16th window made
hostile (huge, negative, bad downscale).
"""
import struct
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

from fastload import DecodeError, ops

LIMIT = 1 << 22
HOSTILE = ([0, 0, 2**31, 2**31, 1], [2**63 - 1, 0, 1, 1, 1], [-5, 0, 8, 8, 1], [0, 0, 8, 8, 3], [0, 0, 0, 8, 1])


def parse(blob):
    if len(blob) < 17:
        return None
    raw = blob[0] & 8
    if raw and len(blob) < 49:
        return None
    return blob[0], blob[1:9], (blob[49:] if raw else blob[17:])


def window(fractions, h, w, d):
    t, l, hh, ww = struct.unpack("<4H", fractions)
    top, left = t * (h - 1) // 65535, l * (w - 1) // 65535
    return [top, left, 1 + hh * (h - top - 1) // 65535, 1 + ww * (w - left - 1) // 65535, d]


def main(args):
    files = [p for a in args for p in (sorted(Path(a).iterdir()) if Path(a).is_dir() else [Path(a)]) if p.is_file()]
    inputs = [x for x in (parse(p.read_bytes()) for p in files) if x is not None]
    counts = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for start in range(0, len(inputs), 64):
            chunk = inputs[start:start + 64]
            datas = [data for _, _, data in chunk]
            sizes, status, _ = ops.read_headers(datas, threads=2, max_pixels=LIMIT)
            windows, sources = [], []
            for k, (flags, fractions, data) in enumerate(chunk):
                d = 1 << ((flags >> 1) & 3)
                ok = int(status[k]) == ops.OK
                win = window(fractions, int(sizes[k, 0]), int(sizes[k, 1]), d) if ok else [0, 0, 1, 1, d]
                if (start + k) % 16 == 15:
                    win = HOSTILE[(start + k) // 16 % len(HOSTILE)]
                windows.append(win)
                if k % 2:
                    path = Path(tmp) / f"{start + k}.jpg"
                    path.write_bytes(data)
                    sources.append(str(path))
                else:
                    sources.append(data)
                try:
                    ops.decode_crop(data, *win[:4], downscale=win[4], strict=bool(flags & 1), max_pixels=LIMIT)
                    counts["single ok"] += 1
                except (DecodeError, ValueError):
                    counts["single refused"] += 1
                if flags & 128:
                    try:
                        copy = ops.add_restart_markers(data, strict=bool(flags & 1), max_pixels=LIMIT)
                        counts["transcode ok" if copy is not None else "transcode left alone"] += 1
                    except DecodeError:
                        counts["transcode refused"] += 1
            out = ops.decode_crops(sources, torch.tensor(windows, dtype=torch.int64), threads=2, max_pixels=LIMIT,
                                   strict=bool(start % 128))[3]
            counts.update(f"batch status {int(s)}" for s in out)
    print(f"replayed {len(inputs)} inputs through the Python API: " + ", ".join(f"{k}: {v}" for k, v in
                                                                          sorted(counts.items())))


if __name__ == "__main__":
    main(sys.argv[1:])
