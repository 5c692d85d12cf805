"""Broken and hostile JPEGs made from good ones, and a worker that decodes them in a child process.

The worker runs as ``python tests/broken_jpeg.py CASE_DIR``: a crash (segfault, abort, hang) then fails the
test that asked for it instead of killing pytest. It prints one JSON line per decode and a "start" line before
each, so whoever reads its output knows which input it died on.
"""
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

_NO_LENGTH = {0xD8, 0xD9, *range(0xD0, 0xD8)}  # SOI, EOI, RSTn carry no length field


def segments(data):
    """[(marker, bytes)] of a JPEG; an SOS segment includes its entropy-coded data."""
    out, i = [], 0
    while i < len(data):
        assert data[i] == 0xFF, f"expected a marker at {i}"
        marker = data[i + 1]
        end = i + 2 if marker in _NO_LENGTH else i + 2 + int.from_bytes(data[i + 2:i + 4], "big")
        if marker == 0xDA:  # entropy data runs to the next marker that is not a stuffed 0xFF00 or an RSTn
            while not (data[end] == 0xFF and data[end + 1] != 0 and not 0xD0 <= data[end + 1] <= 0xD7):
                end += 1
        out.append((marker, data[i:end]))
        i = end
    return out


def scan_start(data):
    """Offset of the first byte of entropy-coded data (just after the first SOS header)."""
    i = data.index(b"\xff\xda")
    return i + 2 + int.from_bytes(data[i + 2:i + 4], "big")


def patch_sof(data, height, width):
    """The same file with the frame header claiming another size."""
    for i in range(2, len(data) - 8):
        if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC1, 0xC2, 0xC9, 0xCA):
            return data[:i + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[i + 9:]
    raise ValueError("no SOF marker")


def flip_bytes(data, count, seed):
    """``count`` bytes of the entropy-coded data XORed with random non-zero values."""
    rng = np.random.default_rng(seed)
    out = bytearray(data)
    for pos in rng.integers(scan_start(data), len(data) - 2, count):
        out[pos] ^= int(rng.integers(1, 256))
    return bytes(out)


def many_scans(baseline, jpegtran="jpegtran"):
    """A valid progressive JPEG with 2,080 scans: every AC coefficient of every component in its own band, sent
    one bit at a time (Al 10 -> 0). jpegtran allows 100 scans per script, so each script codes 9 bands and the
    scans of the 21 files are spliced: each scan brings its own Huffman tables and codes coefficients no other
    file's scans touch, and jpegtran transcodes losslessly, so every file shares the same quantised image."""
    bands = [(c, k) for c in range(3) for k in range(1, 64)]
    head, scans = None, []
    for start in range(0, len(bands), 9):
        lines = ["0,1,2: 0 0 0 0;"]
        for c, k in bands[start:start + 9]:
            lines += [f"{c}: {k} {k} 0 10;"] + [f"{c}: {k} {k} {a} {a - 1};" for a in range(10, 0, -1)]
        script = Path(f"/tmp/fastload-scans-{start}.txt")  # jpegtran reads its script from a file
        script.write_text("\n".join(lines) + "\n")
        try:
            out = subprocess.run([jpegtran, "-scans", str(script)], input=baseline, capture_output=True,
                                 check=True).stdout
        finally:
            script.unlink()
        segs = segments(out)
        first_table = next(i for i, (m, _) in enumerate(segs) if m in (0xC4, 0xCC, 0xDD, 0xDA))
        if head is None:
            head = b"".join(s for _, s in segs[:first_table])
        unit = b""
        for m, s in segs[first_table:]:
            if m == 0xDA:
                ns = s[4]
                if s[5 + 2 * ns] != 0 or not scans:  # AC scans, plus the DC scan of the first file only
                    scans.append(unit + s)
                unit = b""
            elif m != 0xD9:
                unit += s
    return head + b"".join(scans) + b"\xff\xd9"


def run_cases(cases, case_dir, timeout=120):
    """Writes cases ({name: (bytes, windows, kwargs)}) to case_dir and decodes them in a child process.
    Returns ({(name, window_index): result}, {name: header_result}, batch_result, child's returncode, stderr)."""
    case_dir = Path(case_dir)
    case_dir.mkdir(parents=True, exist_ok=True)
    index = {}
    for name, (data, windows, kwargs) in cases.items():
        (case_dir / f"{name}.bin").write_bytes(data)
        index[name] = {"windows": [list(w) for w in windows], "kwargs": kwargs}
    (case_dir / "cases.json").write_text(json.dumps(index))
    proc = subprocess.run([sys.executable, __file__, str(case_dir)], capture_output=True, text=True,
                          timeout=timeout)
    decodes, headers, batch = {}, {}, None
    for line in proc.stdout.splitlines():
        r = json.loads(line)
        if r["what"] == "decode":
            decodes[r["case"], r["window"]] = r
        elif r["what"] == "header":
            headers[r["case"]] = r
        elif r["what"] == "batch":
            batch = r
    return decodes, headers, batch, proc.returncode, proc.stderr[-2000:]


def _outcome(fn):
    from fastload import DecodeError
    t0 = time.perf_counter()
    try:
        value = fn()
        outcome, message = "ok", ""
    except DecodeError as e:
        value, outcome, message = None, "DecodeError", str(e)
    except Exception as e:  # noqa: BLE001 -- anything else is what the test is looking for
        value, outcome, message = None, type(e).__name__, str(e)
    return value, {"outcome": outcome, "message": message, "seconds": time.perf_counter() - t0}


def _emit(record):
    print(json.dumps(record), flush=True)


def _worker(case_dir):
    import torch
    from fastload import ops
    case_dir = Path(case_dir)
    index = json.loads((case_dir / "cases.json").read_text())
    buffers, windows = [], []
    for name, spec in index.items():
        data = (case_dir / f"{name}.bin").read_bytes()
        _emit({"what": "start", "case": name, "step": "header"})
        info, r = _outcome(lambda: ops.read_header(data, **{k: v for k, v in spec["kwargs"].items()
                                                             if k == "max_pixels"}))
        _emit({"what": "header", "case": name, "info": list(info) if info else None, **r})
        for i, w in enumerate(spec["windows"]):
            _emit({"what": "start", "case": name, "step": i})
            out, r = _outcome(lambda: ops.decode_crop(data, *w, **spec["kwargs"]))
            shape = list(out.shape) if out is not None else None
            _emit({"what": "decode", "case": name, "window": i, "shape": shape, **r})
        if not spec["kwargs"]:  # the batch path under the default limits, on several threads at once
            buffers.append(data)
            windows.append((spec["windows"][0] + [1])[:5])  # (top, left, h, w) + downscale
    _emit({"what": "start", "case": "batch", "step": 0})
    _, offsets, shapes, status, messages = ops.decode_crops(buffers, torch.tensor(windows), threads=4)
    _emit({"what": "batch", "cases": [n for n, s in index.items() if not s["kwargs"]], "status": status.tolist(),
           "messages": messages})


if __name__ == "__main__":
    _worker(sys.argv[1])
