"""A token column chunk decoded without its shard's footer: the footer made from the index.

Why: a reader that decodes a row group with pyarrow needs Parquet metadata, and the shard's
own footer costs one more GET per shard and process (~40 % of a rank's requests at scale) and
its parsed form ~1.8 KB of memory per row group for the process's life (~7 GB per process at
10^12 tokens). The index already locates and verifies each row group's ``input_ids`` chunk;
what else a decode needs is small: the column is a ``REQUIRED BYTE_ARRAY`` (no dictionary, so
no dictionary page), the shard's codec (recorded per shard at write time: :data:`CODECS`),
and the values per chunk, which the chunk's own page headers say (verified bytes: they are
part of the piece the digest covers). :func:`metadata` builds a one-column Parquet footer
(Thrift compact protocol) naming exactly the verified pieces, for the row groups one call
decodes, and lets pyarrow parse it; the footer is dropped with the call.

A chunk whose pages do not tile its bytes exactly, a dictionary page, or an unknown page type
raises :class:`ChunkFormatError` (a crafted or damaged index or shard); a wrong codec or value
count fails pyarrow's decode or the reader's token count, never silently.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

#: Parquet's ``CompressionCodec`` values a footer-free decode accepts (the Thrift names)
CODECS = {"UNCOMPRESSED": 0, "SNAPPY": 1, "GZIP": 2, "BROTLI": 4, "ZSTD": 6, "LZ4_RAW": 7}
#: pyarrow's name for a chunk's codec -> the Thrift name (pyarrow calls LZ4_RAW "LZ4")
CODEC_OF_PYARROW = {"UNCOMPRESSED": "UNCOMPRESSED", "SNAPPY": "SNAPPY", "GZIP": "GZIP",
                    "BROTLI": "BROTLI", "ZSTD": "ZSTD", "LZ4": "LZ4_RAW"}
#: the index's per-shard ``shard_codec`` for a shard whose footer must be read
NO_CODEC = 255

_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3
# Thrift compact protocol type ids
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE = 1, 2, 3, 4, 5, 6, 7
_BINARY, _LIST, _SET, _MAP, _STRUCT = 8, 9, 10, 11, 12
_BYTE_ARRAY, _REQUIRED, _RLE, _PLAIN = 6, 0, 3, 0


class ChunkFormatError(ValueError):
    """A token column chunk whose pages are not what a footer-free decode can read."""


def footerless_codec(meta: Any, column: str = "input_ids") -> str:
    """The Thrift name of ``column``'s codec (``meta``: a ``pyarrow.parquet.FileMetaData``)
    when every one of its chunks can be decoded
    without the footer (flat ``REQUIRED BYTE_ARRAY``, no dictionary page, one codec this
    module knows), else ``""``: the writer records it, a reader of ``""`` reads the footer."""
    if column not in meta.schema.names:
        return ""
    i = meta.schema.names.index(column)
    leaf = meta.schema.column(i)
    if (leaf.physical_type != "BYTE_ARRAY" or leaf.max_definition_level
            or leaf.max_repetition_level):
        return ""
    names = set()
    for g in range(meta.num_row_groups):
        chunk = meta.row_group(g).column(i)
        if chunk.has_dictionary_page:
            return ""
        names.add(CODEC_OF_PYARROW.get(chunk.compression, ""))
    return names.pop() if len(names) == 1 and "" not in names else ""


# ---- Thrift compact protocol: just what page headers and a footer need ----------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _zigzag(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))


class _Reader:
    """Reads Thrift compact structs from a buffer; fields a caller does not want are skipped."""

    def __init__(self, data: memoryview, pos: int = 0) -> None:
        self.data, self.pos = data, pos

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise ChunkFormatError("a page header runs past the chunk")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = value = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ChunkFormatError("a page header has an over-long integer")

    def signed(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def fields(self):  # type: ignore[no-untyped-def]
        """(field id, type) of each field of the struct at ``pos``, up to its stop byte."""
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            kind, delta = head & 0x0F, head >> 4
            last = last + delta if delta else self.signed()
            yield last, kind

    def skip(self, kind: int, depth: int = 0, element: bool = False) -> None:
        """Past a value of ``kind``. Every value read as an ``element`` of a container takes at
        least a byte (a bool there is a byte; as a struct field it is in the field's header),
        so a crafted container size ends at the data's end, not after 2**60 empty steps."""
        if depth > 16:
            raise ChunkFormatError("a page header nests too deep")
        if kind in (_TRUE, _FALSE):
            if element:
                self.byte()
            return
        if kind == _BYTE:
            self.byte()
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.pos += 8
        elif kind == _BINARY:
            length = self.varint()  # (read before pos is: it moves pos)
            self.pos += length
        elif kind in (_LIST, _SET):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.skip(head & 0x0F, depth + 1, element=True)
        elif kind == _MAP:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip(types >> 4, depth + 1, element=True)
                    self.skip(types & 0x0F, depth + 1, element=True)
        elif kind == _STRUCT:
            for _fid, inner in self.fields():
                self.skip(inner, depth + 1)
        else:
            raise ChunkFormatError(f"a page header has an unknown Thrift type {kind}")
        if self.pos > len(self.data):
            raise ChunkFormatError("a page header runs past the chunk")


def _page_header(reader: _Reader) -> tuple[int, int, int, int | None]:
    """A PageHeader at ``reader.pos``: (type, uncompressed size, compressed size, values)."""
    kind = page_bytes = raw_bytes = -1
    count = None
    for fid, ftype in reader.fields():
        if ftype == _I32 and fid in (1, 2, 3):
            value = reader.signed()
            if fid == 1:
                kind = value
            elif fid == 2:
                raw_bytes = value
            else:
                page_bytes = value
        elif fid in (5, 8) and ftype == _STRUCT:  # data_page_header(_v2): num_values is 1
            for inner, itype in reader.fields():
                if inner == 1 and itype == _I32:
                    count = reader.signed()
                else:
                    reader.skip(itype)
        else:
            reader.skip(ftype)
    return kind, raw_bytes, page_bytes, count


#: the longest page header read (the pipeline writes no statistics: a few dozen bytes)
MAX_HEADER_BYTES = 64 << 10


def page_values(chunk: memoryview | bytes) -> tuple[int, int]:
    """``(values, uncompressed bytes)`` of a column chunk, from its page headers; the pages
    must tile ``chunk`` exactly (data pages v1 or v2 only)."""
    data = memoryview(chunk)
    size = len(data)
    if not size:
        raise ChunkFormatError("an empty chunk")
    pos = values = uncompressed = 0
    while pos < size:
        reader = _Reader(data[pos:pos + MAX_HEADER_BYTES])
        try:
            kind, raw_bytes, page_bytes, count = _page_header(reader)
        except ChunkFormatError:
            if reader.pos >= len(reader.data) == MAX_HEADER_BYTES:
                raise ChunkFormatError(f"the page header at byte {pos} is over "
                                       f"{MAX_HEADER_BYTES:,} bytes") from None
            raise
        header = reader.pos
        if kind == _DICTIONARY_PAGE:
            raise ChunkFormatError(f"a dictionary page at byte {pos} (the chunk was "
                                   "recorded as dictionary-free)")
        if kind not in (_DATA_PAGE, _DATA_PAGE_V2) or count is None:
            raise ChunkFormatError(f"the page at byte {pos} is not a data page")
        if page_bytes < 0 or raw_bytes < 0 or count < 0:
            raise ChunkFormatError(f"the page at byte {pos} has a negative size or count")
        end = pos + header + page_bytes
        if end > size:
            raise ChunkFormatError(f"the page at byte {pos} ends at byte {end}, past "
                                   f"the chunk's {size}")
        values += count
        uncompressed += header + raw_bytes
        pos = end
    return values, uncompressed


class _Writer:
    """Writes the Thrift compact structs of a footer (field ids ascending per struct)."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.last = [0]

    def field(self, fid: int, kind: int) -> None:
        delta = fid - self.last[-1]
        if 0 < delta <= 15:
            self.out.append(delta << 4 | kind)
        else:
            self.out.append(kind)
            self.out += _zigzag(fid)
        self.last[-1] = fid

    def i32(self, fid: int, value: int) -> None:
        self.field(fid, _I32)
        self.out += _zigzag(value)

    def binary(self, fid: int, value: bytes) -> None:
        self.field(fid, _BINARY)
        self.out += _varint(len(value)) + value

    def list(self, fid: int, kind: int, size: int) -> None:
        self.field(fid, _LIST)
        if size < 15:
            self.out.append(size << 4 | kind)
        else:
            self.out.append(0xF0 | kind)
            self.out += _varint(size)

    def struct(self) -> None:
        """Open a struct (a list element or, after ``field(.., _STRUCT)``, a field)."""
        self.last.append(0)

    def end(self) -> None:
        self.out.append(0)
        self.last.pop()


@functools.lru_cache(maxsize=8)
def _schema(name: bytes) -> bytes:
    """FileMetaData's fields 1-2: version, and the schema (the root, then the column)."""
    w = _Writer()
    w.i32(1, 1)
    w.list(2, _STRUCT, 2)
    w.struct()
    w.binary(4, b"schema")
    w.i32(5, 1)
    w.end()
    w.struct()
    w.i32(1, _BYTE_ARRAY)
    w.i32(3, _REQUIRED)
    w.binary(4, name)
    w.end()
    return bytes(w.out)


def footer(chunks: Sequence[tuple[int, int, int, int]], codec: int,
           column: str = "input_ids") -> bytes:
    """A Parquet footer (``<FileMetaData><length>PAR1``) of one ``REQUIRED BYTE_ARRAY``
    column whose row group ``i`` is ``chunks[i] = (offset, length, values, uncompressed)``.

    A row group's bytes are constant fragments around its five numbers (every field header
    is one byte: field ids ascend by at most 15), so a footer costs ~3 us per row group in
    Python, against ~700 us to decode one."""
    if codec not in CODECS.values():
        raise ChunkFormatError(f"unknown codec {codec}")
    name = column.encode()
    count = len(chunks)
    parts = [_schema(name), b"\x16", _varint(2 * sum(c[2] for c in chunks)),  # num_rows
             b"\x19" + (bytes([count << 4 | _STRUCT]) if count < 15  # row_groups
                         else bytes([0xF0 | _STRUCT]) + _varint(count))]
    # RowGroup{1: [ColumnChunk{2: file_offset, 3: ColumnMetaData{1: type, 2: encodings,
    # 3: path, 4: codec, 5: values, 6: uncompressed, 7: compressed, 9: data_page_offset}}],
    # 2: total_byte_size, 3: num_rows}
    meta_head = (bytes([0x15]) + _zigzag(_BYTE_ARRAY) + bytes([0x19, 0x25]) + _zigzag(_RLE)
                 + _zigzag(_PLAIN) + bytes([0x19, 0x18]) + _varint(len(name)) + name
                 + bytes([0x15]) + _zigzag(codec) + bytes([0x16]))
    for offset, length, values, uncompressed in chunks:
        parts += (b"\x19\x1c\x26", _varint(2 * (offset + length)), b"\x1c", meta_head,
                  _varint(2 * values), b"\x16", _varint(2 * uncompressed), b"\x16",
                  _varint(2 * length), b"\x26", _varint(2 * offset), b"\x00\x00\x16",
                  _varint(2 * uncompressed), b"\x16", _varint(2 * values), b"\x00")
    parts.append(b"\x00")
    body = b"".join(parts)
    return body + len(body).to_bytes(4, "little") + b"PAR1"


def metadata(chunks: Sequence[tuple[int, int, int, int]], codec: int,
             column: str = "input_ids") -> Any:
    """:func:`footer` parsed by pyarrow (a ``pyarrow.parquet.FileMetaData``): what
    ``pq.ParquetFile(.., metadata=)`` takes."""
    return _parser()(footer(chunks, codec, column))


@functools.lru_cache(maxsize=1)
def _parser() -> Callable[[bytes], Any]:
    """Footer bytes -> ``FileMetaData``. pyarrow's own unpickling of a ``FileMetaData`` (its
    ``__reduce__`` names this function) parses the Thrift bytes alone, ~4 us against ~17 us
    for ``read_metadata``, which opens a whole Parquet reader around them; where a pyarrow
    lacks it, ``read_metadata``. (pyarrow is imported here, not with the module: the
    manifest's parser names :data:`CODECS` and need not load it.)"""
    import pyarrow as pa

    try:
        from pyarrow._parquet import _reconstruct_filemetadata
    except ImportError:  # pragma: no cover - every pyarrow this project supports has it
        from storage.format.tokens import parse_footer

        return parse_footer
    return lambda data: _reconstruct_filemetadata(pa.py_buffer(memoryview(data)[:-8]))
