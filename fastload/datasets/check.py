"""Cheap checks of image bytes: JPEG by magic, JPEG segment structure, Pillow identification.

The structure check walks the JPEG's marker segments up to the first scan and then requires an end-of-image
marker after it. Inside entropy-coded data every 0xFF byte is stuffed (0xFF00) or a restart marker, so FF D9
cannot occur there: a file cut short anywhere after its header has no EOI after its first scan (an EXIF
thumbnail's EOI comes before it). Together with the native header parse this catches empty, garbage and
truncated files at a few microseconds each, where a full decode costs ~0.6 ms; corrupted entropy data is
only found by decoding (``fastload pack --verify-decode``, ``fastload verify``).
"""
import io

JPEG_MAGIC = b"\xff\xd8\xff"
#: Files larger than this are refused unread: no training image is that big, and it bounds memory.
MAX_FILE_BYTES = 1 << 30
_EOI = b"\xff\xd9"


def is_jpeg(data, start=0):
    return bytes(data[start:start + 3]) == JPEG_MAGIC


def first_scan_offset(data, start=0):
    """Offset in ``data`` just past the first SOS segment header of the JPEG that starts at ``start``.

    Returns -1 when ``data`` ends before that point (a prefix read too short, or a truncated file); raises
    ValueError for bytes that are not JPEG segments.
    """
    n = len(data)
    pos = start + 2  # past SOI
    while True:
        if pos >= n:
            return -1
        if data[pos] != 0xFF:  # junk between segments: libjpeg skips it to the next marker, with a warning that
            found = data.find(b"\xff", pos)  # ops lets through (the pixels are the encoder's): so does this walk
            if found < 0:
                raise ValueError(f"no JPEG marker at byte {pos - start}")
            pos = found
        while pos < n and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            return -1
        marker = data[pos]
        pos += 1
        if marker == 0xD9:
            raise ValueError("end-of-image marker before any image data")
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # no length field
            continue
        if pos + 2 > n:
            return -1
        length = (data[pos] << 8) | data[pos + 1]
        if length < 2:
            raise ValueError(f"JPEG segment with invalid length {length} at byte {pos - start}")
        pos += length
        if marker == 0xDA:
            return pos if pos <= n else -1


def jpeg_structure_problem(data, start=0, strict=True):
    """None when the JPEG at data[start:] is structurally complete, else the reason (str). ``strict=False`` lets a
    file cut short inside its image data through (libjpeg decodes it with a "premature end" warning, which
    strict=False accepts, as everywhere); its header must still be whole.

    ``data`` must support rfind (bytes or bytearray; use ``start`` for an offset, not a memoryview slice).
    """
    scan, problem = _first_scan(data, start)
    if strict and problem is None and data.rfind(_EOI, scan) < 0:
        problem = "truncated JPEG: no end-of-image marker after the image data"
    return problem


def header_failure(data, message, start=0):
    """The reason to give for a JPEG whose header the decoder refused with ``message``."""
    _, problem = _first_scan(data, start)
    return problem or f"invalid JPEG header: {message}"


def _first_scan(data, start):
    """(offset of the first scan, None), or (-1, reason) when the marker walk shows the file is broken."""
    try:
        scan = first_scan_offset(data, start)
    except ValueError as e:
        return -1, f"corrupt JPEG: {e}"
    if scan < 0:
        return -1, "truncated JPEG: the file ends before its image data"
    return scan, None


def pillow_open(data):
    """Opens non-JPEG bytes with Pillow (header only). Returns the image; raises ValueError with the reason."""
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        raise ValueError(f"image too large: {e}") from None
    except UnidentifiedImageError:
        raise ValueError("not an image (Pillow cannot identify it)") from None
    except Exception as e:  # Pillow raises many types for malformed headers
        raise ValueError(f"corrupt image header: {e}") from None


def pillow_check(data, max_pixels):
    """(height, width, format name) of non-JPEG bytes after a full Pillow decode; ValueError with the reason."""
    im = pillow_open(data)
    if im.width * im.height > max_pixels:  # before allocating it
        im.close()
        raise ValueError(f"image too large ({im.width}x{im.height} pixels)")
    try:
        with im:
            im.load()
            return im.height, im.width, im.format
    except Exception as e:
        raise ValueError(f"corrupt {im.format or 'image'} data: {e}") from None
