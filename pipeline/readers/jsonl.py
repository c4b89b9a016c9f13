"""JSON Lines: one record per line; bad lines become rejects with their line or offset."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

from pipeline.readers.lines import iter_lines
from pipeline.records import Document, Rejected, raw_preview

if TYPE_CHECKING:
    from pipeline.planning.plan import Partition
    from pipeline.readers import ReadOptions


def where(name: str, lineno: int | None, offset: int) -> str:
    return f"{name}:{lineno}" if lineno is not None else f"{name}@{offset}"


def field_text(record: Any, opts: ReadOptions, src: str, raw: str
               ) -> tuple[str, str | None] | Rejected:
    """``(text, id)`` from a parsed record, or why it cannot be used."""
    if not isinstance(record, dict):
        return Rejected(src, "not_an_object", type(record).__name__, raw)
    text = record.get(opts.text_field)
    if text is None:
        return Rejected(src, "missing_field", f"no field {opts.text_field!r}", raw)
    if not isinstance(text, str):
        return Rejected(src, "wrong_type",
                        f"field {opts.text_field!r} is {type(text).__name__}", raw)
    doc_id = None
    if opts.id_field:
        value = record.get(opts.id_field)
        if value is None:
            return Rejected(src, "missing_field", f"no field {opts.id_field!r}", raw)
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            return Rejected(src, "wrong_type",
                            f"field {opts.id_field!r} is {type(value).__name__}", raw)
        doc_id = str(value)
    return text, doc_id


def read(fh: BinaryIO, part: Partition, name: str, opts: ReadOptions,
         position: list[int]) -> Iterator[Document | Rejected]:
    for line in iter_lines(fh, part.start, part.end, opts.max_record_bytes):
        position[0] = line.offset
        src = where(name, line.lineno, line.offset)
        if line.too_long:
            yield Rejected(src, "record_too_large",
                           f"{line.length} bytes > --max-record-bytes {opts.max_record_bytes}",
                           raw_preview(line.data))
            continue
        if not line.data.strip():
            continue
        try:
            decoded = line.data.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield Rejected(src, "invalid_utf8", f"byte {exc.start} of the line: {exc.reason}",
                           raw_preview(line.data))
            continue
        try:
            record = json.loads(decoded)
        except ValueError as exc:
            yield Rejected(src, "malformed_json", str(exc)[:300], raw_preview(decoded))
            continue
        got = field_text(record, opts, src, "")
        if isinstance(got, Rejected):
            yield Rejected(got.source, got.reason, got.detail, raw_preview(decoded))
            continue
        text, doc_id = got
        yield Document(doc_id or src, text, source=src if doc_id else None)
