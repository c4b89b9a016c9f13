"""Storage against real S3 servers on loopback (MinIO or SeaweedFS), nothing mocked.

Tests that kill a server start their own pair; the others use the session's servers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loaders import build_dataloader
from pipeline.config import PipelineConfig
from pipeline.job import run
from storage import QuorumError, ReplicaSet, UnsafePathError, read_manifest, resolve
from storage.scrub import repair, verify
from storage.testing import S3Server, start_servers
from tests.conftest import PLAYS, shakespeare_texts

SEQ = 64


def _cfg(output: str, options: dict, **kw) -> PipelineConfig:
    return PipelineConfig(inputs=[str(shakespeare_texts() / PLAYS[0])], output=output,
                          workers=1, dashboard_address="127.0.0.1:0", row_group_tokens=4096,
                          storage_options=options, **kw)


@pytest.fixture(scope="module")
def own_servers() -> Iterator[list[S3Server]]:
    """A private pair of servers that tests may kill (the session's are shared)."""
    servers = start_servers(2)
    yield servers
    for server in servers:
        server.stop()


def _ids_and_tokens(loader) -> tuple[list[int], list[list[int]]]:
    ids, toks = [], []
    for batch in loader:
        ids += batch["sample_id"].tolist()
        toks += batch["input_ids"].tolist()
    return ids, toks


def test_round_trip_pipeline_to_loader_through_s3(s3_bucket, tmp_path: Path) -> None:
    url = f"{s3_bucket.url}/datasets/hamlet"
    run(_cfg(url, s3_bucket.storage_options), progress=False)
    run(_cfg(str(tmp_path / "local"), {}), progress=False)
    remote = read_manifest(url, s3_bucket.storage_options)
    local = read_manifest(str(tmp_path / "local"))
    assert remote.to_json() == local.to_json()  # the same bytes wherever it is written
    got = _ids_and_tokens(build_dataloader(url, 8, SEQ, rank=0, world_size=1,
                                           storage_options=s3_bucket.storage_options,
                                           return_sample_id=True))
    want = _ids_and_tokens(build_dataloader(str(tmp_path / "local"), 8, SEQ, rank=0,
                                            world_size=1, return_sample_id=True))
    assert got == want and len(got[0]) > 100


def test_inspect_with_credentials_from_the_environment(s3_bucket) -> None:
    url = f"{s3_bucket.url}/ds"
    run(_cfg(url, s3_bucket.storage_options), progress=False)
    opts = s3_bucket.storage_options
    env = {**os.environ, "AWS_ACCESS_KEY_ID": opts["key"], "AWS_SECRET_ACCESS_KEY": opts["secret"],
           "AWS_ENDPOINT_URL": opts["client_kwargs"]["endpoint_url"], "AWS_REGION": "us-east-1"}
    out = subprocess.run([sys.executable, "-m", "pipeline", "inspect", url], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "tokens" in out.stdout and opts["secret"] not in out.stdout + out.stderr


def test_wrong_credentials_fail_clearly_and_never_show_the_secret(s3_bucket, tmp_path) -> None:
    bad = dict(s3_bucket.storage_options, secret="wrong-" + "s" * 30)
    with pytest.raises(Exception) as caught:
        run(_cfg(f"{s3_bucket.url}/ds", bad), progress=False)
    text = "".join(str(a) for a in caught.value.args) + repr(caught.value)
    assert "replica 0 (s3://" in text
    assert any(w in text.lower() for w in ("forbidden", "signature", "denied", "access key"))
    assert bad["secret"] not in text
    out = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(shakespeare_texts() / PLAYS[0]),
         "--output", f"{s3_bucket.url}/ds2", "--workers", "1", "--dashboard-address",
         "127.0.0.1:0", "--storage-options", json.dumps(bad)],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "error:" in out.stderr and bad["secret"] not in out.stdout + out.stderr
    assert "'secret': '***'" in out.stderr


def test_manifest_escaping_the_root_is_rejected_on_s3(s3_bucket) -> None:
    url = f"{s3_bucket.url}/ds"
    run(_cfg(url, s3_bucket.storage_options), progress=False)
    loc = resolve(url, s3_bucket.storage_options)
    manifest = json.loads(loc.fs.cat_file(loc.path("manifest.json")))
    manifest["shards"][0]["path"] = "../other-dataset/shards/part-00000.parquet"
    loc.fs.pipe_file(loc.path("manifest.json"), json.dumps(manifest).encode())
    with pytest.raises(UnsafePathError, match="not a plain relative path"):
        read_manifest(url, s3_bucket.storage_options)


def test_flipped_bytes_on_one_replica_are_caught_verified_and_repaired(s3_buckets) -> None:
    a, b = s3_buckets
    urls = [f"{a.url}/ds", f"{b.url}/ds"]
    opts = [a.storage_options, b.storage_options]
    run(_cfg(urls[0], {}, replicas=[urls[1]], replica_options=opts), progress=False)
    manifest = read_manifest(urls[1], opts[1])
    shard = manifest.shards[0]
    loc = resolve(urls[1], opts[1])
    data = bytearray(loc.fs.cat_file(loc.path(shard.path)))
    data[shard.row_groups[0].offset + 5] ^= 0xFF
    loc.fs.pipe_file(loc.path(shard.path), bytes(data))

    # b preferred: its corrupt row group is caught by the checksum and read from a instead.
    got = _ids_and_tokens(build_dataloader(urls[1], 8, SEQ, rank=0, world_size=1,
                                           replicas=[urls[0]], replica_options=opts[::-1],
                                           return_sample_id=True))
    want = _ids_and_tokens(build_dataloader(urls[0], 8, SEQ, rank=0, world_size=1,
                                            storage_options=opts[0], return_sample_id=True))
    assert got == want
    store = ReplicaSet.from_urls(urls, replica_options=opts)
    report = verify(store)
    assert [(p.path, p.kind) for p in report.problems] == [(shard.path, "corrupt")]
    assert "replica 1" in report.problems[0].replica
    assert [p.path for p in repair(store).repaired] == [shard.path]
    assert verify(store).ok
    assert not repair(store).repaired  # idempotent


def test_loader_survives_sigkill_of_one_replica_server(own_servers, tmp_path: Path) -> None:
    a, b = (s.make_bucket("kill-read") for s in own_servers)
    urls = [f"{a.url}/ds", f"{b.url}/ds"]
    opts = [a.storage_options, b.storage_options]
    run(_cfg(urls[0], {}, replicas=[urls[1]], replica_options=opts), progress=False)
    kwargs = dict(rank=0, world_size=1, return_sample_id=True, lookahead_groups=1)
    want = _ids_and_tokens(build_dataloader(urls[1], 4, SEQ, storage_options=opts[1], **kwargs))
    loader = build_dataloader(urls[0], 4, SEQ, replicas=[urls[1]], replica_options=opts,
                              **kwargs)
    ids, toks = [], []
    for i, batch in enumerate(loader):
        if i == 5:
            own_servers[0].kill()  # the preferred replica dies mid-iteration
        ids += batch["sample_id"].tolist()
        toks += batch["input_ids"].tolist()
    assert (ids, toks) == want
    assert loader.dataset.store.failovers >= 1


def test_write_with_a_replica_down(own_servers) -> None:
    """All-replica quorum: a clear error naming the dead one. Quorum 1: a degraded write."""
    alive = next(s for s in own_servers if s.running)
    dead = next((s for s in own_servers if not s.running), None)
    if dead is None:
        dead = own_servers[1]
        dead.kill()
    bucket = alive.make_bucket("write-down")
    dead_opts = dead.storage_options(config_kwargs={"connect_timeout": 1, "read_timeout": 2})
    urls = [f"{bucket.url}/ds", "s3://gone/ds"]
    opts = [bucket.storage_options, dead_opts]
    with pytest.raises(QuorumError, match=r"reached 1 of 2 replicas.*replica 1 \(s3://gone/ds\)"):
        ReplicaSet.from_urls(urls, replica_options=opts).put("probe", b"x")
    summary = run(_cfg(urls[0], {}, replicas=urls[1:], replica_options=opts, write_quorum=1),
                  progress=False)
    assert summary.docs_out > 0
    loc = resolve(urls[0], opts[0])
    markers = loc.fs.glob(loc.path("_degraded/*.json"))
    assert markers  # recorded for `repair`
    assert read_manifest(urls[0], opts[0]).total_tokens == summary.tokens
