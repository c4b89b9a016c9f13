"""Multipart uploads that never completed, on S3 stores: found under a dataset and aborted.

An object sent from a local file past s3fs's part size (the index at the commit of a large run)
goes up as a multipart upload. When the write deadline cancels it (a hung or crawling server,
:class:`storage.io.replicas.writes.ReplicaWrites`), or the writer dies mid-upload, the upload
stays open: its parts are stored, and billed, but listed by no object listing, so neither
``gc`` nor a person looking at the bucket sees them. s3fs aborts an upload only when a part
fails with an ``Exception``; cancellation is a ``BaseException`` (``asyncio.CancelledError``).

So the writer aborts the uploads of the key it was writing right after a cancelled put (which
works when the server is slow, not when it is hung), and ``storage gc`` aborts those of the
paths it may remove started longer ago than ``--min-age`` (:mod:`storage.admin.gc`).
A bucket lifecycle rule (``AbortIncompleteMultipartUpload``) does the same server-side.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from storage.io.urls import Location


@dataclass(frozen=True)
class Upload:
    """An open multipart upload: ``relative`` to the dataset root, its id, when it started
    (the server's clock, seconds since the epoch)."""

    relative: str
    upload_id: str
    initiated: float


def s3_filesystem(loc: Location) -> Any | None:
    """The s3fs filesystem behind ``loc`` (directly, or behind an obstore read client), or
    ``None`` for a store without multipart uploads (local folders)."""
    fs = getattr(loc.fs, "fsspec", loc.fs)
    return fs if callable(getattr(fs, "call_s3", None)) else None


def _listed(fs: Any, bucket: str, prefix: str, timeout: float | None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    markers: dict[str, str] = {}
    while True:
        page = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix, **markers,
                          timeout=timeout)
        items += page.get("Uploads") or []
        if not page.get("IsTruncated"):
            return items
        markers = {"KeyMarker": page.get("NextKeyMarker", ""),
                   "UploadIdMarker": page.get("NextUploadIdMarker", "")}


def open_uploads(loc: Location) -> list[Upload]:
    """The open multipart uploads under ``loc``, every page of the listing."""
    fs = s3_filesystem(loc)
    if fs is None:
        return []
    bucket, root, _ = fs.split_path(loc.root)
    base = f"{root.rstrip('/')}/" if root else ""
    return [Upload(item["Key"][len(base):], item["UploadId"],
                   item["Initiated"].timestamp() if item.get("Initiated") else 0.0)
            for item in _listed(fs, bucket, base, None)]


def abort(loc: Location, upload: Upload) -> None:
    """Abort ``upload``: its stored parts are dropped. An upload already gone is no error."""
    fs = s3_filesystem(loc)
    if fs is None:
        return
    bucket, root, _ = fs.split_path(loc.root)
    key = f"{root.rstrip('/')}/{upload.relative}" if root else upload.relative
    with contextlib.suppress(FileNotFoundError):  # NoSuchUpload: completed or aborted since
        fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload.upload_id)


def abort_uploads_of(fs: Any, path: str, timeout: float) -> int:
    """After a cancelled write of ``path`` (an s3fs path): abort its open uploads if the store
    answers within ``timeout`` s a request; how many. Best effort: a hung store leaves them to
    ``gc`` (module docstring)."""
    aborted = 0
    with contextlib.suppress(Exception):
        bucket, key, _ = fs.split_path(path)
        for item in _listed(fs, bucket, key, timeout):
            if item["Key"] == key:
                fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key,
                           UploadId=item["UploadId"], timeout=timeout)
                aborted += 1
    return aborted
