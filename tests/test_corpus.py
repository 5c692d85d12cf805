"""bench/corpus.py: the corpora have the promised shapes, are deterministic, and are rebuilt only when needed."""
import json

import pytest

from bench import corpus
from fastload import ops


def _jpegs(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.jpg"))


def test_imagenet_like_layout_and_shapes(imagenet_dir):
    names = _jpegs(imagenet_dir)
    assert names == [f"class_{c:02d}/img_{i:04d}.jpg" for c in range(4) for i in range(12)]
    orientations = set()
    for name in names:
        info = ops.read_header((imagenet_dir / name).read_bytes())
        short, long = sorted((info.height, info.width))
        assert 300 <= short <= 500 and long / short <= 16 / 9 + 0.01, (name, info)
        if info.height > info.width:
            assert info.width / info.height >= 3 / 4 - 0.01, (name, info)
        orientations.add(info.height > info.width)
        assert (info.subsampling, info.progressive, info.arithmetic) == ("4:2:0", False, False)
    assert orientations == {True, False}


def test_hd_shapes(hd_dir):
    sizes = [ops.read_header(p.read_bytes())[:2] for p in sorted(hd_dir.rglob("*.jpg"))]
    assert len(sizes) == 6 and set(sizes) == {(1080, 1920), (1920, 1080)}


def test_same_parameters_same_bytes(imagenet_dir, tmp_path):
    """Every image has its own RNG stream: a smaller corpus reproduces the first images of a bigger one."""
    small = corpus.make_imagenet_like(tmp_path / "small", classes=1, per_class=3)
    for name in _jpegs(small):
        assert (small / name).read_bytes() == (imagenet_dir / name).read_bytes(), name


def test_rebuilds_only_what_does_not_match(tmp_path):
    root = corpus.make_hd(tmp_path / "hd", count=1)
    manifest = json.loads((root / corpus.MANIFEST).read_text())
    image = root / "class_00" / "img_0000.jpg"
    stamp = image.stat().st_mtime_ns
    corpus.make_hd(root, count=1)
    assert image.stat().st_mtime_ns == stamp  # already there: nothing rewritten
    good = image.read_bytes()
    image.write_bytes(good[:100])  # damaged: the manifest's hash no longer matches
    (root / "class_00" / "stray.jpg").write_bytes(good)
    corpus.make_hd(root, count=1)
    assert image.read_bytes() == good and not (root / "class_00" / "stray.jpg").exists()
    assert json.loads((root / corpus.MANIFEST).read_text()) == manifest


def test_refuses_a_folder_that_is_not_a_corpus(tmp_path):
    (tmp_path / "holiday.jpg").write_bytes(b"not ours")
    with pytest.raises(FileExistsError):
        corpus.make_kinds(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["holiday.jpg"]


def test_kinds_are_real_photos_at_odd_sizes(kinds):
    assert set(kinds) == set(corpus.KINDS)
    for kind in ("444", "422", "420", "440", "411", "progressive", "arithmetic", "restart", "gray", "cmyk"):
        info = ops.read_header(kinds[kind].read_bytes())
        assert info.height % 2 and info.width % 2, (kind, info)  # no side a multiple of any MCU size
    assert ops.read_header(kinds["large"].read_bytes())[:2] == (3000, 4000)
    assert corpus.source_photos()[0].shape == (512, 512, 3)  # astronaut.png, the first photo
