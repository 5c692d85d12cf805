"""Per-epoch shuffling and sharding over ranks, resumable mid-epoch; repeated augmentation.

The permutation is a pure function of (seed, epoch): every rank computes the same one without communicating,
and a resumed run computes it again instead of storing it. Ranks take strided shards of it, as
torch.utils.data.DistributedSampler does.

Repeated augmentation (``repeats=r``, torchvision's RASampler): each sample of the permutation is repeated r times
in a row, the list is padded by wrapping around to a multiple of the world size and dealt out to the ranks as
above, so the r copies of a sample land on r different ranks (on one rank, r in a row, when world_size is 1); each
rank then keeps as many as it would without repeats (the epoch length is kept: an epoch covers about 1/r of the
dataset, r times). The copies must be augmented differently, so the sampler hands out *keys*: copy c of sample i
is key ``i + c * num_samples``; the loader reads sample ``key % num_samples`` and draws its randomness with the
key, so copy 0 draws exactly what it would without repeats and the others draw their own.
"""

import os

import numpy as np
import torch

from . import rng

__all__ = ["ShardedSampler", "num_batches"]

_SHUFFLE_STREAM = 0x5348  # keeps shuffle keys independent of the crop draws of the same (seed, epoch, index)


def num_batches(length, batch_size, drop_last=False):
    """Batches made from ``length`` samples: the last partial one is dropped or kept."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    return length // batch_size if drop_last else -(-length // batch_size)


def _dist_world():
    """(rank, world size) of the initialised default process group, or None."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return None


def _launched_world_size():
    """WORLD_SIZE as torchrun (or another launcher) set it for this process, else 1."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def world_size():
    """The initialised process group's world size, else the launcher's WORLD_SIZE (set before init), else 1."""
    world = _dist_world()
    return world[1] if world is not None else _launched_world_size()


def _dist_default(rank, world_size):
    if rank is None or world_size is None:
        initialised = _dist_world() is not None
        launched = _launched_world_size()
        if not initialised and launched > 1:
            # Each rank would take the whole dataset, in the same order and with the same draws (DistributedSampler
            # refuses to start without a process group, too).
            raise RuntimeError(f"this process is one of WORLD_SIZE={launched} (torchrun), but torch.distributed is "
                               f"not initialised: the shard comes from the process group, so build the loader after "
                               f"torch.distributed.init_process_group(), or pass rank= and world_size=")
        if not initialised and rank is None and world_size is not None and world_size > 1:
            # Every process would be rank 0, each taking the same shard (DistributedSampler refuses this too).
            raise RuntimeError(f"world_size={world_size} without rank=, and torch.distributed is not initialised: "
                               f"pass each process's rank= too, or build the loader after init_process_group()")
        if rank is None:
            rank = torch.distributed.get_rank() if initialised else 0
        if world_size is None:
            world_size = torch.distributed.get_world_size() if initialised else 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return int(rank), int(world_size)


class ShardedSampler(torch.utils.data.Sampler):
    """Indices of one rank's shard of a (seed, epoch)-shuffled dataset.

    pad=True (default): the permutation is extended by wrapping around so every rank gets ceil(n / world_size)
    indices (a few samples are seen twice per epoch, as with DistributedSampler). drop_last=True: the tail is
    dropped instead so every rank gets floor(n / world_size). pad=False: no padding, shard lengths differ by at
    most one and every sample is seen exactly once (evaluation). Shards are disjoint apart from the padding.

    repeats: repeated augmentation (module docstring). ``__iter__`` and ``epoch_indices`` give sample indices,
    ``epoch_keys`` the keys (index + copy * num_samples) a loader draws each copy's augmentation with. Unlike
    torchvision's RASampler, the kept length is not rounded down to a multiple of 256 samples first (which would
    empty a small dataset); it is len() without repeats, so pad and drop_last keep their meaning.
    """

    def __init__(self, num_samples, *, shuffle=True, seed=0, rank=None, world_size=None, drop_last=False, pad=True,
                 repeats=1):
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 1:
            raise ValueError(f"repeats must be a positive int, got {repeats!r}")
        if repeats > 1 and not pad:
            raise ValueError("repeats > 1 (repeated augmentation) is for training; pad=False is for evaluation, where "
                             "every sample must be seen exactly once")
        self.repeats = int(repeats)
        self.num_samples = int(num_samples)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.rank, self.world_size = _dist_default(rank, world_size)
        self._from_process_group = rank is None or world_size is None
        self.drop_last = bool(drop_last)
        self.pad = bool(pad)
        self.epoch = 0
        # A FastLoader's set_epoch (a weak method), which this sampler feeds: the loader then holds the position
        # (its state_dict has the sampler's), and the sampler's own state_dict / load_state_dict refuse.
        self.on_set_epoch = None
        self._consumed = 0  # indices of this epoch handed out so far (what state_dict records)
        self._resuming = False  # the next __iter__ starts at _consumed instead of 0

    def follow(self, epoch):
        """The owning loader's epoch (it holds the position): list(sampler) then gives the epoch's indices."""
        self.epoch, self._consumed, self._resuming = int(epoch), 0, False

    def check_world(self):
        """RuntimeError when the rank and world size this sampler took from torch.distributed (none given) are no
        longer the process group's: a sampler made before init_process_group shards for one process."""
        if not self._from_process_group:
            return
        world = _dist_world()
        if world is not None and world != (self.rank, self.world_size):
            raise RuntimeError(f"this shard is for rank {self.rank} of {self.world_size}, but the process group is now "
                               f"rank {world[0]} of {world[1]}: it was built before torch.distributed."
                               f"init_process_group(); build it after, or pass rank= and world_size=")

    def _owner(self):
        return self.on_set_epoch() if self.on_set_epoch is not None else None

    def _total(self):
        n, ws = self.num_samples, self.world_size
        if self.drop_last:
            return n // ws * ws
        return -(-n // ws) * ws if self.pad else n

    def __len__(self):
        total = self._total()
        if self.drop_last or self.pad:
            return total // self.world_size
        return len(range(self.rank, total, self.world_size))

    def set_epoch(self, epoch):
        """Selects the epoch's permutation. Re-selecting the current epoch keeps a pending resume position."""
        if epoch != self.epoch:
            self._consumed = 0
            self._resuming = False
        self.epoch = int(epoch)
        owner = self._owner()
        if owner is not None:
            owner(self.epoch)

    def permutation(self, epoch=None):
        """The whole dataset's order for an epoch (identical on every rank): argsort of per-index hash keys."""
        epoch = self.epoch if epoch is None else epoch
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        keys = rng.bits(self.seed, epoch, np.arange(self.num_samples, dtype=np.int64), 1, _SHUFFLE_STREAM)[:, 0]
        return np.argsort(keys, kind="stable").astype(np.int64)

    def epoch_keys(self, epoch=None, *, full=False):
        """This rank's keys for an epoch, int64 [len(self)]: sample indices, and with repeats the copy too (index +
        copy * num_samples). full=True: before the cut to len(self) (with repeats, ceil(n * repeats / world_size)
        keys, RASampler's per-rank list before it keeps the first ones; over all ranks every copy of every
        sample)."""
        order = self.permutation(epoch)
        if self.repeats > 1:  # RASampler: each sample's copies in a row, then padded and dealt out to the ranks
            n, ws = self.num_samples, self.world_size
            order = (order[:, None] + n * np.arange(self.repeats, dtype=np.int64)).reshape(-1)
            total = -(-len(order) // ws) * ws
        else:
            total = self._total()
        if total > len(order) and len(order):  # pad by wrapping around (several times when n < world_size)
            order = np.resize(order, total)
        shard = order[self.rank:total:self.world_size]
        return shard if full else shard[:len(self)]

    def epoch_indices(self, epoch=None):
        """This rank's sample indices for an epoch, int64 [len(self)] (with repeats, a sample may come several
        times)."""
        keys = self.epoch_keys(epoch)
        return keys % self.num_samples if self.repeats > 1 else keys

    def __iter__(self):
        self.check_world()
        indices = self.epoch_indices()
        start = self._consumed if self._resuming else 0
        self._resuming = False
        self._consumed = start
        for i in indices[start:].tolist():
            self._consumed += 1  # counted once handed out: a checkpoint taken now resumes after it
            yield i

    def state_dict(self, consumed=None):
        """Position to resume from. ``consumed`` overrides the count (a prefetching loader knows how many
        indices the training loop really received, which is fewer than it drew from the sampler)."""
        self._refuse_if_owned("state_dict")
        return self._state_dict(consumed)

    def _refuse_if_owned(self, what):
        if self._owner() is not None:
            raise RuntimeError(f"loader.sampler.{what}(): this sampler belongs to a FastLoader, which holds the "
                               f"position (the batches it has handed out, not the indices drawn ahead): use "
                               f"loader.{what}(), which includes the sampler's")

    def _state_dict(self, consumed=None):
        return {"epoch": self.epoch, "consumed": self._consumed if consumed is None else int(consumed),
                "seed": self.seed, "num_samples": self.num_samples, "world_size": self.world_size,
                "rank": self.rank, "shuffle": self.shuffle, "drop_last": self.drop_last, "pad": self.pad,
                "repeats": self.repeats}

    def load_state_dict(self, state):
        """Restores epoch, seed and position; the next ``__iter__`` yields exactly the indices still to come.

        The saved order is only meaningful for the same dataset size, world size and sharding options, so a change
        there is an error. The rank is not checked: with equal shard lengths every rank has consumed the same count,
        so rank 0's checkpoint is valid everywhere (pad=False is the exception; its shards may differ by one).
        """
        self._refuse_if_owned("load_state_dict")
        self._load_state_dict(state)

    def _check_state(self, state):
        """ValueError naming the first setting ``state`` was saved with that this sampler does not have."""
        for key in ("num_samples", "world_size", "shuffle", "drop_last", "pad", "repeats"):
            saved = state.get(key, 1 if key == "repeats" else getattr(self, key))  # states before repeats: 1
            if saved != getattr(self, key):
                raise ValueError(f"cannot resume: {key} was {saved} when saved, is {getattr(self, key)} now")

    def _load_state_dict(self, state):
        self._check_state(state)
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        consumed = int(state["consumed"])
        if not 0 <= consumed <= len(self):
            raise ValueError(f"cannot resume: consumed={consumed} outside 0..{len(self)}")
        self._consumed = consumed
        self._resuming = True
