"""fastload's native ops as Python functions.

JPEG: ``read_header``, ``decode_crop`` (one window), ``decode_crops`` (a batch, native threads, GIL released) and
``verify_jpegs`` (whether whole files decode, without decoding pixels).
Geometry: ``warp_affine`` (dense batches, CPU and CUDA), ``warp_ragged`` (the loader's ragged batches) and
``affine_from_points``. The decoder returns status codes; this module turns them into exceptions.
"""
import functools
import warnings
from collections import namedtuple

import numpy as np
import torch

from .errors import DecodeError, process_limit_error
from .native import C

__all__ = ["JpegInfo", "JpegWarning", "read_header", "read_headers", "decode_crop", "decode_crops", "verify_jpegs",
           "add_restart_markers", "restart_layout", "warp_affine", "warp_ragged", "affine_nearest", "affine_nearest_",
           "nearest_maps", "affine_from_points", "MAX_PIXELS", "MAX_BYTES", "DOWNSCALES"]

#: Default pixel-count limit, Pillow's DecompressionBombError threshold. Pass ``max_pixels=`` to change it.
MAX_PIXELS = 178_956_970
#: DCT downscales libjpeg-turbo can apply while decoding.
DOWNSCALES = (1, 2, 4, 8)

OK, NOT_JPEG, CORRUPT, TOO_LARGE, BAD_WINDOW, UNSUPPORTED, NO_ROOM, NOT_DECODED, UNREADABLE, INTERNAL, \
    NO_RESOURCES = range(11)
_REASONS = {NOT_JPEG: "not a JPEG", CORRUPT: "corrupt", TOO_LARGE: "too large", BAD_WINDOW: "bad window",
            UNSUPPORTED: "unsupported", NO_ROOM: "no room", NOT_DECODED: "not decoded", UNREADABLE: "unreadable",
            INTERNAL: "native error", NO_RESOURCES: "out of descriptors or memory"}
#: Statuses that are the process's, not the sample's (a native failure such as out of memory; a read refused
#: for want of descriptors or memory): raised whatever on_error says, never skipped.
PROCESS_FAULTS = (INTERNAL, NO_RESOURCES)


def process_fault(status, message):
    """The exception for a PROCESS_FAULTS status; ``message`` names the sample."""
    return process_limit_error(message) if status == NO_RESOURCES else RuntimeError(message)


#: Prefix of the message of an OK sample that decoded with a warning let through (see "Strict mode" below).
WARNING_PREFIX = "warning: "
#: Default per-image byte limit for decode_crops (files and buffers alike).
MAX_BYTES = 256 << 20
_COLOR_SPACES = {0: "unknown", 1: "gray", 2: "rgb", 3: "ycbcr", 4: "cmyk", 5: "ycck"}
_SUBSAMPLING = {(1, 1): "4:4:4", (2, 1): "4:2:2", (2, 2): "4:2:0", (1, 2): "4:4:0", (4, 1): "4:1:1"}

JpegInfo = namedtuple("JpegInfo", "height width components color_space subsampling progressive arithmetic adobe")

_STRICT_DOC = """
Strict mode. libjpeg reports damage as warnings and goes on with made-up pixels. ``strict=True`` (the default)
refuses a file (DecodeError, status CORRUPT) on a warning that means the pixels may be wrong: premature end of
data or of the file, a bad Huffman or arithmetic code, a restart marker out of sequence, an inconsistent
progression, and junk bytes inside or after the entropy-coded data (the mark of a damaged segment). It lets
through, *reported*, the warnings that leave the pixels as the encoder wrote them: junk bytes between header
markers, an unknown JFIF revision or Adobe transform code, a bad ICC marker. ``strict=False`` lets every warning
through. A sample let through with a warning has status OK and the message ``"warning: <libjpeg's text>"``
(the batch ops) or raises a ``JpegWarning`` (the single-sample ops); count those to see how many such files a
dataset holds. Valid JPEGs this build does not decode (lossless, hierarchical, 12-bit) are UNSUPPORTED, not
CORRUPT.
"""


class JpegWarning(UserWarning):
    """A JPEG decoded (or its header read) with a libjpeg warning let through; see fastload.ops's strict mode."""


def _warn(message, sample, stacklevel=3):
    if message:
        where = f"{sample}: " if sample is not None else ""
        warnings.warn(f"{where}{message}", JpegWarning, stacklevel=stacklevel)


def _raise(status, message, sample):
    where = f"{sample}: " if sample is not None else ""
    if status == BAD_WINDOW:
        raise ValueError(f"{where}{message}")
    if status in PROCESS_FAULTS:
        raise process_fault(status, f"{where}{message}")
    raise DecodeError(f"{where}{message}", sample=sample, reason=_REASONS.get(status, "error"))


def read_header(data, *, strict=True, max_pixels=MAX_PIXELS, max_bytes=MAX_BYTES, sample=None):
    """Reads a JPEG's header (no pixel decoding). Raises DecodeError for bad or oversized input.

    data: bytes-like (C-contiguous), uint8 tensor, or a str file path (read natively, at most ``max_bytes``).
    ``strict`` as in decode_crop: a harmless header warning (e.g. junk bytes between markers) is let through with
    a ``JpegWarning``; a harmful one raises unless ``strict=False``.
    """
    h = C.read_header(data, max_pixels, strict, max_bytes)
    if h["status"] != OK:
        _raise(h["status"], h["message"], sample)
    _warn(h["message"], sample)
    subsampling = ("gray" if h["components"] == 1 else
                   _SUBSAMPLING.get((h["h_samp"], h["v_samp"]), "other") if h["chroma_1x1"] else "other")
    return JpegInfo(h["height"], h["width"], h["components"], _COLOR_SPACES.get(h["color_space"], "unknown"),
                    subsampling, h["progressive"], h["arithmetic"], h["adobe"])


def read_headers(buffers, threads=1, *, strict=True, max_pixels=MAX_PIXELS, max_bytes=MAX_BYTES):
    """Heights and widths of many JPEGs at once: (sizes int64 [B, 2], status int32 [B], messages).

    Buffers as in decode_crops. Errors are per sample; an OK sample's message is "" or the warning let through
    ("warning: ...", see strict mode in decode_crop).
    """
    return C.read_headers(list(buffers), threads, max_pixels, strict, max_bytes)


def decoded_shape(top, left, height, width, downscale=1):
    """(h, w) of what ``decode_crop`` returns for a window: its rows/columns in the 1/downscale image."""
    d = downscale
    return (-(-(top + height) // d) - top // d, -(-(left + width) // d) - left // d)


def decode_crop(data, top, left, height, width, downscale=1, *, strict=True, max_pixels=MAX_PIXELS,
                max_bytes=MAX_BYTES, sample=None):
    """Decodes only the window (top, left, height, width) of a JPEG, at 1/downscale (1, 2, 4 or 8).

    Returns uint8 [h, w, 3] RGB: rows top//d .. ceil((top+height)/d) of the DCT-scaled image, same for columns
    (see ``decoded_shape``). At downscale 1 this equals Pillow's full decode cropped to the window (where the
    two libjpeg-turbo builds agree: for a progressive file missing later scans each estimates the missing
    coefficients its own way).
    Raises ``ValueError`` for a window outside the image, ``DecodeError`` for bytes that are not a valid JPEG.
    data: bytes-like (C-contiguous: a strided view raises ValueError), uint8 tensor, or a str file path (read
    natively, at most ``max_bytes``; a larger file or buffer raises DecodeError).
    A window that stops above the last row does not read the rest of the file, so damage below it is not seen.
    """
    status, message, out = C.decode_crop(data, int(top), int(left), int(height), int(width), int(downscale),
                                         strict, max_pixels, max_bytes)
    if status != OK:
        _raise(status, message, sample)
    _warn(message, sample)
    return out


decode_crop.__doc__ += _STRICT_DOC


def add_restart_markers(data, *, strict=True, max_pixels=MAX_PIXELS, sample=None):
    """Re-encodes a JPEG losslessly with restart markers every few MCUs, so that crops decode faster.

    The DCT coefficients are copied untouched (like ``jpegtran``): every decoder gives exactly the pixels of the
    original. The decoder then entropy-decodes only the segments around a crop window instead of every MCU
    above and beside it (1080p RandomResizedCrop: ~1.75x faster). Returns the new bytes (Huffman tables
    optimised, APPn/COM markers kept; usually within a few percent of the original size), or None for files it
    leaves alone (colour spaces other than YCbCr and grayscale; progressive files whose scans leave coefficients
    incomplete, which decoders smooth and a sequential copy would not). Raises DecodeError for a broken JPEG.
    """
    status, message, out = C.add_restart_markers(data, strict, max_pixels)
    if status == UNSUPPORTED:
        return None
    if status != OK:
        _raise(status, message, sample)
    _warn(message, sample)
    return out


def restart_layout(data):
    """How a JPEG's restart markers let the decoder cut out crops: a dict (MCU size, MCUs per row and per
    restart interval), or None when it cannot (no markers, progressive, or an interval that does not fit)."""
    return C.restart_layout(data)


def decode_crops(buffers, windows, out=None, *, threads=1, strict=True, max_pixels=MAX_PIXELS, max_bytes=MAX_BYTES,
                 crcs=None):
    """Decodes a batch of windows into one ragged uint8 buffer, on ``threads`` native threads without the GIL.

    buffers: sequence of bytes-like objects or uint8 tensors (not copied), or str file paths, which the native
    threads read themselves (at most ``max_bytes`` each). windows: int64 [B, 5] rows of
    (top, left, height, width, downscale). out: a 1-D uint8 tensor (e.g. pinned) large enough for the batch;
    allocated when None. crcs: optional integers [B], the CRC-32 each buffer must have (-1: unchecked; other
    values outside 0 to 2^32 - 1 are refused); a mismatch is a CORRUPT status, found before decoding. Returns
    ``(out, offsets [B], shapes [B, 3], status [B], messages)``: sample i is
    ``out[offsets[i]:][:h*w*3].view(h, w, 3)`` when ``status[i] == 0``; otherwise ``messages[i]`` says why.
    Errors are reported per sample, never raised, so one bad file does not cost the batch. An OK sample's message
    is "" or ``"warning: ..."``: decoded with a warning let through (see strict mode below). A native failure
    of one sample (e.g. out of memory reading a file) is that sample's status INTERNAL.
    """
    windows = torch.as_tensor(windows, dtype=torch.int64).reshape(-1, 5)
    if out is None:
        top, left, h, w, d = windows.unbind(1)
        # Windows outside any JPEG (sides are at most 65535) take no room, as in the native layout; the decoder
        # reports them per sample. (Sized as they are, huge ones overflowed int64 here.)
        ok = (top >= 0) & (left >= 0) & (h > 0) & (w > 0) & (top <= 65535 - h) & (left <= 65535 - w) & (d > 0)
        d = d.clamp(min=1)
        rows = torch.where(ok, (top + h + d - 1) // d - top // d, 0)
        cols = torch.where(ok, (left + w + d - 1) // d - left // d, 0)
        out = torch.empty(int((rows * cols).sum()) * 3, dtype=torch.uint8)
    if crcs is not None:
        crcs = torch.as_tensor(crcs, dtype=torch.int64)
    offsets, shapes, status, messages = C.decode_crops(list(buffers), windows, out, threads, strict, max_pixels,
                                                       max_bytes, crcs)
    return out, offsets, shapes, status, messages


decode_crops.__doc__ += _STRICT_DOC


def verify_jpegs(buffers, threads=1, *, strict=True, max_pixels=MAX_PIXELS, max_bytes=MAX_BYTES, crcs=None):
    """Whether each JPEG decodes in full, without decoding its pixels: ``(status int32 [B], messages)``.

    Runs the decoder on the last row of each image: libjpeg entropy-decodes every row above it without IDCT or
    colour conversion, and under strict reads on to EOI as a full decode does. So a sample is OK exactly when
    decoding its whole image with ``decode_crop(..., strict=strict)`` would succeed (messages as in
    decode_crops, "warning: ..." for an OK sample with a warning let through). For decoders that do not report damaged data (nvJPEG's hardware
    path returns success on it). Buffers, ``max_bytes`` and ``crcs`` as in decode_crops; runs on ``threads``
    native threads without the GIL. Costs a fraction of a full decode (mostly the entropy decoding).
    """
    if crcs is not None:
        crcs = torch.as_tensor(crcs, dtype=torch.int64)
    return C.verify_jpegs(list(buffers), threads, strict, max_pixels, max_bytes, crcs)


verify_jpegs.__doc__ += _STRICT_DOC


def crop_view(out, offsets, shapes, i):
    """Sample i of a ragged batch as a uint8 [h, w, 3] view."""
    h, w, c = (int(v) for v in shapes[i])
    start = int(offsets[i])
    return out[start:start + h * w * c].view(h, w, c)


def _per_channel(values, default, channels, name):
    if values is None:
        values = [default] * channels
    elif isinstance(values, (int, float)):
        values = [float(values)]
    else:
        values = [float(v) for v in values]
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise ValueError(f"{name} needs 1 or {channels} values, got {len(values)}")
    return values


def _norm_params(channels, mean, std, in_scale, device):
    """Folds (x * in_scale - mean) / std into x * alpha + beta. Plain floats: no tensor maths to trace."""
    mean = _per_channel(mean, 0.0, channels, "mean")
    std = _per_channel(std, 1.0, channels, "std")
    if any(s == 0 for s in std):
        raise ValueError("std must not contain zeros")
    alpha = [in_scale / s for s in std]
    beta = [-m / s for m, s in zip(mean, std)]
    if torch.compiler.is_compiling():
        return (torch.tensor(alpha, dtype=torch.float32, device=device),
                torch.tensor(beta, dtype=torch.float32, device=device))
    return _param_tensors(tuple(alpha), tuple(beta), torch.device(device))


@functools.lru_cache(maxsize=64)
def _param_tensors(alpha, beta, device):
    # Cached: a fresh CUDA tensor from a Python list is a pageable copy that synchronises the stream, which
    # would stall the side stream once per batch.
    return (torch.tensor(alpha, dtype=torch.float32, device=device),
            torch.tensor(beta, dtype=torch.float32, device=device))


def warp_ragged(data, offsets, shapes, matrices, out_size, *, mean=None, std=None, in_scale=1.0 / 255,
                out_dtype=torch.float32, channels_last=False, fill=0.0, hwc=True, channels=3):
    """The loader's stage: warp + normalise every sample of a ragged batch to ``out_size``.

    data: 1-D uint8/float32 (CPU or CUDA), offsets int64 [B], shapes int64 [B, 3] (h, w, c), matrices [B, 2, 3]
    mapping output pixel (u, v) to input pixel (x, y), or [B, 2, 5]: each row followed by the interval [lo, hi]
    of its input axis (edge coordinates: pixel i spans [i, i + 1]) that is visible; an output pixel whose centre
    maps outside the visible box (or the input, with [B, 2, 3]) is ``fill``, while the filter still reads the whole
    input. Output ``(v * in_scale - mean) / std``, [B, C, H, W].
    ``channels`` must equal every shapes[i, 2]; it is passed, not read, so a CUDA call never syncs.
    """
    out_h, out_w = (out_size, out_size) if isinstance(out_size, int) else out_size
    dev = data.device
    if mean is None and std is None:
        in_scale = 1.0 if in_scale is None else in_scale
    alpha, beta = _norm_params(channels, mean, std, in_scale, dev)
    return torch.ops.fastload.warp_normalize(
        data, offsets.to(dev, torch.int64), shapes.to(dev, torch.int64),
        matrices.to(dev, torch.float32).contiguous(), alpha, beta, channels, out_h, out_w, hwc, out_dtype,
        channels_last, fill_values(fill))


def fill_values(fill):
    """torchvision's ``fill`` for the native ops: a list of floats, one value or one per channel (None: 0)."""
    if fill is None:
        return [0.0]
    if isinstance(fill, torch.Tensor):
        fill = fill.reshape(-1).tolist()
    return [float(v) for v in fill] if isinstance(fill, (list, tuple)) else [float(fill)]


def warp_affine(images, matrices, out_size, mean=None, std=None, out_dtype=None, fill=0, *, channels_last=None,
                layout=None):
    """Warps a dense batch with per-sample 2x3 matrices (output pixel -> input pixel), optionally normalising.

    images: [B, C, H, W] or [B, H, W, C] (``layout="NHWC"``; when not given, NHWC if only the last dim is 1, 3 or
    4, NCHW if only dim 1 is, an error if both are), uint8 or floating (computed in float32), CPU or CUDA, C <= 4.
    matrices: [B, 2, 3] or [2, 3]; or [B, 2, 5] / [2, 5], each row followed by its input axis's visible interval
    (as in warp_ragged). Bilinear, antialiased when shrinking.
    With mean/std, output is ``(x / 255 - mean) / std`` for uint8 input and ``(x - mean) / std`` for float input.
    out_dtype defaults to the input dtype without normalisation and to float32 with it. Returns [B, C, h, w].
    Not differentiable (nor is any fastload op): a backward through the result raises.
    On CUDA, uint8 HWC RGB with axis-aligned matrices takes the loader's fast path: sums within 0.024 of exact in
    pixel values (its row filter uses 16-bit integer weights); everything else matches the CPU op to float32
    rounding.
    """
    if images.dim() != 4:
        raise ValueError(f"images must be 4-D [B, C, H, W] or [B, H, W, C], got shape {tuple(images.shape)}")
    if layout is None:
        channels_first, channels_last_dim = images.shape[1] in (1, 3, 4), images.shape[-1] in (1, 3, 4)
        if channels_first and channels_last_dim:
            raise ValueError(f"images of shape {tuple(images.shape)} could be [B, C, H, W] or [B, H, W, C]: pass "
                             f"layout='NCHW' or layout='NHWC'")
        layout = "NHWC" if channels_last_dim else "NCHW"
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
    hwc = layout == "NHWC"
    b = images.shape[0]
    h, w, c = (images.shape[1], images.shape[2], images.shape[3]) if hwc else (
        images.shape[2], images.shape[3], images.shape[1])
    if not (images.dtype == torch.uint8 or images.is_floating_point()):
        raise TypeError(f"images must be uint8 (0-255) or floating, got {images.dtype}")
    matrices = torch.as_tensor(matrices, dtype=torch.float32, device=images.device)
    if matrices.dim() == 2:
        matrices = matrices.expand(b, *matrices.shape)
    if matrices.shape not in ((b, 2, 3), (b, 2, 5)):
        raise ValueError(f"matrices must be [B, 2, 3] (or [B, 2, 5] with visible intervals) with B={b}, got "
                         f"{tuple(matrices.shape)}")
    normalise = mean is not None or std is not None
    if out_dtype is None:
        out_dtype = torch.float32 if normalise else images.dtype
    if not (out_dtype == torch.uint8 or out_dtype.is_floating_point):
        raise TypeError(f"out_dtype must be uint8 or floating, got {out_dtype}")
    # the kernel reads uint8 or float32 and writes these four; another floating dtype (float64) is cast after
    kernel_dtype = out_dtype if out_dtype in (torch.uint8, torch.float32, torch.float16, torch.bfloat16) \
        else torch.float32
    if images.dtype != torch.uint8:
        images = images.float()
    in_scale = 1.0 / 255 if (normalise and images.dtype == torch.uint8) else 1.0
    data = images.contiguous().reshape(-1)
    offsets = torch.arange(b, dtype=torch.int64) * (h * w * c)
    shapes = torch.tensor([[h, w, c]], dtype=torch.int64).expand(b, 3).contiguous()
    if channels_last is None:
        channels_last = False
    out = warp_ragged(data, offsets, shapes, matrices, out_size, mean=mean, std=std, in_scale=in_scale,
                      out_dtype=kernel_dtype, channels_last=channels_last, fill=fill, hwc=hwc, channels=c)
    return out if out.dtype == out_dtype else out.to(out_dtype)


def affine_nearest(images, matrices, fill=0.0):
    """torchvision's ``affine``/``rotate`` with ``interpolation=NEAREST`` (same output size), per sample: output
    pixel (u, v) of sample i takes input pixel ``round(matrices[i] @ (u, v, 1))`` (pixel centres at integers), or
    ``fill`` where that lies outside the image (rounded for uint8, as torchvision). Coordinates are exact to 2e-6
    pixels (fixed point, the same on CPU and CUDA; native/affine_nearest.h), so a pixel can differ from torchvision's
    float32 grid only at a rounding tie. Matrix entries must be finite and below 2^15 in magnitude (a matrix with
    another entry maps every pixel to fill), sides at most 16384.

    images: [B, C, H, W] uint8 or float32, contiguous or channels_last, CPU or CUDA; matrices: [B, 2, 3] (or [2, 3])
    from output pixel index to input pixel index. Returns a new tensor in images' layout (``affine_nearest_`` works
    in place on chosen samples).
    """
    if images.dim() != 4:
        raise ValueError(f"images must be 4-D [B, C, H, W], got shape {tuple(images.shape)}")
    out = images.clone(memory_format=torch.preserve_format)
    matrices = torch.as_tensor(matrices, dtype=torch.float32)
    if matrices.dim() == 2:
        matrices = matrices.expand(images.shape[0], 2, 3)
    return affine_nearest_(out, torch.arange(images.shape[0]), matrices, fill)


def affine_nearest_(images, samples, matrices, fill=0.0):
    """``affine_nearest`` in place on the samples ``samples`` (int [N], distinct) of images, with matrices [N, 2, 3];
    the other samples are not touched. Returns images. The stage uses the same maths inside the photometric op
    (``functional.photometric(..., nearest=)``: a policy's rotate/shear/translate read at its slot), not this op.
    Host-side samples are checked here; a
    CUDA kernel skips indices outside the batch (a sample listed twice there: undefined)."""
    if images.dim() != 4:
        raise ValueError(f"images must be 4-D [B, C, H, W], got shape {tuple(images.shape)}")
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (images, matrices)):
        # an in-place op autograd cannot see: a backward would pass the gradient through unchanged
        raise RuntimeError("affine_nearest is not differentiable (no fastload op is): call it under torch.no_grad() "
                           "or on tensors that do not require grad; torchvision's F.affine gives a gradient")
    samples, matrices = nearest_maps(samples, matrices, images.shape[0], images.device)
    torch.ops.fastload.affine_nearest_(images, samples, matrices, fill_values(fill))
    return images


def nearest_maps(samples, matrices, batch, device, slots=None, num_slots=1):
    """(samples int64 [N], matrices float32 [N, 2, 3]) on ``device`` for the ops that take nearest maps
    (affine_nearest_, and photometric, which reads the listed samples through them, each at its entry of
    ``slots``: a host list of N non-decreasing slot indices below ``num_slots``, None: all at slot 0). Host samples
    are checked here (indices into a batch of ``batch``, distinct within a slot); device ones are trusted (a CUDA
    kernel skips indices outside, and reads a sample listed twice in a slot through one of its matrices)."""
    samples = torch.as_tensor(samples, dtype=torch.int64)
    matrices = torch.as_tensor(matrices, dtype=torch.float32)
    if samples.dim() != 1 or matrices.shape != (len(samples), 2, 3):
        raise ValueError(f"samples must be [N] and matrices [N, 2, 3], got {tuple(samples.shape)} and "
                         f"{tuple(matrices.shape)}")
    slot = np.zeros(len(samples), np.int64) if slots is None else np.asarray(slots, dtype=np.int64).reshape(-1)
    if len(slot) != len(samples):
        raise ValueError(f"slots must give one slot per listed sample ({len(samples)}), got {len(slot)}")
    if len(slot) and (slot.min() < 0 or slot.max() >= max(num_slots, 1) or (np.diff(slot) < 0).any()):
        raise ValueError(f"slots must be non-decreasing slot indices below {max(num_slots, 1)}, got {slot.tolist()}")
    if samples.device.type == "cpu" and len(samples):  # numpy: a few microseconds (the stage calls this per batch)
        index = samples.numpy()
        if index.min() < 0 or index.max() >= batch:
            raise ValueError(f"samples must index the batch of {batch}, got {index.tolist()}")
        if np.unique(slot * batch + index).size < len(index):
            raise ValueError(f"samples must be distinct within a slot, got {index.tolist()} at slots {slot.tolist()}")
    return samples.to(device, non_blocking=True), matrices.to(device, non_blocking=True).contiguous()


def affine_from_points(src, dst):
    """Least-squares 2x3 affine matrices mapping ``src`` points onto ``dst`` points, batched.

    src, dst: [B, N, 2] or [N, 2] with N >= 3, as (x, y); an [N, 2] side is shared by every sample of the other
    side's batch (e.g. one template for B sets of landmarks). Returns [B, 2, 3] float32 with dst ~= A @ [src; 1],
    or [2, 3] when both are [N, 2]. For warp_affine you want the matrix from *output* to *input* pixels:
    ``affine_from_points(template, landmarks)``.
    """
    src = torch.as_tensor(src)
    dst = torch.as_tensor(dst)
    shapes = f"src {tuple(src.shape)} and dst {tuple(dst.shape)}"
    if src.dim() not in (2, 3) or dst.dim() not in (2, 3) or src.shape[-1] != 2 or dst.shape[-1] != 2:
        raise ValueError(f"src and dst must be [N, 2] or [B, N, 2] point sets, got {shapes}")
    if src.shape[-2] != dst.shape[-2]:
        raise ValueError(f"src and dst must hold the same number of points N, got {shapes}")
    if src.shape[-2] < 3:
        raise ValueError(f"an affine fit needs N >= 3 points, got {shapes}")
    if src.dim() == 3 and dst.dim() == 3 and src.shape[0] != dst.shape[0]:
        raise ValueError(f"src and dst must have the same batch size B, got {shapes}")
    squeeze = src.dim() == 2 and dst.dim() == 2
    b = 1 if squeeze else (src.shape[0] if src.dim() == 3 else dst.shape[0])
    s = src.to(torch.float64).expand(b, *src.shape[-2:])
    d = dst.to(device=s.device, dtype=torch.float64).expand(b, *dst.shape[-2:])
    design = torch.cat([s, torch.ones_like(s[..., :1])], dim=-1)  # [B, N, 3]
    solution = torch.linalg.lstsq(design, d).solution if s.device.type == "cpu" else torch.linalg.pinv(design) @ d
    out = solution.transpose(1, 2).to(torch.float32)  # [B, 2, 3]
    return out[0] if squeeze else out


@torch.library.register_fake("fastload::warp_normalize")
def _warp_normalize_fake(data, offsets, shapes, matrices, alpha, beta, channels, out_h, out_w, hwc, out_dtype,
                         channels_last, fill):
    out = data.new_empty((offsets.shape[0], channels, out_h, out_w), dtype=out_dtype)
    return out.contiguous(memory_format=torch.channels_last) if channels_last else out


@torch.library.register_fake("fastload::affine_nearest_")
def _affine_nearest_fake(images, samples, matrices, fill):
    return None
