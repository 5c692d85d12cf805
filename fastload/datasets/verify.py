"""`fastload verify`: decode every sample of a dataset (native batch decode on threads), list what fails."""
import os
import zlib
from concurrent.futures import ThreadPoolExecutor

from .. import ops
from ..errors import DecodeError
from .base import decode_image
from .progress import progress as progress_bar
from .record import JPEG

_BATCH = 128
_BATCH_BYTES = 64 << 20  # decoded pixels per batch: bounds memory whatever the image sizes


def _pillow(ds, data, i):
    """None if sample i decodes with Pillow to the size the index says, else the reason."""
    try:
        img = decode_image(data, int(ds.formats[i]))
    except DecodeError as e:
        return str(e).removeprefix("None: ")
    if tuple(img.shape[1:]) != (int(ds.heights[i]), int(ds.widths[i])):
        return f"decodes to {img.shape[2]}x{img.shape[1]}, the index says {ds.widths[i]}x{ds.heights[i]}"
    return None


def _read(reader, i, check_crc):
    """The bytes of sample i; for store records the header is checked against the index and the CRC."""
    if not check_crc:
        return reader.get(i)
    (fmt, _, h, w, label, crc), data = reader.raw(i)
    ds = reader._ds
    if (fmt, h, w, label) != (ds.formats[i], ds.heights[i], ds.widths[i], ds.labels[i]):
        raise DecodeError("record header disagrees with the store's index (damaged store)", reason="damaged")
    if zlib.crc32(data) != crc:
        raise DecodeError("checksum mismatch: the stored bytes changed since packing (damaged store)",
                          reason="damaged")
    return data


def verify(ds, *, threads=None, progress=True, strict=True):
    """Fully decodes every sample of ``ds``; returns [(sample name, reason)] for those that fail (``strict`` as in
    ops.decode_crops)."""
    threads = threads or os.cpu_count() or 1
    check_crc = hasattr(ds, "meta")  # an LMDBDataset: records carry a header and a CRC
    failures = []
    n = len(ds)
    pool = ThreadPoolExecutor(threads)
    bar = progress_bar(n, desc="verify", unit="image", enabled=progress)
    try:
        i = 0
        while i < n:
            j, pixels = i, 0
            while j < n and j - i < _BATCH and (j == i or pixels < _BATCH_BYTES):
                pixels += int(ds.heights[j]) * int(ds.widths[j]) * 3
                j += 1
            with ds.reader() as r:
                bufs, idx, others = [], [], []
                for k in range(i, j):
                    try:
                        data = _read(r, k, check_crc)
                    except DecodeError as e:
                        failures.append((ds.sample_name(k), str(e).removeprefix(f"{ds.sample_name(k)}: ")))
                        continue
                    if ds.formats[k] == JPEG:
                        bufs.append(data)
                        idx.append(k)
                    else:
                        others.append((k, pool.submit(_pillow, ds, data, k)))
                if bufs:
                    windows = [[0, 0, int(ds.heights[k]), int(ds.widths[k]), 1] for k in idx]
                    _, _, _, status, messages = ops.decode_crops(bufs, windows, threads=threads, strict=strict)
                    for k, st, msg in zip(idx, status.tolist(), messages):
                        if st != ops.OK:
                            failures.append((ds.sample_name(k), f"{ops._REASONS.get(st, 'error')}: {msg}"))
                for k, fut in others:  # inside the reader: the views stay valid until these are done
                    reason = fut.result()
                    if reason:
                        failures.append((ds.sample_name(k), reason))
            bar.update(j - i)
            i = j
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()
    return failures
