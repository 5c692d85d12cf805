"""Restart markers: lossless re-encoding (`fastload pack --seekable`) and region decoding through them.

The re-encoder copies DCT coefficients, so the maths says decoded pixels must be identical: every comparison here
is exact. Region decoding must give exactly the pixels of the plain decode for every window and downscale, and
must really slice (the region JPEG is smaller than the file) or it would prove nothing.
"""
import io
import struct

import numpy as np
import pytest
import torch
from PIL import Image

import fastload as fl
from fastload import DecodeError, ops
from fastload.cli import main
from fastload.datasets import FolderDataset, LMDBDataset, pack
from fastload.datasets.record import FLAG_SEEKABLE
from fastload.native import C

# Kinds the re-encoder takes (YCbCr and gray, any sampling, progressive and arithmetic input).
REENCODED = ("444", "422", "420", "440", "411", "progressive", "arithmetic", "arithmetic_progressive", "restart",
             "gray", "1x1", "8x8")


def pillow(data):
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def random_windows(h, w, n, seed):
    rng = np.random.default_rng(seed)
    out = [(0, 0, h, w), (h - 1, w - 1, 1, 1), (0, 0, 1, 1)]
    for i in range(n):
        small = i % 3 == 0
        wh = int(rng.integers(1, (min(h, 40) if small else h) + 1))
        ww = int(rng.integers(1, (min(w, 40) if small else w) + 1))
        out.append((int(rng.integers(0, h - wh + 1)), int(rng.integers(0, w - ww + 1)), wh, ww))
    return out


@pytest.fixture(scope="module")
def photos(imagenet_dir, hd_dir):
    """Real photos: a few ImageNet-like ones and two 1080p frames, as bytes."""
    files = sorted(imagenet_dir.rglob("*.jpg"))[:6] + sorted(hd_dir.rglob("*.jpg"))[:2]
    return [f.read_bytes() for f in files]


@pytest.mark.parametrize("kind", REENCODED)
def test_reencoding_keeps_every_pixel(kinds, kind):
    data = kinds[kind].read_bytes()
    out = ops.add_restart_markers(data)
    assert out is not None
    np.testing.assert_array_equal(pillow(out), pillow(data))
    info = ops.read_header(out)
    assert not info.progressive and not info.arithmetic  # sequential Huffman: what the slicer needs
    assert info[:5] == ops.read_header(data)[:5]
    layout = ops.restart_layout(out)
    assert layout is not None and layout["interval"] >= 1
    if kind == "gray":  # one component: the MCU is one 8x8 block
        assert (layout["mcu_height"], layout["mcu_width"]) == (8, 8)


def test_reencoding_leaves_other_colour_spaces_and_refuses_broken_files(kinds):
    assert ops.add_restart_markers(kinds["cmyk"].read_bytes()) is None
    assert ops.add_restart_markers(kinds["rgb"].read_bytes()) is None
    data = kinds["420"].read_bytes()
    with pytest.raises(DecodeError, match="x.jpg"):
        ops.add_restart_markers(data[: len(data) // 2], sample="x.jpg")
    with pytest.raises(DecodeError):
        ops.add_restart_markers(b"not a jpeg at all")
    with pytest.raises(DecodeError, match="over the limit"):
        ops.add_restart_markers(data, max_pixels=1000)


def test_reencoding_keeps_app_and_comment_markers(kinds):
    im = Image.open(kinds["420"])
    exif = Image.Exif()
    exif[0x010E] = "a description that must survive"  # ImageDescription
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90, exif=exif.tobytes(), comment=b"kept comment")
    out = ops.add_restart_markers(buf.getvalue())
    with Image.open(io.BytesIO(out)) as back:
        assert back.getexif()[0x010E] == "a description that must survive"
        assert back.info.get("comment") == b"kept comment"
    assert out.count(b"JFIF") == 1  # the encoder's own APP0, not a second copy


def _progressive_cuts(photo):
    """A real photo as a progressive JPEG, then that file cut after each of its scans with EOI put back: valid
    files whose later scans are missing (a truncated download mended by a tool, an encoder that stopped early)."""
    buf = io.BytesIO()
    with Image.open(io.BytesIO(photo)) as im:
        im.resize((200, 152)).save(buf, "JPEG", quality=90, progressive=True)
    whole = buf.getvalue()
    scans = [k for k in range(len(whole) - 1) if whole[k:k + 2] == b"\xff\xda"]
    assert len(scans) >= 4
    return whole, [whole[:k] + b"\xff\xd9" for k in scans[1:]]


def test_reencoding_leaves_incomplete_progressive_files_alone(photos):
    """A progressive file whose scans leave coefficients incomplete decodes with libjpeg's block smoothing (the
    missing AC coefficients estimated); a sequential copy of its coefficients would decode without it, to other
    pixels, and pack would store them as the sample. Such files are left alone (None: pack keeps the original);
    the complete file is still re-encoded, pixel for pixel."""
    whole, cuts = _progressive_cuts(photos[0])
    out = ops.add_restart_markers(whole)
    assert out is not None and torch.equal(ops.decode_crop(out, 0, 0, 152, 200),
                                           ops.decode_crop(whole, 0, 0, 152, 200))
    passed = 0
    for cut in cuts:
        if int(ops.verify_jpegs([cut], strict=True)[0][0]) != ops.OK:
            continue  # pack refuses it anyway
        passed += 1
        assert ops.add_restart_markers(cut) is None
    assert passed >= 3  # the cuts are valid files: strict decoding accepts them


def test_pack_seekable_keeps_incomplete_progressive_files_as_they_are(photos, tmp_path):
    _, cuts = _progressive_cuts(photos[1])
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "0_partial.jpg").write_bytes(cuts[1])
    (tmp_path / "src" / "a" / "1_photo.jpg").write_bytes(photos[2])
    dst = tmp_path / "p.lmdb"
    pack(tmp_path / "src", dst, seekable=True, progress=False, log=lambda m: None)
    store, folder = LMDBDataset(dst), FolderDataset(tmp_path / "src")
    assert store.meta["seekable"] == 1
    with store.reader() as r:
        header, image = r.raw(0)
        assert not header[1] & FLAG_SEEKABLE and bytes(image) == cuts[1]  # stored as it came
        assert r.raw(1)[0][1] & FLAG_SEEKABLE
    for i in range(2):
        assert torch.equal(store[i][0], folder[i][0])


def test_interval_is_a_divisor_of_the_row_near_32_pixels():
    # Checked through files: 1080p 4:2:0 has 120 MCUs of 16 px per row -> 2 MCUs (32 px) per segment.
    rgb = np.zeros((64, 1920, 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=90)
    layout = ops.restart_layout(ops.add_restart_markers(buf.getvalue()))
    assert layout["mcus_per_row"] == 120 and layout["interval"] == 2
    # A prime number of MCUs per row: one MCU per segment is the only divisor near 32 px.
    buf = io.BytesIO()
    Image.fromarray(np.zeros((64, 16 * 37, 3), np.uint8)).save(buf, "JPEG", quality=90)
    layout = ops.restart_layout(ops.add_restart_markers(buf.getvalue()))
    assert layout["mcus_per_row"] == 37 and layout["interval"] == 1
    # Gray has 8 px MCUs: segments of 2..8 MCUs; none divides 37, so whole rows (vertical slicing only).
    buf = io.BytesIO()
    Image.fromarray(np.zeros((64, 8 * 37), np.uint8)).save(buf, "JPEG", quality=90)
    layout = ops.restart_layout(ops.add_restart_markers(buf.getvalue()))
    assert layout["mcus_per_row"] == 37 and layout["interval"] == 37


@pytest.mark.parametrize("downscale", [1, 2, 4, 8])
def test_region_decode_equals_plain_decode(photos, downscale):
    for n, data in enumerate(photos):
        seekable = ops.add_restart_markers(data)
        h, w = ops.read_header(data)[:2]
        for top, left, wh, ww in random_windows(h, w, 40, seed=n * 10 + downscale):
            a = ops.decode_crop(data, top, left, wh, ww, downscale)
            b = ops.decode_crop(seekable, top, left, wh, ww, downscale)
            assert torch.equal(a, b), (n, top, left, wh, ww, downscale)
        if downscale == 1:  # and both are Pillow's pixels
            top, left, wh, ww = h // 3, w // 4, h // 3, w // 2
            np.testing.assert_array_equal(ops.decode_crop(seekable, top, left, wh, ww).numpy(),
                                          pillow(data)[top:top + wh, left:left + ww])


@pytest.mark.parametrize("kind", ["420", "422", "440", "411", "444", "gray"])
def test_region_decode_is_exact_with_window_edges_at_every_offset_in_their_mcu(kinds, kind):
    """A region carries context only where the window comes within two pixels (of the 1/d image) of its MCUs'
    edges (fancy upsampling's reach): windows starting and ending at every offset in their MCU, at every scale,
    must still decode exactly as the plain file does."""
    data = kinds[kind].read_bytes()
    seekable = ops.add_restart_markers(data)
    layout = ops.restart_layout(seekable)
    mh, mw = layout["mcu_height"], layout["mcu_width"]
    h, w = ops.read_header(data)[:2]
    assert h >= 4 * mh and w >= 4 * mw
    sliced = 0
    for d in (1, 2, 4, 8):
        for k in range(mw + 2):  # starts and ends at each offset, crossing into the next MCU
            top, left = mh + k % mh, mw + k
            for end in (2 * mh + k, 3 * mh - k):
                wh, ww = min(end, h) - top, min(end + mw, w) - left
                if wh <= 0 or ww <= 0:
                    continue
                a = ops.decode_crop(data, top, left, wh, ww, d)
                b = ops.decode_crop(seekable, top, left, wh, ww, d)
                assert torch.equal(a, b), (kind, d, top, left, wh, ww)
                sliced += C.jpeg_region(seekable, top, left, wh, ww, d) is not None
    assert sliced > 0


@pytest.mark.parametrize("subsampling", [0, 1, 2])  # Pillow's 4:4:4, 4:2:2, 4:2:0
def test_region_decode_is_exact_for_windows_in_a_narrow_last_mcu(photos, subsampling):
    """libjpeg upsamples chroma with its fancy filter only when the image it is given has chroma more than 2
    samples wide: a region cut down to the last, partial MCU column (or one MCU at 1/4) would be replicated instead.
    Windows inside the last MCU column or row, of images whose last MCU is 1-4 px or whole, at every scale."""
    photo = Image.fromarray(pillow(photos[0]))
    for w, h in ((97, 66), (99, 131), (100, 35), (108, 64), (112, 50)):
        buf = io.BytesIO()  # the whole photo shrunk: chroma that changes from pixel to pixel, as the test needs
        photo.resize((w, h)).save(buf, "JPEG", quality=90, subsampling=subsampling)
        data = buf.getvalue()
        seekable = ops.add_restart_markers(data)
        assert ops.restart_layout(seekable) is not None
        mcu_w, mcu_h = 8 if subsampling == 0 else 16, 16 if subsampling == 2 else 8
        last_col, last_row = (w - 1) // mcu_w * mcu_w, (h - 1) // mcu_h * mcu_h
        for d in (1, 2, 4, 8):
            windows = [(8, left, 20, w - left) for left in range(last_col, w)]
            windows += [(top, 9, h - top, 30) for top in range(last_row, h)]
            for top, left, wh, ww in windows:
                a = ops.decode_crop(data, top, left, wh, ww, d)
                b = ops.decode_crop(seekable, top, left, wh, ww, d)
                assert torch.equal(a, b), (subsampling, w, h, top, left, wh, ww, d)


def test_region_really_slices_and_is_a_valid_jpeg(photos):
    data = ops.add_restart_markers(photos[-1])  # 1080p
    h, w = ops.read_header(data)[:2]
    # 4:2:0, 16 px MCUs, 2-MCU (32 px) segments. Rows 500-699 lie 4 px inside MCU rows 496-703: no context rows;
    # columns 900-1199 start 4 px inside their MCU (896) and end at an MCU's edge (1200): one MCU of context on
    # the right (to 1216), then whole segments (896-1215).
    top, left, wh, ww = 500, 900, 200, 300
    region, sub = C.jpeg_region(data, top, left, wh, ww, 1)
    assert len(region) < len(data) * 0.12  # a small part of the file
    assert ops.read_header(region)[:2] == (208, 320) and tuple(sub[:2]) == (4, 4)
    st, sl = sub[0], sub[1]
    np.testing.assert_array_equal(pillow(region)[st:st + wh, sl:sl + ww], pillow(data)[top:top + wh, left:left + ww])
    # A window on MCU edges gets one MCU of context on each side: rows 480-719. At 1/2 and 1/4 libjpeg scales
    # 4:2:0's chroma up in its IDCT instead of upsampling it: no context is needed, rows 496-703.
    region, sub = C.jpeg_region(data, 496, left, 208, ww, 1)
    assert ops.read_header(region)[0] == 240 and sub[0] == 16
    for d in (2, 4):
        region, sub = C.jpeg_region(data, 496, left, 208, ww, d)
        assert ops.read_header(region)[0] == 208 and sub[0] == 0
        assert torch.equal(ops.decode_crop(data, 496, left, 208, ww, d), ops.decode_crop(region, 0, sub[1], 208, ww, d))
    # The whole image gains nothing from slicing: the decoder takes the file as it is.
    assert C.jpeg_region(data, 0, 0, h, w, 1) is None
    assert C.jpeg_region(photos[-1], top, left, wh, ww, 1) is None  # no restart markers


def test_whole_row_intervals_from_other_encoders(kinds):
    """cjpeg -restart 1 puts a marker after every MCU row: windows are cut by rows only, still exact."""
    data = kinds["restart"].read_bytes()
    layout = ops.restart_layout(data)
    assert layout["interval"] == layout["mcus_per_row"]
    h, w = ops.read_header(data)[:2]
    region, _ = C.jpeg_region(data, h - 40, 10, 20, 30, 1)
    rh, rw = ops.read_header(region)[:2]
    assert rw == w and rh < h // 4  # full rows, only those around the window
    ref = pillow(data)
    for top, left, wh, ww in random_windows(h, w, 30, seed=3):
        np.testing.assert_array_equal(ops.decode_crop(data, top, left, wh, ww).numpy(),
                                      ref[top:top + wh, left:left + ww])


def _restart_offsets(data):
    """Offsets of the RSTn markers in the entropy-coded data."""
    sos = data.index(b"\xff\xda")
    start = sos + 2 + struct.unpack(">H", data[sos + 2:sos + 4])[0]
    return [i for i in range(start, len(data) - 1) if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]


def test_damage_above_the_window_is_still_an_error(photos):
    """A misnumbered marker makes the slicer step aside; the plain decode then meets it and strict mode refuses."""
    data = bytearray(ops.add_restart_markers(photos[0]))
    h, w = ops.read_header(bytes(data))[:2]
    marks = _restart_offsets(bytes(data))
    at = marks[3]
    data[at + 1] = 0xD0 + (data[at + 1] - 0xD0 + 4) % 8  # RST3 -> RST7
    with pytest.raises(DecodeError, match="(?i)corrupt|marker"):
        ops.decode_crop(bytes(data), h - 30, 0, 30, w // 2, sample="damaged")
    # Lenient mode decodes what it can instead, without crashing.
    out = ops.decode_crop(bytes(data), h - 30, 0, 30, w // 2, strict=False)
    assert out.shape == (30, w // 2, 3)


def _without_markers(data, drop):
    """data with the restart markers numbered ``drop`` (their index in the file) taken out: their segments merge."""
    marks = _restart_offsets(data)
    out, prev = bytearray(), 0
    for k in drop:
        out += data[prev:marks[k]]
        prev = marks[k] + 2
    return bytes(out + data[prev:])


@pytest.mark.parametrize("lost", [1, 8, 16])
def test_lost_restart_markers_give_an_error_never_shifted_pixels(photos, lost):
    """Eight markers lost in a row leave the rest numbered in sequence: a slicer going by the numbers alone would
    read every later segment as the MCUs eight segments earlier, clean data decoding to wrong pixels. Strict
    decoding must give each window exactly or refuse it; windows wholly above the loss still decode (exactly)."""
    good = ops.add_restart_markers(photos[0])
    h, w = ops.read_header(good)[:2]
    marks = _restart_offsets(good)
    mid = len(marks) // 3
    bad = _without_markers(good, range(mid, mid + lost))
    ref = ops.decode_crop(good, 0, 0, h, w)
    windows = [(top, left) for top in range(0, h - 24, 24) for left in range(0, w - 24, 40)]
    exact = refused = 0
    for top, left in windows:
        try:
            crop = ops.decode_crop(bad, top, left, 24, 24)
        except DecodeError:
            refused += 1
            continue
        assert torch.equal(crop, ref[top:top + 24, left:left + 24]), (top, left)
        exact += 1
    assert exact > 0 and refused > 0  # both kinds of window were tried
    # The batch decoder (the loader's path, 2 threads) says the same, sample by sample.
    out, offsets, shapes, status, _ = ops.decode_crops([bad] * len(windows), [[t, l, 24, 24, 1] for t, l in windows],
                                                       threads=2)
    assert int((status != ops.OK).sum()) == refused
    for i, (top, left) in enumerate(windows):
        if status[i] == ops.OK:
            got = out[offsets[i]:offsets[i] + 24 * 24 * 3].view(24, 24, 3)
            assert torch.equal(got, ref[top:top + 24, left:left + 24]), (top, left)


def test_truncated_seekable_file_is_an_error_not_a_crash(photos):
    data = ops.add_restart_markers(photos[-1])
    h, w = ops.read_header(data)[:2]
    for cut in (len(data) // 2, len(data) - 40):
        with pytest.raises(DecodeError):
            ops.decode_crop(data[:cut], h - 64, w - 64, 64, 64)
    # A window wholly above the cut needs nothing from the lost part: it decodes, and exactly.
    short = data[: len(data) * 3 // 4]
    np.testing.assert_array_equal(ops.decode_crop(short, 0, 0, 100, 100).numpy(), pillow(data)[:100, :100])


def test_batch_decode_of_seekable_files_matches(photos):
    seekable = [ops.add_restart_markers(d) for d in photos]
    wins = []
    for n, d in enumerate(photos):
        h, w = ops.read_header(d)[:2]
        wins.append([h // 4, w // 5, h // 2, w // 2, 1 + (n % 4 == 3)])
    wins = torch.tensor(wins)
    a = ops.decode_crops(photos, wins, threads=1)
    b = ops.decode_crops(seekable, wins, threads=4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ---- the store -----------------------------------------------------------------------------------------------

def test_pack_seekable_store_gives_the_same_batches(imagenet_dir, tmp_path, capsys):
    dst = tmp_path / "s.lmdb"
    assert main(["pack", str(imagenet_dir), str(dst), "--seekable", "-q"]) == 0
    assert "48 made seekable" in capsys.readouterr().out
    store, folder = LMDBDataset(dst), FolderDataset(imagenet_dir)
    assert store.meta["seekable"] == 48 and store.meta["options"]["seekable"] is True
    with store.reader() as r:
        for i in (0, 11, 47):
            header, image = r.raw(i)
            assert header[1] & FLAG_SEEKABLE
            assert ops.restart_layout(bytes(image)) is not None
    for i in (0, 23, 47):
        assert torch.equal(store[i][0], folder[i][0]) and store[i][1] == folder[i][1]
    make = lambda ds: fl.FastLoader(ds, batch_size=8, seed=3, crop=fl.RandomResizedCrop(64), threads=2)
    for (xa, ya), (xb, yb) in zip(make(folder), make(store)):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert main(["inspect", str(dst)]) == 0
    assert "48 seekable (restart markers)" in capsys.readouterr().out
    assert main(["verify", str(dst), "-q"]) == 0


def test_resume_must_keep_the_seekable_choice(imagenet_dir, tmp_path, capsys):
    from fastload.datasets import DatasetError
    dst = tmp_path / "r.lmdb"
    pack(imagenet_dir, dst, seekable=True, progress=False, log=lambda m: None)
    with pytest.raises(DatasetError, match="seekable: True then, False now"):
        pack(imagenet_dir, dst, resume=True, progress=False, log=lambda m: None)


def test_failing_reencodes_do_not_grow_memory(photos):
    """Re-encodes that fail (a truncated scan; junk after the scan) free what they allocated: resident memory
    stays where it was. Both fail in jpeg_read_coefficients, which reads to EOI before the encoder starts."""
    import resource
    from PIL import Image as PILImage
    buf = io.BytesIO()
    with PILImage.open(io.BytesIO(photos[0])) as im:
        im.resize((128, 96)).save(buf, "JPEG", quality=90)
    good = buf.getvalue()
    cut = good[:-300]  # "Premature end of JPEG file"
    junk = good[:-2] + bytes(range(40)) * 4 + good[-2:]  # "160 extraneous bytes before marker 0xd9"

    def fail(n):
        for _ in range(n // 2):
            with pytest.raises(DecodeError):
                ops.add_restart_markers(cut)
            with pytest.raises(DecodeError, match="extraneous"):
                ops.add_restart_markers(junk)

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()

    fail(500)  # warm-up: allocator pools, pytest.raises internals
    before = rss()
    fail(5_000)
    grown = rss() - before
    # A leaked decompressor or output buffer (several KiB each) would cost >= 20 MiB over 5,000 calls.
    assert grown < 1 << 20, f"resident memory grew by {grown / 1024:.0f} KiB over 5,000 failing re-encodes"
