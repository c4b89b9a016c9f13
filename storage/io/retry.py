"""The one retry policy of Shardflow's object-store I/O, and how errors are classified.

Deadlines, per request (``storage.io.urls.S3_DEFAULTS``)
    connect 2 s, read 5 s (the longest wait for the first byte, and between two reads of the
    body), exactly one attempt: botocore's own retries are off (``total_max_attempts=1``) and
    s3fs's retry loop runs once (``fs.retries = 1``). So one request to a hung server costs at
    most ~5 s, never ``attempts x timeout`` of nested retry layers (before: 6 x 20 s). Sending
    has no deadline in aiohttp (a PUT to a stopped server blocks once its socket buffer is
    full), so the replica set cancels a whole-object write after
    :func:`storage.io.urls.write_deadline_s` (the two deadlines + its size at 2 MB/s).

Who retries: only :class:`storage.io.replicas.replica_set.ReplicaSet`, on the error's class
    - throttling (:data:`THROTTLE`): the replica is fine and asks us to slow down; retried on
      the same replica with exponential back-off and full jitter (:class:`Backoff`), so many
      readers do not retry in lock-step;
    - a timeout (:data:`TIMEOUT`): the replica already had its deadline; the read moves to the
      next replica at once and the replica rests for a back-off. Reads with another replica do
      not even wait for the timeout: after a hedge deadline derived from observed latency
      (:mod:`storage.io.hedge`), the same range is also asked of the next replica and the first
      verified answer wins;
    - a connection-level failure or HTTP 500/502/504 (:data:`TRANSIENT`): next replica at once;
      when every replica failed that way, one more pass over them after a back-off (a server
      restart, a dropped connection);
    - anything else (:data:`PERMANENT`: access denied, a wrong checksum, a bad request): next
      replica at once, no second pass; a missing object is the object's problem, not the
      replica's, and is never retried.
    Writes go to every replica: throttling is retried with back-off, a transient failure once,
    a timeout not at all (the replica is hung).

Classification is by exception type and by the S3 error code / HTTP status of a botocore
``ClientError``, found on the exception itself or along its ``__cause__``/``__context__`` chain
(s3fs re-raises S3 errors as ``OSError``/``PermissionError``... with the ``ClientError`` as the
cause). Never by substring: an ``OSError`` whose message mentions ``part-00503.parquet`` or port
50399 is not throttling.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

THROTTLE = "throttle"
TIMEOUT = "timeout"
TRANSIENT = "transient"
PERMANENT = "permanent"

#: S3 (and AWS-wide) error codes that mean "slow down"; HTTP 429 and 503 mean it too.
THROTTLE_CODES = frozenset({"SlowDown", "TooManyRequests", "RequestLimitExceeded", "Throttling",
                            "ThrottlingException", "RequestThrottled"})
THROTTLE_STATUS = frozenset({429, 503})
#: server-side failures worth another pass (500 InternalError is what SeaweedFS answers while
#: a storage node is gone; 502/504 come from proxies and load balancers)
TRANSIENT_STATUS = frozenset({500, 502, 504})


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, then its causes and contexts, each once."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]


def _loaded(module: str) -> Any:
    """A module only if something already imported it.

    An exception from botocore or aiohttp can exist only once they are imported, so their
    types are looked up, never imported, here: importing both cost ~0.17 s in every process
    whose first error came from a local store (a pipeline's driver and each worker).
    """
    return sys.modules.get(module)


def _client_error(e: BaseException) -> tuple[str, int] | None:
    """(error code, HTTP status) of a botocore ``ClientError``, else None."""
    boto = _loaded("botocore.exceptions")
    if boto is None or not isinstance(e, boto.ClientError):
        return None
    response = getattr(e, "response", None) or {}
    code = str((response.get("Error") or {}).get("Code") or "")
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return code, int(status) if isinstance(status, int) else 0


def _timeout_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [TimeoutError]  # socket.timeout, asyncio.TimeoutError
    boto = _loaded("botocore.exceptions")
    if boto is not None:
        types += [boto.ReadTimeoutError, boto.ConnectTimeoutError]
    return tuple(types)


def _connection_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [ConnectionError]  # refused, reset, aborted, broken pipe
    boto = _loaded("botocore.exceptions")
    if boto is not None:
        types += [boto.ConnectionError, boto.ConnectionClosedError, boto.ResponseStreamingError]
    aio = _loaded("aiohttp.client_exceptions")
    if aio is not None:
        types += [aio.ClientConnectionError, aio.ClientPayloadError]
    return tuple(types)


def classify(exc: BaseException) -> str:
    """:data:`THROTTLE`, :data:`TIMEOUT`, :data:`TRANSIENT` or :data:`PERMANENT`.

    The first exception along the cause/context chain that says something decides: an S3
    ``ClientError`` by its code and status, a timeout or connection error by its type.
    """
    timeouts, connections = _timeout_types(), _connection_types()
    for e in _chain(exc):
        found = _client_error(e)
        if found is not None:
            code, status = found
            if code in THROTTLE_CODES or status in THROTTLE_STATUS:
                return THROTTLE
            return TRANSIENT if status in TRANSIENT_STATUS else PERMANENT
        status = getattr(e, "status", None)  # storage.io.clients.HTTPStatusError (obstore)
        if isinstance(e, OSError) and isinstance(status, int) and 400 <= status < 600:
            if status in THROTTLE_STATUS:
                return THROTTLE
            return TRANSIENT if status in TRANSIENT_STATUS else PERMANENT
        if isinstance(e, timeouts):  # before connections: some timeouts are both
            return TIMEOUT
        if isinstance(e, connections):
            return TRANSIENT
    return PERMANENT


def is_store_error(exc: BaseException) -> bool:
    """Did talking to a store fail (rather than our code)? A CLI reports such an error in one
    line instead of a traceback. botocore's errors (``EndpointConnectionError``, a
    ``ClientError`` that s3fs did not translate) and aiohttp's are no ``OSError``."""
    types: list[type[BaseException]] = [OSError]
    boto = _loaded("botocore.exceptions")
    if boto is not None:
        types += [boto.BotoCoreError, boto.ClientError]
    aio = _loaded("aiohttp")
    if aio is not None:
        types.append(aio.ClientError)
    return any(isinstance(e, tuple(types)) for e in _chain(exc))


def is_throttle(exc: BaseException) -> bool:
    """Is this the store asking us to slow down (S3 SlowDown & co., HTTP 429/503)?"""
    return classify(exc) == THROTTLE


@dataclass(frozen=True)
class Backoff:
    base_s: float = 0.1
    cap_s: float = 5.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Full-jitter delay before retry ``attempt`` (0-based): uniform in [0, min(cap, b*2^a)]."""
        ceiling = min(self.cap_s, self.base_s * (2 ** attempt))
        return (rng or random).uniform(0, ceiling)

    def sleep(self, attempt: int) -> None:
        time.sleep(self.delay(attempt))
