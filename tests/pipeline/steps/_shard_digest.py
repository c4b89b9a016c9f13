"""What a shard holds, as a digest that does not depend on the Parquet writer's version: its
schema, its row groups' row counts and every value (the file's bytes also name the pyarrow
that wrote them, in the footer's ``created_by``), with the checkout's own path in a value
(a web record's ``source`` is its file's whole path) written as ``<repo>``."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow.parquet as pq


def content_digest(path: Path, repo: str) -> str:
    f = pq.ParquetFile(path)
    h = hashlib.sha256(f.schema_arrow.to_string().encode())
    for i in range(f.num_row_groups):
        group = f.read_row_group(i)
        h.update(str(group.num_rows).encode())
        for column in group.columns:
            for value in column.to_pylist():
                if isinstance(value, str):
                    value = value.replace(repo, "<repo>")
                h.update(repr(value).encode() if not isinstance(value, bytes) else value)
                h.update(b"\0")
    return h.hexdigest()


def dataset_digests(root: Path, repo: str) -> dict[str, dict[str, str]]:
    """Shard name (without its content hash) -> its file sha256 and content digest."""
    out = {}
    for path in sorted((root / "shards").glob("*.parquet")):
        name = path.name.rsplit("-", 1)[0]
        out[name] = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                     "content": content_digest(path, repo)}
    return out
