"""Keyed random-access permutations of ``[0, n)``: pure NumPy over integers, no I/O.

:class:`Feistel` maps any index to its image (and back) without building the permutation: a
Feistel network over ``bits = ceil(log2 n)`` bits (two halves of ``bits // 2`` and the rest;
each round XORs one half with a keyed hash of the other, so every round, and the network, is a
bijection of ``[0, 2**bits)``) with *cycle-walking*: an image ``>= n`` is encrypted again until
it lands in ``[0, n)``, which restricts the bijection to ``[0, n)``. The domain is under
``2 n``, so a walk takes fewer than two steps on average. Images of a whole array are computed
at once (the walk continues only for the elements still outside), about 25 ns per element.

:func:`hash32` is the keyed hash used for within-window shuffle keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
ROUNDS = 4


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64's finaliser of ``x + key`` (uint64 in, uint64 out, wraps silently)."""
    z = x + key
    z ^= z >> _S30
    z *= _C1
    z ^= z >> _S27
    z *= _C2
    z ^= z >> _S31
    return z


def _keys(key: Sequence[int], count: int) -> np.ndarray:
    return np.random.SeedSequence([int(k) for k in key]).generate_state(count, np.uint64)


def hash32(values: np.ndarray, key: Sequence[int]) -> np.ndarray:
    """A keyed 32-bit hash of each value (uint64 result below ``2**32``)."""
    k = _keys(key, 1)[0]
    return _mix(np.asarray(values, dtype=np.uint64), k) >> np.uint64(32)


class Feistel:
    """A keyed bijection of ``[0, n)`` with random access in both directions."""

    def __init__(self, n: int, key: Sequence[int], rounds: int = ROUNDS) -> None:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self.n = int(n)
        bits = max(2, (self.n - 1).bit_length())
        self._lo_bits = bits // 2
        self._hi_bits = bits - self._lo_bits
        self._lo_mask = np.uint64((1 << self._lo_bits) - 1)
        self._hi_mask = np.uint64((1 << self._hi_bits) - 1)
        self._shift = np.uint64(self._lo_bits)
        self._round_keys = [np.uint64(k) for k in _keys(key, rounds)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        hi, lo = x >> self._shift, x & self._lo_mask
        for r, k in enumerate(self._round_keys):
            if r % 2 == 0:
                hi ^= _mix(lo, k) & self._hi_mask
            else:
                lo ^= _mix(hi, k) & self._lo_mask
        return (hi << self._shift) | lo

    def _decrypt(self, x: np.ndarray) -> np.ndarray:
        hi, lo = x >> self._shift, x & self._lo_mask
        for r in reversed(range(len(self._round_keys))):
            k = self._round_keys[r]
            if r % 2 == 0:
                hi ^= _mix(lo, k) & self._hi_mask
            else:
                lo ^= _mix(hi, k) & self._lo_mask
        return (hi << self._shift) | lo

    def _walk(self, index: np.ndarray | int, step) -> np.ndarray:  # type: ignore[no-untyped-def]
        given = np.asarray(index, dtype=np.int64)
        x = given.reshape(-1)
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise IndexError(f"index outside [0, {self.n})")
        if self.n <= 1:
            return given.copy()
        out = step(x.astype(np.uint64))
        todo = np.flatnonzero(out >= np.uint64(self.n))
        while todo.size:
            out[todo] = step(out[todo])
            todo = todo[out[todo] >= np.uint64(self.n)]
        return out.astype(np.int64).reshape(given.shape)

    def __call__(self, index: np.ndarray | int) -> np.ndarray:
        """The image of each index."""
        return self._walk(index, self._encrypt)

    def inverse(self, image: np.ndarray | int) -> np.ndarray:
        """The index whose image is each value: ``inverse(self(i)) == i``."""
        return self._walk(image, self._decrypt)
