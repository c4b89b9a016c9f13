"""The two things a reader yields: a document, or a record rejected with where and why.

Kept apart from the readers so that stages, quarantine and strict mode share one definition.
"""

from __future__ import annotations

from dataclasses import dataclass


class InputError(ValueError):
    """The inputs given cannot be read (nothing matches, unknown format, ...)."""


class StrictModeError(RuntimeError):
    """``--strict``: the first bad record stops the run; the message names file and line."""


@dataclass(frozen=True)
class Document:
    """``kind``: ``"text"``, ``"html"`` (the web steps extract its text) or ``"other:MIME"``
    (a web record that is neither, counted and dropped by the web steps). ``url``, ``date`` and
    ``source`` (``file@offset``) come from WARC/WET records; for the other formats ``source``
    (``file:line``, ``file@offset``, ``file#row``) is set only when the id is not it
    (``--id-field``): otherwise the id *is* the source, and lineage reads it there."""

    doc_id: str
    text: str
    url: str | None = None
    date: str | None = None
    source: str | None = None
    kind: str = "text"


@dataclass(frozen=True)
class Rejected:
    """A record that could not become a document.

    ``source`` is ``file:line`` when the line number is known (the partition starts at the
    beginning of its file), else ``file@byte_offset`` in the (decompressed) stream, or
    ``file#row`` for Parquet. ``raw`` holds at most the first KiB of the record.
    """

    source: str
    reason: str
    detail: str
    raw: str = ""
    file: str = ""

    def describe(self) -> str:
        return f"{self.source}: {self.reason} ({self.detail})"


RAW_LIMIT = 1024


def raw_preview(data: bytes | str) -> str:
    """The start of a bad record for the quarantine file; bytes that are not UTF-8 are escaped,
    never silently replaced, so the quarantine shows exactly what was there."""
    if isinstance(data, str):
        return data[:RAW_LIMIT]
    return data[:RAW_LIMIT].decode("utf-8", errors="backslashreplace")
