"""One fsspec filesystem from a URL and its (already completed) storage options: the piece
both :mod:`storage.io.urls` (every location) and :mod:`storage.io.clients` (the s3fs behind the
obstore read client) need, so that neither imports the other for it."""

from __future__ import annotations

from typing import Any


def fsspec_fs(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and its root (options completed by :func:`resolve`).

    fsspec is imported here, not with the module: importing it costs ~20-30 ms of CPU (it reads
    every installed package's entry points), which a loader reading a local dataset or an S3
    one through obstore never needs to pay (:class:`storage.io.local.files.LocalFiles`)."""
    import fsspec.core
    from fsspec.core import split_protocol

    protocol = split_protocol(url)[0] or "file"
    fs, root = fsspec.core.url_to_fs(url, **options)
    if protocol in ("s3", "s3a"):
        # s3fs's own retry loop (5 tries with growing sleeps, on top of botocore's) would
        # multiply every deadline; one try, and the replica set retries or fails over.
        fs.retries = 1
    return fs, root
