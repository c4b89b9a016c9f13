"""The fetch side of the token reader from a real S3 server: obstore and s3fs give the same
samples, a corrupt copy fails over to a good replica, remote reads keep more GETs in flight."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from loaders import build_dataloader
from loaders.coalesce import run_per_lane_bytes
from loaders.prefetch import REMOTE_IN_FLIGHT, PrefetchingWindows
from loaders.reader import _sparse_shard
from storage import IndexFormatError, ReplicaSet
from storage.io.clients import CLIENT_ENV, ObstoreS3FileSystem
from tests.loaders._crafted import piece_moved_to_the_next_group

pytest.importorskip("obstore")

SEQ = 255


def _copy(dataset: str, store: ReplicaSet) -> list[str]:
    """The dataset's files, uploaded as they are; returns the shards' relative paths."""
    root = Path(dataset)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    for p in files:
        store.put(p.relative_to(root).as_posix(), p.read_bytes())
    return [p.relative_to(root).as_posix() for p in files if p.suffix == ".parquet"
            and "quarantine" not in p.parts]


def _epoch(url: str, options: dict | None, **kw) -> list[np.ndarray]:
    return [b["input_ids"].numpy().copy() for b in build_dataloader(
        url, 4, SEQ, storage_options=options, **kw)]


def test_sparse_shard_holds_only_its_pieces() -> None:
    pieces = [(3, b"abc"), (5000, memoryview(b"xyz" * 1000)), (9000, b"\xff")]
    buf = _sparse_shard(10_000, pieces)
    data = bytes(buf)
    assert len(data) == 10_000
    want = bytearray(10_000)
    for start, piece in pieces:
        want[start:start + len(piece)] = piece
    assert data == bytes(want)  # zeros wherever no verified piece was written


def test_obstore_and_s3fs_deliver_the_same_epoch(s3_bucket, monkeypatch, tiny_dataset,
                                                 no_python_file_reads) -> None:
    url = f"{s3_bucket.url}/ds"
    opts = s3_bucket.storage_options
    _copy(tiny_dataset, ReplicaSet.from_urls([url], opts))
    local = tiny_dataset
    monkeypatch.setenv(CLIENT_ENV, "obstore")
    fast = _epoch(url, opts)
    monkeypatch.setenv(CLIENT_ENV, "s3fs")
    slow = _epoch(url, opts)
    want = _epoch(local, None)
    assert len(fast) == len(slow) == len(want) > 10
    assert all(np.array_equal(a, b) and np.array_equal(a, c)
               for a, b, c in zip(fast, slow, want, strict=True))


@pytest.mark.parametrize("codecs", [False, True])
def test_a_footer_placing_tokens_outside_the_verified_piece_is_refused_from_s3(
        s3_bucket, tiny_dataset, tmp_path, codecs: bool) -> None:
    """From an object store only the verified pieces are decoded: a footer that places row
    group 0 elsewhere is named, not decoded from zeros or a hole's bytes (an index without
    shard codecs); with them, the footer made from the index decodes exactly the verified
    piece, and its token count, not the index's, is refused."""
    url = f"{s3_bucket.url}/moved"
    _copy(str(piece_moved_to_the_next_group(tiny_dataset, tmp_path, codecs)),
          ReplicaSet.from_urls([url], s3_bucket.storage_options))
    match = (r"row group 0 holds [\d,]+ tokens where the index says" if codecs
             else r"the footer places row group 0's tokens")
    with pytest.raises(IndexFormatError, match=match):
        _epoch(url, s3_bucket.storage_options)


def test_corrupt_replica_fails_over_through_obstore(s3_buckets, monkeypatch,
                                                    tiny_dataset) -> None:
    monkeypatch.setenv(CLIENT_ENV, "obstore")
    a, b = s3_buckets
    urls = [f"{a.url}/ds", f"{b.url}/ds"]
    opts = [a.storage_options, b.storage_options]
    for u, o in zip(urls, opts, strict=True):
        shards = _copy(tiny_dataset, ReplicaSet.from_urls([u], o))
    good = _epoch(urls[1], opts[1])
    bad = ReplicaSet.from_urls([urls[0]], opts[0])
    assert isinstance(bad.primary.fs, ObstoreS3FileSystem)
    assert shards
    for shard in shards:
        data = bytearray(bad.get(shard))
        data[len(data) // 3:len(data) // 3 + 64] = b"\0" * 64  # inside a token column chunk
        bad.put(shard, bytes(data))
    loader = build_dataloader(urls[0], 4, SEQ, replicas=urls[1:], replica_options=opts)
    got = [b["input_ids"].numpy().copy() for b in loader]
    metrics = loader.metrics()
    assert metrics["failovers"] > 0, metrics
    assert all(np.array_equal(x, y) for x, y in zip(got, good, strict=True))


def test_remote_reads_keep_more_requests_in_flight() -> None:
    from types import SimpleNamespace

    def reader(local: bool) -> SimpleNamespace:
        replica = SimpleNamespace(loc=SimpleNamespace(is_local=local))
        return SimpleNamespace(store=SimpleNamespace(replicas=[replica]))

    starts = np.array([0])
    assert PrefetchingWindows(reader(True), starts, SEQ, 16, 2).threads == 2
    assert PrefetchingWindows(reader(False), starts, SEQ, 16, 2).threads == REMOTE_IN_FLIGHT
    assert PrefetchingWindows(reader(False), starts, SEQ, 4, 2).threads == 4  # <= lookahead
    assert PrefetchingWindows(reader(False), starts, SEQ, 16, 12).threads == 12


def test_dataloader_workers_read_s3_after_the_parent_used_obstore(s3_bucket, monkeypatch,
                                                                   tiny_dataset) -> None:
    monkeypatch.setenv(CLIENT_ENV, "obstore")
    url = f"{s3_bucket.url}/ds"
    _copy(tiny_dataset, ReplicaSet.from_urls([url], s3_bucket.storage_options))
    want = _epoch(url, s3_bucket.storage_options)
    got = _epoch(url, s3_bucket.storage_options, num_workers=2)
    assert len(got) == len(want)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    # The parent's S3 client still works after the workers are gone (a trainer writes its
    # checkpoint next): workers forked from the trainer itself broke its pooled connections.
    t0 = time.monotonic()
    ReplicaSet.from_urls([url], s3_bucket.storage_options).put("after-workers", b"x" * 200_000)
    assert time.monotonic() - t0 < 5


def test_requests_grow_along_the_plan_same_samples_fewer_gets(s3_bucket, monkeypatch,
                                                                tmp_path) -> None:
    """From a real S3 server: with the read-ahead budget the requests grow (here the store
    always "keeps up") and an epoch makes far fewer GETs than at the fixed starting window,
    with every sample the same, byte for byte, as from local disk."""
    import loaders.coalesce
    from benchmarks.bench_utils import write_token_dataset

    url = f"{s3_bucket.url}/ds"
    tokens = np.random.default_rng(7).integers(0, 50_000, 12 * 16 * 4096, dtype=np.uint16)
    for where, opts in ((url, s3_bucket.storage_options), (str(tmp_path / "ds"), None)):
        write_token_dataset(ReplicaSet.from_urls([where], opts), tokens, 12,
                            row_group_tokens=4096, doc_tokens=512)
    monkeypatch.setattr(loaders.coalesce, "GROWTH_TOLERANCE", float("inf"))
    monkeypatch.setattr(loaders.coalesce, "GROWTH_SAMPLES", 1)

    def epoch(**kw) -> tuple[list[np.ndarray], dict[str, float], list[int]]:
        loader = build_dataloader(url, 4, SEQ, storage_options=s3_bucket.storage_options,
                                  lookahead_groups=1, **kw)
        got = [b["input_ids"].numpy().copy() for b in loader]
        window = loader.source.reader.coalesce_window
        return got, loader.source.metrics(), window.history

    fixed, fixed_m, fixed_h = epoch(readahead_bytes=0)
    grown, grown_m, grown_h = epoch()
    local = _epoch(str(tmp_path / "ds"), None)
    assert fixed_h == [8] and grown_h[0] == 8 and grown_h[-1] > 8, grown_h
    assert fixed_m["row_groups_read"] == grown_m["row_groups_read"] == 12 * 16  # each once
    assert grown_m["requests"] < fixed_m["requests"] / 2, (grown_m, fixed_m)
    assert len(grown) == len(fixed) == len(local)
    assert all(np.array_equal(a, b) and np.array_equal(a, c)
               for a, b, c in zip(grown, fixed, local, strict=True))


def test_a_run_is_one_request_from_s3(s3_bucket, monkeypatch, tmp_path) -> None:
    """From a real S3 server, on a dataset much larger than the read-ahead window (the
    situation at scale, made small: 16 shards, a budget of a run per lane): runs of 16
    neighbouring row groups go about one GET each, where single blocks scatter a rank's next
    row groups over the shards; every row group read once, the samples those of local disk."""
    import loaders.coalesce
    from benchmarks.bench_utils import write_token_dataset

    url = f"{s3_bucket.url}/runs"
    tokens = np.random.default_rng(11).integers(0, 50_000, 256 * 4096, dtype=np.uint16)
    for where, opts in ((url, s3_bucket.storage_options), (str(tmp_path / "runs"), None)):
        write_token_dataset(ReplicaSet.from_urls([where], opts), tokens, 16,
                            row_group_tokens=4096, doc_tokens=512)
    monkeypatch.setattr(loaders.coalesce, "GROWTH_TOLERANCE", float("inf"))
    monkeypatch.setattr(loaders.coalesce, "GROWTH_SAMPLES", 1)
    lanes, run, lookahead = 4, 16, 2
    budget = run_per_lane_bytes(lanes, run, lookahead, 4096 * 2)  # a run per lane, decoded

    def epoch(run_blocks: int) -> tuple[list[np.ndarray], dict[str, float]]:
        loader = build_dataloader(url, lanes, SEQ, storage_options=s3_bucket.storage_options,
                                  run_blocks=run_blocks, lookahead_groups=lookahead,
                                  readahead_bytes=budget)
        got = [b["input_ids"].numpy().copy() for b in loader]
        return got, loader.source.metrics()

    runs, runs_m = epoch(run)
    singles, singles_m = epoch(1)
    assert runs_m["row_groups_read"] == singles_m["row_groups_read"] == 256
    assert runs_m["requests"] <= 2 * 256 // run, runs_m  # runs, cut by lanes and the growth
    assert singles_m["requests"] >= 1.6 * runs_m["requests"], (singles_m, runs_m)
    for got, k in ((runs, run), (singles, 1)):
        local = _epoch(str(tmp_path / "runs"), None, run_blocks=k)
        assert len(got) == len(local)
        assert all(np.array_equal(a, b) for a, b in zip(got, local, strict=True))


def test_a_budget_short_of_a_run_per_lane_is_named_with_the_one_that_is_not(
        s3_bucket, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """From a real S3 server, a read-ahead budget that cannot hold a run of each lane a reader
    serves is logged once, with the budget that can (what the test above reads with); at that
    budget, on local disk, or with workers that each serve fewer lanes, nothing is logged."""
    import logging

    from benchmarks.bench_utils import write_token_dataset

    url = f"{s3_bucket.url}/budget"
    tokens = np.random.default_rng(12).integers(0, 50_000, 256 * 4096, dtype=np.uint16)
    for where, opts in ((url, s3_bucket.storage_options), (str(tmp_path / "budget"), None)):
        write_token_dataset(ReplicaSet.from_urls([where], opts), tokens, 16,
                            row_group_tokens=4096, doc_tokens=512)
    lanes, run, lookahead = 4, 16, 2
    need = run_per_lane_bytes(lanes, run, lookahead, 4096 * 2)

    def warnings(where: str, budget: int, run_blocks: int = run,
                 **kw) -> list[str]:  # type: ignore[no-untyped-def]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="loaders"):
            build_dataloader(where, lanes, SEQ, run_blocks=run_blocks,
                             lookahead_groups=lookahead, readahead_bytes=budget, **kw)
        return [r.getMessage() for r in caplog.records if r.name.startswith("loaders")]

    short = warnings(url, need - 1, storage_options=s3_bucket.storage_options)
    assert len(short) == 1, short
    assert f"a run of {run} row groups" in short[0] and f"the {lanes} lanes" in short[0]
    assert f"readahead_bytes={-(-need * 10 // 2**20) / 10:.1f} MiB" in short[0], short[0]
    assert "s3://" in short[0]
    for secret in s3_bucket.storage_options.values():
        if isinstance(secret, str) and len(secret) > 8:
            assert secret not in short[0]
    assert warnings(url, need, storage_options=s3_bucket.storage_options) == []
    # run_blocks beyond the dataset is one run of its 256 row groups (plan.run_length): the
    # advice asks for that; without shuffling there are no runs to advise on
    whole = run_per_lane_bytes(lanes, 256, lookahead, 4096 * 2)
    huge = warnings(url, whole - 1, run_blocks=10**9, storage_options=s3_bucket.storage_options)
    assert len(huge) == 1 and "a run of 256 row groups" in huge[0], huge
    assert warnings(url, whole, run_blocks=10**9, storage_options=s3_bucket.storage_options) == []
    assert warnings(url, 1, shuffle=False, storage_options=s3_bucket.storage_options) == []
    assert warnings(str(tmp_path / "budget"), need - 1) == []
    two_each = run_per_lane_bytes(lanes // 2, run, lookahead, 4096 * 2)
    assert warnings(url, two_each, storage_options=s3_bucket.storage_options,
                    num_workers=2) == []
    assert len(warnings(url, two_each - 1, storage_options=s3_bucket.storage_options,
                        num_workers=2)) == 1
