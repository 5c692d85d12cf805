"""RandomErasing and MixUp/CutMix in one native pass over the finished batch (``torch.ops.fastload.batch_ops``,
fastload/native/batch_ops*):

    out[i] = mix_i(erase_i(x[i]), erase_j(x[j])),   j = i - 1 (x.roll(1, 0), mode "batch") or B - 1 - i (x.flip(0))

written to a new tensor in x's layout (contiguous or channels_last), x read once per value. It equals the torch-op
chain it replaced (RandomErasing's torch.where / masked_scatter, then MixUp's ``x[j].mul_(1 - lam).add_(x.mul(lam))``
or CutMix's ``torch.where(box, x[j], x)``) bit for bit, on the CPU and on CUDA (batch_ops.h says how).

Everything the op needs per batch goes to the device in one copy: one int32 buffer holding the per-sample table
[B, 11] (batch_ops.h's columns: the erase box and where its noise starts, CutMix's box, MixUp's float32 weights as
bit patterns), the erase value per channel (float32 bits) and value="random"'s noise (float32 bits).
"""
import numpy as np
import torch

from .. import ops  # noqa: F401  (loads the native library that defines the op)

__all__ = ["run"]

_COLUMNS = 11  # batch_ops.h's Column
_MIX = {None: 0, "mixup": 1, "cutmix": 2}
_PARTNER = {"roll": 0, "flip": 1}


def _host_buffer(parts, device):
    """The int32 parts concatenated, on ``device`` (one pinned, non-blocking copy for a GPU)."""
    buffer = torch.from_numpy(np.concatenate([np.ascontiguousarray(p, dtype=np.int32).reshape(-1) for p in parts]))
    if device.type == "cpu":
        return buffer
    return buffer.pin_memory().to(device, non_blocking=True)


def run(x, *, erase=None, mix=None):
    """One pass of erasing and/or mixing over x [B, C, H, W] (float32/float16/bfloat16, or uint8 without MixUp
    and noise; contiguous or channels_last). Returns a new tensor; x is not modified.

    erase: None, or RandomErasing.op_args' (columns int32 [B, 5]: top, left, h, w, noise start; fill float32 [C]
    or None for the noise; noise float32 [N]). mix: None, or _Mix.op_args' (kind "mixup"/"cutmix", partner
    "roll"/"flip", columns int32 [B, 6]: CutMix's y1, y2, x1, x2, MixUp's own and other weights' float32 bits).
    """
    b, c = x.shape[:2]
    table = np.zeros((b, _COLUMNS), dtype=np.int32)
    fill, noise = np.zeros(0, np.float32), np.zeros(0, np.float32)
    if erase is not None:
        columns, erase_fill, noise = erase
        table[:, :5] = columns
        fill = np.zeros(0, np.float32) if erase_fill is None else np.ascontiguousarray(erase_fill, np.float32)
    kind, partner = None, "roll"
    if mix is not None:
        kind, partner, columns = mix
        table[:, 5:] = columns
    if erase is not None and fill.size == 0 and noise.size == 0 and (table[:, 2] * table[:, 3] > 0).any():
        raise ValueError("batch_ops: erase boxes with neither a fill value nor noise")
    buffer = _host_buffer([table, fill.view(np.int32), np.asarray(noise, np.float32).view(np.int32)], x.device)
    n_table = table.size
    dev_table = buffer[:n_table].view(b, _COLUMNS)
    dev_fill = buffer[n_table:n_table + fill.size].view(torch.float32)
    dev_noise = buffer[n_table + fill.size:].view(torch.float32)
    return torch.ops.fastload.batch_ops(x, dev_table, dev_fill, dev_noise, _MIX[kind], _PARTNER[partner])


@torch.library.register_fake("fastload::batch_ops")
def _batch_ops_fake(x, table, fill, noise, mix, partner):
    return torch.empty_like(x)
