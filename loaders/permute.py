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
#: Round functions are tabulated when a half has at most this many bits (domains up to 2**32,
#: 4 tables of at most 64 Ki int64): a round is then one gather from a table that stays in
#: cache instead of a dozen passes of 64-bit arithmetic, ~4x faster for the same values.
TABLE_BITS = 16


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64's finaliser of ``x + key`` (uint64 in, uint64 out, wraps silently)."""
    z = x + key
    z ^= z >> _S30
    z *= _C1
    z ^= z >> _S27
    z *= _C2
    z ^= z >> _S31
    return z


_M32 = 0xFFFF_FFFF
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R, _POOL = 0xCA01F9DD, 0x4973F715, 4


def seed_state(key: Sequence[int], count: int) -> list[int]:
    """``np.random.SeedSequence(key).generate_state(count, np.uint64)`` as Python ints, in
    pure Python: NumPy's published seeding algorithm (its ``hashmix``/``mix`` over a pool of
    4 words), without importing ``numpy.random`` (~10 ms of a process's first batch).
    ``key``: non-negative ints, each taken as its 32-bit words, least significant first."""
    words: list[int] = []
    for k in key:
        k = int(k)
        if k < 0:
            raise ValueError(f"key values must be non-negative, got {k}")
        words.append(k & _M32)
        k >>= 32
        while k:
            words.append(k & _M32)
            k >>= 32
    const = _INIT_A

    def hashmix(value: int) -> int:
        nonlocal const
        value ^= const
        const = (const * _MULT_A) & _M32
        value = (value * const) & _M32
        return value ^ (value >> 16)

    def mix(x: int, y: int) -> int:
        r = (_MIX_L * x - _MIX_R * y) & _M32
        return r ^ (r >> 16)

    pool = [hashmix(words[i] if i < len(words) else 0) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for w in words[_POOL:]:
        for dst in range(_POOL):
            pool[dst] = mix(pool[dst], hashmix(w))
    const, state = _INIT_B, []
    for i in range(2 * count):
        value = pool[i % _POOL] ^ const
        const = (const * _MULT_B) & _M32
        value = (value * const) & _M32
        state.append(value ^ (value >> 16))
    return [state[2 * i] | state[2 * i + 1] << 32 for i in range(count)]


def _keys(key: Sequence[int], count: int) -> np.ndarray:
    return np.array(seed_state(key, count), dtype=np.uint64)


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
        #: round functions as lookup tables (``None``: computed per element): the same values
        self._tables: list[np.ndarray] | None = None
        if self._hi_bits <= TABLE_BITS:
            self._tables = [
                (_mix(np.arange(1 << (self._lo_bits if r % 2 == 0 else self._hi_bits),
                                dtype=np.uint64), k)
                 & (self._hi_mask if r % 2 == 0 else self._lo_mask)).astype(np.int64)
                for r, k in enumerate(self._round_keys)]

    def _encrypt_tables(self, x: np.ndarray) -> np.ndarray:
        """:meth:`_encrypt` of int64 values from the round tables."""
        assert self._tables is not None
        shift = self._lo_bits
        hi, lo = x >> shift, x & int(self._lo_mask)
        for r, table in enumerate(self._tables):
            if r % 2 == 0:
                hi ^= table[lo]
            else:
                lo ^= table[hi]
        hi <<= shift
        hi |= lo
        return hi

    def _decrypt_tables(self, x: np.ndarray) -> np.ndarray:
        assert self._tables is not None
        shift = self._lo_bits
        hi, lo = x >> shift, x & int(self._lo_mask)
        for r in reversed(range(len(self._tables))):
            if r % 2 == 0:
                hi ^= self._tables[r][lo]
            else:
                lo ^= self._tables[r][hi]
        hi <<= shift
        hi |= lo
        return hi

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

    def _walk(self, index: np.ndarray | int, step,  # type: ignore[no-untyped-def]
              tables: bool) -> np.ndarray:
        given = np.asarray(index, dtype=np.int64)
        x = given.reshape(-1)
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise IndexError(f"index outside [0, {self.n})")
        if self.n <= 1:
            return given.copy()
        out = step(x if tables else x.astype(np.uint64))  # a step never writes its input
        n = self.n if tables else np.uint64(self.n)
        todo = np.flatnonzero(out >= n)
        while todo.size:
            out[todo] = step(out[todo])
            todo = todo[out[todo] >= n]
        return (out if tables else out.astype(np.int64)).reshape(given.shape)

    def __call__(self, index: np.ndarray | int) -> np.ndarray:
        """The image of each index."""
        if self._tables is not None:
            return self._walk(index, self._encrypt_tables, True)
        return self._walk(index, self._encrypt, False)

    def inverse(self, image: np.ndarray | int) -> np.ndarray:
        """The index whose image is each value: ``inverse(self(i)) == i``."""
        if self._tables is not None:
            return self._walk(image, self._decrypt_tables, True)
        return self._walk(image, self._decrypt, False)

    def reference(self, index: np.ndarray | int, inverse: bool = False) -> np.ndarray:
        """:meth:`__call__` (or :meth:`inverse`) without the round tables, in 64-bit
        arithmetic per element: the definition the tables are tested against."""
        return self._walk(index, self._decrypt if inverse else self._encrypt, False)


class RunPermutation:
    """A keyed permutation of ``[0, n)`` that moves runs of ``run`` consecutive values as one:
    index ``i`` maps to ``F(i // run) * run + i % run``, ``F`` a :class:`Feistel` over the
    ``ceil(n / run)`` runs.

    Why: a rank reads the blocks (row groups) of its positions in order, and a block's
    neighbours in the stream are the neighbours in its shard. Permuted one by one, a rank's
    next blocks lie in other shards once the dataset is much larger than its read-ahead, so
    every block is a request of its own (~0.5 MB at the default row-group size); permuted in
    runs, ``run`` neighbours are read with one request at any dataset size. The domain is
    padded to whole runs: ``n`` (the padded size) is a multiple of ``run``, and images
    ``>= blocks`` (the last run's missing members) are slots with no block, which a caller
    skips.
    """

    def __init__(self, blocks: int, run: int, key: Sequence[int]) -> None:
        if run < 1:
            raise ValueError(f"run must be >= 1, got {run}")
        self.blocks, self.run = int(blocks), int(run)
        self.runs = -(-self.blocks // self.run)
        self.n = self.runs * self.run
        self._runs = Feistel(self.runs, key)

    def __call__(self, index: np.ndarray | int) -> np.ndarray:
        """The image of each index of the padded domain ``[0, n)``."""
        idx = np.asarray(index, dtype=np.int64)
        return self._runs(idx // self.run) * self.run + idx % self.run

    def inverse(self, image: np.ndarray | int) -> np.ndarray:
        """The index whose image is each value: ``inverse(self(i)) == i``."""
        img = np.asarray(image, dtype=np.int64)
        return self._runs.inverse(img // self.run) * self.run + img % self.run
