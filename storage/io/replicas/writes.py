"""A replica set's writes: every replica in parallel, the write quorum, retries of throttled
and transient failures, a deadline on object-store PUTs, ``_degraded/`` markers for a replica
missed (:mod:`storage.io.degraded`), deletes. Mixed into
:class:`storage.io.replicas.replica_set.ReplicaSet`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from storage.format.checksums import digest_bytes, digest_stream
from storage.io import degraded, multipart
from storage.io.atomic import Payload, payload_size, write_atomic
from storage.io.replicas.errors import QuorumError, short_error
from storage.io.replicas.health import Replica, ReplicaHealth
from storage.io.retry import THROTTLE, TRANSIENT, Backoff, classify
from storage.io.urls import Location, write_deadline_s

#: How long the clean-up after a cancelled write waits on each request (a hung store leaves
#: the upload to ``gc``: :mod:`storage.io.multipart`)
ABORT_TIMEOUT_S = 1.0


class _WriteDeadline:
    """An async filesystem (s3fs, ...) whose whole-object writes are cancelled after
    ``seconds``: fsspec's ``timeout`` wraps the request in ``asyncio.wait_for``. A cancelled
    write's multipart upload, if it began one, is aborted when the store still answers
    (cancellation skips s3fs's own abort)."""

    def __init__(self, fs: Any, seconds: float) -> None:
        self._fs, self._seconds = fs, seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    def _bounded(self, what: str, call: Callable[..., Any], *args: Any,
                 uploading: str | None = None, **kwargs: Any) -> Any:
        from fsspec.exceptions import FSTimeoutError

        try:
            return call(*args, timeout=self._seconds, **kwargs)
        except FSTimeoutError as exc:
            if uploading is not None:
                multipart.abort_uploads_of(self._fs, uploading, ABORT_TIMEOUT_S)
            raise TimeoutError(f"{what} not done in {self._seconds:.1f} s (cancelled)") from exc

    def pipe_file(self, path: str, data: bytes, **kwargs: Any) -> Any:
        return self._bounded(f"write of {len(data):,} bytes to {path}", self._fs.pipe_file,
                             path, data, uploading=path, **kwargs)

    def put_file(self, source: str, path: str, **kwargs: Any) -> Any:
        """A local file's bytes, under the deadline for its size."""
        return self._bounded(f"write of {source} to {path}", self._fs.put_file, source, path,
                             uploading=path, **kwargs)

    def cp_file(self, source: str, path: str, **kwargs: Any) -> Any:
        """A server-side copy, under the same deadline as writing the bytes would have."""
        return self._bounded(f"copy of {source} to {path}", self._fs.cp_file, source, path,
                             **kwargs)


def _with_write_deadline(loc: Location, nbytes: int) -> Location:
    from fsspec.asyn import AsyncFileSystem

    fs = getattr(loc.fs, "fsspec", loc.fs)  # the s3fs behind an obstore read client writes
    if not isinstance(fs, AsyncFileSystem):
        return loc  # local and other blocking filesystems: the OS's own semantics
    return dataclasses.replace(loc, fs=_WriteDeadline(fs, write_deadline_s(nbytes)))



def _digest(data: Payload) -> str:
    if isinstance(data, Path):
        with open(data, "rb") as fh:
            return digest_stream(fh)
    return digest_bytes(data)


class ReplicaWrites(ReplicaHealth):
    """The writes of :class:`storage.io.replicas.replica_set.ReplicaSet` (which sets these)."""

    write_quorum: int
    backoff: Backoff
    throttle_retries: int
    sync: bool

    def put(self, relative: str, data: Payload, same_as: str | None = None) -> list[str]:
        """Write to every replica; returns the names of replicas missed (degraded write).

        ``data``: the bytes, or a local file holding them (``pathlib.Path``: read as it is
        sent, never held whole; it must not change until this returns).

        ``same_as``: an object on the primary replica holding exactly ``data``, which the
        primary may link or copy inside the store instead of writing the bytes (see
        :func:`storage.io.atomic.write_atomic`).
        """
        results: dict[int, BaseException | None] = {}

        def one(replica: Replica) -> None:
            try:
                self._write_with_retries(replica, relative, data,
                                         same_as if replica.index == 0 else None)
                results[replica.index] = None
            except Exception as exc:
                results[replica.index] = exc

        if len(self.replicas) == 1:
            one(self.replicas[0])
        else:
            with ThreadPoolExecutor(len(self.replicas)) as pool:
                list(pool.map(one, self.replicas))
        failed = [r for r in self.replicas if results[r.index] is not None]
        ok = [r for r in self.replicas if results[r.index] is None]
        for r in failed:
            self._mark_failed(r, results[r.index])  # type: ignore[arg-type]
        if len(ok) < self.write_quorum:
            detail = "; ".join(f"{r.name}: {short_error(results[r.index])}"  # type: ignore[arg-type]
                               for r in failed)
            raise QuorumError(f"write of {relative} reached {len(ok)} of {len(self.replicas)} "
                              f"replicas, quorum is {self.write_quorum}: {detail}")
        if failed:
            self._record_degraded(relative, _digest(data), ok, failed)
        return [r.name for r in failed]

    def _write_with_retries(self, replica: Replica, relative: str, data: Payload,
                            same_as: str | None = None) -> None:
        """The write side of the policy in :mod:`storage.io.retry`: throttling is retried with
        back-off, a transient failure (connection refused or reset, HTTP 5xx) once; a timeout is
        not (the replica is hung: waiting for it again only doubles the stall). A PUT to an
        object store is cancelled after :func:`storage.io.urls.write_deadline_s`. Rewriting the
        same bytes is idempotent."""
        transient_left = 1
        loc = _with_write_deadline(replica.loc, payload_size(data))
        for attempt in range(self.throttle_retries + 2):
            try:
                write_atomic(loc, relative, data, same_as, sync=self.sync)
                return
            except Exception as exc:
                kind = classify(exc)
                if kind == THROTTLE and attempt < self.throttle_retries:
                    self.backoff.sleep(attempt)
                    continue
                if kind == TRANSIENT and transient_left:
                    transient_left -= 1
                    self.backoff.sleep(attempt)
                    continue
                raise

    def _record_degraded(self, relative: str, sha256: str, ok: list[Replica],
                         failed: list[Replica]) -> None:
        """Leave a marker (:mod:`storage.io.degraded`) on the replicas written: which object,
        which bytes, which replicas missed it (by URL, so any admin ordering finds them)."""
        by_loc = {id(r.loc): r for r in ok}
        for loc, exc in degraded.record([r.loc for r in ok], relative, sha256,
                                        [(r.index, r.loc.url) for r in failed]):
            self._mark_failed(by_loc[id(loc)], exc)  # the scrub in `repair` still finds the gap

    def delete(self, relative: str) -> None:
        """Remove an object from every replica that is reachable (missing is fine)."""
        for replica in self.replicas:
            try:
                path = replica.loc.path(relative)
                if replica.loc.fs.exists(path):
                    replica.loc.fs.rm_file(path)
            except Exception as exc:
                self._mark_failed(replica, exc)
