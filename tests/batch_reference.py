"""The torch-op chain that RandomErasing.apply and MixUp/CutMix.apply_planned ran before the fused native op
(issue 17), kept verbatim as the reference the op must equal bit for bit: erase with a mask built from aranges
(torch.where / masked_scatter), then mix (MixUp: x[partner].mul_(other).add_(x.mul(own)) with the weights as Python
floats, as torchvision holds them, so a half-precision batch is multiplied in float32; CutMix: torch.where).
Both act on a contiguous batch, as the stage ran them (it made the batch channels_last after them)."""
import torch


def erase(e, x, table, seed, epoch, indices):
    """RandomErasing ``e``'s old apply (out of place)."""
    b, c, height, width = x.shape
    table = torch.as_tensor(table, dtype=torch.float32).cpu()
    top, left, h, w = table.unbind(1)
    if not (h > 0).any():
        return x
    box = table.to(x.device)[:, :, None, None, None].unbind(1)  # each [B, 1, 1, 1]
    top, left, h, w = box
    rows = torch.arange(height, device=x.device, dtype=torch.float32)[:, None]
    cols = torch.arange(width, device=x.device, dtype=torch.float32)
    mask = (rows >= top) & (rows < top + h) & (cols >= left) & (cols < left + w)  # [B, 1, H, W]
    if e.value is None:
        noise = e.noise(seed, epoch, indices, table, c).to(x.device, x.dtype)
        mask = mask.expand(b, c, height, width)
        return x.masked_scatter(mask, noise)
    value = torch.tensor(e.value, dtype=x.dtype).view(1, -1, 1, 1).to(x.device)
    return torch.where(mask, value, x)


def partner(op, t):
    return t.roll(1, 0) if op.mode == "batch" else t.flip(0)


def mix(op, x, plan):
    """MixUp's or CutMix's old _mix_images with a plan() ([B, 6] float32 weights and box)."""
    w = plan.to(x.device)
    if op._op_kind == "mixup":  # torchvision's order of operations, its weights Python floats (per sample here)
        other = partner(op, x)
        return torch.stack([other[i].mul(float(w[i, 1])).add_(x[i].mul(float(w[i, 0]))) for i in range(len(x))])
    _, _, height, width = x.shape
    y1, y2, x1, x2 = w[:, 2:, None, None, None].unbind(1)  # each [B, 1, 1, 1]
    rows = torch.arange(height, device=x.device, dtype=torch.float32)[:, None]
    cols = torch.arange(width, device=x.device, dtype=torch.float32)
    inside = (rows >= y1) & (rows < y2) & (cols >= x1) & (cols < x2)  # [B, 1, H, W]
    return torch.where(inside, partner(op, x), x)
