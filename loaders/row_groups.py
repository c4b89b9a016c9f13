"""Where the row groups are: per-row-group arrays for the plan and the reads, for either
manifest format.

- The plan needs tokens per row group only: ``RowGroupIndex.open`` reads the index's
  ``tokens`` and ``first_group`` columns (4 bytes per row group, plus 8 per shard), verified
  against the manifest, through the local cache when one is set, once per rank.
- The reads need where each row group's token column chunk is (``offset``, ``length``) and its
  checksum (``digest``: the first 16 bytes of its BLAKE3, or SHA-256 in older datasets), and
  each shard's path, size, footer and (``shard_codec``, in indexes written since) the codec
  that lets its chunks decode without the footer: :meth:`RowGroupIndex.locations` reads those
  columns on the first read, once per process (a DataLoader worker inherits them when they
  were read before it was started); an index small enough to come in one GET
  (``WHOLE_OBJECT_BYTES``) gives them at once, from the same bytes as the plan's.

A ``shardflow.dataset/1`` manifest lists the same facts inline; they are turned into the same
arrays (through :func:`storage.format.index.build_index`), so the reader has one code path. Nothing
here holds a Python object per row group.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from infra.process.local import ProcessLocal
from loaders import shared_index
from storage import Manifest, ManifestError, ReplicaSet, tokens
from storage.format.checksums import SHA256, piece_key
from storage.format.chunk_footer import NO_CODEC
from storage.format.index import (
    DIGEST_BYTES,
    LOADER_OPTIONAL_COLUMNS,
    LOADER_PLAN_COLUMNS,
    LOADER_READ_COLUMNS,
    build_index,
    check_counts,
    digest_algorithm,
    digest_hex,
    read_index,
    shard_paths,
)
from storage.io.index_store import WHOLE_OBJECT_BYTES, PieceCache, fetch_columns


@dataclass(frozen=True)
class Locations:
    """Byte ranges and checksums: per row group ``offset``/``length``/``digest``; per shard
    ``paths``, ``shard_bytes``, ``footer_length``, ``footer_sha256`` and ``shard_sha256``
    (V32; the local cache names a shard's row groups by it)."""

    offset: np.ndarray
    length: np.ndarray
    digest: np.ndarray  # V16: a truncated BLAKE3 (or SHA-256) per row group
    paths: list[str]
    shard_bytes: np.ndarray
    footer_length: np.ndarray
    footer_sha256: np.ndarray
    shard_sha256: np.ndarray
    #: what ``digest`` holds: ``blake3`` or ``sha256`` prefixes (``storage.format.checksums``)
    algorithm: str = SHA256
    #: per shard, the Parquet codec of its token chunks when they decode without the footer
    #: (``storage.format.chunk_footer``; 255: read the footer); ``None``: an older index
    codec: np.ndarray | None = None

    @classmethod
    def from_columns(cls, cols: dict[str, np.ndarray], algorithm: str = SHA256) -> Locations:
        return cls(cols["offset"], cols["length"], cols["digest"], shard_paths(cols),
                   cols["shard_bytes"], cols["footer_length"], cols["footer_sha256"],
                   cols["shard_sha256"], algorithm, cols.get("shard_codec"))

    def codec_of(self, shard: int) -> int | None:
        """The codec shard ``shard``'s token chunks decode with, footer-free; ``None``: read
        its footer (not recorded)."""
        if self.codec is None or int(self.codec[shard]) == NO_CODEC:
            return None
        return int(self.codec[shard])

    def piece(self, g: int) -> tuple[int, int, str]:
        """Row group ``g``'s token column chunk: ``(start, end, key)``; a piece is verified by
        ``storage.format.checksums.piece_matches(key, bytes)`` (the key names the algorithm)."""
        start = int(self.offset[g])
        return start, start + int(self.length[g]), piece_key(digest_hex(self.digest, g),
                                                             self.algorithm)

    def footer(self, shard: int) -> tuple[int, int, str]:
        """Shard ``shard``'s footer: ``(start, end, sha256 hex)``; ``(0, 0, "")`` when the
        dataset predates recorded footers."""
        size, length = int(self.shard_bytes[shard]), int(self.footer_length[shard])
        if not length:
            return 0, 0, ""
        return size - length, size, digest_hex(self.footer_sha256, shard)


class ShardOf:
    """Row group -> its shard, looked up in ``first_group`` (per shard, ``S + 1``): an int
    for an int, an array for an array; nothing stored per row group."""

    def __init__(self, first_group: np.ndarray) -> None:
        self.first_group = first_group

    def __len__(self) -> int:
        return int(self.first_group[-1]) if len(self.first_group) else 0

    def __getitem__(self, g):  # type: ignore[no-untyped-def]
        if isinstance(g, (int, np.integer)):
            n = len(self)
            if not -n <= g < n:
                raise IndexError(f"row group {g} outside [0, {n})")
            return int(np.searchsorted(self.first_group, g % n, side="right")) - 1
        g = np.asarray(g, dtype=np.int64)
        return np.searchsorted(self.first_group, g, side="right") - 1


class GroupOf(ShardOf):
    """Row group -> its number inside its shard."""

    def __getitem__(self, g):  # type: ignore[no-untyped-def]
        shard = super().__getitem__(g)
        if isinstance(shard, int):
            return int(g) % len(self) - int(self.first_group[shard])
        return np.asarray(g, dtype=np.int64) - self.first_group[shard]


class RowGroupIndex(ProcessLocal):
    """Where every row group starts in the global token stream, and (on first use) where its
    bytes are. Picklable: a DataLoader worker gets the arrays already read.

    Per row group it holds one array, ``starts`` (int64, ``n + 1``: the token stream's
    offsets; a large index maps it from the host's shared copy); shards are found from
    ``first_group`` (per shard) by :class:`ShardOf` and :class:`GroupOf`."""

    _process_local = {"_lock": threading.Lock}

    def __init__(self, group_tokens: np.ndarray, first_group: np.ndarray, encoding: str,
                 locations: Locations | None = None, manifest: Manifest | None = None,
                 cache: PieceCache | None = None,
                 arrays: dict[str, np.ndarray] | None = None) -> None:
        a = arrays if arrays is not None else self.arrays(group_tokens, first_group)
        self.starts, self.first_group = a["starts"], a["first_group"]
        self.shard_of, self.group_of = ShardOf(self.first_group), GroupOf(self.first_group)
        #: how ``input_ids`` is encoded (checked here, so a bad manifest fails before any read)
        self.encoding = encoding
        tokens.dtype_of(self.encoding)
        self.total_tokens = int(self.starts[-1])
        self._locations = locations
        self._manifest = manifest  # v2: where the location columns are read from
        self._cache = cache
        self._lock = threading.Lock()

    @staticmethod
    def arrays(group_tokens: np.ndarray, first_group: np.ndarray) -> dict[str, np.ndarray]:
        """The arrays from the index's ``tokens`` and ``first_group``: ``starts`` (exclusive
        prefix sums of the tokens, ``n + 1``) and ``first_group`` as int64."""
        group_tokens = np.asarray(group_tokens)
        starts = np.empty(len(group_tokens) + 1, dtype=np.int64)
        starts[0] = 0
        np.cumsum(group_tokens, dtype=np.int64, out=starts[1:])
        return {"starts": starts, "first_group": np.asarray(first_group, dtype=np.int64)}

    def group_tokens(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Tokens of row groups ``lo .. hi - 1`` (int64), from ``starts``."""
        hi = len(self) if hi is None else hi
        return np.diff(self.starts[lo:hi + 1])

    @classmethod
    def open(cls, store: ReplicaSet, manifest: Manifest,
             cache: PieceCache | None = None, shared_dir: str | None = None) -> RowGroupIndex:
        """From a v2 manifest's index (the plan's columns now, the rest on first read) or a
        v1 manifest's inline shards. ``shared_dir``: a large index's arrays are mapped from
        this host's copy there (:mod:`loaders.shared_index`), built from the store once."""
        encoding = manifest.schema.get("input_ids", tokens.LEGACY_LIST)
        if manifest.index is None:
            digest = digest_algorithm(manifest.shards)
            cols = read_index(build_index(manifest.shards, digest))
            return cls(cols["tokens"], cols["first_group"], encoding,
                       Locations.from_columns(cols, digest))
        ref = manifest.index
        share = shared_dir is not None and ref.bytes >= shared_index.MIN_INDEX_BYTES
        if ref.bytes <= WHOLE_OBJECT_BYTES and not share:
            # A small index comes in one GET whatever the columns: the read columns are taken
            # now from the same bytes (one round trip to the store fewer before a first batch).
            names = list(dict.fromkeys((*LOADER_PLAN_COLUMNS, *LOADER_READ_COLUMNS)))
            cols = fetch_columns(store, ref, names, cache, LOADER_OPTIONAL_COLUMNS)
            check_counts(manifest, cols)
            index = cls(cols["tokens"], cols["first_group"], encoding, None, manifest, cache)
            index._locations = index._checked_locations(cols)
            return index

        def build() -> dict[str, np.ndarray]:
            cols = fetch_columns(store, ref, LOADER_PLAN_COLUMNS, cache)
            check_counts(manifest, cols)
            return cls.arrays(cols["tokens"], cols["first_group"])

        if share:
            assert shared_dir is not None
            t = manifest.counts  # a copy of any other index's arrays fails these
            arrays = shared_index.shared_arrays(
                shared_dir, f"{ref.sha256[:16]}-starts", build,
                shared_index.expect({"starts": t.row_groups + 1, "first_group": t.shards + 1},
                                    {"starts": t.tokens, "first_group": t.row_groups}))
        else:
            arrays = build()
        return cls(None, None, encoding, None, manifest, cache, arrays)  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.starts) - 1

    def locations(self, store: ReplicaSet) -> Locations:
        """The read columns, read (once) from the index on first use."""
        if self._locations is None:
            with self._lock:
                if self._locations is None:
                    m = self._manifest
                    assert m is not None and m.index is not None
                    cols = fetch_columns(store, m.index, LOADER_READ_COLUMNS, self._cache,
                                         LOADER_OPTIONAL_COLUMNS)
                    self._locations = self._checked_locations(cols)
        return self._locations

    def _checked_locations(self, cols: dict[str, np.ndarray]) -> Locations:
        m = self._manifest
        assert m is not None and m.index is not None
        n = len(self)
        s = len(self.first_group) - 1
        if (len(cols["offset"]) != n or len(cols["digest"]) != n
                or cols["digest"].dtype.itemsize != DIGEST_BYTES
                or len(cols["shard_bytes"]) < s
                or len(cols.get("shard_codec", cols["shard_bytes"])) < s):
            raise ManifestError(f"{m.index.path}: location columns do not match the row groups")
        return Locations.from_columns(cols, m.index.digest)

