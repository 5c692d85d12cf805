"""Counter-based per-sample randomness: numbers that are a pure function of (seed, epoch, index, column).

A sample's crop must not depend on which batch, thread or worker handles it, nor on what was drawn before, so
there is no generator state at all: every number is a hash of its coordinates. The hash is SplitMix64's
finaliser (full 64-bit avalanche) chained over seed, stream, epoch and index, then SplitMix64's own counter
sequence over columns. Everything is vectorised numpy uint64 arithmetic (wrapping is what we want).
"""
import numpy as np

__all__ = ["uniforms", "bits", "derived_stream"]

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment (2^64 / golden ratio)
_K_EPOCH = 0xD1B54A32D192ED03
_K_INDEX = 0xAEF17502108EF2D9


def _mix_int(z):
    """SplitMix64 finaliser on a Python int (scalar keys: numpy scalars would warn on overflow)."""
    z &= _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _mix(z):
    """SplitMix64 finaliser on a uint64 array (wraps modulo 2^64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def derived_stream(stream, k):
    """A stream for the k-th private use of a transform's stream (its noise, a container's children): far above
    the small stream numbers Compose hands out, so it meets no other transform's draws. A stream already derived
    (a container inside another) gets a 64-bit hash of (stream, k) instead: shifting it again would wrap modulo
    2^64 once stream + 1 reaches 2^32, to the same stream for every outer one."""
    stream, k = int(stream), int(k)
    if stream < 1 << 31:
        return ((stream + 1) << 32) + k
    return _mix_int(_mix_int(stream) + k + 1)


def bits(seed, epoch, indices, n, stream=0):
    """uint64 [len(indices), n]: column j of row i is a hash of (seed, stream, epoch, indices[i], j).

    ``stream`` separates independent uses (crop draws vs. the sampler's shuffle keys) of the same coordinates.
    """
    key = _mix_int(_mix_int(int(seed) + _GOLDEN * (int(stream) + 1)) ^ ((int(epoch) * _K_EPOCH) & _MASK))
    idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1).view(np.uint64)
    with np.errstate(over="ignore"):
        state = _mix(np.uint64(key) ^ (idx * np.uint64(_K_INDEX)))  # one state per sample
        cols = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(_GOLDEN)  # SplitMix64's counter sequence
        return _mix(state[:, None] + cols[None, :])


def uniforms(seed, epoch, indices, n, stream=0):
    """float64 [len(indices), n] in [0, 1): the top 53 bits of ``bits``, so every value is exact and < 1."""
    return (bits(seed, epoch, indices, n, stream) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
