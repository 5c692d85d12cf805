"""float64 reference of the warp/normalise maths (fastload/native/warp.h) and test matrices."""
import numpy as np
import torch


def reference_warp(img, m, out_h, out_w, fill=0.0):
    """float64 reference of warp.h's definition. img: [H, W, C]; m: 2x3 output index -> input index, or 2x5 with
    each input axis's visible interval [lo, hi] (edge coordinates) after its row: centres outside it are fill."""
    img = img.astype(np.float64)
    h, w, c = img.shape
    m = np.asarray(m, dtype=np.float64).reshape(2, -1)
    x_lo, x_hi, y_lo, y_hi = (max(0.0, m[0, 3]), min(w, m[0, 4]), max(0.0, m[1, 3]), min(h, m[1, 4])) \
        if m.shape[1] == 5 else (0.0, w, 0.0, h)
    a, b, tx, cc, d, ty = (float(v) for v in m[:, :3].reshape(-1))
    sx, sy = max(1.0, np.hypot(a, b)), max(1.0, np.hypot(cc, d))
    out = np.empty((out_h, out_w, c))
    for v in range(out_h):
        for u in range(out_w):
            cx, cy = a * u + b * v + tx + 0.5, cc * u + d * v + ty + 0.5
            if not (x_lo <= cx <= x_hi and y_lo <= cy <= y_hi):
                out[v, u] = fill
                continue
            x0, x1 = max(int(np.floor(cx - sx + 0.5)), 0), min(int(np.floor(cx + sx + 0.5)), w)
            y0, y1 = max(int(np.floor(cy - sy + 0.5)), 0), min(int(np.floor(cy + sy + 0.5)), h)
            wx = np.maximum(0, 1 - np.abs((np.arange(x0, x1) + 0.5 - cx) / sx))
            wy = np.maximum(0, 1 - np.abs((np.arange(y0, y1) + 0.5 - cy) / sy))
            out[v, u] = np.einsum("y,x,yxc->c", wy, wx, img[y0:y1, x0:x1]) / (wx.sum() * wy.sum())
    return out


def random_matrices(rng, n, h, w, out_h, out_w, axis_aligned):
    """Matrices that map the output onto (mostly) the image: scale 0.3x..4x, rotation, shear, shift, flips."""
    mats = []
    for _ in range(n):
        scale = np.exp(rng.uniform(np.log(0.3), np.log(4.0), size=2)) * np.array([w / out_w, h / out_h]) ** 0.5
        if axis_aligned:
            lin = np.diag(scale * rng.choice([-1, 1], size=2))
        else:
            t = rng.uniform(-np.pi, np.pi)
            lin = np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]]) @ np.diag(scale)
            lin += rng.normal(0, 0.1, size=(2, 2))
        centre_in = np.array([w, h]) / 2 + rng.normal(0, 0.15, size=2) * np.array([w, h])
        centre_out = np.array([out_w - 1, out_h - 1]) / 2
        mats.append(np.concatenate([lin, (centre_in - lin @ centre_out)[:, None]], axis=1))
    return torch.tensor(np.stack(mats), dtype=torch.float32)


def random_boxes(rng, n, h, w):
    """Visible intervals [B, 2, 2] (x: [x0, x1], y: [y0, y1], edge coordinates) inside an h x w input, at fractional
    positions, some reaching its edges."""
    boxes = []
    for _ in range(n):
        x0, x1 = np.sort(rng.uniform(-0.2, 1.2, size=2)) * w
        y0, y1 = np.sort(rng.uniform(-0.2, 1.2, size=2)) * h
        boxes.append([[x0, x1], [y0, y1]])
    return torch.tensor(np.array(boxes), dtype=torch.float32)
