"""Parquet readers over verified in-memory bytes, decoding into the loader's own memory pool.

Decoded row groups are the loader's churn: ~0.5 MB each, made by the read threads and freed at
their last use, hundreds a second, up to the read-ahead budget alive at once from an object
store. Under pyarrow's default pool (mimalloc in its wheels) that churn kept handing pages back
to the kernel and faulting them in again: ``perf`` of 20 epochs from S3 put 9 % of all CPU in
zeroing fresh 2 MB huge pages (``clear_page_erms`` under ``mi_page_free_list_extend`` and
copies into new memory), most of it in a process's first epoch: the same process's later
epochs cost the same under either pool, its first one from S3 up to 2.6x more under mimalloc
(31 vs 12 CPU-s/Gtok). jemalloc keeps freed pages a while for reuse (Arrow sets its decay to a
second). Measured from a loopback S3 server, 50 M tokens, a fresh process per epoch (as a short
job, an eval, and ``benchmarks/loader_throughput.py`` run it), 10 interleaved rounds against
the code before: **1.51x the rate, 1.75x after the first batch** (99.8 vs 66.0 and 156.9 vs
89.5 Mtok/s) at 11.8 vs 18.7 CPU-s/Gtok, every round 10.4-12.7 where mimalloc's were 13.6-28.2
(the bimodal "slow rounds" of the benchmark's S3 rows). Local disk, 16 rounds: the same within
the noise (median rates 166.3 vs 155.5 Mtok/s, 9.10 vs 9.52 CPU-s/Gtok).

The pool is given to each reader (pyarrow's ``ParquetReader`` takes one; ``ParquetFile``, its
public wrapper, does not), so the process's default pool, which the user's own pyarrow code
allocates from, stays what it was. Where pyarrow was built without jemalloc (or a future
``ParquetReader`` stops taking a pool) decoding falls back to the default pool and
``pq.ParquetFile``: the same bytes, the same tokens.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

try:  # the reader behind pq.ParquetFile; it takes a memory pool
    from pyarrow._parquet import ParquetReader
except ImportError:  # pragma: no cover  (a pyarrow that moved it: the public reader)
    ParquetReader = None

#: the one column a loader decodes
TOKENS = "input_ids"


@cache
def decode_pool() -> pa.MemoryPool:
    """jemalloc's Arrow pool where pyarrow has it, else the default pool."""
    try:
        return pa.jemalloc_memory_pool()
    except (NotImplementedError, pa.ArrowException):
        return pa.default_memory_pool()


class TokenChunks:
    """The ``input_ids`` column chunks of one in-memory Parquet buffer, under ``metadata``
    (a shard's own footer, or one made from the index for the chunks of one request)."""

    __slots__ = ("_column", "_reader")

    def __init__(self, buffer: Any, metadata: pq.FileMetaData) -> None:
        source = pa.BufferReader(pa.py_buffer(buffer))
        try:
            reader = ParquetReader(memory_pool=decode_pool())  # type: ignore[misc]
            reader.open(source, metadata=metadata)
        except TypeError:  # an API that moved (or None above): pyarrow's public reader
            reader = pq.ParquetFile(source, metadata=metadata).reader
        self._reader = reader
        self._column = reader.column_name_idx(TOKENS)

    def read(self, number: int) -> pa.Table:
        """Row group ``number``'s tokens (a one-column table), decoded on this thread."""
        return self._reader.read_row_group(number, column_indices=[self._column],
                                           use_threads=False)
