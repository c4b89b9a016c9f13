"""A private pair of real S3 servers that a test module may stop, resume and kill."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loopback_s3 import S3Server, start_servers
from tests.storage.io._s3_faults import resume


@pytest.fixture(scope="module")
def fault_servers() -> Iterator[list[S3Server]]:
    """A private pair that tests stop (SIGSTOP), resume and kill; one per test module."""
    servers = start_servers(2)
    try:
        yield servers
    finally:
        for server in servers:
            resume(server)
            server.stop()
