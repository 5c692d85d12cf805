"""bench/decode.py: runs end to end on a tiny corpus, and (a) and (c) really decode the same windows."""
import io

import pytest
import torch
from PIL import Image

from bench import decode as bench_decode


def test_prints_the_table(imagenet_dir, hd_dir):
    out = io.StringIO()
    rows = bench_decode.run(imagenet_dir, hd_dir, imagenet_count=4, hd_count=2, passes=1, warmup=False, out=out)
    assert [(r["corpus"], r["method"]) for r in rows] == [(c, m) for c in ("imagenet-like", "1080p") for m in "abcdefg"]
    assert all(r["img_per_s"] > 0 and r["images"] == (4 if r["corpus"] == "imagenet-like" else 2) for r in rows)
    assert [r["speedup"] for r in rows if r["method"] == "a"] == [1.0, 1.0]
    text = out.getvalue()
    assert "img/s/core" in text and "vs (a)" in text
    for r in rows:
        assert f"{r['corpus']:<14} ({r['method']}) {r['label']}" in text


@pytest.mark.parametrize("size, d", [((224, 224), 1), ((447, 1000), 1), ((448, 448), 2), ((900, 1800), 4),
                                     ((1791, 1792), 4), ((1792, 1792), 8), ((3000, 4000), 8), ((100, 90), 1)])
def test_dct_downscale_keeps_the_crop_at_least_224(size, d):
    assert bench_decode.dct_downscale(*size) == d


def test_windows_are_the_ones_randomresizedcrop_draws(imagenet_dir):
    from torchvision.transforms import v2
    files = bench_decode.load(imagenet_dir, 8)
    windows = bench_decode.plan(files, seed=5)
    torch.manual_seed(5)
    rrc = v2.RandomResizedCrop(224, antialias=True)
    for data, (top, left, h, w, d) in zip(files, windows.tolist()):
        params = rrc.make_params([Image.open(io.BytesIO(data)).convert("RGB")])
        assert (params["top"], params["left"], params["height"], params["width"]) == (top, left, h, w)
        assert d == bench_decode.dct_downscale(h, w)
