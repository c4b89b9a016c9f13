"""Storage against real S3 servers on loopback (MinIO or SeaweedFS), nothing mocked.

Tests that kill a server start their own pair; the others use the session's servers.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from loaders import build_dataloader
from loopback_s3 import S3Server, start_servers
from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from storage import (
    QuorumError,
    ReplicaError,
    ReplicaSet,
    UnsafePathError,
    digest_bytes,
    read_manifest,
    resolve,
    shards_of,
)
from storage.admin.scrub import repair, verify
from storage.io.urls import write_deadline_s
from tests.conftest import PLAYS, shakespeare_texts
from tests.storage.io._s3_faults import default_options, resume, stop

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


def test_put_same_as_copies_inside_the_store(s3_buckets) -> None:
    """Phase 2's move of a shard that lost no row: a server-side copy on the primary (the
    bytes do not travel again), the bytes on the other replica, the bytes where the source
    is missing."""
    urls = [f"{b.url}/ds" for b in s3_buckets]
    opts = [b.storage_options for b in s3_buckets]
    primary = resolve(urls[0], opts[0])
    stored = secrets.token_bytes(300_000)
    primary.fs.pipe_file(primary.path("_work/rows"), stored)
    store = ReplicaSet.from_urls(urls, replica_options=opts)
    # The contract is that the caller's bytes equal the source's; breaking it here shows
    # which path ran: the primary's object is the source's bytes, so it was copied there.
    passed = secrets.token_bytes(1_000)
    assert store.put("shards/s.parquet", passed, same_as="_work/rows") == []
    assert primary.fs.cat_file(primary.path("shards/s.parquet")) == stored
    other = resolve(urls[1], opts[1])
    assert other.fs.cat_file(other.path("shards/s.parquet")) == passed
    store.put("shards/t.parquet", passed, same_as="_work/missing")
    assert primary.fs.cat_file(primary.path("shards/t.parquet")) == passed


def test_put_from_a_local_file_sends_it_in_parts(s3_buckets, tmp_path: Path) -> None:
    """An object too big to hold (a 100 TB dataset's index: ~3 GB) is sent from a local
    file: above two of s3fs's 50 MB parts as a multipart upload, to every replica, the same
    bytes as a put of them."""
    urls = [f"{b.url}/ds" for b in s3_buckets]
    opts = [b.storage_options for b in s3_buckets]
    store = ReplicaSet.from_urls(urls, replica_options=opts)
    for name, size in (("small", 70_000), ("big", (100 << 20) + 12_345)):
        data = secrets.token_bytes(size)
        local = tmp_path / name
        local.write_bytes(data)
        assert store.put(f"index/{name}.sfidx", local) == []
        for url, opt in zip(urls, opts, strict=True):
            loc = resolve(url, opt)
            got = loc.fs.cat_file(loc.path(f"index/{name}.sfidx"))
            assert len(got) == size and digest_bytes(got) == digest_bytes(data), (url, name)


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
    manifest["index"]["path"] = "../other-dataset/index/0123456789abcdef.sfidx"
    loc.fs.pipe_file(loc.path("manifest.json"), json.dumps(manifest).encode())
    with pytest.raises(UnsafePathError, match="not a plain relative path"):
        read_manifest(url, s3_bucket.storage_options)


def test_flipped_bytes_on_one_replica_are_caught_verified_and_repaired(s3_buckets) -> None:
    a, b = s3_buckets
    urls = [f"{a.url}/ds", f"{b.url}/ds"]
    opts = [a.storage_options, b.storage_options]
    run(_cfg(urls[0], {}, replicas=[urls[1]], replica_options=opts), progress=False)
    manifest = read_manifest(urls[1], opts[1])
    shard = shards_of(ReplicaSet.from_urls([urls[1]], opts[1]), manifest)[0]
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


# -- a hung (not dead) server, and a killed one: seconds, not minutes -----------------------

#: a batch that waited longer waited on the hung server: for its read timeout, set to
#: :data:`HUNG_READ_TIMEOUT_S` in that test so that the two stay far apart on a loaded
#: machine too (a hedge deadline is at most 1.5 s, then the other replica's read)
MAX_BATCH_WAIT_S = 10.0
HUNG_READ_TIMEOUT_S = 60


@pytest.fixture()
def pair(fault_servers: list[S3Server]) -> list[S3Server]:
    for server in fault_servers:
        resume(server)
        if not server.running:
            server.start()  # killed by an earlier test: a fresh, empty server
    return fault_servers


def _upload(local: str, url: str, options: dict) -> None:
    loc = resolve(url, options)
    for path in sorted(Path(local).rglob("*")):
        if path.is_file():
            loc.fs.pipe_file(loc.path(path.relative_to(local).as_posix()), path.read_bytes())


def _replicated(servers: list[S3Server], dataset: str, name: str
                ) -> tuple[list[str], list[dict]]:
    buckets = [s.make_bucket(f"{name}-{secrets.token_hex(4)}") for s in servers]
    urls = [f"{b.url}/ds" for b in buckets]
    opts = [default_options(b) for b in buckets]
    for url, o in zip(urls, opts, strict=True):
        _upload(dataset, url, o)
    return urls, opts


def _timed_batches(loader, at: int, fault) -> tuple[list[int], list[list[int]], list[float]]:  # type: ignore[no-untyped-def]
    """Iterate, calling ``fault()`` after batch ``at``; the wait for each batch."""
    ids, toks, waits = [], [], []
    batches = iter(loader)
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            return ids, toks, waits
        waits.append(time.perf_counter() - t0)
        ids += batch["sample_id"].tolist()
        toks += batch["input_ids"].tolist()
        if len(waits) == at:
            fault()


LOADER = dict(rank=0, world_size=1, return_sample_id=True, lookahead_groups=1)


def test_loader_rides_through_a_hung_replica_server(pair, tiny_dataset: str) -> None:
    """SIGSTOP of the preferred server mid-epoch: hedged to the other replica within a hedge
    deadline, the same samples as a clean run, and the server is primary again once back."""
    urls, opts = _replicated(pair, tiny_dataset, "hang")
    opts = [{**o, "config_kwargs": {"read_timeout": HUNG_READ_TIMEOUT_S}} for o in opts]
    want = _ids_and_tokens(build_dataloader(urls[1], 4, SEQ, storage_options=opts[1], **LOADER))
    loader = build_dataloader(urls[0], 4, SEQ, replicas=[urls[1]], replica_options=opts,
                              **LOADER)
    at = len(loader) // 4
    try:
        ids, toks, waits = _timed_batches(loader, at, lambda: stop(pair[0]))
    finally:
        resume(pair[0])
    store = loader.dataset.store
    assert (ids, toks) == want
    assert store.hedges >= 1 and store.errors["ReplicaStalledError"] >= 1  # the hang was met
    assert max(waits) < MAX_BATCH_WAIT_S, (max(waits), waits.index(max(waits)), at)
    # Back from the hang: after its back-off a background probe finds it answering again.
    deadline = time.monotonic() + 30
    while not store.status()[0]["healthy"] and time.monotonic() < deadline:
        store.get("manifest.json")
        time.sleep(0.2)
    assert store.status()[0]["healthy"] and store.probes >= 1
    assert store.read_order()[0].index == 0


def test_verify_reads_and_writes_on_a_hung_endpoint_fail_in_seconds(pair, tiny_dataset,
                                                                     tmp_path: Path) -> None:
    """One endpoint, hung: no replica to hedge to, so the read timeout (5 s, one attempt)
    bounds the wait; before, nested botocore and s3fs retries made it ~123 s. A PUT, which
    blocks for ever once the stopped server's socket buffer is full, is cancelled after its
    write deadline (a `pipeline run` into a hung output waited > 400 s). The five waits run
    side by side (each timed on its own, each with its own client), as the clients of one
    hung server would."""
    urls, opts = _replicated(pair[:1], tiny_dataset, "hung-verify")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": opts[0]["key"],
           "AWS_SECRET_ACCESS_KEY": opts[0]["secret"],
           "AWS_ENDPOINT_URL": opts[0]["client_kwargs"]["endpoint_url"],
           "AWS_REGION": "us-east-1"}
    blob = secrets.token_bytes(2 << 20)
    from_file = tmp_path / "blob"
    from_file.write_bytes(blob)

    def store() -> ReplicaSet:
        return ReplicaSet.from_urls(urls[:1], replica_options=opts[:1])

    def read() -> None:
        with pytest.raises(ReplicaError, match="ReadTimeout"):
            store().read_manifest()

    def cli() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "storage", "verify", urls[0]], env=env,
                              capture_output=True, text=True, timeout=120)

    def write() -> None:
        with pytest.raises(QuorumError, match="Timeout"):
            store().put("blob", blob)

    def copy() -> None:  # a server-side copy (phase 2's move) has the same deadline
        with pytest.raises(QuorumError, match="Timeout"):
            store().put("copied", b"x", same_as="manifest.json")

    def filed() -> None:  # an object sent from a local file (the index) has it too
        with pytest.raises(QuorumError, match="Timeout"):
            store().put("filed", from_file)

    def timed(call):  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        result = call()
        return result, time.monotonic() - t0

    stop(pair[0])
    try:
        with ThreadPoolExecutor(5) as pool:
            futures = {call.__name__: pool.submit(timed, call)
                       for call in (read, cli, write, copy, filed)}
            took = {name: future.result()[1] for name, future in futures.items()}
            out = futures["cli"].result()[0]
    finally:
        resume(pair[0])
    # Stall bounds, each the deadline plus a loaded machine's margin (a CLI starts its
    # interpreter first): far from ~123 s of retries and from a PUT blocked for ever.
    assert took["read"] < 5 + 15, took
    assert out.returncode == 2 and "ReadTimeout" in out.stderr, out.stderr
    assert took["cli"] < 5 + 40, took
    assert took["write"] < write_deadline_s(len(blob)) + 15, took
    assert took["copy"] < write_deadline_s(1) + 15, took
    assert took["filed"] < write_deadline_s(len(blob)) + 15, took


def test_first_read_after_sigkill_of_the_primary_fails_over_fast(pair, tiny_dataset) -> None:
    """A dead server refuses connections: the read moves to the other replica at once."""
    urls, opts = _replicated(pair, tiny_dataset, "killed")
    want = _ids_and_tokens(build_dataloader(urls[1], 4, SEQ, storage_options=opts[1], **LOADER))
    loader = build_dataloader(urls[0], 4, SEQ, replicas=[urls[1]], replica_options=opts,
                              **LOADER)
    ids, toks, waits = _timed_batches(loader, len(loader) // 4, pair[0].kill)
    assert (ids, toks) == want
    assert loader.dataset.store.failovers >= 1
    assert max(waits) < 1.0, max(waits)
    store = ReplicaSet.from_urls(urls, replica_options=opts)  # fresh: nothing known yet
    manifest = read_manifest(urls[1], opts[1])
    shard = shards_of(ReplicaSet.from_urls([urls[1]], opts[1]), manifest)[0]
    g = shard.row_groups[0]
    t0 = time.perf_counter()
    data = store.get(shard.path, None, g.offset, g.offset + g.length)
    first_read = time.perf_counter() - t0
    assert digest_bytes(data).startswith(g.sha256)  # the index's 128-bit digest
    assert store.failovers == 1 and first_read < 1.0, first_read
