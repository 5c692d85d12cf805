"""fastload.ops JPEG decoding on real photos: bit-exact against Pillow and libjpeg-turbo, safe on broken input.

References: at downscale 1, Pillow's full decode + crop (what users compare against). At 1/2, 1/4, 1/8, libjpeg-
turbo's own scaled full decode through TurboJPEG (PyTurboJPEG, flags=0: ISLOW IDCT and fancy upsampling, the
same defaults as djpeg and as fastload), cropped at the scaled coordinates.
"""
import ctypes
import io
import os
import shutil
import subprocess
import time
from functools import lru_cache

import numpy as np
import pytest
import torch
from PIL import Image

import broken_jpeg as bj
from bench.corpus import KINDS, source_photos
from fastload import DecodeError, ops

ERR = {"DecodeError"}
ANY = {"DecodeError", "ok"}  # a valid decode of bytes that still parse is fine; anything else is not


@lru_cache(maxsize=None)
def _turbo():
    from bench.decode import turbojpeg
    return turbojpeg()


@lru_cache(maxsize=None)
def pillow_rgb(path):
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


@lru_cache(maxsize=None)
def turbo_rgb(path, d):
    """libjpeg-turbo's full decode at 1/d, as RGB the way Pillow would convert it."""
    from turbojpeg import TJPF_CMYK, TJPF_RGB
    data = path.read_bytes()
    if ops.read_header(data).color_space in ("cmyk", "ycck"):
        raw = _turbo().decode(data, pixel_format=TJPF_CMYK, scaling_factor=(1, d))
        # Adobe CMYK is stored inverted; Pillow's CMYK;I raw mode undoes that before its own CMYK -> RGB.
        cmyk = Image.frombytes("CMYK", (raw.shape[1], raw.shape[0]), (255 - raw).tobytes())
        return np.asarray(cmyk.convert("RGB"))
    return _turbo().decode(data, pixel_format=TJPF_RGB, scaling_factor=(1, d))


def windows(h, w, n, seed):
    """Edge windows (whole image, corner pixels, last row and column) plus n random ones, a third of them small."""
    rng = np.random.default_rng(seed)
    out = [(0, 0, h, w), (0, 0, 1, 1), (h - 1, w - 1, 1, 1), (h - 1, 0, 1, w), (0, w - 1, h, 1),
           (h // 2, w // 2, h - h // 2, w - w // 2)]
    for i in range(n):
        limit_h, limit_w = (min(h, 32), min(w, 32)) if i % 3 == 0 else (h, w)
        wh, ww = int(rng.integers(1, limit_h + 1)), int(rng.integers(1, limit_w + 1))
        out.append((int(rng.integers(0, h - wh + 1)), int(rng.integers(0, w - ww + 1)), wh, ww))
    return out


def assert_same(out, ref, what):
    out = out.numpy() if isinstance(out, torch.Tensor) else out
    assert out.shape == ref.shape, f"{what}: shape {out.shape}, expected {ref.shape}"
    if not np.array_equal(out, ref):
        bad = np.argwhere((out != ref).any(axis=-1))
        worst = int(np.abs(out.astype(int) - ref).max())
        raise AssertionError(f"{what}: {len(bad)} pixels differ (first at {bad[0].tolist()}, max |diff| {worst})")


# ---- decoding good files ----------------------------------------------------------------------------------

#: kind -> (colour space, subsampling, progressive, arithmetic, adobe)
HEADERS = {
    "444": ("ycbcr", "4:4:4", False, False, False), "422": ("ycbcr", "4:2:2", False, False, False),
    "420": ("ycbcr", "4:2:0", False, False, False), "440": ("ycbcr", "4:4:0", False, False, False),
    "411": ("ycbcr", "4:1:1", False, False, False), "progressive": ("ycbcr", "4:2:0", True, False, False),
    "arithmetic": ("ycbcr", "4:2:0", False, True, False),
    "arithmetic_progressive": ("ycbcr", "4:2:0", True, True, False),
    "restart": ("ycbcr", "4:2:0", False, False, False), "gray": ("gray", "gray", False, False, False),
    "cmyk": ("cmyk", "4:4:4", False, False, True), "rgb": ("rgb", "4:4:4", False, False, True),
    "1x1": ("ycbcr", "4:2:0", False, False, False), "8x8": ("ycbcr", "4:2:0", False, False, False),
    "large": ("ycbcr", "4:2:0", False, False, False),
}


@pytest.mark.parametrize("kind", KINDS)
def test_read_header(kinds, kind):
    info = ops.read_header(kinds[kind].read_bytes())
    with Image.open(kinds[kind]) as im:
        width, height = im.size
    components = {"gray": 1, "cmyk": 4}.get(kind, 3)
    assert info == ops.JpegInfo(height, width, components, *HEADERS[kind])


@pytest.mark.parametrize("kind", KINDS)
def test_full_scale_equals_pillow(kinds, kind):
    data = kinds[kind].read_bytes()
    ref = pillow_rgb(kinds[kind])
    h, w = ref.shape[:2]
    for top, left, wh, ww in windows(h, w, 10 if kind == "large" else 60, seed=len(data)):
        out = ops.decode_crop(data, top, left, wh, ww)
        assert out.dtype == torch.uint8
        assert_same(out, ref[top:top + wh, left:left + ww], f"{kind} window {(top, left, wh, ww)}")


@pytest.mark.parametrize("d", (2, 4, 8))
@pytest.mark.parametrize("kind", KINDS)
def test_downscaled_equals_libjpeg_scaled_decode(kinds, kind, d):
    data = kinds[kind].read_bytes()
    ref = turbo_rgb(kinds[kind], d)
    info = ops.read_header(data)
    for top, left, wh, ww in windows(info.height, info.width, 8 if kind == "large" else 30, seed=d):
        out = ops.decode_crop(data, top, left, wh, ww, d)
        assert tuple(out.shape[:2]) == ops.decoded_shape(top, left, wh, ww, d)
        r0, c0 = top // d, left // d
        assert_same(out, ref[r0:r0 + out.shape[0], c0:c0 + out.shape[1]], f"{kind} 1/{d} {(top, left, wh, ww)}")


def test_reference_is_djpegs_scaled_decode(kinds):
    """The TurboJPEG reference above decodes exactly like djpeg's defaults (ISLOW, fancy upsampling)."""
    djpeg = shutil.which("djpeg")
    if djpeg is None:
        pytest.skip("djpeg not installed (libjpeg-turbo-progs)")
    for d in (1, 2, 8):
        ppm = subprocess.run([djpeg, "-scale", f"1/{d}", "-ppm", str(kinds["420"])], capture_output=True,
                             check=True).stdout
        assert_same(np.asarray(Image.open(io.BytesIO(ppm))), turbo_rgb(kinds["420"], d), f"djpeg 1/{d}")
    assert_same(turbo_rgb(kinds["420"], 1), pillow_rgb(kinds["420"]), "TurboJPEG vs Pillow")


def test_input_types_decode_alike(kinds):
    data = kinds["422"].read_bytes()
    padded = bytearray(b"x" * 7 + data + b"y" * 5)  # a view into the middle of a bigger buffer, like an LMDB page
    want = ops.decode_crop(data, 10, 20, 100, 90, 2)
    for buf in (bytearray(data), memoryview(padded)[7:7 + len(data)], np.frombuffer(data, np.uint8),
                torch.frombuffer(bytearray(data), dtype=torch.uint8)):
        assert torch.equal(ops.decode_crop(buf, 10, 20, 100, 90, 2), want), type(buf)


# ---- windows and limits ----------------------------------------------------------------------------------

def test_window_outside_the_image_is_a_value_error(kinds):
    data = kinds["420"].read_bytes()
    h, w = 333, 517
    bad = [(h - 9, 0, 10, 8), (0, w - 3, 5, 4), (0, 0, h + 1, w), (-1, 0, 4, 4), (0, -2, 4, 4), (0, 0, 0, 4),
           (0, 0, 4, -1), (0, 0, 4, 4, 3), (0, 0, 4, 4, 16)]
    for window in bad:
        with pytest.raises(ValueError) as e:
            ops.decode_crop(data, *window)
        assert type(e.value) is ValueError, f"{window}: {e.value!r} should be a plain ValueError"
    batch = torch.tensor([list(win) + [1] * (5 - len(win)) for win in bad] + [[0, 0, h, w, 1]])
    status = ops.decode_crops([data] * len(batch), batch)[3]
    assert status.tolist() == [ops.BAD_WINDOW] * len(bad) + [ops.OK]


def test_max_pixels_refuses_before_decoding(kinds):
    # A 3.6 GPixel claim in a few hundred bytes (libjpeg itself refuses sides over 65500).
    tiny = bj.patch_sof(kinds["8x8"].read_bytes(), 60000, 60000)
    for call in (lambda: ops.read_header(tiny), lambda: ops.decode_crop(tiny, 0, 0, 8, 8),
                 lambda: ops.decode_crop(tiny, 0, 0, 60000, 60000)):
        t0 = time.perf_counter()
        with pytest.raises(DecodeError, match="limit") as e:
            call()
        assert e.value.reason == "too large"
        assert time.perf_counter() - t0 < 0.1  # refused from the header, nothing decoded or allocated
    assert ops.decode_crops([tiny], torch.tensor([[0, 0, 8, 8, 1]]))[3].tolist() == [ops.TOO_LARGE]

    data = kinds["420"].read_bytes()  # the limit is inclusive and configurable
    assert ops.decode_crop(data, 0, 0, 8, 8, max_pixels=333 * 517).shape == (8, 8, 3)
    with pytest.raises(DecodeError, match="limit"):
        ops.decode_crop(data, 0, 0, 8, 8, max_pixels=333 * 517 - 1)
    with pytest.raises(DecodeError, match="limit"):
        ops.read_header(data, max_pixels=333 * 517 - 1)


def test_strict_false_accepts_a_truncated_file(kinds):
    data = kinds["420"].read_bytes()
    start = bj.scan_start(data)
    cut = data[:start + (len(data) - start) * 6 // 10]
    with pytest.raises(DecodeError, match="(?i)premature|corrupt"):
        ops.decode_crop(cut, 0, 0, 333, 517)
    out = ops.decode_crop(cut, 0, 0, 333, 517, strict=False).numpy()
    ref = pillow_rgb(kinds["420"])
    assert out.shape == ref.shape
    assert_same(out[:32], ref[:32], "rows decoded before the data ran out")
    assert not np.array_equal(out, ref)  # the rest is libjpeg's filler, not the photo


def _png(path):
    buf = io.BytesIO()
    with Image.open(path) as im:
        im.save(buf, "PNG")
    return buf.getvalue()


# ---- batches ----------------------------------------------------------------------------------------------

def _mixed_batch(kinds):
    """~60 samples: every kind as bytes, memoryview or tensor, with random windows and downscales, plus broken
    buffers. Returns (buffers, windows [B, 5], expected status per sample or None where it must be OK)."""
    rng = np.random.default_rng(3)
    good = [kinds[k].read_bytes() for k in KINDS]
    buffers, rows, expect = [], [], []
    for i in range(48):
        data = good[i % len(good)]
        info = ops.read_header(data)
        top, left, wh, ww = windows(info.height, info.width, 1 + i % 2, seed=i)[-1]  # small or any size
        form = i % 3
        buffers.append(data if form == 0 else memoryview(bytearray(data)) if form == 1
                       else torch.frombuffer(bytearray(data), dtype=torch.uint8))
        rows.append([top, left, wh, ww, int(rng.choice(ops.DOWNSCALES))])
        expect.append(ops.OK)
    cut = good[2][:len(good[2]) // 2]
    png = _png(kinds["420"])
    broken = [(cut, [0, 0, 333, 517, 1], ops.CORRUPT), (png, [0, 0, 8, 8, 1], ops.NOT_JPEG),
              (b"", [0, 0, 8, 8, 1], ops.NOT_JPEG), (good[2], [300, 0, 40, 8, 1], ops.BAD_WINDOW),
              (bj.patch_sof(good[2], 60000, 60000), [0, 0, 8, 8, 2], ops.TOO_LARGE),
              (bj.patch_sof(good[2], 0, 517), [0, 0, 8, 8, 1], ops.CORRUPT)]
    for j, (data, row, status) in enumerate(broken):  # spread among the good ones
        at = 5 + 9 * j
        buffers.insert(at, data)
        rows.insert(at, row)
        expect.insert(at, status)
    return buffers, torch.tensor(rows), expect


def test_threaded_batch_equals_single_decodes(kinds):
    buffers, wins, expect = _mixed_batch(kinds)
    need = int(sum(np.prod(ops.decoded_shape(*w.tolist())) * 3 for w in wins if w[2] > 0 and w[3] > 0))
    slot = torch.full((need + 4096,), 0xA5, dtype=torch.uint8)  # a caller's (e.g. pinned) buffer, with a tail
    out, offsets, shapes, status, messages = ops.decode_crops(buffers, wins, slot, threads=8)
    assert out is slot
    assert status.tolist() == expect
    assert bool((slot[need:] == 0xA5).all()), "decode_crops wrote past the batch"
    for i, (data, w) in enumerate(zip(buffers, wins.tolist())):
        if expect[i] == ops.OK:
            single = ops.decode_crop(data, *w)
            assert torch.equal(ops.crop_view(out, offsets, shapes, i), single), f"sample {i} window {w}"
            assert messages[i] == ""
        else:
            with pytest.raises(ValueError) as e:
                ops.decode_crop(data, *w)
            assert isinstance(e.value, DecodeError) == (expect[i] != ops.BAD_WINDOW)
            assert messages[i], f"sample {i}: an error needs a message"
    again = ops.decode_crops(buffers, wins, threads=1)  # same bytes whatever the thread count
    assert torch.equal(again[3], status) and torch.equal(again[1], offsets)
    ok = [i for i in range(len(buffers)) if expect[i] == ops.OK]
    for i in ok:
        assert torch.equal(ops.crop_view(again[0], offsets, shapes, i), ops.crop_view(out, offsets, shapes, i))


def test_rows_written_in_place_touch_nothing_outside_their_window(kinds):
    """RGB rows are decoded straight into the output, with libjpeg's context columns spilling onto the previous
    row's tail (put back) and the next row's head: windows of 1-3 rows and narrow ones, with context on the left,
    the right or both, packed back to back in one batch between sentinel bytes, each equal to Pillow's pixels."""
    rows, buffers, refs = [], [], []
    for kind in ("420", "422", "444", "progressive", "restart", "gray"):
        data = kinds[kind].read_bytes()
        ref = pillow_rgb(kinds[kind])
        h, w = ref.shape[:2]
        for top, left, wh, ww in [(0, 17, 1, 5), (3, 33, 2, 40), (h - 3, w - 41, 3, 7), (5, 1, 3, w - 2),
                                  (h // 2, w // 2 - 5, 1, 1), (7, 48, 4, 16), (h - 1, 31, 1, w - 63)]:
            rows.append([top, left, wh, ww, 1])
            buffers.append(data)
            refs.append(ref[top:top + wh, left:left + ww])
    need = sum(r.size for r in refs)
    slot = torch.full((need + 4096,), 0x5A, dtype=torch.uint8)
    for threads in (1, 4):
        slot[:] = 0x5A
        out, offsets, shapes, status, messages = ops.decode_crops(buffers, torch.tensor(rows), slot, threads=threads)
        assert status.tolist() == [ops.OK] * len(rows), messages
        assert bool((slot[need:] == 0x5A).all()), "decode_crops wrote past the batch"
        for i, ref in enumerate(refs):
            assert_same(ops.crop_view(out, offsets, shapes, i), ref, f"window {rows[i]} ({threads} threads)")


def test_read_headers_batch(kinds):
    buffers, _, _ = _mixed_batch(kinds)
    sizes, status, messages = ops.read_headers(buffers, threads=4)
    for i, data in enumerate(buffers):
        try:
            info = ops.read_header(data)
        except DecodeError:
            assert status[i] != ops.OK and messages[i]
        else:
            assert status[i] == ops.OK and sizes[i].tolist() == [info.height, info.width]


# ---- broken and hostile input, decoded in a child process -------------------------------------------------

def _broken_cases(kinds):
    """name -> (bytes, [(window, allowed outcomes)], decode kwargs, substring every DecodeError must contain)."""
    ok = kinds["420"].read_bytes()  # 333 x 517, baseline 4:2:0
    prog = kinds["progressive"].read_bytes()
    full, corner = (0, 0, 333, 517), (0, 0, 8, 8)
    start = bj.scan_start(ok)
    rng = np.random.default_rng(0)
    cases = {
        "empty": (b"", [(corner, ERR)], {}, "not a JPEG"),
        "png": (_png(kinds["420"]), [(corner, ERR)], {}, "not a JPEG"),
        "text": (b"this is not a JPEG file\n" * 20, [(corner, ERR)], {}, "not a JPEG"),
        "garbage": (rng.integers(0, 256, 4096, dtype=np.uint8).tobytes(), [(corner, ERR)], {}, ""),
        "garbage_after_soi": (b"\xff\xd8\xff" + rng.integers(0, 256, 4096, dtype=np.uint8).tobytes(),
                              [(corner, ERR)], {}, ""),
        "soi_only": (ok[:2], [(corner, ERR)], {}, ""),
        "truncated_in_header": (ok[:start // 2], [(corner, ERR)], {}, ""),
        "header_only": (ok[:start], [(full, ERR), (corner, ERR)], {}, ""),
        "header_then_eoi": (ok[:start] + b"\xff\xd9", [(full, ERR)], {}, ""),
        "no_eoi": (ok[:-2], [(full, ANY)], {}, ""),
        "sof_65535": (bj.patch_sof(ok, 65535, 65535), [(corner, ERR)], {}, ""),  # over libjpeg's 65500
        "sof_60000": (bj.patch_sof(ok, 60000, 60000), [(corner, ERR), ((0, 0, 60000, 60000), ERR)], {}, "limit"),
        # with the limit lifted, libjpeg must still notice the data cannot fill such an image
        "sof_60000_no_limit": (bj.patch_sof(ok, 60000, 60000), [(corner, ERR)], {"max_pixels": 1 << 62}, ""),
        "zero_height": (bj.patch_sof(ok, 0, 517), [(corner, ERR)], {}, ""),
        "zero_width": (bj.patch_sof(ok, 333, 0), [(corner, ERR)], {}, ""),
        "many_scans": (bj.many_scans(ok), [(full, ERR), (corner, ERR)], {}, "scans"),
        "many_scans_not_strict": (bj.many_scans(ok), [(full, ERR)], {"strict": False}, "scans"),
        "progressive_truncated": (prog[:len(prog) // 2], [(full, ERR), (corner, ANY)], {}, ""),
        "progressive_truncated_not_strict": (prog[:len(prog) // 2], [(full, ANY)], {"strict": False}, ""),
    }
    for pct in (10, 50, 90):
        cases[f"truncated_{pct}"] = (ok[:start + (len(ok) - start) * pct // 100], [(full, ERR), (corner, ANY)],
                                     {}, "")
    for kind in ("420", "progressive", "arithmetic", "restart"):
        data = kinds[kind].read_bytes()
        h, w = ops.read_header(data)[:2]
        for count in (1, 4, 32):
            for seed in range(3):
                cases[f"flipped_{kind}_{count}_{seed}"] = (bj.flip_bytes(data, count, seed),
                                                           [((0, 0, h, w), ANY), ((h // 3, w // 3, 64, 64), ANY)],
                                                           {}, "")
    return cases


BROKEN = ["empty", "png", "text", "garbage", "garbage_after_soi", "soi_only", "truncated_in_header",
          "header_only", "header_then_eoi", "no_eoi", "sof_65535", "sof_60000", "sof_60000_no_limit", "zero_height",
          "zero_width", "many_scans", "many_scans_not_strict", "progressive_truncated",
          "progressive_truncated_not_strict", "truncated_10", "truncated_50", "truncated_90"] + [
    f"flipped_{k}_{n}_{s}" for k in ("420", "progressive", "arithmetic", "restart") for n in (1, 4, 32)
    for s in range(3)]


@pytest.fixture(scope="module")
def broken(kinds, tmp_path_factory):
    cases = _broken_cases(kinds)
    assert sorted(cases) == sorted(BROKEN)
    results = bj.run_cases({n: (d, [w for w, _ in wins], kw) for n, (d, wins, kw, _) in cases.items()},
                           tmp_path_factory.mktemp("broken"))
    return cases, results


def test_many_scans_file_is_a_valid_jpeg(kinds):
    """The hostile 2,080-scan file is legal: Pillow decodes it to the original pixels. It is refused for its
    scan count alone (see test_broken_input[many_scans])."""
    crafted = bj.many_scans(kinds["420"].read_bytes())
    assert sum(m == 0xDA for m, _ in bj.segments(crafted)) == 2080
    assert_same(np.asarray(Image.open(io.BytesIO(crafted)).convert("RGB")), pillow_rgb(kinds["420"]), "Pillow")


@pytest.mark.parametrize("name", BROKEN)
def test_broken_input(broken, name):
    cases, (decodes, headers, _, returncode, stderr) = broken
    data, wins, _, must_say = cases[name]
    header = headers.get(name)
    assert header is not None, f"the child died before reading {name}'s header (rc {returncode}): {stderr}"
    assert header["outcome"] in ANY, header
    for i, (window, allowed) in enumerate(wins):
        r = decodes.get((name, i))
        assert r is not None, f"the child died decoding {name} window {window} (rc {returncode}): {stderr}"
        assert r["outcome"] in allowed, f"{name} {window}: {r['outcome']}: {r['message']}"
        if r["outcome"] == "ok":
            assert tuple(r["shape"]) == (*ops.decoded_shape(*window), 3)
        else:
            assert r["message"] and must_say in r["message"], r["message"]
        assert r["seconds"] < 5, f"{name} {window} took {r['seconds']:.1f} s"


def test_broken_batch(broken):
    """The same inputs through decode_crops on 4 threads: one status per sample, agreeing with decode_crop."""
    cases, (decodes, _, batch, returncode, stderr) = broken
    assert batch is not None, f"the child died in decode_crops (rc {returncode}): {stderr}"
    assert returncode == 0, stderr
    for name, status, message in zip(batch["cases"], batch["status"], batch["messages"]):
        single = decodes[name, 0]["outcome"]
        assert (status == ops.OK) == (single == "ok"), f"{name}: batch status {status}, single {single}"
        assert status in (ops.OK, ops.NOT_JPEG, ops.CORRUPT, ops.TOO_LARGE), f"{name}: status {status}"
        assert (status == ops.OK) != bool(message), f"{name}: status {status} with message {message!r}"


# ---- resources --------------------------------------------------------------------------------------------

try:
    _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
except (OSError, AttributeError):  # not glibc: resident memory is read as it is
    _malloc_trim = None


def _rss():
    """Resident bytes, after glibc hands free heap pages back (malloc_trim): what earlier tests left free in the
    decode threads' arenas then does not read as growth (it did, 2.5 MB, after tests/test_seekable.py), while
    memory still in use, as a leak's is, stays counted."""
    if _malloc_trim is not None:
        _malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_failing_decodes_do_not_grow_memory():
    """10,000 decodes that fail (mid-scan, and in the header) leave resident memory where it was."""
    buf = io.BytesIO()
    Image.fromarray(source_photos()[2]).resize((128, 96)).save(buf, "JPEG", quality=90)  # small, so 10,000 decodes take ~1 s
    good = buf.getvalue()
    start = bj.scan_start(good)
    cut = good[:start + (len(good) - start) * 6 // 10]  # fails in the middle of the scan
    zero = bj.patch_sof(good, 0, 128)  # fails in the header
    batch = torch.tensor([[0, 0, 96, 128, 1]] * 250)

    def fail(n):
        for _ in range(n // 2):
            with pytest.raises(DecodeError):
                ops.decode_crop(cut, 0, 0, 96, 128)
        for _ in range(n // 2 // 250):
            status = ops.decode_crops([cut, zero] * 125, batch, threads=2)[3]
            assert bool((status == ops.CORRUPT).all())

    fail(1000)  # warm-up: allocator pools, thread stacks, pytest.raises internals
    before = _rss()
    fail(10_000)
    grown = _rss() - before
    # Measured noise after the warm-up is 0-100 KiB. A leaked libjpeg decompressor (its pools hold the Huffman
    # and quantisation tables, several KiB at least) would cost >= 40 MiB here, a leaked message string >= 1 MiB.
    assert grown < 1 << 20, f"resident memory grew by {grown / 1024:.0f} KiB over 10,000 failing decodes"


def test_strict_rejects_corruption_found_at_end_of_scan(kinds, tmp_path):
    """A flipped scan byte that libjpeg only notices at the end of the scan ("extraneous bytes before
    marker"): a window reaching the last row must fail in strict mode, as `djpeg -strict` does."""
    bad = bj.flip_bytes(kinds["420"].read_bytes(), 1, 0)
    info = ops.read_header(bad)
    with pytest.raises(DecodeError, match="Corrupt JPEG data"):
        ops.decode_crop(bad, 0, 0, info.height, info.width)
    (tmp_path / "bad.jpg").write_bytes(bad)
    djpeg = subprocess.run(["djpeg", "-strict", "-ppm", str(tmp_path / "bad.jpg")], capture_output=True)
    assert djpeg.returncode != 0 and b"Corrupt JPEG data" in djpeg.stderr
    assert ops.decode_crop(bad, 0, 0, info.height, info.width, strict=False).shape == (info.height, info.width, 3)


def test_decode_crops_reads_files_natively(kinds, tmp_path):
    """str items are paths that the native threads read: same pixels as bytes, clear errors otherwise."""
    path = kinds["420"]
    info = ops.read_header(path.read_bytes())
    windows = torch.tensor([[3, 5, 40, 60, 1]] * 3)
    big = tmp_path / "big.jpg"
    big.write_bytes(path.read_bytes() + bytes(1000))  # one byte over the limit set below is enough
    out, offsets, shapes, status, messages = ops.decode_crops(
        [str(path), str(tmp_path / "missing.jpg"), str(big)], windows, threads=2, max_bytes=os.path.getsize(path))
    ref = ops.decode_crop(path.read_bytes(), 3, 5, 40, 60)
    assert int(status[0]) == ops.OK and torch.equal(ops.crop_view(out, offsets, shapes, 0), ref)
    assert int(status[1]) == ops.UNREADABLE and "No such file" in messages[1]
    assert int(status[2]) == ops.UNREADABLE and "limit" in messages[2]
    assert info.height > 0


def test_decode_crops_checks_expected_crcs(kinds):
    """crcs: each buffer's CRC-32 is compared before decoding; -1 skips the check."""
    import zlib
    data = kinds["420"].read_bytes()
    good = zlib.crc32(data)
    windows = torch.tensor([[0, 0, 16, 16, 1]] * 3)
    _, _, _, status, messages = ops.decode_crops([data] * 3, windows, crcs=[good, good ^ 1, -1])
    assert status.tolist() == [ops.OK, ops.CORRUPT, ops.OK]
    assert "checksum mismatch" in messages[1] and f"{good ^ 1:08x}" in messages[1]


# Legal sampling layouts outside the named subsamplings (cjpeg -sample): libjpeg-turbo 2.1's column crop at DCT
# scale 1/2 and 1/4 returns other pixels for them (different ones from call to call), so such files decode whole
# rows at those scales (jpeg_decoder.cpp, crop_is_exact). Found by fuzzing.
@pytest.mark.parametrize("sample, extra", [("1x4,2x1,1x1", ()), ("2x2,1x4,1x1", ()), ("4x1,1x1,1x2", ("-restart", "1")),
                                           ("1x2,2x1,1x1", ())])
def test_unusual_sampling_layouts_decode_windows_exactly(sample, extra):
    from bench.corpus import _cjpeg, _crop, _photos
    photo = _crop(np.random.default_rng(3), _photos()[1], 203, 317)
    data = _cjpeg(photo, "-sample", sample, *extra)
    info = ops.read_header(data)
    header = ops.C.read_header(data, ops.MAX_PIXELS)
    assert info.subsampling == "other" and not header["chroma_1x1"]
    from fastload.decoders import _hardware_decodable  # nor do they go to the JPEG engines (4:2:0 by luma alone)
    assert not _hardware_decodable(header) and _hardware_decodable(ops.C.read_header(_cjpeg(photo), ops.MAX_PIXELS))
    h, w = info.height, info.width
    with Image.open(io.BytesIO(data)) as im:
        assert np.array_equal(ops.decode_crop(data, 0, 0, h, w).numpy(), np.asarray(im.convert("RGB")))
    windows = [(0, 40, h, 30), (33, 58, 39, 32), (10, 20, 40, 40), (101, 150, 97, 160)]
    for d in (1, 2, 4, 8):
        full = ops.decode_crop(data, 0, 0, h, w, downscale=d).numpy()
        batch = [[t, left, wh, ww, d] for t, left, wh, ww in windows]
        out, offsets, shapes, status, _ = ops.decode_crops([data] * len(batch), batch, threads=2)
        assert not status.any()
        for k, (t, left, wh, ww) in enumerate(windows):
            crop = ops.decode_crop(data, t, left, wh, ww, downscale=d).numpy()
            assert np.array_equal(crop, full[t // d:t // d + crop.shape[0], left // d:left // d + crop.shape[1]]), (d, k)
            n = crop.size
            assert np.array_equal(out[int(offsets[k]):int(offsets[k]) + n].view(crop.shape).numpy(), crop), (d, k)


def test_cmyk_without_an_intact_adobe_marker_decodes_as_pillow_does():
    """Pillow reads every CMYK JPEG as Adobe's inverted CMYK: one whose APP14 marker is missing or damaged decodes
    as the intact file, and so does fastload (it inverted only with the marker: every value wrong)."""
    from bench.corpus import _crop, _photos, _to_cmyk
    buf = io.BytesIO()
    _to_cmyk(_crop(np.random.default_rng(5), _photos()[2], 64, 96)).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    at = data.index(b"\xff\xee")  # APP14 "Adobe"
    length = int.from_bytes(data[at + 2:at + 4], "big")
    assert data[at + 4:at + 9] == b"Adobe"
    variants = {"no APP14": data[:at] + data[at + 2 + length:],
                "damaged id": data[:at + 4] + b"Adobf" + data[at + 9:]}
    intact = ops.decode_crop(data, 0, 0, 64, 96).numpy()
    for name, bad in variants.items():
        with Image.open(io.BytesIO(bad)) as im:
            pillow = np.asarray(im.convert("RGB"))
        assert np.array_equal(pillow, intact), name  # Pillow's reading, the reference
        assert np.array_equal(ops.decode_crop(bad, 0, 0, 64, 96).numpy(), pillow), name
