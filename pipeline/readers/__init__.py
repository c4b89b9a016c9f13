"""Readers: one per input format, each turning one partition into documents and rejects.

``read_partition`` opens the partition's file (decompressing through fsspec), hands it to the
format's reader, and turns the ways a file can fail — unreadable, truncated, not a regular
file, not its listed size (:mod:`pipeline.planning.input_checks`) — into rejected records, so that
a bad
file never stops a run unless ``--strict`` asks for it.
"""

from __future__ import annotations

import io
import posixpath
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.planning import input_checks
from pipeline.planning.plan import Partition
from pipeline.records import Document, Rejected
from storage import display_url, resolve

DEFAULT_MAX_RECORD_BYTES = 8 << 20


@dataclass(frozen=True)
class ReadOptions:
    text_field: str = "text"
    id_field: str | None = None
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES


def _truncation_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [EOFError, zlib.error]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:  # pragma: no cover - zstd inputs then fail to open instead
        pass
    return tuple(errors)


class _Salvage(io.RawIOBase):
    """A decompressed stream that ends cleanly where the compressed data breaks off.

    Everything decompressed before the break is delivered (buffered readers would otherwise
    drop their last buffer); the error is kept for the caller to report as a reject.
    """

    def __init__(self, inner: Any, errors: tuple[type[BaseException], ...]) -> None:
        self.inner, self.errors = inner, errors
        self.error: BaseException | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self.error is not None:
            return 0
        try:
            read = getattr(self.inner, "read1", self.inner.read)
            data = read(len(b))
        except self.errors as exc:
            self.error = exc
            return 0
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.inner.close()
        super().close()


def read_partition(part: Partition, opts: ReadOptions,
                   storage_options: dict[str, Any] | None = None
                   ) -> Iterator[Document | Rejected]:
    """Stream the documents (and rejected records) of one partition: its files one after
    another when it is packed (:func:`pipeline.planning.plan.plan_partitions`)."""
    if part.members:
        for piece in part.pieces():
            yield from read_partition(piece, opts, storage_options)
        return
    from pipeline.readers import csv, jsonl, parquet, text, warc

    loc = resolve(part.url, storage_options)
    name = posixpath.basename(loc.root)
    shown = display_url(part.url)
    truncated = _truncation_errors()
    position = [0]  # decompressed offset reached, for the truncation report
    # a FIFO or device is never opened, a file not of its listed size never cut: quarantined
    refused = input_checks.before_open(part, loc.root, loc.is_local)
    if refused is not None:
        yield from input_checks.rejects(part, refused, name, shown)
        return
    try:
        # WARC/WET: the reader takes the gzip members itself (pipeline.readers.warc)
        compression = (None if part.fmt == "warc" and part.compression == "gzip"
                       else part.compression)
        fh = loc.fs.open(loc.root, "rb", compression=compression, block_size=4 << 20)
        refused = input_checks.after_open(part, fh)  # a remote file's size, from the open
        if refused is not None:
            fh.close()
            yield from input_checks.rejects(part, refused, name, shown)
            return
        salvage = None
        if compression:
            salvage = _Salvage(fh, truncated)
            fh = io.BufferedReader(salvage, 1 << 16)
        elif part.fmt != "parquet" and not loc.is_local:
            # Object-store files (s3fs, gcsfs, ...) have no readline(size), which the line
            # readers need to bound a line's memory; a buffered reader over them does.
            fh = io.BufferedReader(fh, 1 << 16)
    except Exception as exc:
        yield Rejected(name, "unreadable_file", f"{type(exc).__name__}: {exc}"[:500],
                       file=shown)
        return
    try:
        with fh:
            if part.fmt == "jsonl":
                items = jsonl.read(fh, part, name, opts, position)
            elif part.fmt == "txt":
                items = text.read(fh, part, name, opts, position)
            elif part.fmt == "csv":
                items = csv.read(fh, name, opts, position)
            elif part.fmt == "warc":
                # the whole URL, not the base name: a crawl's files share names across
                # segments, and ``source`` (file@offset) must find the record again
                items = warc.read(fh, shown, opts, position)
            else:
                items = parquet.read(fh, part, name, opts)
            for item in items:
                if isinstance(item, Rejected) and not item.file:
                    item = Rejected(item.source, item.reason, item.detail, item.raw, shown)
                yield item
        if salvage is not None and salvage.error is not None:
            raise salvage.error
    except truncated as exc:
        yield Rejected(f"{name}@{position[0]}", "truncated_input",
                       f"{type(exc).__name__}: {exc}"[:500], file=shown)
    except OSError as exc:
        yield Rejected(f"{name}@{position[0]}", "unreadable_file",
                       f"{type(exc).__name__}: {exc}"[:500], file=shown)
