"""The native ops refuse what they cannot read right (issue 19): strided buffers, shapes whose byte count wraps
int64, memory failures in worker threads; libjpeg's warnings are sorted into "pixels may be wrong" (refused under
strict) and harmless (let through, reported); verify_jpegs accepts exactly what a strict full decode accepts."""
import io
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fastload import DecodeError, ops
from fastload.native import C

sys.path.insert(0, str(Path(__file__).parent))
from broken_jpeg import flip_bytes, scan_start, segments  # noqa: E402


@pytest.fixture(scope="module")
def jpegs(imagenet_dir):
    return [p.read_bytes() for p in sorted(Path(imagenet_dir).rglob("*.jpg"))[:12]]


def pillow(data):
    return np.array(Image.open(io.BytesIO(data)).convert("RGB"))


def full_decode(data, strict=True):
    info = ops.read_header(data, strict=False)
    return ops.decode_crop(data, 0, 0, info.height, info.width, strict=strict)


def run_child(code, timeout=120):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


# ---- item 5: strided buffers -------------------------------------------------------------------------------

def test_strided_buffers_are_refused_by_every_op(jpegs):
    data = np.frombuffer(jpegs[0], dtype=np.uint8)
    strided = memoryview(np.repeat(data, 2))[::2]  # the same bytes, every other one: not C-contiguous
    assert bytes(strided) == jpegs[0]
    calls = {
        "crc32s": lambda: C.crc32s([jpegs[1], strided]),
        "read_header": lambda: ops.read_header(strided),
        "read_headers": lambda: ops.read_headers([jpegs[1], strided]),
        "decode_crop": lambda: ops.decode_crop(strided, 0, 0, 8, 8),
        "decode_crops": lambda: ops.decode_crops([jpegs[1], strided], [[0, 0, 8, 8, 1]] * 2),
        "verify_jpegs": lambda: ops.verify_jpegs([jpegs[1], strided]),
        "add_restart_markers": lambda: ops.add_restart_markers(strided),
        "restart_layout": lambda: ops.restart_layout(strided),
    }
    for op, call in calls.items():
        with pytest.raises(ValueError, match="not C-contiguous") as e:
            call()
        assert op in str(e.value)
        # the batch ops name the sample, the single ones their argument
        assert ("buffer 1" if op in ("crc32s", "read_headers", "decode_crops", "verify_jpegs") else "data") in str(
            e.value), str(e.value)


def test_contiguous_views_read_their_own_bytes(jpegs):
    # A contiguous view that starts inside a larger buffer: the ops read exactly its bytes.
    padded = np.frombuffer(b"\x00" * 7 + jpegs[0], dtype=np.uint8)[7:]
    import zlib
    assert C.crc32s([padded, jpegs[0]]).tolist() == [zlib.crc32(jpegs[0])] * 2
    info = ops.read_header(jpegs[0])
    assert torch.equal(ops.decode_crop(padded, 0, 0, info.height, info.width), torch.from_numpy(pillow(jpegs[0])))


def test_crc32_is_zlibs_for_every_length_and_alignment(jpegs):
    """The stores' CRC-32 check (carry-less multiplies where the CPU has them, zlib for the rest: native/crc32.cpp)
    gives zlib's value for every length around the fold's 16- and 64-byte steps, at every alignment, on real JPEGs
    and on bytes that stress the reduction (all zeros, all ones)."""
    import zlib
    rng = np.random.default_rng(0)
    data = b"".join(jpegs) + rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    whole = np.frombuffer(data, dtype=np.uint8)
    lengths = list(range(0, 700)) + [1023, 1024, 1025, 4096 + 17, 65_536, 65_536 + 63, 299_999]
    views = [whole[start:start + n] for n in lengths for start in (0, 1, 7, 15, 33)]
    views += [np.zeros(5000, np.uint8), np.full(5000, 255, np.uint8), np.frombuffer(jpegs[0], np.uint8)]
    assert C.crc32s(views, 2).tolist() == [zlib.crc32(v.tobytes()) for v in views]


@pytest.fixture
def jpeg_path(imagenet_dir):
    return str(sorted(Path(imagenet_dir).rglob("*.jpg"))[0])


def test_reversed_view_is_refused_in_a_child(jpeg_path):
    code = f"""
    import mmap, ctypes
    import numpy as np
    from fastload import ops
    data = open({jpeg_path!r}, "rb").read()
    page = mmap.PAGESIZE
    n = -(-len(data) // page) * page
    m = mmap.mmap(-1, n + page)
    arr = np.frombuffer(m, dtype=np.uint8)
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    arr[n - len(data):n] = np.frombuffer(data, dtype=np.uint8)[::-1]
    assert libc.mprotect(arr.ctypes.data + n, page, 0) == 0  # the page after the view's memory
    view = arr[n - len(data):n][::-1]  # the JPEG's bytes in order, through a negative stride
    assert view.tobytes() == data
    for call in (lambda: ops.decode_crops([view], [[0, 0, 8, 8, 1]]), lambda: ops.read_header(view)):
        try:
            call()
            print("accepted")
        except ValueError as e:
            print("refused:", e)
    """
    proc = run_child(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("refused:") and "not C-contiguous" in line for line in lines), lines


# ---- item 6: warp_normalize's shape check --------------------------------------------------------------------

WRAPPING_H = 2 ** 32 * 1431655765 + 1431655766  # h * 3 wraps int64 to 2: a 2-byte "image" of 2^63 rows


def _warp_args(data, shape, device="cpu"):
    alpha = torch.ones(1, device=device)
    beta = torch.zeros(1, device=device)
    return (data, torch.zeros(1, dtype=torch.int64, device=device),
            torch.tensor([shape], dtype=torch.int64, device=device),
            torch.tensor([[[1.0, 0, 0], [0, 1.0, 0]]], device=device), alpha, beta, 1, 4, 4, True, torch.float32,
            False, [0.0])


def test_warp_shape_whose_size_wraps_int64_is_refused_on_cpu():
    assert (WRAPPING_H * 3) % 2 ** 64 == 2  # the product the old check computed
    data = torch.zeros(16, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="sample 0 has shape"):
        torch.ops.fastload.warp_normalize(*_warp_args(data, [WRAPPING_H, 3, 1]))
    with pytest.raises(RuntimeError, match="sample 0 has shape"):  # a side past int range, product in range
        torch.ops.fastload.warp_normalize(*_warp_args(torch.zeros(2 ** 31 // 2 ** 20, dtype=torch.uint8),
                                                      [2 ** 31, 1, 1]))
    # the real thing still works: a 4x4 image of 16 bytes
    out = torch.ops.fastload.warp_normalize(*_warp_args(torch.arange(16, dtype=torch.uint8), [4, 4, 1]))
    assert torch.equal(out[0, 0], torch.arange(16, dtype=torch.float32).view(4, 4))


def test_warp_offset_past_the_end_is_refused_without_overflow():
    data = torch.zeros(16, dtype=torch.uint8)
    args = list(_warp_args(data, [4, 4, 1]))
    args[1] = torch.tensor([2 ** 63 - 8], dtype=torch.int64)  # off + size wraps negative
    with pytest.raises(RuntimeError, match="extends past the end of data"):
        torch.ops.fastload.warp_normalize(*args)


def test_warp_sample_of_2_31_values_is_refused_on_cpu():
    # Sides below 2^31 whose h*w*c is not: the kernels index within a sample with int, so a row of w*c past 2^31
    # wrote before the buffer (CHW) or produced nothing (HWC) when the data was really that large
    data = torch.zeros(16, dtype=torch.uint8)
    for shape in ([2, 2 ** 30, 1], [2 ** 16, 2 ** 15, 1]):
        shape_ok = [shape[0], shape[1] // 2, 1]  # under the bound: only the (too small) data is wrong then
        with pytest.raises(RuntimeError, match="sample 0 has shape"):
            torch.ops.fastload.warp_normalize(*_warp_args(data, shape))
        with pytest.raises(RuntimeError, match="extends past the end of data"):
            torch.ops.fastload.warp_normalize(*_warp_args(data, shape_ok))


@pytest.mark.parametrize("size", [(1, 2 ** 32 + 1), (2 ** 31, 1), (2 ** 16, 2 ** 15)], ids=str)
def test_warp_output_of_2_31_values_is_refused(size):
    # out_h / out_w were cut to int: (1, 2^32 + 1) wrote one column of a 4-billion-column tensor and left the
    # rest uninitialised
    img = torch.full((1, 1, 4, 4), 7, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="fewer than 2\\^31 values a sample"):
        ops.warp_affine(img, torch.eye(2, 3), size, fill=9, layout="NCHW")
    assert ops.warp_affine(img, torch.eye(2, 3), (4, 6), fill=9, layout="NCHW")[0, 0, 0].tolist() == [7, 7, 7, 7, 9, 9]


@pytest.mark.parametrize("scale", [1e8, 3e9, 1e30])
@pytest.mark.parametrize("shear", [0.0, 0.5], ids=["separable", "general"])
@pytest.mark.parametrize("baseline", [False, True], ids=["avx2", "baseline"])
def test_warp_huge_scales_filter_the_whole_image(scale, shear, baseline, monkeypatch):
    # A scale of 2^31 or more overflowed the taps' int cast and left no taps (beta instead of the image): output
    # pixel (0, 0) maps into the image and its filter covers all of it (a constant image's value); the others map
    # outside it (fill), at any scale, on every path.
    if baseline:
        monkeypatch.setenv("FASTLOAD_WARP_BASELINE", "1")
    data = torch.full((6 * 8 * 3,), 100, dtype=torch.uint8)
    m = torch.tensor([[[scale, shear, 0.0], [0.0, scale, 0.0]]])
    out = torch.ops.fastload.warp_normalize(
        data, torch.zeros(1, dtype=torch.int64), torch.tensor([[6, 8, 3]]), m, torch.ones(3), torch.zeros(3), 3, 5,
        4, True, torch.float32, False, [0.0])
    assert torch.allclose(out[0, :, 0, 0], torch.full((3,), 100.0), rtol=0, atol=1e-4)  # weights summing to 1
    out[0, :, 0, 0] = 0
    assert torch.equal(out, torch.zeros(1, 3, 5, 4))


@pytest.mark.parametrize("width", [2 ** 24 + 1, 2 ** 24 + 3])
def test_warp_avx2_and_scalar_agree_on_sides_past_2_24(width, monkeypatch):
    # float(size) rounds above 2^24: a clamp against it made the AVX2 and scalar (and CUDA) taps differ there
    h = 2
    data = torch.randint(0, 256, (h * width * 3,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))

    def run(m, baseline):
        monkeypatch.setenv("FASTLOAD_WARP_BASELINE", "1" if baseline else "0")
        return torch.ops.fastload.warp_normalize(
            data, torch.zeros(1, dtype=torch.int64), torch.tensor([[h, width, 3]]), torch.tensor([m]), torch.ones(3),
            torch.zeros(3), 3, 1, 16, True, torch.float32, False, [0.0])
    for shift in (width - 20.0, width - 17.0, width - 16.5, width - 16.0, width - 15.3):
        for scale in (1.0, 1.5, 2.0):
            m = [[scale, 0.25, shift - 16 * (scale - 1)], [0.0, 1.0, 0.0]]  # sheared: the general path
            assert torch.equal(run(m, False), run(m, True)), (shift, scale)


# ---- hostile arguments of the JPEG ops ------------------------------------------------------------------------

def test_crcs_that_are_no_crc32_are_refused(jpegs):
    # Only -1 means "unchecked": a CRC column kept as int32 (half of all CRCs negative) passed every damaged
    # buffer unchecked, and a value past 2^32 matched on its low 32 bits
    data = jpegs[0]
    crc = C.crc32s([data])[0]
    changed = bytearray(data)
    changed[len(data) // 2] ^= 0xFF
    as_int32 = np.array([crc | 0x80000000], np.uint32).astype(np.int32)  # the same bits, read as negative
    for bad in (as_int32, [crc + 2 ** 32], [-2]):
        for call in (lambda: ops.verify_jpegs([bytes(changed)], crcs=bad, strict=False),
                     lambda: ops.decode_crops([bytes(changed)], [[0, 0, 8, 8, 1]], crcs=bad)):
            with pytest.raises(RuntimeError, match="is no CRC-32"):
                call()
    with pytest.raises(RuntimeError, match="crcs must be an integer CPU tensor"):
        ops.verify_jpegs([data], crcs=torch.tensor([crc], dtype=torch.int64, device="meta"))
    status, messages = ops.verify_jpegs([bytes(changed), data], crcs=[crc, -1])
    assert status.tolist() == [ops.CORRUPT, ops.OK] and "checksum mismatch" in messages[0]


def test_a_downscale_past_int32_is_a_bad_window(jpegs):
    # It was cut to its low 32 bits: 2^32 + 1 decoded at downscale 1 as if valid
    for d in (2 ** 32 + 1, 2 ** 32 + 4, -(2 ** 32) + 2):
        _, _, _, status, messages = ops.decode_crops([jpegs[0]], [[0, 0, 8, 8, d]],
                                                     out=torch.empty(1000, dtype=torch.uint8))
        assert status.tolist() == [ops.BAD_WINDOW], d
        assert "downscale must be 1, 2, 4 or 8" in messages[0]


def test_paths_with_a_nul_byte_are_refused_and_an_empty_path_is_no_buffer(jpeg_path):
    # open() stops at the NUL: "a.jpg\0.ignored" read a.jpg (Python's open refuses such a name)
    with pytest.raises(ValueError, match="embedded NUL"):
        ops.read_header(str(jpeg_path) + "\0.ignored")
    with pytest.raises(ValueError, match="embedded NUL"):
        ops.decode_crops([str(jpeg_path) + "\0x"], [[0, 0, 8, 8, 1]])
    _, _, _, status, messages = ops.decode_crops([""], [[0, 0, 8, 8, 1]])
    assert status.tolist() == [ops.UNREADABLE] and "no such file" in messages[0].lower(), messages


def test_a_tensor_buffer_dropped_by_its_list_during_the_call_stays_alive():
    # The native call held only the tensor's data pointer: a list cleared by another thread while the GIL was
    # released freed the memory under it (a segfault every time with a 1 GB tensor)
    proc = run_child("""
        import threading, time, torch, zlib
        from fastload.native import C
        items = [torch.ones(1 << 28, dtype=torch.uint8)]
        expected = zlib.crc32(items[0].numpy())
        threading.Thread(target=lambda: (time.sleep(0.02), items.clear())).start()
        print(int(C.crc32s(items)[0]) == expected)
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "True", (proc.returncode, proc.stderr[-2000:])


@pytest.mark.cuda
def test_warp_shape_whose_size_wraps_int64_yields_fill_on_cuda():
    # The CUDA op does not sync to check shapes on the host: its kernels treat a malformed sample as empty and
    # write the fill value (normalised), never reading stray memory.
    data = torch.arange(16, dtype=torch.uint8, device="cuda")
    args = list(_warp_args(data, [WRAPPING_H, 3, 1], device="cuda"))
    args[-1] = [7.0]
    out = torch.ops.fastload.warp_normalize(*args)
    assert torch.equal(out.cpu(), torch.full((1, 1, 4, 4), 7.0))
    ok = torch.ops.fastload.warp_normalize(*_warp_args(data, [4, 4, 1], device="cuda"))
    assert torch.equal(ok[0, 0].cpu(), torch.arange(16, dtype=torch.float32).view(4, 4))


# ---- item 9: std::bad_alloc in a worker thread ---------------------------------------------------------------

def test_out_of_memory_in_a_worker_thread_is_that_samples_error(jpeg_path, tmp_path):
    # A 1 GiB sparse file under a raised max_bytes: read_file's buffer resize throws std::bad_alloc once the
    # address space is capped (RLIMIT_AS) a little above what the child already uses. Uncaught in a native
    # thread that was std::terminate; now it is the sample's INTERNAL status, and the good sample decodes.
    big = tmp_path / "big.jpg"
    with open(big, "wb") as f:
        f.truncate(1 << 30)
    code = f"""
    import resource
    import torch
    from fastload import ops
    ops.decode_crops([{jpeg_path!r}], [[0, 0, 8, 8, 1]], threads=2)  # warm up: threads, pools, libjpeg
    used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (used + (512 << 20), resource.RLIM_INFINITY))
    paths = [{str(big)!r}, {jpeg_path!r}]
    for threads in (1, 2):
        _, _, _, status, messages = ops.decode_crops(paths, [[0, 0, 8, 8, 1]] * 2, threads=threads,
                                                     max_bytes=1 << 31)
        print("decode", status.tolist(), messages[0])
        status, messages = ops.verify_jpegs(paths, threads, max_bytes=1 << 31)
        print("verify", status.tolist(), messages[0])
    """
    proc = run_child(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 4, proc.stdout
    for line in lines:
        assert f"[{ops.INTERNAL}, {ops.OK}]" in line and "out of memory" in line, line


# ---- item 11: affine_from_points broadcasting ----------------------------------------------------------------

def test_affine_from_points_broadcasts_a_shared_template():
    template = torch.tensor([[30.3, 51.7], [65.5, 51.5], [48.0, 71.7], [33.5, 92.4], [62.7, 92.2]])
    angles = torch.tensor([0.0, 0.3, -0.5])
    rot = torch.stack([torch.stack([angles.cos(), -angles.sin()], -1), torch.stack([angles.sin(), angles.cos()], -1)],
                      1)  # [3, 2, 2]
    landmarks = template @ rot.transpose(1, 2) * 1.5 + torch.tensor([[[10.0, -4.0]], [[0.0, 3.0]], [[7.0, 7.0]]])
    batched = ops.affine_from_points(template, landmarks)
    assert batched.shape == (3, 2, 3)
    for i in range(3):
        assert torch.equal(batched[i], ops.affine_from_points(template, landmarks[i]))
        # an exact similarity: the fit recovers it (float32 rounding of the result)
        torch.testing.assert_close(batched[i, :, :2], rot[i] * 1.5, atol=1e-5, rtol=0)
    assert torch.equal(ops.affine_from_points(landmarks, template),
                       torch.stack([ops.affine_from_points(landmarks[i], template) for i in range(3)]))


def test_affine_from_points_errors_name_the_callers_shapes():
    with pytest.raises(ValueError, match=r"src \(5, 2\) and dst \(3, 4, 2\)"):
        ops.affine_from_points(torch.zeros(5, 2), torch.zeros(3, 4, 2))
    with pytest.raises(ValueError, match=r"src \(2, 5, 2\) and dst \(3, 5, 2\)"):
        ops.affine_from_points(torch.zeros(2, 5, 2), torch.zeros(3, 5, 2))
    with pytest.raises(ValueError, match=r"N >= 3.*src \(2, 2\)"):
        ops.affine_from_points(torch.zeros(2, 2), torch.zeros(2, 2))


# ---- item 16: which warnings are refused ---------------------------------------------------------------------

def _insert_before(data, marker, junk, after=0):
    """`junk` inserted before the first `marker` segment found at or after offset `after`."""
    i = data.index(bytes([0xFF, marker]), after)
    return data[:i] + junk + data[i:]


def _with_header_segment(data, segment):
    """`segment` inserted right after the SOI marker."""
    return data[:2] + segment + data[2:]


def _app14_adobe(transform):
    body = b"Adobe" + (100).to_bytes(2, "big") + b"\x00\x00\x00\x00" + bytes([transform])
    return b"\xff\xee" + (len(body) + 2).to_bytes(2, "big") + body


def _without_jfif(data):
    return b"".join(seg for marker, seg in segments(data) if marker != 0xE0)


def _jfif_revision(data, major):
    i = data.index(b"JFIF\x00")
    return data[:i + 5] + bytes([major]) + data[i + 6:]


def benign_cases(jpeg):
    return {
        "junk before a header marker": _insert_before(jpeg, 0xDB, b"\x12\x34\x56"),
        "FF00 between header markers": _insert_before(jpeg, 0xC4, b"\xff\x00"),
        "junk before SOS": _insert_before(jpeg, 0xDA, b"\x00\x01"),
        "unknown JFIF revision": _jfif_revision(jpeg, 3),
        # libjpeg reads the Adobe transform only without a JFIF marker; code 7 is unknown: it assumes YCbCr
        "unknown Adobe transform": _with_header_segment(_without_jfif(jpeg), _app14_adobe(7)),
    }


def harmful_cases(jpeg, restart):
    start = scan_start(jpeg)
    body = jpeg[start:-2]
    return {
        "truncated scan, EOI re-appended": jpeg[:start + len(body) // 2] + b"\xff\xd9",
        "junk before an RST marker": _insert_before(restart, 0xD0, b"\x12\x34\x56", scan_start(restart)),
        "junk before EOI": jpeg[:-2] + b"\x12\x34\x56\x78" * 8 + jpeg[-2:],
        "no EOI": jpeg[:start + len(body) // 3],
    }


def _patch_sof(jpeg, marker=None, precision=None):
    i = next(k for k in range(2, len(jpeg) - 1) if jpeg[k] == 0xFF and jpeg[k + 1] in (0xC0, 0xC1, 0xC2))
    out = bytearray(jpeg)
    if marker is not None:
        out[i + 1] = marker
    if precision is not None:
        out[i + 4] = precision
    return bytes(out)


def test_harmless_warnings_pass_strict_with_pillows_pixels_and_a_report(jpegs):
    for jpeg in jpegs[:4]:
        for name, data in benign_cases(jpeg).items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = full_decode(data, strict=True)
            assert np.array_equal(out.numpy(), pillow(data)), name
            assert np.array_equal(out.numpy(), pillow(jpeg)), name
            assert [w.category for w in caught] == [ops.JpegWarning] * 2, (name, caught)  # header, decode
            # the batch ops: status OK, the warning in the message, for the loader to count
            info = ops.read_header(jpeg)
            _, _, _, status, messages = ops.decode_crops([data, jpeg], [[0, 0, info.height, info.width, 1]] * 2)
            assert status.tolist() == [ops.OK, ops.OK] and messages[1] == "", name
            assert messages[0].startswith(ops.WARNING_PREFIX), (name, messages[0])
            sizes, status, messages = ops.read_headers([data])
            assert status.tolist() == [ops.OK] and messages[0].startswith(ops.WARNING_PREFIX), name
            assert sizes.tolist() == [[info.height, info.width]]


def test_harmful_warnings_are_refused_under_strict_and_reported_without(jpegs):
    for jpeg in jpegs[:4]:
        restart = ops.add_restart_markers(jpeg)
        for name, data in harmful_cases(jpeg, restart).items():
            with pytest.raises(DecodeError, match="Corrupt JPEG data|Premature end") as e:
                full_decode(data, strict=True)
            assert e.value.reason == "corrupt", name
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                full_decode(data, strict=False)
            # strict=False stops at the last row and does not read on to EOI: junk found there goes unseen
            reported = any(w.category is ops.JpegWarning for w in caught)
            assert reported == ("before marker 0xd9" not in str(e.value)), (name, str(e.value))


def test_header_strict_switch(jpegs):
    # read_header's strict has decode_crop's meaning: a harmless header warning passes either way (reported),
    # and the switch reaches the native op.
    data = benign_cases(jpegs[0])["junk before a header marker"]
    for strict in (True, False):
        with pytest.warns(ops.JpegWarning, match="extraneous bytes before marker 0xdb"):
            info = ops.read_header(data, strict=strict)
        assert (info.height, info.width) == ops.read_header(jpegs[0])[:2]
    assert C.read_header(jpegs[0], 0, False, 0)["message"] == ""


@pytest.mark.parametrize("patch, expected", [
    (dict(marker=0xC3), "unsupported: lossless JPEG (SOF3)"),
    (dict(marker=0xC5), "unsupported: hierarchical JPEG (SOF5)"),
    (dict(marker=0xC7), "unsupported: hierarchical lossless JPEG (SOF7)"),
    (dict(precision=12), "unsupported: 12-bit JPEG"),
])
def test_valid_but_unsupported_jpegs_are_unsupported_not_corrupt(jpegs, patch, expected):
    data = _patch_sof(jpegs[0], **patch)
    for call in (lambda: ops.read_header(data), lambda: ops.decode_crop(data, 0, 0, 8, 8)):
        with pytest.raises(DecodeError) as e:
            call()
        assert e.value.reason == "unsupported" and expected in str(e.value)
    status, messages = ops.verify_jpegs([data])
    assert status.tolist() == [ops.UNSUPPORTED] and messages == [expected]


def test_bad_precision_that_no_jpeg_has_is_still_corrupt(jpegs):
    with pytest.raises(DecodeError) as e:
        ops.read_header(_patch_sof(jpegs[0], precision=7))
    assert e.value.reason == "corrupt"


# ---- item 1 (native half): verify_jpegs ----------------------------------------------------------------------

def _zoo(jpegs):
    zoo = {f"good {i}": j for i, j in enumerate(jpegs)}
    for i, jpeg in enumerate(jpegs[:6]):
        restart = ops.add_restart_markers(jpeg)
        zoo[f"restart {i}"] = restart
        for name, data in {**benign_cases(jpeg), **harmful_cases(jpeg, restart)}.items():
            zoo[f"{name} {i}"] = data
        for seed in range(6):  # some flips warn, some decode silently to other pixels: both must agree
            zoo[f"flip16 seed {seed} {i}"] = flip_bytes(jpeg, 16, seed)
            zoo[f"flip1 seed {seed} {i}"] = flip_bytes(jpeg, 1, seed)
            zoo[f"flip1 restart seed {seed} {i}"] = flip_bytes(restart, 1, seed)
        zoo[f"lossless {i}"] = _patch_sof(jpeg, marker=0xC3)
        zoo[f"header only {i}"] = jpeg[:scan_start(jpeg)]
        zoo[f"claims more rows {i}"] = _claim_rows(jpeg)
    zoo["not a JPEG"] = b"GIF89a" + jpegs[0][6:]
    zoo["empty"] = b""
    return zoo


def _claim_rows(jpeg):
    from broken_jpeg import patch_sof
    info = ops.read_header(jpeg)
    return patch_sof(jpeg, info.height + 64, info.width)


def _full_status(data, strict):
    h = C.read_header(data, 0, strict, 0)
    if h["status"] != ops.OK:
        return ops._REASONS[h["status"]]
    status, message, _ = C.decode_crop(data, 0, 0, h["height"], h["width"], 1, strict, 0)
    return ops._REASONS.get(status, "ok")


def test_verify_jpegs_accepts_exactly_what_a_full_decode_accepts(jpegs):
    zoo = _zoo(jpegs)
    for strict in (True, False):
        status, messages = ops.verify_jpegs(list(zoo.values()), threads=2, strict=strict)
        got = {name: ops._REASONS.get(s, "ok") for name, s in zip(zoo, status.tolist())}
        want = {name: _full_status(data, strict) for name, data in zoo.items()}
        assert got == want
        assert all(got[f"good {i}"] == "ok" for i in range(len(jpegs)))
        if strict:  # the zoo is not trivially accepted: the harmful cases are refused
            assert sum(v == "corrupt" for v in got.values()) >= 6 * len(harmful_cases(jpegs[0], ops.add_restart_markers(jpegs[0])))
    # the messages are the decoder's
    status, messages = ops.verify_jpegs([zoo["truncated scan, EOI re-appended 0"]])
    with pytest.raises(DecodeError) as e:
        full_decode(zoo["truncated scan, EOI re-appended 0"])
    assert messages[0] and messages[0] in str(e.value)


def test_verify_jpegs_reads_paths_like_decode_crops(jpegs, tmp_path):
    good, bad = tmp_path / "good.jpg", tmp_path / "bad.jpg"
    good.write_bytes(jpegs[0])
    bad.write_bytes(harmful_cases(jpegs[0], ops.add_restart_markers(jpegs[0]))["truncated scan, EOI re-appended"])
    fifo = tmp_path / "fifo.jpg"
    os.mkfifo(fifo)
    status, messages = ops.verify_jpegs([str(good), str(bad), str(fifo), str(tmp_path / "missing.jpg"),
                                         torch.frombuffer(bytearray(jpegs[1]), dtype=torch.uint8)], threads=2)
    assert status.tolist() == [ops.OK, ops.CORRUPT, ops.UNREADABLE, ops.UNREADABLE, ops.OK], messages
    assert "not a regular file" in messages[2]
    status, messages = ops.verify_jpegs([str(good), jpegs[0]], max_bytes=len(jpegs[0]) - 1)
    assert status.tolist() == [ops.UNREADABLE] * 2 and all("over the per-image limit" in m for m in messages)
    import zlib
    status, messages = ops.verify_jpegs([jpegs[0], jpegs[1]], crcs=[zlib.crc32(jpegs[0]), zlib.crc32(jpegs[0])])
    assert status.tolist() == [ops.OK, ops.CORRUPT] and "checksum mismatch" in messages[1]
