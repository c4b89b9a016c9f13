"""Listing a store: every object under a folder (never from a stale cache) and the
modification time in an fsspec ``info`` dict, however the filesystem spells it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from storage.io.urls import Location


def mtime_of(info: dict[str, Any]) -> float | None:
    """The modification time in an fsspec ``info`` dict (local, S3, GCS, ... spell it apart)."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "mtime_ns", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, dt.datetime):
            if value.tzinfo is None:
                value = value.replace(tzinfo=dt.timezone.utc)
            return value.timestamp()
        if isinstance(value, str):
            try:
                return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
        if isinstance(value, int | float):
            return float(value) / (1e9 if key == "mtime_ns" else 1.0)
    return None


def list_tree(loc: Location, relative: str = "") -> dict[str, dict[str, Any]]:
    """Every object under ``relative`` (the whole dataset by default): relative path -> info.

    Never cached: s3fs keeps listings, and a stale one would hide what a writer just added.
    """
    fs, top = loc.fs, loc.path(relative).rstrip("/")
    fs.invalidate_cache(top)
    found = fs.find(top, detail=True, withdirs=False)
    root = loc.root.rstrip("/") + "/"
    out = {}
    for name, info in found.items():
        name = name.rstrip("/")
        if name.startswith(root) and info.get("type", "file") != "directory":
            out[name[len(root):]] = info
    return out
