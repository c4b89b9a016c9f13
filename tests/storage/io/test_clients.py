"""The obstore read client behind fsspec URLs: option translation, errors, reads, pickling."""

from __future__ import annotations

import pickle

import pytest

from storage import ReplicaSet
from storage.io.clients import (
    CLIENT_ENV,
    HTTPStatusError,
    ObstoreS3FileSystem,
    ReadTimeoutError,
    read_range,
    s3_config,
)
from storage.io.retry import PERMANENT, THROTTLE, TRANSIENT, classify
from storage.io.urls import resolve

pytest.importorskip("obstore")

OPTS = {"key": "AK", "secret": "SK", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000",
                                                       "region_name": "eu-west-1"},
        "config_kwargs": {"connect_timeout": 2, "read_timeout": 5,
                          "retries": {"total_max_attempts": 1}, "s3": {"addressing_style": "path"}}}


def test_s3fs_options_translate() -> None:
    got = s3_config(OPTS, env={})
    assert got is not None
    cfg = got["config"]
    assert cfg["access_key_id"] == "AK" and cfg["secret_access_key"] == "SK"
    assert cfg["endpoint"] == "http://127.0.0.1:9000" and cfg["region"] == "eu-west-1"
    assert cfg["virtual_hosted_style_request"] is False
    assert got["client_options"]["allow_http"] is True
    assert got["client_options"]["read_timeout"].total_seconds() == 5


def test_options_obstore_cannot_honour_keep_s3fs() -> None:
    assert s3_config({"profile": "dev"}, env={}) is None
    assert s3_config({**OPTS, "requester_pays": True}, env={}) is None
    assert s3_config({"client_kwargs": {"endpoint_url": "http://x"}}, env={}) is None  # no creds
    assert s3_config({"anon": True}, env={})["config"]["skip_signature"] is True
    env = {"AWS_ACCESS_KEY_ID": "A", "AWS_SECRET_ACCESS_KEY": "S"}
    assert s3_config({}, env=env)["config"]["access_key_id"] == "A"
    assert s3_config({}, env={**env, "AWS_PROFILE": "p"}) is None


def test_client_choice_by_environment(monkeypatch) -> None:
    monkeypatch.setenv(CLIENT_ENV, "s3fs")
    assert not isinstance(resolve("s3://b/ds", OPTS).fs, ObstoreS3FileSystem)
    monkeypatch.setenv(CLIENT_ENV, "auto")
    loc = resolve("s3://b/ds/", OPTS)
    assert isinstance(loc.fs, ObstoreS3FileSystem) and loc.root == "b/ds"
    assert loc.path("x/y") == "b/ds/x/y"
    monkeypatch.setenv(CLIENT_ENV, "obstore")
    with pytest.raises(ValueError):
        resolve("s3://b/ds", {"profile": "dev"})


def test_http_status_errors_classify_like_botocore_ones() -> None:
    assert classify(HTTPStatusError("x", 503)) == THROTTLE
    assert classify(HTTPStatusError("x", 500)) == TRANSIENT
    assert classify(HTTPStatusError("x", 400)) == PERMANENT
    assert classify(ReadTimeoutError("x")) == "timeout"


def test_reads_errors_and_pickling_against_a_real_server(s3_bucket, monkeypatch) -> None:
    monkeypatch.setenv(CLIENT_ENV, "obstore")
    url = f"{s3_bucket.url}/ds"
    store = ReplicaSet.from_urls([url], s3_bucket.storage_options)
    fs = store.primary.fs
    assert isinstance(fs, ObstoreS3FileSystem)
    data = bytes(range(256)) * 40
    store.put("obj.bin", data)  # writes go through s3fs
    path = store.primary.path("obj.bin")
    assert fs.cat_file(path) == data
    assert fs.cat_file(path, start=100, end=300) == data[100:300]
    assert bytes(read_range(fs, path, 5, 10)) == data[5:10]
    assert fs.cat_file(path, start=10_000, end=20_000) == data[10_000:]  # cut at the end
    assert fs.exists(path)  # delegated to s3fs
    with pytest.raises(FileNotFoundError):
        fs.cat_file(store.primary.path("missing"))
    clone = pickle.loads(pickle.dumps(store))
    assert clone.get("obj.bin", start=1, end=4) == data[1:4]
    bad = dict(s3_bucket.storage_options, secret="wrong-" + "s" * 30)
    denied = resolve(url, bad)
    with pytest.raises(PermissionError) as info:
        denied.fs.cat_file(path)
    assert "wrong-" not in str(info.value)
    refused = dict(s3_bucket.storage_options,
                   client_kwargs={"endpoint_url": "http://127.0.0.1:1", "region_name": "us-east-1"})
    with pytest.raises(ConnectionError):
        resolve(url, refused).fs.cat_file(path)


def test_a_child_forked_after_obstore_started_reads_through_s3fs(s3_bucket) -> None:
    """obstore's runtime does not survive fork (a DataLoader worker would hang): the child
    reads the same bytes through s3fs instead. In a fresh interpreter, as a training job."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = """
import json, os, signal, sys
from storage import ReplicaSet
url, opts = sys.argv[1], json.loads(sys.argv[2])
store = ReplicaSet.from_urls([url], opts)
store.put("obj.bin", b"0123456789")
assert store.get("obj.bin", start=2, end=5) == b"234"  # obstore's runtime runs here now
pid = os.fork()
if pid == 0:
    signal.alarm(20)
    os._exit(0 if store.get("obj.bin", start=2, end=5) == b"234" else 1)
_, status = os.waitpid(pid, 0)
sys.exit(0 if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else 3)
"""
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, CLIENT_ENV: "obstore", "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-c", script, f"{s3_bucket.url}/ds",
                           json.dumps(s3_bucket.storage_options)], env=env, timeout=60,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _copies_in_a_fresh_process(blob: bytes, path: str) -> tuple[bool, bool, bytes]:
    """Unpickle a filesystem twice, as two Dask tasks' arguments are, and use both copies."""
    first, second = pickle.loads(blob), pickle.loads(blob)
    data = first.cat_file(path)
    assert second.cat_file(path) == data
    bucket = path.split("/", 1)[0]
    return (first.fsspec is second.fsspec,
            first._store(bucket) is second._store(bucket), data)


def test_copies_sent_to_another_process_share_its_clients(s3_bucket) -> None:
    """A filesystem already used here, pickled to a worker for every task, must not bring a
    new s3fs and S3 client to each task there (~0.2-0.7 s each: S3 pipelines ran 3x slower)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    loc = resolve(f"{s3_bucket.url}/ds", s3_bucket.storage_options)
    assert isinstance(loc.fs, ObstoreS3FileSystem)
    loc.fs.pipe_file(loc.path("probe"), b"payload")  # the parent's s3fs now exists
    assert loc.fs.cat_file(loc.path("probe")) == b"payload"
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        same_fs, same_store, data = pool.submit(
            _copies_in_a_fresh_process, pickle.dumps(loc.fs), loc.path("probe")).result()
    assert data == b"payload"
    assert same_fs, "each unpickled copy built its own s3fs (and S3 client)"
    assert same_store, "each unpickled copy built its own obstore store"
