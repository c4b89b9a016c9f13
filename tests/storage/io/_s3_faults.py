"""Stopping and resuming a real loopback S3 server, for the tests of hung (not dead) stores."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

from loopback_s3 import S3Server


def stop(server: S3Server) -> None:
    """SIGSTOP every process of the server: it keeps accepting connections, never answers."""
    for pid in server.pids:
        os.kill(pid, signal.SIGSTOP)


def resume(server: S3Server) -> None:
    for pid in server.pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def default_options(bucket: Any) -> dict[str, Any]:
    """Endpoint and credentials only: the timeouts and retries are storage's own defaults."""
    opts = bucket.storage_options
    return {"key": opts["key"], "secret": opts["secret"], "client_kwargs": opts["client_kwargs"]}
