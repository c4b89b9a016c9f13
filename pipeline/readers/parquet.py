"""Parquet: the partition's row groups, the text (and id) column only, in record batches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.records import Document, Rejected, raw_preview

if TYPE_CHECKING:
    from pipeline.planning.plan import Partition
    from pipeline.readers import ReadOptions

_STRINGS = (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())


def read(fh: BinaryIO, part: Partition, name: str,
         opts: ReadOptions) -> Iterator[Document | Rejected]:
    try:
        pf = pq.ParquetFile(fh)
    except (pa.ArrowException, OSError) as exc:
        yield Rejected(name, "unreadable_file", f"{type(exc).__name__}: {exc}"[:500])
        return
    schema = pf.schema_arrow
    wanted = [opts.text_field] + ([opts.id_field] if opts.id_field else [])
    for col in wanted:
        if col not in schema.names:
            yield Rejected(f"{name}#rg{part.start}", "missing_field",
                           f"no column {col!r} (columns: {schema.names[:20]})")
            return
    if schema.field(opts.text_field).type not in _STRINGS:
        yield Rejected(f"{name}#rg{part.start}", "wrong_type",
                       f"column {opts.text_field!r} is {schema.field(opts.text_field).type}")
        return
    meta = pf.metadata
    end = meta.num_row_groups if part.end < 0 else part.end
    row = sum(meta.row_group(i).num_rows for i in range(part.start))
    groups = list(range(part.start, end))
    if not groups:
        return
    for batch in pf.iter_batches(batch_size=2048, row_groups=groups, columns=wanted):
        texts = batch.column(0).cast(pa.binary()).to_pylist()
        ids = batch.column(1).cast(pa.string()).to_pylist() if opts.id_field else None
        for i, raw in enumerate(texts):
            src = f"{name}#{row + i}"
            if raw is None:
                yield Rejected(src, "missing_field", f"{opts.text_field!r} is null")
                continue
            if len(raw) > opts.max_record_bytes:
                yield Rejected(src, "record_too_large", f"{len(raw)} bytes", raw_preview(raw))
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield Rejected(src, "invalid_utf8", exc.reason, raw_preview(raw))
                continue
            doc_id = ids[i] if ids is not None else None
            if ids is not None and doc_id is None:
                yield Rejected(src, "missing_field", f"{opts.id_field!r} is null")
                continue
            yield Document(doc_id or src, text, source=src if doc_id else None)
        row += len(texts)
