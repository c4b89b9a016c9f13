"""Token reads: global token ranges -> row groups of Parquet shards -> NumPy arrays.

The manifest's per-row-group token counts map any token offset to (shard, row group) without
opening a file; a small LRU of decoded row groups serves the consecutive samples of a block
from memory, so each row group is read once per pass of the plan over it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from storage import Location, Manifest, resolve


class RowGroupIndex:
    """Where every row group starts in the global token stream (pure, picklable)."""

    def __init__(self, manifest: Manifest) -> None:
        self.shard_paths = [s.path for s in manifest.shards]
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


class TokenReader:
    """Reads token ranges through ``storage``; one per process (opened lazily after fork)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None, index: RowGroupIndex,
                 cache_groups: int = 16) -> None:
        self.url = url
        self.storage_options = storage_options
        self.index = index
        self.cache_groups = cache_groups
        self._loc: Location | None = None
        self._files: dict[int, pq.ParquetFile] = {}
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self.bytes_read = 0
        self.groups_read = 0

    @property
    def loc(self) -> Location:
        if self._loc is None:
            self._loc = resolve(self.url, self.storage_options)
        return self._loc

    def _file(self, shard: int) -> pq.ParquetFile:
        pf = self._files.get(shard)
        if pf is None:
            fh = self.loc.fs.open(self.loc.path(self.index.shard_paths[shard]), "rb")
            pf = pq.ParquetFile(fh)
            self._files[shard] = pf
        return pf

    def group(self, g: int) -> np.ndarray:
        """All tokens of global row group ``g``, flattened (int32)."""
        arr = self._cache.get(g)
        if arr is not None:
            self._cache.move_to_end(g)
            return arr
        pf = self._file(int(self.index.shard_of[g]))
        gi = int(self.index.group_of[g])
        table = pf.read_row_group(gi, columns=["input_ids"])
        self.bytes_read += pf.metadata.row_group(gi).total_byte_size
        self.groups_read += 1
        arr = table.column(0).combine_chunks().flatten().to_numpy(zero_copy_only=False)
        self._cache[g] = arr
        if len(self._cache) > self.cache_groups:
            self._cache.popitem(last=False)
        return arr

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the global stream."""
        parts = []
        for g in self.index.groups_for(start, stop):
            g_start = int(self.index.starts[g])
            arr = self.group(g)
            lo = max(start - g_start, 0)
            hi = min(stop - g_start, len(arr))
            parts.append(arr[lo:hi])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def close(self) -> None:
        for pf in self._files.values():
            pf.close()
        self._files.clear()
        self._cache.clear()
