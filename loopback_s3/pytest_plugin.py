"""Pytest fixtures that give tests real S3 buckets on loopback servers.

Enable with `pytest_plugins = ["loopback_s3.pytest_plugin"]` in the root conftest or
`pytest -p loopback_s3.pytest_plugin`. Servers start only when a test asks for one of these
fixtures, once per session (~4 s), so test runs that never touch S3 pay nothing.
Set SHARDFLOW_S3_BACKEND=minio|seaweedfs to force a backend (default: auto).

Tests that kill or stop servers must start their own `S3Server`, not use these shared ones.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

import pytest

from infra import environment
from loopback_s3.servers import S3Bucket, S3Server, start_servers

#: forces the fixtures' server implementation (registered in infra/environment.py)
BACKEND_ENV = "SHARDFLOW_S3_BACKEND"

N_SERVERS = 2


def _fresh_bucket(server: S3Server) -> Iterator[S3Bucket]:
    """Create a uniquely named bucket, yield it, then delete it with its contents.

    Deleting matters on SeaweedFS: every bucket holds its own volumes until it is removed.
    """
    bucket = server.make_bucket(f"bucket-{secrets.token_hex(6)}")
    yield bucket
    # cleanup only: a failure here must not hide the test's own result
    with contextlib.suppress(Exception):
        server.remove_bucket(bucket.name)


@pytest.fixture(scope="session")
def s3_servers() -> Iterator[list[S3Server]]:
    """Two independent S3 servers (own credentials, ports and data), started in parallel."""
    servers = start_servers(N_SERVERS, backend=environment.value(BACKEND_ENV))
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def s3_server(s3_servers: list[S3Server]) -> S3Server:
    """The first of `s3_servers`."""
    return s3_servers[0]


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> Iterator[S3Bucket]:
    """A fresh, empty bucket on `s3_server`: `.url` ("s3://bucket-..."), `.storage_options`."""
    yield from _fresh_bucket(s3_server)


@pytest.fixture
def s3_buckets(s3_servers: list[S3Server]) -> Iterator[list[S3Bucket]]:
    """One fresh, empty bucket on each of `s3_servers` (same order)."""
    buckets: list[S3Bucket] = []
    generators = [_fresh_bucket(server) for server in s3_servers]
    try:
        for gen in generators:
            buckets.append(next(gen))
        yield buckets
    finally:
        for gen in generators[: len(buckets)]:
            next(gen, None)
