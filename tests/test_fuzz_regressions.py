"""Inputs the fuzzer (fuzz/fuzz_decode.cpp, `make fuzz`) found, replayed through the Python API in a child process.

Each file in tests/data/fuzz_regressions is a fuzz input: 17 control bytes (flags, two windows as fractions of the
image), 32 more bytes of raw window when flag bit 3 is set, then the JPEG bytes (see the harness). The child
decodes it as the harness did, with ops.read_header / decode_crop / decode_crops (2 windows on 2 threads), and
checks a window against the whole image decoded at the same scale; with flag bit 7 it also re-encodes the JPEG
with ops.add_restart_markers and, where the original passes a strict check (what pack asks before it stores the
re-encoded file), checks that the copy decodes to the same pixels. A crash, hang or mismatch fails the test.
"""
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data" / "fuzz_regressions"
LIMIT = 1 << 22  # the harness's pixel limit


def _fractions(p, h, w):
    t, l, hh, ww = struct.unpack("<4H", p)
    top, left = t * (h - 1) // 65535, l * (w - 1) // 65535
    return [top, left, 1 + hh * (h - top - 1) // 65535, 1 + ww * (w - left - 1) // 65535]


def replay(blob):
    """What the harness does with ``blob``, through the public API. Returns a JSON-able summary."""
    import torch

    from fastload import DecodeError, ops

    flags = blob[0]
    strict, raw, differential, transcode = bool(flags & 1), bool(flags & 8), bool(flags & 64), bool(flags & 128)
    d = 1 << ((flags >> 1) & 3)
    data = blob[49:] if raw else blob[17:]
    try:
        info = ops.read_header(data, max_pixels=LIMIT)
    except DecodeError:
        info = None
    if raw:
        window = list(struct.unpack("<4q", blob[17:49]))
    else:
        window = _fractions(blob[1:9], info.height, info.width) if info else [0, 0, 1, 1]
    other = (_fractions(blob[9:17], info.height, info.width) if info else [0, 0, 1, 1]) + [1 << ((blob[9] >> 1) & 3)]
    out = {"header": info is not None}
    try:
        crop = ops.decode_crop(data, *window, downscale=d, strict=strict, max_pixels=LIMIT)
        out["single"] = "ok"
    except (DecodeError, ValueError) as e:
        crop, out["single"] = None, type(e).__name__
    windows = torch.tensor([window + [d], other], dtype=torch.int64)
    _, offsets, shapes, status, _ = ops.decode_crops([data, data], windows, threads=2, strict=strict,
                                                     max_pixels=LIMIT)
    out["batch"] = status.tolist()
    if crop is not None and differential and strict and info:
        whole = ops.decode_crop(data, 0, 0, info.height, info.width, downscale=d, strict=strict, max_pixels=LIMIT)
        r0, c0 = window[0] // d, window[1] // d
        out["differs"] = not torch.equal(crop, whole[r0:r0 + crop.shape[0], c0:c0 + crop.shape[1]])
    if transcode:
        try:
            copy = ops.add_restart_markers(data, strict=strict, max_pixels=LIMIT)
            out["transcode"] = "ok" if copy is not None else "left alone"
        except DecodeError as e:
            copy, out["transcode"] = None, type(e).__name__
        if copy is not None and int(ops.verify_jpegs([data], strict=True, max_pixels=LIMIT)[0][0]) == ops.OK:
            h, w = info.height, info.width
            again = ops.read_header(copy, max_pixels=LIMIT)
            before = ops.decode_crop(data, 0, 0, h, w, max_pixels=LIMIT)
            out["transcode_differs"] = ((again.height, again.width) != (h, w) or
                                        not torch.equal(before, ops.decode_crop(copy, 0, 0, h, w, max_pixels=LIMIT)))
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.iterdir()) if DATA.is_dir() else [])
def test_fuzz_finding_stays_fixed(name):
    proc = subprocess.run([sys.executable, __file__, str(DATA / name)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{name}: child died (rc {proc.returncode}): {proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result.get("differs"), f"{name}: the window decode differs from the whole image's decode"
    assert not result.get("transcode_differs"), f"{name}: the re-encoded file decodes to different pixels"


def test_hostile_windows_in_a_batch_do_not_corrupt_memory():
    """Windows whose byte counts overflow int64 (found with the raw-window fuzz mode): decode_crops laid the batch
    out with a negative offset for the next sample and wrote before its buffer (a segfault, or worse)."""
    script = """
import io, torch
from PIL import Image
from skimage import data as photos
import fastload.ops as ops
buf = io.BytesIO()
Image.fromarray(photos.astronaut()[100:148, 200:264]).save(buf, "JPEG")
data = buf.getvalue()
big = 2**31
for bad in ([0, 0, big, big, 1], [0, 0, 2**62, 3, 1], [2**63 - 1, 0, 1, 1, 1], [0, 2**63 - 2, 8, 8, 2],
            [-1, 0, 8, 8, 1], [0, 0, 8, 8, 3]):
    out = torch.zeros(64 * 48 * 3 + 64, dtype=torch.uint8)
    _, offsets, shapes, status, messages = ops.decode_crops([data, data], [bad, [0, 0, 48, 64, 1]], out)
    assert status.tolist() == [ops.BAD_WINDOW, ops.OK], (bad, status, messages)
    room = int((shapes.prod(1)).sum())
    assert 0 <= int(offsets.min()) and int(offsets.max()) + int(shapes[1].prod()) <= room <= 64 * 48 * 3 + 27
    assert not out[room:].any(), bad  # nothing written past the batch's layout
    status = ops.decode_crops([data, data], [bad, [0, 0, 48, 64, 1]])[3]  # out=None: sized in Python
    assert status.tolist() == [ops.BAD_WINDOW, ops.OK], (bad, status)
    try:
        ops.decode_crop(data, *bad[:4], downscale=bad[4])
        raise AssertionError(bad)
    except ValueError as e:
        assert "window" in str(e) or "downscale" in str(e), e
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", f"rc {proc.returncode}: {proc.stderr[-3000:]}"


if __name__ == "__main__":
    print(json.dumps(replay(Path(sys.argv[1]).read_bytes())))
