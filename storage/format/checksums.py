"""Object checksums.

Objects: SHA-256: collision-resistant (a checksum that a corrupted or tampered object could
match by accident or design would defeat verification), hardware-accelerated in OpenSSL, and
what S3 itself offers as an additional checksum, so a value can be cross-checked against the
store without re-reading.

Row-group pieces (what a loader verifies on every read, every epoch): BLAKE3, as
collision-resistant and markedly cheaper per byte than SHA-256 (even with SHA-NI), whose
cost per token was more than a local-disk loader spent reading the bytes
(``benchmarks/checksums.py``; figures in benchmarks/README.md). Non-cryptographic checksums
(xxh3, crc32c) would be cheaper still, but
a piece digest is also what a replica's bytes are trusted by, and one that can be matched by
design would let a tampered replica feed chosen tokens to a trainer. The manifest names the
algorithm (``index.digest``); datasets written before carry SHA-256 prefixes and still load.
A piece key is its digest in hex, prefixed ``b3-`` for BLAKE3 (:func:`piece_key`), so a key
alone says how to verify the bytes it names (the local cache relies on that).
"""

from __future__ import annotations

import hashlib
from typing import IO

import blake3

#: the row-group piece digest of datasets written now; ``SHA256`` for older ones
PIECE_DIGEST = "blake3"
SHA256 = "sha256"
PIECE_ALGORITHMS = (SHA256, PIECE_DIGEST)
_B3 = "b3-"
_CHUNK = 4 * 1024 * 1024


def digest_bytes(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_stream(stream: IO[bytes]) -> str:
    h = hashlib.sha256()
    while chunk := stream.read(_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def blake3_hex(data: bytes | memoryview) -> str:
    """BLAKE3 of ``data`` (256 bits, hex), on the calling thread (readers already run one
    verification per read thread)."""
    return blake3.blake3(data).hexdigest()


def piece_digest(data: bytes | memoryview, algorithm: str = PIECE_DIGEST) -> str:
    """The full hex digest of a piece under ``algorithm`` (``blake3`` or ``sha256``)."""
    if algorithm == PIECE_DIGEST:
        return blake3_hex(data)
    if algorithm == SHA256:
        return hashlib.sha256(data).hexdigest()
    raise ValueError(f"unknown piece digest {algorithm!r}; expected one of {PIECE_ALGORITHMS}")


def piece_key(digest_hex: str, algorithm: str) -> str:
    """The key a piece is verified (and cached) by: its digest (or a prefix), tagged."""
    return _B3 + digest_hex if algorithm == PIECE_DIGEST else digest_hex


def piece_matches(key: str, data: bytes | memoryview) -> bool:
    """Does ``data`` hash to ``key`` (a :func:`piece_key`: prefix of the digest it names)?"""
    algorithm, want = (PIECE_DIGEST, key[len(_B3):]) if key.startswith(_B3) else (SHA256, key)
    return bool(want) and piece_digest(data, algorithm)[:len(want)] == want
