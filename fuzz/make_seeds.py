"""Seed corpus for fuzz/fuzz_decode.cpp: every JPEG kind of bench/corpus.py (make_kinds), each under 64 KB, with
the harness's control bytes in front (several windows, scales and modes per file), plus a few broken files, a
progressive file missing its last scans, and files re-encoded with restart markers (the region slicer's input).

    python fuzz/make_seeds.py OUT_DIR

Kinds larger than 64 KB are made smaller without changing their kind: baseline/CMYK/RGB files are cropped
losslessly with jpegtran (-crop keeps sampling, colour space, Adobe marker, restart interval), the large photo is
downsized with Pillow and re-encoded at the same 4:2:0 sampling.
"""
import hashlib
import io
import os
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MAX_SEED = 64 << 10
# (flags, window fractions): flags bit 0 strict, bits 1-2 downscale, 4 batch, 6 differential, 7 transcode (see
# the harness). Transcoding (add_restart_markers, then a whole decode of both files) is slower: two modes of four.
MODES = [
    (0x01 | 0x40 | 0x80, (0, 0, 0xFFFF, 0xFFFF)),          # whole image, scale 1, strict, checked, transcoded
    (0x01 | 0x40 | 2, (0x4000, 0x3000, 0x6000, 0x7000)),   # a crop at 1/2
    (0x01 | 0x40 | 6, (0x8000, 0x8000, 0xFFFF, 0xFFFF)),   # bottom-right at 1/8 (reaches the last row)
    (0x00 | 0x10 | 4 | 0x80, (0x1000, 0x0, 0x2000, 0xFFFF)),  # batch of 2 on 2 threads, lenient, 1/4, transcoded
]


def prefix(flags, a, b=(0x2000, 0x2000, 0x8000, 0x8000)):
    return bytes([flags]) + struct.pack("<4H", *a) + struct.pack("<4H", *b)


def shrink(kind, data):
    if len(data) <= MAX_SEED:
        return data
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        if kind == "large":
            for side in (1024, 768, 512, 384):
                small = im.convert("RGB").resize((side, side * h // w), Image.Resampling.LANCZOS)
                buf = io.BytesIO()
                small.save(buf, "JPEG", quality=75, subsampling=2)
                if buf.tell() <= MAX_SEED:
                    return buf.getvalue()
    for frac in (0.75, 0.5, 0.35, 0.25, 0.15):
        cw, ch = max(1, int(w * frac)), max(1, int(h * frac))
        out = subprocess.run(["jpegtran", "-copy", "all", "-crop", f"{cw}x{ch}+{w // 7}+{h // 9}"], input=data,
                             capture_output=True, check=True).stdout
        if len(out) <= MAX_SEED:
            return out
    raise RuntimeError(f"{kind}: cannot make a seed under {MAX_SEED} bytes")


def main(out):
    from bench import corpus

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(os.environ.get("FASTLOAD_TEST_CORPUS", "/tmp/fastload-test-corpus")) / "kinds"
    kinds = corpus.make_kinds(cache)
    files = {}
    for kind, path in kinds.items():
        files[kind] = shrink(kind, Path(path).read_bytes())
    # Restart markers every few MCUs (`fastload pack --seekable`): window decodes then go through the region
    # slicer (jpeg_regions.cpp), and the differential mode checks them against a plain decode of the whole image.
    from fastload import ops
    for kind in ("420", "422", "444", "gray", "progressive"):
        files[f"seekable_{kind}"] = ops.add_restart_markers(files[kind])
    base = files["420"]
    sos = base.index(b"\xff\xda")
    files["broken_truncated"] = base[: len(base) // 2]
    files["broken_header_only"] = base[:sos]
    files["broken_no_eoi"] = base[:-2]
    files["broken_trailing"] = base + b"\x00garbage\xff\xd9"
    # Valid but incomplete: a progressive file cut after its second scan, EOI put back (decoders smooth the
    # missing coefficients; the re-encoder must leave it alone).
    prog = files["progressive"]
    scans = [k for k in range(len(prog) - 1) if prog[k:k + 2] == b"\xff\xda"]
    files["progressive_partial"] = prog[: scans[2]] + b"\xff\xd9"
    n = 0
    for kind, data in sorted(files.items()):
        for flags, window in MODES:
            seed = prefix(flags, window) + data
            name = f"{kind}-{flags:02x}-{hashlib.sha1(seed).hexdigest()[:8]}"
            (out / name).write_bytes(seed)
            n += 1
    print(f"{n} seeds from {len(files)} files in {out} (largest {max(map(len, files.values()))} bytes)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/fuzz/seeds")
