"""The packed store's record format: what `fastload pack` writes and LMDBDataset reads.

An LMDB environment (a directory holding data.mdb) with one unnamed database:

* record i: key = i as a big-endian uint64 (8 bytes, so keys sort in index order); value = a 24-byte
  little-endian header, then the image file's bytes exactly as they were on disk (unless the pack was asked to
  re-encode): ``magic "FLRC", u16 format version, u8 image format (0 JPEG, 1 other: decode with Pillow),
  u8 flags (1 re-encoded, 2 converted to JPEG, 4 restart markers added losslessly), u32 height, u32 width, i32 label, u32 CRC-32 of the image bytes``.
* every other key is longer than 8 bytes and starts with ``__fastload_``, so it can never be taken for a record:
  ``META_KEY`` (JSON, written last, in the pack's final transaction: a store without it is not finished),
  ``SOURCES_KEY`` (written with it: each record's source file, so error messages can name it; stores packed
  before it existed lack it), and, only while a pack is in progress, ``PLAN_KEY``, ``PROGRESS_KEY`` and
  ``SKIP_PREFIX`` + file index.

The metadata JSON holds the format version, count, classes, per-class counts, source, skipped files with reasons
and the index (heights, widths, labels, formats as base64 of little-endian arrays), so a reader plans crops
without touching a record. No pickle anywhere.
"""
import base64
import json
import struct

import numpy as np

from ..errors import DecodeError

FORMAT_NAME = "fastload-lmdb"
#: Version of the record format this fastload writes; readers refuse stores with a newer one.
VERSION = 1
MAGIC = b"FLRC"
HEADER = struct.Struct("<4sHBBIIiI")
HEADER_SIZE = HEADER.size  # 24

JPEG, OTHER = 0, 1
FORMAT_NAMES = {JPEG: "JPEG", OTHER: "other (Pillow)"}
FLAG_REENCODED, FLAG_CONVERTED, FLAG_SEEKABLE = 1, 2, 4

META_KEY = b"__fastload_meta__"
PLAN_KEY = b"__fastload_plan__"
PROGRESS_KEY = b"__fastload_progress__"
SKIP_PREFIX = b"__fastload_skip__"
SOURCES_KEY = b"__fastload_sources__"
KEY_SIZE = 8

# Index arrays in the metadata: name -> little-endian dtype on disk.
_INDEX_DTYPES = {"heights": "<u4", "widths": "<u4", "labels": "<i4", "formats": "u1"}


def record_key(i):
    return struct.pack(">Q", i)


def key_index(key):
    """The record index of a key, or None for a non-record key."""
    return struct.unpack(">Q", key)[0] if len(key) == KEY_SIZE else None


def skip_key(file_index):
    return SKIP_PREFIX + struct.pack(">Q", file_index)


def write_header(buf, fmt, height, width, label, crc, flags=0):
    """Fills the first HEADER_SIZE bytes of ``buf`` (a bytearray that already holds the image after them)."""
    HEADER.pack_into(buf, 0, MAGIC, VERSION, fmt, flags, height, width, label, crc)


def parse_header(value, sample=None):
    """(format, flags, height, width, label, crc) of a record value; DecodeError when it is not a record."""
    if len(value) < HEADER_SIZE:
        raise DecodeError(f"{sample}: record is {len(value)} bytes, shorter than its header (damaged store)",
                          sample=sample, reason="damaged record")
    magic, version, fmt, flags, height, width, label, crc = HEADER.unpack_from(value, 0)
    if magic != MAGIC:
        raise DecodeError(f"{sample}: record does not start with the fastload magic (damaged store)",
                          sample=sample, reason="damaged record")
    if version > VERSION:
        raise DecodeError(f"{sample}: record format version {version} is newer than this fastload reads "
                          f"({VERSION}); upgrade fastload", sample=sample, reason="newer format")
    return fmt, flags, height, width, label, crc


def encode_index(**arrays):
    """The metadata's index: {"name": {"dtype": "<u4", "base64": ...}} for heights, widths, labels, formats."""
    out = {}
    for name, dtype in _INDEX_DTYPES.items():
        a = np.ascontiguousarray(np.asarray(arrays[name]).astype(dtype, copy=False))
        out[name] = {"dtype": dtype, "base64": base64.b64encode(a.tobytes()).decode("ascii")}
    return out


def decode_index(index, count):
    """The index arrays as int64 (heights, widths, labels) and uint8 (formats); ValueError if inconsistent."""
    arrays = {}
    for name in _INDEX_DTYPES:
        entry = index[name]
        a = np.frombuffer(base64.b64decode(entry["base64"]), dtype=np.dtype(entry["dtype"]))
        if a.size != count:
            raise ValueError(f"index array {name!r} has {a.size} entries, the store has {count} records")
        arrays[name] = a.astype(np.uint8 if name == "formats" else np.int64)
    return arrays


def dumps(obj):
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def loads(data):
    return json.loads(bytes(data).decode("utf-8"))


def encode_sources(paths):
    """SOURCES_KEY's value: u64 count, count + 1 u64 offsets, then the UTF-8 paths back to back (one lookup reads
    two offsets and one path, so a store of millions of records never parses them all). A file name that is not
    UTF-8 (bytes the OS gave as surrogates) is stored as its bytes, and read back as the same name."""
    data = [p.encode("utf-8", "surrogateescape") for p in paths]
    offsets = np.zeros(len(data) + 1, dtype="<u8")
    np.cumsum([len(d) for d in data], out=offsets[1:])
    return struct.pack("<Q", len(data)) + offsets.tobytes() + b"".join(data)


def source_at(value, i):
    """Record i's source path from SOURCES_KEY's value, or None when it has no entry i."""
    (count,) = struct.unpack_from("<Q", value, 0)
    if not 0 <= i < count:
        return None
    start, end = struct.unpack_from("<QQ", value, 8 + 8 * i)
    base = 8 + 8 * (count + 1)
    return bytes(value[base + start:base + end]).decode("utf-8", "surrogateescape")
