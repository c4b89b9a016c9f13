"""Token reads: global token ranges -> row groups of Parquet shards -> NumPy arrays.

The manifest's per-row-group token counts map any token offset to (shard, row group) without
opening a file. A row group is fetched as exactly one ranged GET of its token column chunk,
through ``storage``'s replica set (failover, back-off), and checked against the manifest's
sha256 before it is decoded; the shard's footer is fetched and checked once per reader. A small
LRU of decoded row groups serves the consecutive samples of a block from memory.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from storage import Manifest, ManifestError, ReplicaSet, ShardInfo


class RowGroupIndex:
    """Where every row group starts in the global token stream (pure, picklable)."""

    def __init__(self, manifest: Manifest) -> None:
        self.shards: list[ShardInfo] = list(manifest.shards)
        entries = [(si, gi, g.tokens) for si, s in enumerate(manifest.shards)
                   for gi, g in enumerate(s.row_groups)]
        self.shard_of = np.array([e[0] for e in entries], dtype=np.int64)
        self.group_of = np.array([e[1] for e in entries], dtype=np.int64)
        tokens = np.array([e[2] for e in entries], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(tokens)])
        self.total_tokens = int(self.starts[-1])

    def __len__(self) -> int:
        return len(self.shard_of)

    def groups_for(self, start: int, stop: int) -> range:
        """Indices of the row groups overlapping tokens ``[start, stop)``."""
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        last = int(np.searchsorted(self.starts, stop, side="left")) - 1
        return range(first, last + 1)


class _RangeFile(io.RawIOBase):
    """A read-only file made of the few verified byte ranges that pyarrow will ask for."""

    def __init__(self, size: int, ranges: dict[int, bytes], name: str) -> None:
        self._size, self._ranges, self._name, self._pos = size, ranges, name, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def size(self) -> int:
        return self._size

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        want = min(len(buffer), self._size - self._pos)
        for start, data in self._ranges.items():
            if start <= self._pos and self._pos + want <= start + len(data):
                lo = self._pos - start
                buffer[:want] = data[lo:lo + want]
                self._pos += want
                return want
        raise OSError(f"{self._name}: read of [{self._pos}, {self._pos + want}) outside the "
                      "row group located by the manifest (manifest and shard disagree)")


def _metadata_from_footer(footer: bytes) -> pq.FileMetaData:
    # A footer is <thrift metadata><4-byte length>PAR1; with the leading magic it parses alone.
    return pq.read_metadata(pa.BufferReader(b"PAR1" + footer))


class TokenReader:
    """Reads token ranges through ``storage``; one per process (its caches are not shared)."""

    def __init__(self, store: ReplicaSet, index: RowGroupIndex, cache_groups: int = 16) -> None:
        self.store = store
        self.index = index
        self.cache_groups = cache_groups
        self._meta: dict[int, pq.FileMetaData] = {}
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self.bytes_read = 0
        self.groups_read = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_lock=None, _meta={}, _cache=OrderedDict())
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _count(self, nbytes: int, groups: int = 0) -> None:
        with self._lock:
            self.bytes_read += nbytes
            self.groups_read += groups

    def _metadata(self, shard: int) -> pq.FileMetaData:
        meta = self._meta.get(shard)
        if meta is None:
            info = self.index.shards[shard]
            if not info.footer_length:
                raise ManifestError(f"{info.path}: manifest lacks footer/row-group locations; "
                                    "rebuild the dataset with this version of the pipeline")
            footer = self.store.get(info.path, info.footer_sha256,
                                    info.bytes - info.footer_length, info.bytes)
            self._count(len(footer))
            meta = self._meta[shard] = _metadata_from_footer(footer)
        return meta

    def fetch_group(self, g: int) -> np.ndarray:
        """Fetch, verify and decode global row group ``g`` (no caching)."""
        shard = int(self.index.shard_of[g])
        gi = int(self.index.group_of[g])
        info = self.index.shards[shard]
        group = info.row_groups[gi]
        chunk = self.store.get(info.path, group.sha256, group.offset, group.offset + group.length)
        self._count(len(chunk), 1)
        source = _RangeFile(info.bytes, {group.offset: chunk}, info.path)
        table = pq.ParquetFile(source, metadata=self._metadata(shard)).read_row_group(
            gi, columns=["input_ids"], use_threads=False)
        return table.column(0).combine_chunks().flatten().to_numpy(zero_copy_only=False)

    def group(self, g: int) -> np.ndarray:
        """All tokens of global row group ``g``, flattened (int32), through the LRU."""
        arr = self._cache.get(g)
        if arr is not None:
            self._cache.move_to_end(g)
            return arr
        arr = self._cache[g] = self.fetch_group(g)
        if len(self._cache) > self.cache_groups:
            self._cache.popitem(last=False)
        return arr

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the global stream."""
        parts = []
        for g in self.index.groups_for(start, stop):
            g_start = int(self.index.starts[g])
            arr = self.group(g)
            parts.append(arr[max(start - g_start, 0):min(stop - g_start, len(arr))])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def close(self) -> None:
        self._meta.clear()
        self._cache.clear()
