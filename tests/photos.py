"""Real photos for the pixel tests: scikit-image's photographs as JPEG, and a 1920x1080 mosaic of them."""
import io

import numpy as np
import torch
from PIL import Image


def encode_jpeg(rgb, quality=90):
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def real_photos():
    """[(jpeg bytes, Pillow's full decode as float CHW)] for astronaut, chelsea, coffee (quality 90, 4:2:0) and a
    1920x1080 mosaic of them, so that 224-pixel crops get DCT-downscaled as they do on large images."""
    import skimage.data as skd
    rgbs = [skd.astronaut(), skd.chelsea(), skd.coffee()]
    g = np.random.default_rng(0)
    mosaic = np.zeros((1080, 1920, 3), np.uint8)
    for k, (y, x) in enumerate((y, x) for y in range(0, 1080, 270) for x in range(0, 1920, 384)):
        src = rgbs[k % 3]
        oy, ox = g.integers(0, src.shape[0] - 270 + 1), g.integers(0, src.shape[1] - 384 + 1)
        mosaic[y:y + 270, x:x + 384] = src[oy:oy + 270, ox:ox + 384]
    out = []
    for rgb in rgbs + [mosaic]:
        data = encode_jpeg(rgb)
        full = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB"))).permute(2, 0, 1)
        out.append((data, full.float()))
    return out
