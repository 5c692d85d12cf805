"""bench/corpus.py: the corpora have the promised shapes, are deterministic, and are rebuilt only when needed."""
import io
import json

import numpy as np
import pytest
from PIL import Image

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


# ---- the ImageNet-density corpus ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    """8 images of the ImageNet-density corpus (2 classes x 4)."""
    return corpus.make_imagenet_dense(tmp_path_factory.mktemp("dense") / "d", classes=2, per_class=4)


def _quality_tables():
    """{quality: the quantisation tables Pillow writes at that quality}, for 85-100."""
    tables = {}
    for q in range(85, 101):
        with Image.open(io.BytesIO(corpus._encode(Image.new("RGB", (16, 16)), q, subsampling=2))) as im:
            tables[q] = im.quantization
    return tables


def test_imagenet_dense_shapes_quality_and_subsampling(dense_dir):
    names = _jpegs(dense_dir)
    assert names == [f"class_{c:02d}/img_{i:04d}.jpg" for c in range(2) for i in range(4)]
    by_tables = {tuple(tuple(t) for t in tables.values()): q for q, tables in _quality_tables().items()}
    qualities = []
    for name in names:
        data = (dense_dir / name).read_bytes()
        info = ops.read_header(data)
        short, long = sorted((info.height, info.width))
        assert 300 <= short <= 500 and long <= 889, (name, info)
        assert (info.subsampling, info.progressive, info.arithmetic) == ("4:2:0", False, False)
        with Image.open(io.BytesIO(data)) as im:
            qualities.append(by_tables.get(tuple(tuple(t) for t in im.quantization.values())))
    assert all(q is not None and 90 <= q <= 96 for q in qualities), qualities
    assert len(set(qualities)) > 1, qualities  # drawn per image


def test_imagenet_dense_has_imagenet_density(dense_dir, imagenet_dir):
    """ImageNet's training JPEGs carry ~0.6 bytes per pixel (~110 KB); the imagenet-like corpus ~0.23. The noise
    level is drawn per image (0.31-0.94 B/px over 256 images), so a few images are held to a +-25% band."""
    n, size, pixels = corpus.density(dense_dir)
    assert n == 8 and 0.45 <= size / pixels <= 0.75, size / pixels
    assert 70e3 <= size / n <= 160e3, size / n
    n, size, pixels = corpus.density(imagenet_dir)
    assert size / pixels < 0.3, size / pixels  # what the dense corpus is for


def test_imagenet_dense_same_bytes_any_threads(dense_dir, tmp_path, monkeypatch):
    """Each image has its own RNG stream and the noise only IEEE-exact float maths: a smaller build on one thread
    reproduces the first images of the bigger, threaded one; another seed gives other bytes."""
    monkeypatch.setattr(corpus.os, "cpu_count", lambda: 1)
    small = corpus.make_imagenet_dense(tmp_path / "small", classes=1, per_class=3)
    for name in _jpegs(small):
        assert (small / name).read_bytes() == (dense_dir / name).read_bytes(), name
    other = corpus.make_imagenet_dense(tmp_path / "other", classes=1, per_class=1, seed=1)
    assert (other / "class_00/img_0000.jpg").read_bytes() != (dense_dir / "class_00/img_0000.jpg").read_bytes()
    manifest = json.loads((dense_dir / corpus.MANIFEST).read_text())
    assert manifest["kind"] == "imagenet-dense" and manifest["complete"] and len(manifest["files"]) == 8


def test_sensor_noise_is_shot_plus_read_noise_in_linear_light():
    """On flat grey patches the noise has the variance of the model, signal + read^2 electrons in linear light, and
    the channels share 1 - chroma^2 of it (mostly luminance noise)."""
    rng = np.random.default_rng(0)
    full_well, read, chroma = 400.0, 3.0, 0.35
    for code in (60, 128, 220):  # darker codes clip at 0 at this level
        flat = Image.new("RGB", (400, 400), (code,) * 3)
        lin = corpus._LINEAR[np.asarray(corpus._sensor_noise(rng, flat, full_well, read, chroma))]
        signal = corpus._LINEAR[code] * full_well
        sigma = np.sqrt(signal + read * read) / full_well
        noise = lin.reshape(-1, 3) - corpus._LINEAR[code]
        # 160,000 draws a channel: ~0.2% sampling error on sigma; rounding to 8-bit codes adds <0.3%: +-2%.
        assert abs(noise.mean()) < 0.05 * sigma, code
        assert noise.std(axis=0) == pytest.approx([sigma] * 3, rel=0.02), code
        r = np.corrcoef(noise.T)[np.triu_indices(3, 1)]
        assert r == pytest.approx([1 - chroma * chroma] * 3, abs=0.01), code
    with pytest.raises(AssertionError):  # the test can fail: without read noise the shadows are cleaner
        flat = Image.new("RGB", (400, 400), (60,) * 3)
        lin = corpus._LINEAR[np.asarray(corpus._sensor_noise(rng, flat, full_well, 0.0, chroma))]
        signal = corpus._LINEAR[60] * full_well
        assert lin.std() == pytest.approx(np.sqrt(signal + read * read) / full_well, rel=0.02)


def test_bench_loader_names_its_corpora(tmp_path, capsys):
    """`python -m bench.loader --sets` takes ImageNet-dense beside the others and refuses unknown names before
    building anything."""
    from bench import loader
    with pytest.raises(SystemExit) as e:
        loader.main(["--data", str(tmp_path), "--sets", "ImageNet-dense,ImageNet-huge"])
    assert e.value.code == 2 and "unknown ImageNet-huge" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_bench_loader_rounds_report_medians(tmp_path, capsys):
    """`--rounds N` reports each loader's median over N alternating runs and keeps every run; the speed-up column
    divides medians; fewer than one round is refused before anything is built."""
    from bench import loader
    from fastload import benchmark
    with pytest.raises(SystemExit) as e:
        loader.main(["--data", str(tmp_path), "--sets", "ImageNet-like", "--rounds", "0"])
    assert e.value.code == 2 and "--rounds must be at least 1" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    rows = [loader.median_row("fastload FastLoader", [900.0, 1500.0, 1000.0]),
            loader.median_row("torchvision DataLoader", [200.0, 250.0, 300.0])]
    assert [r["images_per_s"] for r in rows] == [1000.0, 250.0]
    assert rows[0]["rounds"] == [900.0, 1500.0, 1000.0] and "[900-1,500]" in rows[0]["pipeline"]
    table = benchmark.format_table(rows)
    assert "4.00x" in table and "1.00x" in table
    assert loader.median_row("one", [123.0])["pipeline"] == "one"  # a single run has no range
