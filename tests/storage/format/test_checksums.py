"""Piece checksums: BLAKE3 for datasets written now, SHA-256 for older ones; a key names its
algorithm, a prefix verifies, anything else does not."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.format.checksums import (
    PIECE_DIGEST,
    blake3_hex,
    piece_digest,
    piece_key,
    piece_matches,
)


def test_blake3_is_the_reference_function() -> None:
    # The published test vector of BLAKE3 for the empty input.
    assert blake3_hex(b"") == "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    assert PIECE_DIGEST == "blake3" and piece_digest(b"abc") == blake3_hex(b"abc")
    assert piece_digest(b"abc", "sha256") == hashlib.sha256(b"abc").hexdigest()
    with pytest.raises(ValueError, match="unknown piece digest 'md5'"):
        piece_digest(b"abc", "md5")


@given(st.binary(max_size=4096), st.integers(1, 64), st.sampled_from(["blake3", "sha256"]))
def test_a_key_verifies_its_bytes_and_only_those(data: bytes, width: int, algorithm: str
                                                 ) -> None:
    key = piece_key(piece_digest(data, algorithm)[:width], algorithm)
    assert key.startswith("b3-") == (algorithm == "blake3")
    assert piece_matches(key, data)
    assert piece_matches(key, memoryview(data))  # a mapped or fetched view, not a copy
    # Other bytes fail against a 128-bit prefix (what an index keeps) or more; a shorter
    # prefix is only a test of the prefix rule, and may collide by chance.
    key = piece_key(piece_digest(data, algorithm)[:max(width, 32)], algorithm)
    assert not piece_matches(key, data + b"\0")
    if data:
        assert not piece_matches(key, bytes([data[0] ^ 1]) + data[1:])
    other = "sha256" if algorithm == "blake3" else "blake3"
    # The same hex under the other algorithm's tag is a different claim, and fails.
    assert not piece_matches(piece_key(piece_digest(data, algorithm), other), data)


def test_an_empty_key_verifies_nothing() -> None:
    assert not piece_matches("", b"")
    assert not piece_matches("b3-", b"")
