"""The dataset layout on the store (see DESIGN.md), and the rule that keeps paths inside it."""

from __future__ import annotations

import posixpath
import re

MANIFEST = "manifest.json"
TOKENIZER = "tokenizer.json"
SHARDS_DIR = "shards"
QUARANTINE_DIR = "quarantine"

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class UnsafePathError(ValueError):
    """A manifest named a path that would leave the dataset root."""


def shard_name(index: int) -> str:
    return f"{SHARDS_DIR}/part-{index:05d}.parquet"


def quarantine_name(index: int) -> str:
    return f"{QUARANTINE_DIR}/part-{index:05d}.jsonl"


def safe_relative(path: str) -> str:
    """Validate a dataset-relative path and return it normalised.

    Paths come from manifests that anyone may have written; a path that is absolute, carries
    a URL scheme, or climbs out with ``..`` could make a reader fetch or a repair overwrite
    objects outside the dataset, so it is refused rather than cleaned up.
    """
    if not isinstance(path, str) or not path:
        raise UnsafePathError(f"empty or non-string path in manifest: {path!r}")
    if "\\" in path or "\x00" in path:
        raise UnsafePathError(f"path {path!r} contains a backslash or NUL")
    if _SCHEME.match(path) or path.startswith("/"):
        raise UnsafePathError(f"path {path!r} is absolute; manifest paths must be relative")
    parts = path.split("/")
    if any(part in ("..", ".", "") for part in parts):
        raise UnsafePathError(f"path {path!r} is not a plain relative path inside the dataset")
    return posixpath.normpath(path)
