"""How token ids sit in a shard's ``input_ids`` column: one value per document.

Each document's ids are stored as one Parquet ``BYTE_ARRAY`` holding them as little-endian
unsigned integers, ``uint16`` when the vocabulary fits (GPT-2, BERT, Llama 2) and ``uint32``
otherwise. Why not ``list<int32>``, the obvious Arrow type: decoding a list column walks
repetition and definition levels for every token, ~10 CPU-s per billion tokens before zstd
and several times a reader's whole budget, while a binary column decodes to one contiguous
buffer that NumPy views without a copy; uint16 also halves the bytes to fetch and
decompress. Datasets written with ``list<int32>`` still read (``LEGACY_LIST``).

The manifest's ``schema["input_ids"]`` names the encoding, e.g. ``"binary<uint16le>"``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa

LEGACY_LIST = "list<int32>"
_BINARY = re.compile(r"^binary<(uint16|uint32)le>$")
#: Arrow ``binary`` offsets are int32: one column chunk holds at most this many bytes
MAX_COLUMN_BYTES = (1 << 31) - 1


class TokenEncodingError(ValueError):
    """A manifest names a token encoding this version cannot read."""


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest little-endian unsigned type that holds every id of the vocabulary."""
    if vocab_size <= 1 << 16:
        return np.dtype("<u2")
    if vocab_size <= 1 << 32:
        return np.dtype("<u4")
    raise TokenEncodingError(f"vocabulary of {vocab_size} ids does not fit in uint32")


def encoding_name(dtype: np.dtype) -> str:
    """The manifest's name for ``input_ids`` stored as ``dtype``, e.g. ``binary<uint16le>``."""
    return f"binary<{np.dtype(dtype).name}le>"


def dtype_of(encoding: str) -> np.dtype | None:
    """The token dtype of a manifest ``input_ids`` encoding; ``None`` for ``list<int32>``."""
    if encoding == LEGACY_LIST:
        return None
    match = _BINARY.match(encoding)
    if not match:
        raise TokenEncodingError(f"unknown input_ids encoding {encoding!r}; expected "
                                 f"'binary<uint16le>', 'binary<uint32le>' or {LEGACY_LIST!r}")
    return np.dtype(match.group(1)).newbyteorder("<")


def chunk_range(meta: Any, row_group: int, column: str = "input_ids") -> tuple[int, int]:
    """Where row group ``row_group``'s ``column`` chunk lies in its shard, ``[start, end)``, as
    the footer (``pyarrow.parquet.FileMetaData``) places it: the bytes the index's offset and
    length name and its digest covers. The writer records it from here, and a reader checks
    the footer against the index with it before decoding, so that only verified bytes decode
    (a footer that places a chunk elsewhere is crafted or damaged)."""
    chunk = meta.row_group(row_group).column(meta.schema.names.index(column))
    start = (chunk.dictionary_page_offset if chunk.has_dictionary_page
             else chunk.data_page_offset)
    return start, start + chunk.total_compressed_size


def parse_footer(footer: bytes | bytearray | memoryview) -> Any:
    """A shard's footer bytes (``<Thrift FileMetaData><4-byte length>PAR1``, what the index
    locates and checksums) as a ``pyarrow.parquet.FileMetaData``: with the leading magic the
    footer parses alone."""
    import pyarrow.parquet as pq

    return pq.read_metadata(pa.BufferReader(b"PAR1" + bytes(footer)))


def footer_disagreement(meta: Any, chunks: list[tuple[int, int]]) -> str | None:
    """Where a shard's own footer and the index part ways (``chunks``: the index's token
    chunk ``(offset, length)`` per row group): its row-group count, or the first token chunk
    it places elsewhere; ``None`` when they agree. ``storage verify`` reports it, ``storage
    upgrade`` refuses to record a codec from such a footer."""
    if meta.num_row_groups != len(chunks):
        return (f"the footer holds {meta.num_row_groups} row groups, the index gives the "
                f"shard {len(chunks)}")
    for g, (offset, length) in enumerate(chunks):
        located = chunk_range(meta, g)
        if located != (offset, offset + length):
            return (f"row group {g}'s token chunk: the footer places it at "
                    f"[{located[0]:,}, {located[1]:,}), the index at "
                    f"[{offset:,}, {offset + length:,})")
    return None


def pack(lengths: np.ndarray, values: np.ndarray, dtype: np.dtype) -> pa.BinaryArray:
    """One binary value per document from per-document lengths and all ids concatenated."""
    dtype = np.dtype(dtype)
    if values.size and int(values.max(initial=0)) > np.iinfo(dtype).max:
        raise TokenEncodingError(f"token id {int(values.max())} does not fit in {dtype.name}")
    data = np.ascontiguousarray(values, dtype=dtype)
    if data.nbytes > MAX_COLUMN_BYTES:
        raise TokenEncodingError(f"{data.nbytes:,} bytes of token ids in one column; "
                                 "use smaller partitions")
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(np.asarray(lengths, dtype=np.int64) * dtype.itemsize, out=offsets[1:])
    return pa.BinaryArray.from_buffers(pa.binary(), len(lengths),
                                       [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def lengths(column: pa.Array | pa.ChunkedArray, encoding: str) -> np.ndarray:
    """Tokens per document of an ``input_ids`` column."""
    array = _contiguous(column)
    dtype = dtype_of(encoding)
    if len(array) == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32,
                            count=len(array) + 1, offset=array.offset * 4)
    sizes = np.diff(offsets.astype(np.int64))
    return sizes if dtype is None else sizes // dtype.itemsize


def unpack(column: pa.Array | pa.ChunkedArray, encoding: str) -> np.ndarray:
    """All token ids of an ``input_ids`` column, in order, as one array (a view where possible).

    Binary columns come back in their stored dtype (uint16/uint32) without a copy; callers
    widen to int64 only for the few tokens they hand to torch.
    """
    array = _contiguous(column)
    dtype = dtype_of(encoding)
    if dtype is None:
        return array.flatten().to_numpy(zero_copy_only=False)
    if len(array) == 0:
        return np.zeros(0, dtype=dtype)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32,
                            count=len(array) + 1, offset=array.offset * 4)
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = array.buffers()[2]
    return np.frombuffer(data, dtype=dtype, count=(hi - lo) // dtype.itemsize, offset=lo)


def documents(column: pa.Array | pa.ChunkedArray, encoding: str) -> list[np.ndarray]:
    """Each document's token ids as its own array (for tests and inspection, not hot paths)."""
    flat = unpack(column, encoding)
    bounds = np.concatenate([[0], np.cumsum(lengths(column, encoding))])
    return [flat[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def _contiguous(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column
