"""ShardedSampler and the counter-based RNG it and the crop planners draw from."""
import itertools
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from fastload import rng
from fastload.sampler import ShardedSampler, num_batches

SIZES = [0, 1, 2, 3, 5, 7, 16, 17, 100, 101, 1000, 1003]
WORLDS = [1, 2, 3, 4, 7, 8]


def shards(n, ws, **kw):
    return [ShardedSampler(n, rank=r, world_size=ws, **kw).epoch_indices(3) for r in range(ws)]


@pytest.mark.parametrize("n,ws", list(itertools.product(SIZES, WORLDS)))
def test_shards_pad(n, ws):
    parts = shards(n, ws, seed=5)
    assert {len(p) for p in parts} == {math.ceil(n / ws)}
    allidx = np.concatenate(parts)
    assert set(allidx.tolist()) == set(range(n))  # covers the dataset
    # disjoint apart from the padding: the wrap-around repeats samples as evenly as possible
    if n:
        counts = np.bincount(allidx, minlength=n)
        assert counts.min() >= 1 and counts.max() - counts.min() <= 1
        assert (counts > counts.min()).sum() == len(allidx) % n


@pytest.mark.parametrize("n,ws", list(itertools.product(SIZES, WORLDS)))
def test_shards_drop_last(n, ws):
    parts = shards(n, ws, seed=5, drop_last=True)
    assert {len(p) for p in parts} == {n // ws}
    allidx = np.concatenate(parts)
    assert len(set(allidx.tolist())) == len(allidx) == n // ws * ws  # disjoint
    assert set(allidx.tolist()) <= set(range(n))


@pytest.mark.parametrize("n,ws", list(itertools.product(SIZES, WORLDS)))
def test_shards_no_pad(n, ws):
    parts = shards(n, ws, seed=5, pad=False)
    lengths = [len(p) for p in parts]
    assert max(lengths) - min(lengths) <= 1
    assert lengths == [len(ShardedSampler(n, rank=r, world_size=ws, pad=False)) for r in range(ws)]
    allidx = np.concatenate(parts)
    assert sorted(allidx.tolist()) == list(range(n))  # disjoint and covering: every sample exactly once


def test_permutation_same_on_every_rank_and_depends_on_seed_and_epoch():
    perms = [ShardedSampler(500, rank=r, world_size=4, seed=1).permutation(2) for r in range(4)]
    assert all(np.array_equal(perms[0], p) for p in perms)
    assert sorted(perms[0].tolist()) == list(range(500))
    s = ShardedSampler(500, seed=1)
    assert not np.array_equal(s.permutation(2), s.permutation(3))
    assert not np.array_equal(s.permutation(2), ShardedSampler(500, seed=2).permutation(2))
    assert np.array_equal(ShardedSampler(500, shuffle=False).permutation(7), np.arange(500))


def test_iter_len_set_epoch():
    s = ShardedSampler(10, rank=1, world_size=3, seed=0)
    s.set_epoch(4)
    assert list(s) == s.epoch_indices(4).tolist() == list(s)  # re-iterating replays the epoch
    assert len(s) == 4 and s.epoch_indices().dtype == np.int64
    assert all(isinstance(i, int) for i in s)


def test_defaults_follow_torch_distributed(monkeypatch):
    assert (ShardedSampler(10).rank, ShardedSampler(10).world_size) == (0, 1)
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 2)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 4)
    s = ShardedSampler(10)
    assert (s.rank, s.world_size) == (2, 4)
    assert ShardedSampler(10, rank=1).rank == 1
    with pytest.raises(ValueError):
        ShardedSampler(10, rank=4, world_size=4)


def test_a_sampler_made_before_the_process_group_is_refused(monkeypatch):
    # Under torchrun (WORLD_SIZE set) without a process group yet: it would shard for one process
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="WORLD_SIZE=2 .* not initialised"):
        ShardedSampler(10)
    assert ShardedSampler(10, rank=1, world_size=2).rank == 1  # given explicitly: fine
    monkeypatch.delenv("WORLD_SIZE")
    # world_size= alone, no process group: every process would be rank 0 (DistributedSampler refuses it too)
    with pytest.raises(RuntimeError, match="world_size=2 without rank="):
        ShardedSampler(10, world_size=2)
    assert ShardedSampler(10, world_size=1).world_size == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    # Started otherwise (mp.spawn: no WORLD_SIZE), the group made after the sampler: refused when it iterates
    monkeypatch.delenv("WORLD_SIZE")
    s, explicit = ShardedSampler(10), ShardedSampler(10, rank=0, world_size=1)
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    with pytest.raises(RuntimeError, match="rank 0 of 1, but the process group is now rank 1 of 2"):
        list(s)
    assert len(list(explicit)) == 10


@pytest.mark.parametrize("kw", [{}, {"drop_last": True}, {"pad": False}, {"shuffle": False}])
def test_resume_mid_epoch_yields_exactly_the_rest(kw):
    s = ShardedSampler(103, rank=1, world_size=3, seed=9, **kw)
    s.set_epoch(2)
    full = list(s)
    it = iter(s)
    head = [next(it) for _ in range(17)]
    state = s.state_dict()
    assert state["consumed"] == 17 and state["epoch"] == 2

    fresh = ShardedSampler(103, rank=1, world_size=3, seed=0, **kw)  # seed comes from the checkpoint
    fresh.load_state_dict(state)
    fresh.set_epoch(2)  # a training loop re-selecting the same epoch must not lose the position
    rest = list(fresh)
    assert head + rest == full
    assert list(fresh) == full  # the resume offset applies once
    fresh.set_epoch(3)
    assert list(fresh) == fresh.epoch_indices(3).tolist()


def test_resume_from_loader_count_and_end_of_epoch():
    s = ShardedSampler(50, seed=1)
    full = list(s)  # the loader drew everything ahead, but the training loop got only 20
    fresh = ShardedSampler(50)
    fresh.load_state_dict(s.state_dict(consumed=20))
    assert list(fresh) == full[20:]
    end = ShardedSampler(50)
    end.load_state_dict(s.state_dict())  # saved after the epoch finished: nothing left of it
    assert list(end) == []
    end.set_epoch(1)
    assert len(list(end)) == 50


def test_resume_other_rank_and_validation():
    a = ShardedSampler(40, rank=0, world_size=4, seed=3)
    it = iter(a)
    [next(it) for _ in range(4)]
    state = a.state_dict()
    b = ShardedSampler(40, rank=2, world_size=4)
    b.load_state_dict(state)  # rank 0's checkpoint resumes rank 2 at the same position of its own shard
    assert list(b) == ShardedSampler(40, rank=2, world_size=4, seed=3).epoch_indices(0)[4:].tolist()
    for bad in [ShardedSampler(41, world_size=4, rank=0), ShardedSampler(40, world_size=2, rank=0),
                ShardedSampler(40, world_size=4, rank=0, drop_last=True)]:
        with pytest.raises(ValueError, match="cannot resume"):
            bad.load_state_dict(state)
    with pytest.raises(ValueError, match="consumed"):
        ShardedSampler(40, world_size=4, rank=0).load_state_dict({**state, "consumed": 11})


def test_num_batches():
    assert [num_batches(n, 4) for n in (0, 1, 4, 5, 8)] == [0, 1, 1, 2, 2]
    assert [num_batches(n, 4, drop_last=True) for n in (0, 1, 4, 5, 8)] == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError):
        num_batches(10, 0)


# ---------------------------------------------------------------- rng

def test_rng_golden_values():
    # Pinned so that a change of the hash (which would silently change every user's crops and shuffles for a
    # given seed) is deliberate.
    u = rng.uniforms(0, 0, np.array([0, 1, 2]), 2)
    np.testing.assert_array_equal(u, GOLDEN)


GOLDEN = np.array([[0.17541561601846456, 0.4732158221135335],
                   [0.3509653962300796, 0.9683549214593611],
                   [0.5607752782094467, 0.8940651202719736]])


def test_rng_pure_function_of_coordinates():
    idx = np.array([5, 900, 3, 2**40, 77], dtype=np.int64)
    u = rng.uniforms(11, 2, idx, 6)
    assert u.shape == (5, 6) and u.dtype == np.float64
    # the same index gives the same row whatever batch, order or thread it is computed in
    for i, k in enumerate(idx):
        np.testing.assert_array_equal(rng.uniforms(11, 2, np.array([k]), 6)[0], u[i])
    perm = np.array([4, 2, 0, 3, 1])
    np.testing.assert_array_equal(rng.uniforms(11, 2, idx[perm], 6), u[perm])
    with ThreadPoolExecutor(4) as ex:
        parts = list(ex.map(lambda k: rng.uniforms(11, 2, np.array([k]), 6), idx))
    np.testing.assert_array_equal(np.concatenate(parts), u)
    # fewer columns are a prefix of more columns
    np.testing.assert_array_equal(rng.uniforms(11, 2, idx, 3), u[:, :3])
    # every coordinate matters
    for other in (rng.uniforms(12, 2, idx, 6), rng.uniforms(11, 3, idx, 6), rng.uniforms(11, 2, idx + 1, 6),
                  rng.uniforms(11, 2, idx, 6, stream=1)):
        assert not np.any(other == u)
    assert np.all(rng.uniforms(-1, 2**70, idx, 2) >= 0)  # any Python int seed/epoch is accepted


def test_rng_uniformity():
    n = 200_000
    u = rng.uniforms(123, 4, np.arange(n), 4)
    assert u.min() >= 0.0 and u.max() < 1.0
    # Sample mean and variance of n uniforms have standard deviations sqrt(1/12/n) = 6.5e-4 and
    # sqrt((1/80 - 1/144)/n) = 1.7e-4; 6 sigma tolerances make a false failure impossible in practice while a
    # biased or badly mixed generator misses by far more.
    assert np.all(np.abs(u.mean(axis=0) - 0.5) < 6 * math.sqrt(1 / 12 / n))
    assert np.all(np.abs(u.var(axis=0) - 1 / 12) < 6 * math.sqrt((1 / 80 - 1 / 144) / n))
    # 100-bin histogram: chi-square with 99 degrees of freedom has mean 99, sd 14
    for col in u.T:
        counts = np.bincount((col * 100).astype(int), minlength=100)
        chi2 = ((counts - n / 100) ** 2 / (n / 100)).sum()
        assert chi2 < 99 + 6 * 14
    # neither columns nor neighbouring indices are correlated (sd of a correlation coefficient: 1/sqrt(n))
    c = np.corrcoef(np.concatenate([u[:-1], u[1:]], axis=1).T)
    assert np.abs(c - np.eye(8))[np.triu_indices(8, 1)].max() < 6 / math.sqrt(n)


# --- repeated augmentation (torchvision's RASampler) -------------------------------------------------------------

def rasampler_reference(order, repetitions, num_replicas, rank, keep):
    """torchvision references/classification/sampler.py, RASampler.__iter__, with the permutation given (theirs
    comes from torch.randperm) and the kept count given (theirs: floor(n // 256 * 256 / num_replicas))."""
    num_samples = math.ceil(len(order) * repetitions / num_replicas)
    total_size = num_samples * num_replicas
    indices = [ele for ele in order for _ in range(repetitions)]
    indices += indices[: (total_size - len(indices))]
    assert len(indices) == total_size
    indices = indices[rank:total_size:num_replicas]
    return indices[:keep]


@pytest.mark.parametrize("n,ws,reps", [(512, 1, 4), (512, 4, 4), (512, 8, 4), (768, 3, 3), (256, 2, 2)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_repeats_deal_samples_as_torchvision_rasampler(n, ws, reps, shuffle):
    # n a multiple of 256 and drop_last: torchvision's kept count floor(n // 256 * 256 / ws) is floor(n / ws), ours
    for rank in range(ws):
        s = ShardedSampler(n, rank=rank, world_size=ws, seed=9, shuffle=shuffle, drop_last=True, repeats=reps)
        expected = rasampler_reference(s.permutation(2).tolist(), reps, ws, rank, math.floor(n // 256 * 256 / ws))
        assert s.epoch_indices(2).tolist() == expected
        s.set_epoch(2)
        assert list(s) == expected


@pytest.mark.parametrize("n,ws,reps", [(1, 1, 4), (7, 1, 4), (17, 4, 4), (48, 4, 4), (101, 8, 4), (100, 3, 2),
                                       (5, 8, 3)])
def test_each_sample_comes_reps_times_over_the_ranks_each_copy_its_own_key(n, ws, reps):
    samplers = [ShardedSampler(n, rank=r, world_size=ws, seed=1, repeats=reps) for r in range(ws)]
    full = np.concatenate([s.epoch_keys(4, full=True) for s in samplers])
    # every copy of every sample once, plus the wrap-around padding to a multiple of the world size
    assert len(full) == math.ceil(n * reps / ws) * ws
    counts = np.bincount(full, minlength=n * reps)
    assert len(counts) == n * reps and counts.min() >= 1 and counts.sum() - n * reps == len(full) - n * reps
    assert (counts > 1).sum() == len(full) - n * reps
    per_sample = np.bincount(full % n, minlength=n)
    assert per_sample.min() >= reps
    for r, s in enumerate(samplers):
        kept = s.epoch_keys(4)
        assert len(s) == len(ShardedSampler(n, rank=r, world_size=ws)) == len(kept)  # epoch length kept
        assert np.array_equal(kept, s.epoch_keys(4, full=True)[:len(s)])  # the first ones, as RASampler keeps
        assert np.array_equal(s.epoch_indices(4), kept % n)
    if ws >= reps:  # a sample's copies go to different ranks: no rank holds two copies (before the padding)
        for s in samplers:
            own = s.epoch_keys(4, full=True)[:n * reps // ws] % n
            assert len(np.unique(own)) == len(own)


def test_repeats_one_is_the_plain_sampler():
    for ws in (1, 3):
        for r in range(ws):
            a = ShardedSampler(50, rank=r, world_size=ws, seed=2)
            b = ShardedSampler(50, rank=r, world_size=ws, seed=2, repeats=1)
            assert np.array_equal(a.epoch_indices(1), b.epoch_keys(1))
            assert np.array_equal(a.epoch_indices(1), b.epoch_indices(1))


def test_repeats_resume_and_checks():
    s = ShardedSampler(40, seed=3, repeats=4, world_size=2, rank=1)
    s.set_epoch(2)
    it = iter(s)
    head = [next(it) for _ in range(7)]
    state = s.state_dict()
    assert state["repeats"] == 4
    resumed = ShardedSampler(40, repeats=4, world_size=2, rank=1)
    resumed.load_state_dict(state)
    assert head + list(resumed) == s.epoch_indices(2).tolist()
    with pytest.raises(ValueError, match="repeats was 4 when saved, is 1 now"):
        ShardedSampler(40, world_size=2, rank=1).load_state_dict(state)
    with pytest.raises(ValueError, match="repeats"):
        ShardedSampler(40, repeats=0)
    with pytest.raises(ValueError, match="repeats"):
        ShardedSampler(40, repeats=2.0)
    with pytest.raises(ValueError, match="pad=False is for evaluation"):
        ShardedSampler(40, repeats=2, pad=False)
