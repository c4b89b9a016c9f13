"""Reading and writing ``manifest.json`` at a URL (the format itself is
:mod:`storage.format.manifest`): a dataset without a committed manifest does not exist for
readers; the manifest is written last and atomically."""

from __future__ import annotations

from typing import Any

from storage.format.layout import MANIFEST
from storage.format.manifest import DatasetNotFoundError, Manifest
from storage.io.atomic import write_atomic
from storage.io.urls import Location, resolve


def read_manifest(url: str | Location, storage_options: dict[str, Any] | None = None) -> Manifest:
    """Read and validate the manifest of the dataset at ``url``.

    Raises :class:`DatasetNotFoundError` when there is none: a dataset whose manifest has not
    been committed does not exist for readers, whatever shards may already be there.
    """
    loc = (url if isinstance(url, Location) else resolve(url, storage_options)).confined()
    path = loc.path(MANIFEST)
    try:
        text = loc.fs.cat_file(path)
    except FileNotFoundError:
        raise DatasetNotFoundError(
            f"no dataset at {loc.url}: {MANIFEST} is missing (an unfinished or failed run "
            "leaves none; rerun the pipeline to commit it)") from None
    return Manifest.from_json(text, source=loc.child_url(MANIFEST))


def write_manifest(loc: Location, manifest: Manifest) -> None:
    """Commit a dataset: the manifest is written last and atomically."""
    write_atomic(loc, MANIFEST, manifest.to_json().encode("utf-8"))
