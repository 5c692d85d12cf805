"""Shared fixtures: real-photo JPEG corpora (bench/corpus.py) and the `cuda` marker.

Corpora are cached under /tmp/fastload-test-corpus, one folder per parameter set; bench.corpus checks each
folder against its manifest (hashes included) and rebuilds what does not match, so a stale or half-written cache
cannot leak into a run. Where /tmp is not writable they are built in pytest's own temporary folder.
"""
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `bench` is a folder of the checkout, not installed

from bench import corpus  # noqa: E402
from photos import real_photos  # noqa: E402  (tests/photos.py)

CACHE = Path(os.environ.get("FASTLOAD_TEST_CORPUS", "/tmp/fastload-test-corpus"))


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def _corpus_dir(tmp_path_factory, name):
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        if os.access(CACHE, os.W_OK):
            return CACHE / name
    except OSError:
        pass
    return tmp_path_factory.mktemp(name)


@pytest.fixture(scope="session")
def imagenet_dir(tmp_path_factory):
    """ImageNet-like ImageFolder corpus: 4 classes x 12 images."""
    return corpus.make_imagenet_like(_corpus_dir(tmp_path_factory, "imagenet-c4-p12-s0"), classes=4, per_class=12)


@pytest.fixture(scope="session")
def hd_dir(tmp_path_factory):
    """1080p ImageFolder corpus: 6 images (one of them portrait)."""
    return corpus.make_hd(_corpus_dir(tmp_path_factory, "hd-n6-s0"), count=6)


@pytest.fixture(scope="session")
def kinds(tmp_path_factory):
    """{kind: path} with one JPEG per decoder path, see bench.corpus.KINDS."""
    return corpus.make_kinds(_corpus_dir(tmp_path_factory, "kinds"))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Every test gets its own FolderDataset scan cache: no test sees another's cached sizes, none writes ~/.cache."""
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "scan-cache"))


@pytest.fixture(scope="session")
def photos():
    """Real photos as JPEG with Pillow's full decode (photos.py)."""
    pytest.importorskip("skimage.data")
    return real_photos()
