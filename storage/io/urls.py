"""Resolve dataset URLs to fsspec filesystems.

Every byte Shardflow reads or writes goes through here, so that local paths, ``s3://`` and any
other fsspec protocol behave the same and S3 settings come from one place: explicit storage
options first, then the standard AWS environment variables.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from storage.io.clients import ObstoreS3FileSystem, wants_obstore
from storage.io.fsspec_fs import fsspec_fs
from storage.io.local.files import LocalFiles

#: Option keys whose values are secrets: never logged, never written to a manifest.
SECRET_KEYS = frozenset({"secret", "key", "token", "aws_secret_access_key", "session_token",
                         "aws_session_token", "password"})


@dataclass(frozen=True)
class Location:
    """A directory-like place on some filesystem: ``fs`` plus the protocol-less ``root``."""

    url: str
    fs: Any = field(repr=False, compare=False)
    root: str

    def path(self, relative: str) -> str:
        """Path of ``relative`` under the root, in the filesystem's own notation."""
        if not relative:
            return self.root
        return f"{self.root.rstrip('/')}/{relative.lstrip('/')}"

    def child_url(self, relative: str) -> str:
        return f"{self.url.rstrip('/')}/{relative.lstrip('/')}"

    @property
    def is_local(self) -> bool:
        if isinstance(self.fs, LocalFiles):
            return True
        # fsspec's own (a caller's): never an instance while fsspec is not even imported
        local = sys.modules.get("fsspec.implementations.local")
        return local is not None and isinstance(self.fs, local.LocalFileSystem)

    def confined(self) -> Location:
        """This location as a dataset's: on a local filesystem, one whose every read, write
        and removal stays inside the root, never through a symlink out
        (:class:`storage.io.local.dataset_fs.DatasetFileSystem`; the rules are in
        :mod:`storage.io.local.paths`). Other filesystems are returned as they are: object
        stores have no symlinks.

        Not the default of :func:`resolve`: input corpora (often symlink farms, such as a
        model hub's cache) and other folders keep plain local semantics.
        """
        if not self.is_local or getattr(self.fs, "dataset_root", None) is not None:
            return self  # a LocalFiles or DatasetFileSystem of a dataset already
        options = getattr(self.fs, "storage_options", {})  # e.g. auto_mkdir, kept
        return replace(self, fs=LocalFiles(self.root, **options))


def s3_options_from_env(env: os._Environ[str] | dict[str, str] | None = None) -> dict[str, Any]:
    """S3 options from the standard AWS variables, for endpoints that botocore would not find.

    botocore already reads ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_PROFILE`` on its
    own; we only add the endpoint (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``) and region so
    that a loopback MinIO/SeaweedFS server works with nothing but environment variables.
    """
    env = os.environ if env is None else env
    opts: dict[str, Any] = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    client_kwargs: dict[str, Any] = {}
    if endpoint:
        client_kwargs["endpoint_url"] = endpoint
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        client_kwargs["region_name"] = region
    if client_kwargs:
        opts["client_kwargs"] = client_kwargs
    return opts


#: Per-request deadlines of the one retry policy (see :mod:`storage.io.retry`): connect within 2 s,
#: first byte (and each later read) within 5 s, and a single attempt: botocore retries nothing
#: (``total_max_attempts=1``), s3fs's loop runs once (``fs.retries = 1`` in :func:`resolve`), and
#: the replica set decides what is retried where. Explicit storage options override these.
CONNECT_TIMEOUT_S = 2
READ_TIMEOUT_S = 5
#: A send has no deadline in aiohttp (a hung server's full socket buffer blocks a PUT for
#: ever), so a whole-object write gets one: connect + read deadlines + its size at this rate.
MIN_WRITE_BYTES_PER_S = 2 << 20


def write_deadline_s(nbytes: int) -> float:
    """How long one PUT of ``nbytes`` may take before it is cancelled."""
    return CONNECT_TIMEOUT_S + READ_TIMEOUT_S + nbytes / MIN_WRITE_BYTES_PER_S
S3_DEFAULTS: dict[str, Any] = {
    "config_kwargs": {"connect_timeout": CONNECT_TIMEOUT_S, "read_timeout": READ_TIMEOUT_S,
                      "retries": {"total_max_attempts": 1, "mode": "standard"}},
}


def display_url(url: str) -> str:
    """The URL without any ``user:password@`` part, for logs and errors."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    return f"{scheme}://{netloc}{slash}{path}"


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def s3_options(storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """The fsspec options :func:`resolve` uses for an S3 URL: our deadlines and retries
    (:data:`S3_DEFAULTS`), then the endpoint and region from the environment, then the
    caller's options. Public for code that builds its own s3fs (DCP's checkpoint writer), so
    there is one merge rule for the whole project."""
    options = dict(storage_options or {})
    user_retries = options.get("config_kwargs", {}).get("retries")
    options = _merge(_merge(S3_DEFAULTS, s3_options_from_env()), options)
    if isinstance(user_retries, dict):
        # botocore lets total_max_attempts win over max_attempts: an explicit retries
        # setting replaces ours whole instead of being silently overridden by it
        options["config_kwargs"]["retries"] = dict(user_retries)
    return options


def split_protocol(url: Any) -> tuple[str | None, str]:
    """``(protocol, path)`` of a URL or path, as ``fsspec.core.split_protocol`` splits it
    (``None`` for a plain path), without importing fsspec."""
    url = os.fspath(url)
    if "://" in url:
        protocol, path = url.split("://", 1)
        if len(protocol) > 1:  # not a Windows drive letter
            return protocol, path
    if url.startswith("data:"):
        protocol, path = url.split(":", 1)
        return protocol, path
    return None, url


def resolve(url: str, storage_options: dict[str, Any] | None = None) -> Location:
    """Turn a URL (or plain path) plus options into a :class:`Location`.

    An ``s3://`` URL reads through ``obstore`` when it is installed and the options allow
    (:mod:`storage.io.clients`); everything else, and S3 writes, through fsspec.
    """
    protocol, path = split_protocol(url)
    protocol = protocol or "file"
    options = dict(storage_options or {})
    if protocol in ("file", "local"):  # no fsspec until a call needs more than reads
        root = os.path.abspath(os.path.expanduser(path))
        return Location(url=root, fs=LocalFiles(None, **options), root=root)
    if protocol in ("s3", "s3a"):
        options = s3_options(options)
        settings = wants_obstore(options)
        if settings is not None:
            root = url.split("://", 1)[1].strip("/")
            fs = ObstoreS3FileSystem(url, options, settings)
            return Location(url=url.rstrip("/") or url, fs=fs, root=root)
    fs, root = fsspec_fs(url, options)
    from fsspec.implementations.local import LocalFileSystem  # imported with fs already

    if isinstance(fs, LocalFileSystem):
        root = os.path.abspath(root)
        url = root
    return Location(url=url.rstrip("/") or url, fs=fs, root=root.rstrip("/") or root)


def redact(options: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of storage options that is safe to print: secret values replaced by ``***``."""
    if not options:
        return {}
    out: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, dict):
            out[key] = redact(value)
        elif key.lower() in SECRET_KEYS:
            out[key] = "***"
        else:
            out[key] = value
    return out
