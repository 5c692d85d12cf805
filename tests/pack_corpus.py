"""Helpers for the dataset and pack tests: a writable copy of the real-photo corpus, plus broken files.

The session corpus (conftest's ``imagenet_dir``) is shared and cached, so tests never write into it: they copy it.
"""
import os
import shutil
from pathlib import Path

import lmdb
import numpy as np
from PIL import Image

from fastload.datasets.record import record_key


def photo_tree(src, dst, *, png=True):
    """Copies the ImageFolder corpus ``src`` to ``dst`` (class folders only) and adds one real-photo PNG."""
    dst = Path(dst)
    for class_dir in sorted(Path(src).iterdir()):
        if class_dir.is_dir() and not class_dir.name.startswith("."):
            shutil.copytree(class_dir, dst / class_dir.name)
    if png:
        import skimage.data

        Image.fromarray(skimage.data.coffee()[::2, ::2]).save(dst / "class_01" / "coffee.png")
    return dst


def jpeg_files(root):
    return sorted(p for p in Path(root).rglob("*") if p.is_file() and p.suffix.lower() in (".jpg", ".jpeg"))


#: name -> expected fragment of the skip reason
BROKEN = {
    "empty.jpg": "empty file",
    "truncated.jpg": "truncated JPEG",
    "header_only.jpg": "truncated JPEG: the file ends before its image data",
    "garbage.jpg": "not an image",
    "notes.jpg": "not an image",
    "bad_header.jpg": "corrupt JPEG",
    "dangling.jpg": "dangling symlink",
    "fifo.jpg": "not a regular file",
}


def add_broken(root, good_jpeg, class_name="class_02"):
    """Writes every kind of broken file into root/class_name; returns {relative path: reason fragment}."""
    d = Path(root) / class_name
    data = Path(good_jpeg).read_bytes()
    sos = data.index(b"\xff\xda")
    (d / "empty.jpg").write_bytes(b"")
    (d / "truncated.jpg").write_bytes(data[: len(data) // 2])
    (d / "header_only.jpg").write_bytes(data[:sos])
    (d / "garbage.jpg").write_bytes(b"\x00" + np.random.default_rng(0).integers(0, 256, 4000, np.uint8).tobytes())
    (d / "notes.jpg").write_text("this is a text file, not a photo\n")
    (d / "bad_header.jpg").write_bytes(b"\xff\xd8\xff\xe0\x00\x02" + b"\x13" * 200)
    os.symlink(d / "no-such-file.jpg", d / "dangling.jpg")
    os.mkfifo(d / "fifo.jpg")
    return {f"{class_name}/{name}": reason for name, reason in BROKEN.items()}


def rewrite_record(path, i, change):
    """Changes record i of the store at ``path`` in place: ``change(value)`` edits its bytearray."""
    env = lmdb.open(str(path), lock=False)
    with env.begin(write=True) as txn:
        value = bytearray(txn.get(record_key(i)))
        change(value)
        txn.put(record_key(i), bytes(value))
    env.close()


def flip_middle_byte(value):
    """A ``rewrite_record`` change: one byte in the middle of the record, so its CRC-32 no longer matches."""
    value[len(value) // 2] ^= 0x55
