"""Real S3 servers on loopback for tests and demos (see `servers` for the why).

Use `S3Server` / `start_servers` directly, the pytest fixtures in `pytest_plugin`, or
`python -m storage.testing serve` for a manual demo.
"""

from storage.testing.servers import (
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
