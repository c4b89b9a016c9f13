"""Dedup keys of documents: content hashes and MinHash LSH band hashes, as NumPy records."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence

import numpy as np

KIND_EXACT = 0
KIND_NEAR = 1
#: one key of one document: 128-bit key, where the document is, and what kind of key it is
ENTRY = np.dtype([("k0", "<u8"), ("k1", "<u8"), ("part", "<u4"), ("pos", "<u4"),
                  ("kind", "u1")])
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def content_key(text: str) -> bytes:
    """16 bytes of BLAKE2b over the UTF-8 text: collisions are out of reach at any scale."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


class MinHasher:
    """MinHash signatures over word shingles, cut into LSH bands.

    Two documents with Jaccard similarity ``s`` share at least one band with probability
    ``1 - (1 - s**rows)**bands``: the defaults' 21 bands of 5 rows put the 50% point near
    s = 0.54, so that pairs at the 0.7 threshold are nearly all (98 %) candidates; those are
    then verified on the whole signature (:mod:`pipeline.dedup.verify`), whose ``perms`` values
    may outnumber the bands' ``bands x rows`` (``rows`` 0: ``perms // bands``). The
    permutations come from a fixed seed, so every worker computes the same signatures.

    Each permutation is a multiply-add-shift hash of the 32-bit shingle hash, the high 32 bits
    of ``a x + b`` mod 2**64 with ``a`` odd (Dietzfelbinger's universal family), without the
    modulo by a Mersenne prime used before (that step took 2.7x as long with it; precision
    and recall on ``benchmarks/near_dup_quality.py``'s corpus the same over 4 seeds).
    """

    def __init__(self, perms: int = 256, bands: int = 21, shingle_words: int = 5,
                 seed: int = 1, rows: int = 5) -> None:
        rows = rows or perms // max(1, bands)
        if bands < 1 or rows < 1 or bands * rows > perms:
            raise ValueError(f"minhash: {bands} bands x {rows} rows need at least that many "
                             f"permutations, not {perms}")
        rng = np.random.default_rng(seed)
        self.a = rng.integers(0, 1 << 64, size=perms, dtype=np.uint64) | np.uint64(1)
        self.b = rng.integers(0, 1 << 64, size=perms, dtype=np.uint64)
        self.perms, self.bands, self.rows, self.k = perms, bands, rows, shingle_words

    def signature(self, text: str) -> np.ndarray:
        words = text.lower().split() or [""]
        wh = np.fromiter((zlib.crc32(w.encode("utf-8")) for w in words), dtype=np.uint64,
                         count=len(words))
        k = min(self.k, len(words))
        # shingle hash: a polynomial of its word hashes (vectorised over all shingles)
        sh = np.zeros(len(words) - k + 1, dtype=np.uint64)
        for j in range(k):
            sh = sh * np.uint64(1000003) + wh[j:len(words) - k + 1 + j]
        sh &= _MASK32
        with np.errstate(over="ignore"):  # wraps mod 2**64, as meant
            ph = (sh[:, None] * self.a[None, :] + self.b[None, :]) >> _SHIFT32
        return ph.min(axis=0)

    def bands_of(self, sig: np.ndarray) -> list[bytes]:
        """The LSH band keys of a signature: 16 bytes per band of ``rows`` values."""
        sig = sig.astype("<u4")
        return [hashlib.blake2b(sig[i * self.rows:(i + 1) * self.rows].tobytes(),
                                digest_size=16, salt=i.to_bytes(2, "little")).digest()
                for i in range(self.bands)]

    def band_keys(self, text: str) -> list[bytes]:
        return self.bands_of(self.signature(text))

    def keys_and_sketch(self, text: str) -> tuple[list[bytes], np.ndarray]:
        """Band keys and the compact signature (:func:`sketch`) of one document."""
        sig = self.signature(text)
        return self.bands_of(sig), sketch(sig)


def sketch(sig: np.ndarray) -> np.ndarray:
    """A signature kept for verification: the low 8 bits of each MinHash value (b-bit
    MinHash), ``perms`` bytes a document. Two documents' values agree with probability
    ``J + (1 - J) / 256`` (:func:`pipeline.dedup.verify.min_matches` corrects for it)."""
    return (sig & np.uint64(0xFF)).astype(np.uint8)


def entries(keys: Sequence[bytes], positions: Sequence[int], kinds: Sequence[int],
            part: int = 0) -> np.ndarray:
    """Pack ``(key, position, kind)`` triples into an ``ENTRY`` array."""
    out = np.zeros(len(keys), dtype=ENTRY)
    if keys:
        raw = np.frombuffer(b"".join(keys), dtype="<u8").reshape(-1, 2)
        out["k0"], out["k1"] = raw[:, 0], raw[:, 1]
        out["pos"] = np.asarray(positions, dtype=np.uint32)
        out["kind"] = np.asarray(kinds, dtype=np.uint8)
    out["part"] = part
    return out
