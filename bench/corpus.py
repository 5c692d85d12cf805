"""Deterministic JPEG corpora built from the real photographs that scikit-image, scikit-learn and matplotlib ship.

Random noise is not a JPEG workload: every image here is a crop, rescale or mosaic of real photos, so entropy
decoding costs what it costs on real data. Same seed, same bytes (for a given Pillow / libjpeg-turbo build).
A folder that already holds exactly the requested corpus (checked against its manifest.json) is left alone.

    python -m bench.corpus imagenet data/imagenet [--classes 8 --per-class 32 --seed 0]
    python -m bench.corpus imagenet-dense data/imagenet-dense [--classes 8 --per-class 32 --seed 0]
    python -m bench.corpus hd data/hd [--count 32 --seed 0]
    python -m bench.corpus kinds data/kinds
"""
import argparse
import fcntl
import hashlib
import io
import json
import math
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

__all__ = ["source_photos", "make_imagenet_like", "make_imagenet_dense", "make_hd", "make_kinds", "seekable_store",
           "density", "describe", "KINDS"]

VERSION = 1  # bump whenever the generator would write different bytes: cached folders then rebuild
MANIFEST = "manifest.json"
_LOCK = ".corpus.lock"
_GENERATOR = "fastload bench.corpus"

#: make_kinds' keys: one JPEG per decoder path worth testing.
KINDS = ("444", "422", "420", "440", "411", "progressive", "arithmetic", "arithmetic_progressive", "restart",
         "gray", "cmyk", "rgb", "1x1", "8x8", "large")


def _photo_paths():
    import matplotlib
    import skimage
    import sklearn
    sk = Path(skimage.__file__).parent / "data"
    sl = Path(sklearn.__file__).parent / "datasets" / "images"
    mpl = Path(matplotlib.__file__).parent / "mpl-data" / "sample_data"
    names = ("astronaut.png", "coffee.png", "chelsea.png", "motorcycle_left.png", "hubble_deep_field.jpg",
             "retina.jpg", "rocket.jpg")
    return [sk / n for n in names] + [sl / "china.jpg", sl / "flower.jpg", mpl / "grace_hopper.jpg"]


@lru_cache(maxsize=1)
def _photos():
    photos = []
    for path in _photo_paths():
        with Image.open(path) as im:
            photos.append(im.convert("RGB"))
    return tuple(photos)


def source_photos():
    """The source photographs, RGB uint8 [H, W, 3] arrays (fresh copies, in a fixed order)."""
    return [np.array(im) for im in _photos()]


# ---- picture synthesis: crops, rescales and mosaics of the photos -------------------------------------------

def _crop(rng, photo, h, w):
    """A random region of ``photo`` with aspect w:h, resampled to w x h, randomly mirrored."""
    ph, pw = photo.height, photo.width
    ch, cw = (ph, ph * w / h) if pw * h >= ph * w else (pw * h / w, pw)  # largest region of that aspect
    # Zoom in at most until the region is as small as the output: upscaling blurs, and blur decodes cheaper.
    low = min(1.0, max(0.45, h / ch))
    s = rng.uniform(low, 1.0)
    ch, cw = max(ch * s, 1.0), max(cw * s, 1.0)
    top, left = rng.uniform(0, ph - ch), rng.uniform(0, pw - cw)
    img = photo.resize((w, h), Image.Resampling.LANCZOS, box=(left, top, left + cw, top + ch))
    return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else img


def _cuts(rng, n, parts):
    """Splits n pixels into ``parts`` spans of roughly equal size."""
    weights = rng.uniform(0.6, 1.4, parts)
    return [0] + [int(v) for v in np.round(np.cumsum(weights) / weights.sum() * n)]


def _picture(rng, h, w, mosaic, grids, favourite=None):
    """One h x w picture: a single-photo crop, or (with probability ``mosaic``) a grid of crops."""
    photos = _photos()

    def pick():
        if favourite is not None and rng.random() < 0.7:  # classes get a look of their own, so they are learnable
            return photos[favourite % len(photos)]
        return photos[rng.integers(len(photos))]

    if rng.random() >= mosaic:
        return _crop(rng, pick(), h, w)
    rows, cols = grids[rng.integers(len(grids))]
    ys, xs = _cuts(rng, h, rows), _cuts(rng, w, cols)
    canvas = Image.new("RGB", (w, h))
    for r in range(rows):
        for c in range(cols):
            canvas.paste(_crop(rng, pick(), ys[r + 1] - ys[r], xs[c + 1] - xs[c]), (xs[c], ys[r]))
    return canvas


def _aspect(rng):
    """w / h between 3:4 and 16:9, mostly the shapes cameras produce (ImageNet is mostly 4:3 and 3:4)."""
    if rng.random() < 0.6:
        return (4 / 3, 4 / 3, 3 / 4, 3 / 2, 1.0, 16 / 9)[rng.integers(6)]
    return float(np.exp(rng.uniform(np.log(3 / 4), np.log(16 / 9))))


# ---- camera noise: what makes real photos dense ---------------------------------------------------------------

def _srgb_to_linear(v):
    return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4


# Both curves come from Python's scalar maths and the noise from + * sqrt on float64 arrays (correctly rounded on
# every CPU): no vectorised pow/exp, whose SIMD variants differ in the last bit between CPUs and would move roundings.
_LINEAR = np.array([_srgb_to_linear(k / 255) for k in range(256)])  # uint8 code -> linear light
_CUTS = np.array([_srgb_to_linear((k + 0.5) / 255) for k in range(255)])  # linear light -> nearest code


def _sensor_noise(rng, img, full_well, read_noise, chroma):
    """``img`` as a camera would have recorded it: shot noise (variance = signal, in electrons, ``full_well`` at
    white) plus read noise (``read_noise`` electrons), added in linear light, so shadows get the large relative
    noise real photos have once gamma-encoded. Mostly luminance noise: every channel shares one normal draw, and
    ``chroma`` (0-1) mixes in independent per-channel draws (camera pipelines suppress chroma noise)."""
    signal = _LINEAR[np.asarray(img)] * full_well
    h, w, _ = signal.shape
    z = rng.standard_normal((h, w, 1)) * np.sqrt(1 - chroma * chroma) + rng.standard_normal((h, w, 3)) * chroma
    noisy = signal + np.sqrt(signal + read_noise * read_noise) * z
    codes = np.searchsorted(_CUTS, noisy / full_well).astype(np.uint8)  # clips to 0..255 too
    return Image.fromarray(codes, "RGB")


def _encode(img, quality, **options):
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=int(quality), **options)
    return buf.getvalue()


def _tool(name):
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"`{name}` not found: install libjpeg-turbo-progs (apt) to build the JPEG kinds corpus")
    return path


def _cjpeg(img, *args):
    ppm = io.BytesIO()
    img.save(ppm, "PPM")
    return subprocess.run([_tool("cjpeg"), "-quality", "90", *args], input=ppm.getvalue(), capture_output=True,
                          check=True).stdout


def _jpegtran(data, *args):
    return subprocess.run([_tool("jpegtran"), *args], input=data, capture_output=True, check=True).stdout


def _to_cmyk(img):
    """RGB -> CMYK with a real black channel (Pillow's own conversion leaves K at 0)."""
    rgb = np.asarray(img, dtype=np.float64)
    k = 255 - rgb.max(axis=2)
    room = np.maximum(255 - k, 1)[..., None]
    cmy = (255 - rgb - k[..., None]) * 255 / room
    cmyk = np.round(np.dstack([cmy, k])).clip(0, 255).astype(np.uint8)
    return Image.frombytes("CMYK", img.size, cmyk.tobytes())


# ---- folders: manifest, lock, atomic writes ------------------------------------------------------------------

@contextmanager
def _locked(root):
    with open(root / _LOCK, "w") as f:  # concurrent builders (two pytest runs) take turns
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read_manifest(root):
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("generator") == _GENERATOR else None


def _write_manifest(root, manifest):
    tmp = root / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, root / MANIFEST)


def _jpegs(root):
    return {p.relative_to(root).as_posix() for p in root.rglob("*.jpg")}


def _holds(root, manifest, header):
    if manifest is None or not manifest.get("complete") or any(manifest.get(k) != v for k, v in header.items()):
        return False
    files = manifest.get("files", {})
    if _jpegs(root) != set(files):
        return False
    return all(hashlib.sha256((root / rel).read_bytes()).hexdigest() == digest for rel, digest in files.items())


def _build(root, kind, params, items):
    """Writes the (relative path, bytes) pairs that ``items()`` yields under root, unless root already holds them."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    header = {"generator": _GENERATOR, "version": VERSION, "kind": kind, "params": params}

    def foreign():  # someone else's files: never write (or delete) there
        return _read_manifest(root) is None and any(p.name not in (_LOCK, MANIFEST) for p in root.iterdir())

    if foreign():
        raise FileExistsError(f"{root} is not empty and is not a corpus folder; refusing to write into it")
    with _locked(root):
        manifest = _read_manifest(root)
        if _holds(root, manifest, header):
            return root
        if foreign():
            raise FileExistsError(f"{root} is not empty and is not a corpus folder; refusing to write into it")
        _write_manifest(root, {**header, "complete": False, "files": {}})  # an interrupted build is not a corpus
        files = {}
        for rel, data in items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            files[rel] = hashlib.sha256(data).hexdigest()
        for stale in _jpegs(root) - set(files):
            (root / stale).unlink()
        _write_manifest(root, {**header, "complete": True, "files": files})
    return root


# ---- the corpora ---------------------------------------------------------------------------------------------

def make_imagenet_like(root, classes=8, per_class=32, seed=0):
    """ImageFolder corpus ``root/class_XX/img_XXXX.jpg``: short side 300-500, aspect 3:4 to 16:9, quality 75-95,
    baseline 4:2:0. Each image has its own RNG stream, so a corpus is a pure function of its parameters."""
    def items():
        for c in range(classes):
            for i in range(per_class):
                rng = np.random.default_rng([seed, c, i])
                short, aspect = int(rng.integers(300, 501)), _aspect(rng)
                h, w = (short, round(short * aspect)) if aspect >= 1 else (round(short / aspect), short)
                img = _picture(rng, h, w, mosaic=0.25, grids=((1, 2), (2, 1), (2, 2)), favourite=c)
                yield f"class_{c:02d}/img_{i:04d}.jpg", _encode(img, rng.integers(75, 96), subsampling=2)

    return _build(root, "imagenet", {"classes": classes, "per_class": per_class, "seed": seed}, items)


#: make_imagenet_dense's camera: full well (electrons at white) drawn log-uniformly per image, as ISO varies from
#: photo to photo (mid-grey noise ~10 to ~3 levels of 255 before sharpening), read noise in electrons, chroma share
#: (_sensor_noise), then the in-camera sharpening (Pillow UnsharpMask radius, percent, threshold) that also
#: sharpens the noise. Tuned so the corpus carries ImageNet's ~0.6 bytes per pixel (0.32 with neither noise nor
#: sharpening, 0.39 sharpened only; with both, full well 300-3000 gave 0.56, 200-2000 0.59 on 96 images).
DENSE_FULL_WELL = (200.0, 2000.0)
DENSE_READ_NOISE = 3.0
DENSE_CHROMA = 0.35
DENSE_SHARPEN = (1.0, 80, 0)


def _imagenet_shape(rng):
    """(h, w) as ImageNet's photos come: most have a 500-pixel long side (Flickr's size), the rest a short side
    of 300-500; the short side always within 300-500."""
    aspect = _aspect(rng)
    if rng.random() < 0.75:
        short = min(max(round(500 / max(aspect, 1 / aspect)), 300), 500)
        long = 500
    else:
        short = int(rng.integers(300, 501))
        long = round(short * max(aspect, 1 / aspect))
    return (short, long) if aspect >= 1 else (long, short)


def make_imagenet_dense(root, classes=8, per_class=32, seed=0):
    """ImageFolder corpus ``root/class_XX/img_XXXX.jpg`` as dense as ImageNet's JPEGs (~0.6 bytes per pixel, ~115 KB
    for ~0.2 MP; make_imagenet_like's carry ~0.23): the same kind of pictures, through a camera (sensor noise at a
    level drawn per image, then sharpening: DENSE_*), encoded at quality 90-96, baseline 4:2:0, in ImageNet's
    geometry (_imagenet_shape). Its own RNG streams: not the imagenet-like pictures plus noise."""
    def one(key):
        c, i = key
        rng = np.random.default_rng([seed, c, i, 600])
        h, w = _imagenet_shape(rng)
        img = _picture(rng, h, w, mosaic=0.25, grids=((1, 2), (2, 1), (2, 2)), favourite=c)
        full_well = math.exp(rng.uniform(math.log(DENSE_FULL_WELL[0]), math.log(DENSE_FULL_WELL[1])))
        img = _sensor_noise(rng, img, full_well, DENSE_READ_NOISE, DENSE_CHROMA)
        img = img.filter(ImageFilter.UnsharpMask(*DENSE_SHARPEN))
        return f"class_{c:02d}/img_{i:04d}.jpg", _encode(img, rng.integers(90, 97), subsampling=2)

    def items():  # ~50 ms of numpy and Pillow per image, mostly without the GIL: one thread per core
        _photos()
        with ThreadPoolExecutor(os.cpu_count()) as pool:
            yield from pool.map(one, [(c, i) for c in range(classes) for i in range(per_class)])

    params = {"classes": classes, "per_class": per_class, "seed": seed, "full_well": list(DENSE_FULL_WELL),
              "read_noise": DENSE_READ_NOISE, "chroma": DENSE_CHROMA, "sharpen": list(DENSE_SHARPEN)}
    return _build(root, "imagenet-dense", params, items)


def make_hd(root, count=32, seed=0, classes=4):
    """ImageFolder corpus of 1920x1080 photos (every sixth one 1080x1920 portrait), quality 75-95, baseline 4:2:0.
    Mostly mosaics: the source photos are smaller than 1080p, and mosaic cells keep them near native sharpness."""
    def items():
        for i in range(count):
            rng = np.random.default_rng([seed, 1080, i])
            h, w = (1920, 1080) if i % 6 == 5 else (1080, 1920)
            img = _picture(rng, h, w, mosaic=0.7, grids=((2, 2), (2, 3), (3, 2), (3, 3)), favourite=i % classes)
            yield f"class_{i % classes:02d}/img_{i:04d}.jpg", _encode(img, rng.integers(75, 96), subsampling=2)

    return _build(root, "hd", {"count": count, "seed": seed, "classes": classes}, items)


def _kind_bytes():
    photos = _photos()

    def pic(i, h, w):  # odd sizes: no dimension a multiple of the 8/16-pixel MCU
        return _crop(np.random.default_rng([7, i]), photos[i % len(photos)], h, w)

    base = _encode(pic(6, 355, 479), 85)
    yield "444", _encode(pic(0, 333, 517), 90, subsampling=0)
    yield "422", _encode(pic(1, 517, 333), 90, subsampling=1)
    yield "420", _encode(pic(2, 333, 517), 90, subsampling=2)
    yield "440", _cjpeg(pic(3, 517, 333), "-sample", "1x2")
    yield "411", _cjpeg(pic(4, 301, 467), "-sample", "4x1")
    yield "progressive", _encode(pic(5, 333, 517), 85, subsampling=2, progressive=True)
    yield "arithmetic", _jpegtran(base, "-arithmetic")
    yield "arithmetic_progressive", _jpegtran(base, "-arithmetic", "-progressive")
    yield "restart", _cjpeg(pic(7, 333, 517), "-restart", "1")
    yield "gray", _encode(pic(8, 517, 333).convert("L"), 90)
    yield "cmyk", _encode(_to_cmyk(pic(9, 333, 517)), 90)  # Pillow writes Adobe-inverted CMYK
    yield "rgb", _cjpeg(pic(0, 301, 467), "-rgb")  # no colour transform, Adobe marker
    yield "1x1", _encode(pic(1, 1, 1), 90)
    yield "8x8", _encode(pic(2, 8, 8), 90)
    yield "large", _encode(_picture(np.random.default_rng([7, 99]), 3000, 4000, mosaic=1.0,
                                    grids=((2, 3), (3, 4))), 90, subsampling=2)


def make_kinds(root):
    """One JPEG per decoder path (see ``KINDS``), from real photos at odd sizes. Returns {kind: path}."""
    root = _build(root, "kinds", {}, lambda: ((f"{k}.jpg", data) for k, data in _kind_bytes()))
    return {k: root / f"{k}.jpg" for k in KINDS}


def linked_copies(src, dst, times):
    """DST: the ImageFolder SRC with each file linked ``times`` times (R_name), so epochs are long enough that
    their start and end weigh little, without more distinct images. Existing links are kept."""
    for c in sorted(os.listdir(src)):
        if not os.path.isdir(os.path.join(src, c)):
            continue
        os.makedirs(os.path.join(dst, c), exist_ok=True)
        for f in sorted(os.listdir(os.path.join(src, c))):
            for r in range(times):
                link = os.path.join(dst, c, f"{r}_{f}")
                if not os.path.exists(link):
                    os.symlink(os.path.abspath(os.path.join(src, c, f)), link)
    return dst


def density(root):
    """(JPEG count, total bytes, total pixels) of the corpus folder ``root``; the pixels from the headers."""
    files = sorted(Path(root).rglob("*.jpg"))
    pixels = 0
    for f in files:
        with Image.open(f) as im:
            pixels += im.width * im.height
    return len(files), sum(f.stat().st_size for f in files), pixels


def describe(root):
    """One line: count, size, mean file size and bytes per pixel of the corpus folder ``root``."""
    n, size, pixels = density(root)
    return (f"{root}: {n} JPEGs, {size / 1e6:.1f} MB, mean {size / max(n, 1) / 1e3:.1f} KB at "
            f"{pixels / max(n, 1) / 1e6:.3f} MP, {size / max(pixels, 1):.3f} bytes/pixel")


def seekable_store(root):
    """The store `fastload pack --seekable` makes of the folder ``root``, beside it (ROOT.seekable.lmdb), packed
    the first time it is asked for (an interrupted pack resumes)."""
    from fastload.datasets.pack import pack
    store = os.fspath(root).rstrip(os.sep) + ".seekable.lmdb"
    if not os.path.exists(store):
        pack(root, store, seekable=True, progress=False, resume=True)
    return store


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.corpus", description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=("imagenet", "imagenet-dense", "hd", "kinds"))
    p.add_argument("dir", type=Path)
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--per-class", type=int, default=32)
    p.add_argument("--count", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    if a.kind == "imagenet":
        make_imagenet_like(a.dir, a.classes, a.per_class, a.seed)
    elif a.kind == "imagenet-dense":
        make_imagenet_dense(a.dir, a.classes, a.per_class, a.seed)
    elif a.kind == "hd":
        make_hd(a.dir, a.count, a.seed)
    else:
        make_kinds(a.dir)
    print(describe(a.dir) + f" ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
