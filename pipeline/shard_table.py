"""Phase 2's shard records as the driver keeps them: compact per-partition arrays, not
``ShardInfo`` objects.

A ``ShardInfo`` and its ``RowGroupInfo`` objects hold ~510 bytes per row group in the driver
(four ints and two hex digests as Python objects; measured with ``tracemalloc``): at 100 TB of
text (~25 T tokens, ~95 M row groups of 262,144 tokens) ~48 GB, held until the index was
written. Each result is folded in as it arrives (a fresh task's, or a rerun's marker) into one
NumPy record per row group (52 bytes: rows, tokens and length as uint32, offset as uint64, the
first 16 bytes of its BLAKE3 and of its SHA-256) and a tuple per shard, and the index's
columns are made from them at the end, in partition order: the same columns, hence the same
bytes, as :func:`storage.format.index.build_index` of the ``ShardInfo`` objects
(``tests/pipeline/test_shard_table.py``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from storage import ShardInfo
from storage.format.checksums import PIECE_DIGEST, SHA256
from storage.format.chunk_footer import CODECS, NO_CODEC
from storage.format.index import DIGEST_BYTES, ShardFields, raw_digest
from storage.format.manifest import Totals

#: one row group as the driver keeps it
GROUP = np.dtype([("rows", "<u4"), ("tokens", "<u4"), ("length", "<u4"), ("offset", "<u8"),
                  ("blake3", f"V{DIGEST_BYTES}"), ("sha256", f"V{DIGEST_BYTES}")])


class _Shard(NamedTuple):
    path: bytes
    rows: int
    tokens: int
    bytes: int
    sha256: bytes
    footer_length: int
    footer_sha256: bytes
    codec: int
    all_blake3: bool  # every row group has a BLAKE3 (else the index keeps SHA-256s)
    groups: np.ndarray  # GROUP records


class ShardTable:
    """The shards of a run by partition index (a partition without rows has none)."""

    def __init__(self) -> None:
        self._shards: dict[int, _Shard] = {}

    def __len__(self) -> int:
        return len(self._shards)

    def add(self, index: int, shard: ShardInfo) -> None:
        """Fold in partition ``index``'s shard (the object can be dropped after)."""
        gs = shard.row_groups
        groups = np.zeros(len(gs), dtype=GROUP)
        for name in ("rows", "tokens", "length", "offset"):
            values = [getattr(g, name) for g in gs]
            if name != "offset" and values and max(values) >= 1 << 32:
                raise ValueError(f"{shard.path}: a row group's {name} does not fit in 32 bits")
            groups[name] = values
        for name in ("blake3", "sha256"):
            raw = b"".join(raw_digest(getattr(g, name), DIGEST_BYTES) for g in gs)
            groups[name] = np.frombuffer(raw, dtype=f"V{DIGEST_BYTES}")
        self._shards[index] = _Shard(
            shard.path.encode(), shard.rows, shard.tokens, shard.bytes,
            raw_digest(shard.sha256, 32), shard.footer_length,
            raw_digest(shard.footer_sha256, 32), CODECS.get(shard.codec, NO_CODEC),
            all(g.blake3 for g in shard.row_groups), groups)

    def discard(self, index: int) -> None:
        self._shards.pop(index, None)

    def _ordered(self) -> list[_Shard]:
        return [self._shards[i] for i in sorted(self._shards)]

    def totals(self) -> Totals:
        shards = self._shards.values()
        return Totals(len(self._shards), sum(len(s.groups) for s in shards),
                      sum(s.rows for s in shards), sum(s.tokens for s in shards),
                      sum(s.bytes for s in shards))

    def digest_algorithm(self) -> str:
        """BLAKE3 when every row group has one, else SHA-256
        (:func:`storage.format.index.digest_algorithm`)."""
        shards = self._shards.values()
        has_groups = any(len(s.groups) for s in shards)
        return PIECE_DIGEST if has_groups and all(s.all_blake3 for s in shards) else SHA256

    def columns(self) -> dict[str, np.ndarray]:
        """The index's columns, shards in partition order."""
        shards = self._ordered()
        digest = "blake3" if self.digest_algorithm() == PIECE_DIGEST else "sha256"

        def field(name: str) -> np.ndarray:
            """One field of every row group, in order, as its own array (no copy of the whole
            records first)."""
            parts = [s.groups[name] for s in shards] or [np.zeros(0, dtype=GROUP)[name]]
            return np.concatenate(parts)

        fields = ShardFields([s.path for s in shards], [len(s.groups) for s in shards],
                             [s.rows for s in shards], [s.tokens for s in shards],
                             [s.bytes for s in shards], [s.sha256 for s in shards],
                             [s.footer_length for s in shards],
                             [s.footer_sha256 for s in shards], [s.codec for s in shards])
        return {
            # in the index's own dtypes (GROUP_COLUMNS), so writing it copies them once more
            "rows": field("rows"), "tokens": field("tokens"), "offset": field("offset"),
            "length": field("length"), "digest": field(digest), **fields.columns(),
        }
