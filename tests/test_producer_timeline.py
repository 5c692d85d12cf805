"""bench.producer_timeline: the producers' time per batch by phase, which bench.train_profile --producer-times
prints inside a training loop (issue 18)."""
import numpy as np
import pytest
import torch

import fastload as fl
from bench.producer_timeline import PHASES, Timeline
from fastload import decoders, producer
from fastload.datasets import FolderDataset


def _timed(loader, batches):
    """The summary over ``batches`` batches, the loader closed inside (no batch half timed)."""
    with Timeline().installed(loader._maker) as timeline:
        it = iter(loader)
        for _ in range(batches):
            next(it)
        loader.close()
    return timeline.summary()


def _check(summary, workers, busy_phase):
    threads = {k: v for k, v in summary.items() if k.startswith("fastload-")}
    assert 1 <= len(threads) <= workers and sum(t["batches"] for t in threads.values()) >= 4
    for t in threads.values():
        assert set(PHASES) <= set(t) and all(t[p] >= 0 for p in PHASES)
        # a producer's phases follow one another: together they fit in the wall time (nothing counted twice)
        assert t[busy_phase] > 0 and sum(t[p] for p in PHASES) <= t["wall"] * 1.01


def test_the_cores_phase_is_the_decode_and_the_patches_are_undone(imagenet_dir):
    originals = (producer.Slot.wait_reusable, decoders.Cores.make, decoders.wait_for, producer.BatchMaker.make)
    loader = fl.FastLoader(FolderDataset(imagenet_dir), batch_size=4, crop=fl.RandomResizedCrop(64), threads=1,
                           workers=2)
    lock = loader._maker._hardware_lock
    summary = _timed(loader, 6)
    _check(summary, 2, "cores")
    assert summary["engines_busy"] == 0.0
    assert (producer.Slot.wait_reusable, decoders.Cores.make, decoders.wait_for, producer.BatchMaker.make) == originals
    assert loader._maker._hardware_lock is lock


@pytest.mark.cuda
def test_on_the_engines_the_lock_is_held_and_timed(imagenet_dir):
    if not fl.nvjpeg.available()[0]:
        pytest.skip("needs a GPU with a hardware JPEG decoder")
    loader = fl.FastLoader(FolderDataset(imagenet_dir), batch_size=4, crop=fl.RandomResizedCrop(64),
                           device="cuda", decoder="nvjpeg")
    summary = _timed(loader, 6)
    _check(summary, loader.workers, "submit")
    assert 0 < summary["engines_busy"] <= 1
    assert np.mean([t["sync"] for k, t in summary.items() if k.startswith("fastload-")]) > 0
