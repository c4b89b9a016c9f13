"""CSV with a header row. Not split: a quoted field may hold newlines, so a byte offset inside
the file cannot be mapped to a record boundary without reading from the start."""

from __future__ import annotations

import csv as _csv
import io
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO

from pipeline.records import Document, Rejected, raw_preview

if TYPE_CHECKING:
    from pipeline.readers import ReadOptions


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read(fh: BinaryIO, name: str, opts: ReadOptions,
         position: list[int]) -> Iterator[Document | Rejected]:
    # surrogateescape keeps undecodable bytes visible as lone surrogates, which we then refuse
    # per record, instead of replacing them silently or failing the whole file.
    stream = io.TextIOWrapper(fh, encoding="utf-8", errors="surrogateescape", newline="")
    _csv.field_size_limit(max(opts.max_record_bytes, 1024))
    reader = _csv.reader(stream)
    try:
        header = next(reader)
    except StopIteration:
        return
    except _csv.Error as exc:
        yield Rejected(f"{name}:1", "malformed_csv", str(exc))
        return
    columns = {h: i for i, h in enumerate(header)}
    if opts.text_field not in columns:
        yield Rejected(f"{name}:1", "missing_field",
                       f"no column {opts.text_field!r} (columns: {header[:20]})")
        return
    ti = columns[opts.text_field]
    ii = columns.get(opts.id_field) if opts.id_field else None
    if opts.id_field and ii is None:
        yield Rejected(f"{name}:1", "missing_field", f"no column {opts.id_field!r}")
        return
    while True:
        start_line = reader.line_num + 1
        src = f"{name}:{start_line}"
        try:
            row = next(reader)
        except StopIteration:
            return
        except _csv.Error as exc:
            reason = "record_too_large" if "field larger" in str(exc) else "malformed_csv"
            yield Rejected(src, reason, str(exc))
            continue
        position[0] = reader.line_num
        if not row or (len(row) == 1 and not row[0].strip() and len(header) > 1):
            continue
        if len(row) != len(header):
            yield Rejected(src, "malformed_csv",
                           f"{len(row)} fields, header has {len(header)}",
                           raw_preview(",".join(row).encode("utf-8", "surrogateescape")))
            continue
        text = row[ti]
        doc_id = row[ii] if ii is not None else None
        if not _encodable(text) or (doc_id is not None and not _encodable(doc_id)):
            yield Rejected(src, "invalid_utf8", "bytes that are not UTF-8",
                           raw_preview(text.encode("utf-8", "surrogateescape")))
            continue
        if len(text) > opts.max_record_bytes:
            yield Rejected(src, "record_too_large", f"{len(text)} characters", text[:1024])
            continue
        yield Document(doc_id or src, text, source=src if doc_id else None)
