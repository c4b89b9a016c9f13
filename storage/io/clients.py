"""The S3 read client: ranged GETs through ``obstore`` (Rust ``object_store``) behind fsspec.

Why: on the ranged GETs a loader issues, ``obstore`` costs less CPU per GB than
s3fs/aiobotocore (several times less on small ranges) at a higher rate, and importing s3fs +
aiobotocore would take a large part of a loader's first batch
(``benchmarks/storage_read.py --clients``; figures in benchmarks/README.md).

How: :func:`storage.io.urls.resolve` gives an ``s3://`` location an :class:`ObstoreS3FileSystem`
as its ``fs``. It answers ``cat_file`` (whole objects and byte ranges) and :meth:`read_range`
(zero-copy buffer) with ``obstore``; every other filesystem call (writes, listings, deletes,
``info``...) goes to the s3fs filesystem the same URL and ``storage_options`` give, created on
first use. So the user-facing interface stays fsspec URLs + ``storage_options``, and every read
of the replica set, the index and the loader goes through this one client.

Options are translated from s3fs's: ``key``/``secret``/``token``, ``anon``,
``client_kwargs.endpoint_url``/``region_name``, ``config_kwargs.connect_timeout``/
``read_timeout``/``s3.addressing_style``. Anything else (a profile, requester-pays, SSE
settings...) or no explicit credentials at all (botocore's chain: profiles, SSO, instance
roles) keeps plain s3fs. ``SHARDFLOW_S3_CLIENT=s3fs`` forces s3fs, ``=obstore`` requires it.

Errors are mapped onto what :mod:`storage.io.retry` classifies: a missing key is
``FileNotFoundError``; an HTTP error status becomes :class:`HTTPStatusError` (``status``,
so 503 is throttling and 500 transient); a timeout ``TimeoutError``; a failed connection
``ConnectionError``; denied/unauthenticated ``PermissionError``. ``obstore`` retries nothing
(``max_retries=0``): the replica set decides, as for s3fs.
"""

from __future__ import annotations

import json
import os
import re
import select
import sys
import threading
from datetime import timedelta
from typing import Any

from infra import environment
from infra.process.local import ProcessLocal, none
from storage.io.fsspec_fs import fsspec_fs

#: ``auto`` (obstore when importable and the options allow), ``obstore`` or ``s3fs``
CLIENT_ENV = "SHARDFLOW_S3_CLIENT"

#: s3fs option keys the translation understands; any other key keeps s3fs
_KNOWN = {"key", "secret", "token", "anon", "client_kwargs", "config_kwargs", "use_listings_cache",
          "skip_instance_cache", "default_block_size", "default_cache_type", "asynchronous",
          "loop", "listings_expiry_time", "max_concurrency"}
_KNOWN_CLIENT = {"endpoint_url", "region_name", "aws_access_key_id", "aws_secret_access_key",
                 "aws_session_token"}
_KNOWN_CONFIG = {"connect_timeout", "read_timeout", "retries", "s3", "max_pool_connections"}

_STATUS = re.compile(r"non-2xx status code: (\d{3})\b")
_HTTP_KIND = re.compile(r"HttpError \{\s*kind: (\w+)")


#: The pid of the process whose obstore (tokio) runtime is running, once one is. obstore's
#: runtime is process-global and does not survive ``fork``: a forked child (a DataLoader worker)
#: that calls it hangs. So a child forked after obstore started reads through s3fs instead.
_RUNTIME_PID: int | None = None
_FORKED_AFTER_RUNTIME = False

#: obstore stores shared by every copy of a filesystem in this process, by bucket and settings:
#: a Dask task's arguments are unpickled afresh for each task, and a store per copy cost ~9 ms
#: and a new connection pool each time. The pid in the key keeps a forked child off its
#: parent's stores (their runtime threads are not in the child).
_STORES: dict[tuple[int, str, str], Any] = {}
_STORES_LOCK = threading.Lock()


def _shared_store(bucket: str, settings: dict[str, Any]) -> Any:
    key = (os.getpid(), bucket, json.dumps(settings, sort_keys=True, default=repr))
    store = _STORES.get(key)
    if store is None:
        from obstore.store import S3Store

        with _STORES_LOCK:
            store = _STORES.get(key)
            if store is None:
                store = S3Store(bucket, config=settings["config"],
                                client_options=settings["client_options"],
                                retry_config={"max_retries": 0})
                _STORES[key] = store
    return store


#: fsspec's I/O event loop as it was when this process forked (see :func:`_unshare_epoll`)
_LOOP_AT_FORK: list[Any] = []


def _before_fork() -> None:
    asyn = sys.modules.get("fsspec.asyn")
    _LOOP_AT_FORK[:] = [asyn.loop[0]] if asyn is not None and asyn.loop[0] is not None else []


def _unshare_epoll() -> None:
    """In a forked child: give the inherited event loop (s3fs's, run by a thread that did not
    come along) an epoll instance of its own.

    An epoll instance survives ``fork`` as one kernel object shared by parent and child. When
    the child drops an inherited connection (fsspec clears its instance cache on a new pid and
    s3fs's finalizer closes the pooled connections), each close unregisters its socket from
    that shared epoll: the parent's loop then never hears from the socket again, and its next
    request on it waited until its deadline (a trainer writing a checkpoint to S3 after an
    epoch with DataLoader workers). With a private epoll the child's unregistering finds
    nothing (ENOENT, ignored by :mod:`selectors`) and the parent keeps its sockets.
    """
    epoll = getattr(select, "epoll", None)  # Linux; elsewhere kqueue is not inherited
    for loop in _LOOP_AT_FORK:
        selector = getattr(getattr(loop, "_selector", None), "_selector", None)
        if epoll is not None and isinstance(selector, epoll):
            loop._selector._selector = epoll()
            selector.close()  # the child's descriptor only: the parent's epoll stays open
    _LOOP_AT_FORK.clear()


def _after_fork_in_child() -> None:
    global _FORKED_AFTER_RUNTIME
    if _RUNTIME_PID is not None:
        _FORKED_AFTER_RUNTIME = True
    _unshare_epoll()


def _after_fork_in_parent() -> None:
    _LOOP_AT_FORK.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child,
                        after_in_parent=_after_fork_in_parent)


def obstore_usable() -> bool:
    """Can this process call obstore (not a child forked after its runtime started)?"""
    return not _FORKED_AFTER_RUNTIME


class HTTPStatusError(OSError):
    """The store answered a request with an HTTP error ``status`` (classified by it)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ReadTimeoutError(TimeoutError):
    """The store accepted the request but sent nothing for the read timeout (or the whole
    request outlived its deadline): a hung or overloaded server."""


def obstore_available() -> bool:
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True


def s3_config(options: dict[str, Any],
              env: dict[str, str] | os._Environ[str] | None = None) -> dict[str, Any] | None:
    """``obstore`` S3Store settings equivalent to s3fs ``options``, or None when some option
    (or the lack of explicit credentials) needs s3fs/botocore."""
    env = os.environ if env is None else env
    if set(options) - _KNOWN:
        return None
    ck = dict(options.get("client_kwargs") or {})
    cfg = dict(options.get("config_kwargs") or {})
    if set(ck) - _KNOWN_CLIENT or set(cfg) - _KNOWN_CONFIG:
        return None
    s3 = dict(cfg.get("s3") or {})
    if set(s3) - {"addressing_style"}:
        return None
    config: dict[str, Any] = {}
    key = options.get("key") or ck.get("aws_access_key_id")
    secret = options.get("secret") or ck.get("aws_secret_access_key")
    token = options.get("token") or ck.get("aws_session_token")
    if options.get("anon"):
        config["skip_signature"] = True
    elif key and secret:
        config.update(access_key_id=key, secret_access_key=secret)
        if token:
            config["session_token"] = token
    elif env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY") \
            and not env.get("AWS_PROFILE"):
        config.update(access_key_id=env["AWS_ACCESS_KEY_ID"],
                      secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
        if env.get("AWS_SESSION_TOKEN"):
            config["session_token"] = env["AWS_SESSION_TOKEN"]
    else:
        return None  # profiles, SSO, instance roles: botocore's credential chain
    endpoint = ck.get("endpoint_url")
    if endpoint:
        config["endpoint"] = endpoint
    region = ck.get("region_name") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    config["region"] = region or "us-east-1"
    style = s3.get("addressing_style")
    if style == "path" or (endpoint and style != "virtual"):
        config["virtual_hosted_style_request"] = False  # custom endpoints: path style
    elif style == "virtual":
        config["virtual_hosted_style_request"] = True
    client: dict[str, Any] = {
        "connect_timeout": timedelta(seconds=float(cfg.get("connect_timeout", 2))),
        "read_timeout": timedelta(seconds=float(cfg.get("read_timeout", 5))),
        "timeout": timedelta(seconds=300),  # the read timeout bounds a stall; this a whole GET
        "pool_idle_timeout": timedelta(seconds=30),
    }
    if endpoint and endpoint.startswith("http://"):
        client["allow_http"] = True
    return {"config": config, "client_options": client}


def map_error(exc: BaseException, what: str) -> BaseException:
    """An ``obstore`` exception -> the builtin type :mod:`storage.io.retry` classifies."""
    from obstore import exceptions as oe

    text = f"{what}: {str(exc).strip()[:500]}"
    if isinstance(exc, oe.NotFoundError):
        return FileNotFoundError(text)
    if isinstance(exc, (oe.PermissionDeniedError, oe.UnauthenticatedError)):
        return PermissionError(text)
    raw = str(exc)
    status = _STATUS.search(raw)
    if status:
        code = int(status.group(1))
        if code == 404:
            return FileNotFoundError(text)
        if code in (401, 403):
            return PermissionError(text)
        return HTTPStatusError(text, code)
    kind = _HTTP_KIND.search(raw)  # object_store's HttpErrorKind, in the error's debug source
    if kind:
        if kind.group(1) == "Timeout":
            return ReadTimeoutError(text)
        if kind.group(1) in ("Connect", "Request", "Interrupted", "Decode"):
            return ConnectionError(text)
    return exc


class ObstoreS3FileSystem(ProcessLocal):
    """An s3fs filesystem whose reads go through ``obstore``; see the module docstring.

    Picklable (DataLoader workers): the ``obstore`` stores and the s3fs filesystem are made
    again, lazily, in each process.
    """

    protocol = ("s3", "s3a")
    #: Pickled without the s3fs instance: the copy takes its process's own from fsspec's
    #: instance cache. Kept, it looked inherited from another process to the copy (whose pid
    #: differs), which then built a fresh s3fs and S3 client for every unpickling, i.e. in
    #: every Dask task of a pipeline writing to S3.
    _process_local = {"_stores": dict, "_lock": threading.Lock, "_pid": none, "_fs": none,
                      "_fs_pid": none}

    def __init__(self, url: str, storage_options: dict[str, Any], settings: dict[str, Any],
                 fs: Any = None) -> None:
        self._url = url
        self._options = storage_options
        self._settings = settings
        self._fs = fs
        self._fs_pid = os.getpid() if fs is not None else None
        self._stores: dict[str, Any] = {}
        self._pid = os.getpid()
        self._lock = threading.Lock()

    # -- the s3fs filesystem, for everything but reads ------------------------------------

    @property
    def fsspec(self) -> Any:
        """The s3fs filesystem of the same URL and options (created on first use, and again
        in a forked child: an s3fs instance is not fork-safe)."""
        pid = os.getpid()
        if self._fs is None or self._fs_pid != pid:
            with self._lock:
                if self._fs is None or self._fs_pid != pid:
                    options = self._options
                    if self._fs is not None:  # inherited: fsspec's cached one is the parent's
                        options = {**options, "skip_instance_cache": True}
                    self._fs = fsspec_fs(self._url, options)[0]
                    self._fs_pid = pid
        return self._fs

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_fs", "_fs_pid", "_url", "_options", "_settings",
                                             "_stores", "_pid", "_lock"):
            raise AttributeError(name)
        return getattr(self.fsspec, name)

    # -- reads ----------------------------------------------------------------------------

    def _store(self, bucket: str) -> Any:
        global _RUNTIME_PID
        pid = os.getpid()
        _RUNTIME_PID = pid
        if self._pid != pid:  # a forked child: the parent's runtime threads are not here
            self._stores, self._pid = {}, pid
        store = self._stores.get(bucket)
        if store is None:
            store = self._stores[bucket] = _shared_store(bucket, self._settings)
        return store

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        path = path.split("://", 1)[-1].lstrip("/")
        bucket, _, key = path.partition("/")
        return bucket, key

    def read_range(self, path: str, start: int | None = None, end: int | None = None) -> Any:
        """Bytes ``[start, end)`` of ``path`` (bucket/key) as a zero-copy buffer (or the whole
        object); ``end`` beyond the object is cut to its size, as in fsspec."""
        if not obstore_usable():  # a child forked after obstore started: s3fs
            return self.fsspec.cat_file(path, start=start, end=end)
        import obstore

        bucket, key = self._split(path)
        store = self._store(bucket)
        what = f"s3://{path}" if start is None and end is None else f"s3://{path}[{start}:{end}]"
        try:
            if start is None and end is None:
                return obstore.get(store, key).bytes()
            if start is None or start < 0 or end is None or end < 0:
                return self.fsspec.cat_file(path, start=start, end=end)  # suffix ranges
            if end <= start:
                return b""
            return obstore.get_range(store, key, start=start, end=end)
        except Exception as exc:
            mapped = map_error(exc, what)
            if mapped is exc:
                raise
            raise mapped from exc

    def cat_file(self, path: str, start: int | None = None, end: int | None = None,
                 **kwargs: Any) -> bytes:
        if kwargs:
            return self.fsspec.cat_file(path, start=start, end=end, **kwargs)
        data = self.read_range(path, start, end)
        return data if isinstance(data, bytes) else bytes(data)

    def invalidate_cache(self, path: str | None = None) -> None:
        if self._fs is not None:
            self._fs.invalidate_cache(path)


def read_range(fs: Any, path: str, start: int | None = None, end: int | None = None) -> Any:
    """Bytes ``[start, end)`` of ``path`` on ``fs``: a zero-copy buffer where the filesystem
    offers one (``obstore``), else ``bytes``."""
    reader = getattr(type(fs), "read_range", None)
    if reader is not None:
        return reader(fs, path, start, end)
    return fs.cat_file(path, start=start, end=end)


def wants_obstore(options: dict[str, Any]) -> dict[str, Any] | None:
    """The ``obstore`` settings for these s3fs ``options`` when ``obstore`` should be used."""
    choice = environment.value(CLIENT_ENV).strip().lower() or "auto"
    if choice == "s3fs":
        return None
    settings = s3_config(options)
    if choice == "obstore":
        if not obstore_available():
            raise ImportError(f"{CLIENT_ENV}=obstore but obstore is not installed")
        if settings is None:
            raise ValueError(f"{CLIENT_ENV}=obstore but these storage options need s3fs")
        return settings
    return settings if settings is not None and obstore_available() else None
