"""Row groups decode into the loader's own Arrow pool (jemalloc where pyarrow has it), the same
tokens as pyarrow's public reader gives, and the process's default pool is left alone."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from loaders import build_dataloader
from loaders.decode import TokenChunks, decode_pool
from storage import tokens


def _shard() -> tuple[bytes, pq.FileMetaData]:
    """A zstd shard of 8 documents of 40,000 uint16 ids in 3 row groups."""
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 50_000, 40_000, dtype=np.uint16).tobytes() for _ in range(8)]
    table = pa.table({"doc_id": [str(i) for i in range(8)],
                      "input_ids": pa.array(docs, pa.binary())})
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=3, compression="zstd")
    data = out.getvalue()
    return data, pq.ParquetFile(io.BytesIO(data)).metadata


def test_the_pool_is_jemalloc_where_pyarrow_has_it() -> None:
    try:
        want = pa.jemalloc_memory_pool().backend_name
    except NotImplementedError:
        want = pa.default_memory_pool().backend_name
    assert decode_pool().backend_name == want


def test_tokens_equal_pyarrow_s_and_are_held_by_the_decode_pool() -> None:
    data, meta = _shard()
    chunks, public = TokenChunks(data, meta), pq.ParquetFile(io.BytesIO(data), metadata=meta)
    pool, default = decode_pool(), pa.default_memory_pool()
    held = []
    before = pool.bytes_allocated()
    for number in range(meta.num_row_groups):
        got = chunks.read(number)
        want = public.read_row_group(number, columns=["input_ids"])
        assert got.column_names == ["input_ids"]
        assert np.array_equal(tokens.unpack(got.column(0), "binary<uint16le>"),
                              tokens.unpack(want.column(0), "binary<uint16le>"))
        held.append(got)
    decoded = sum(t.nbytes for t in held)
    assert decoded > 600_000
    if pool is not default:  # the decoded tokens live in the loader's pool
        assert pool.bytes_allocated() - before >= decoded * 0.9
    del held


def test_a_loader_leaves_the_process_s_default_pool_as_it_was(tiny_dataset: str) -> None:
    backend = pa.default_memory_pool().backend_name
    batches = list(build_dataloader(tiny_dataset, 2, 64, seed=1))
    assert batches and pa.default_memory_pool().backend_name == backend


def test_without_a_reader_that_takes_a_pool_it_decodes_through_pyarrow_s_public_one(
        monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import loaders.decode

    data, meta = _shard()
    want = [TokenChunks(data, meta).read(n) for n in range(meta.num_row_groups)]
    monkeypatch.setattr(loaders.decode, "ParquetReader", None)  # a pyarrow that moved it
    got = [TokenChunks(data, meta).read(n) for n in range(meta.num_row_groups)]
    assert all(a.equals(b) for a, b in zip(got, want, strict=True))
