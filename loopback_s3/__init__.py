"""Real S3 servers on loopback for tests and demos (see `servers` for the why).

Development only: not part of the installed wheel (pyproject's package list leaves it out),
imported from a checkout's root by the tests, the benchmarks and demos. Use `S3Server` /
`start_servers` directly, the pytest fixtures in `pytest_plugin`, or
`python -m loopback_s3 serve` for a manual demo.
"""

from loopback_s3.servers import (
    BackendNotFoundError,
    S3Bucket,
    S3Server,
    ServerStartError,
    find_backend,
    start_servers,
)

__all__ = [
    "BackendNotFoundError",
    "S3Bucket",
    "S3Server",
    "ServerStartError",
    "find_backend",
    "start_servers",
]
