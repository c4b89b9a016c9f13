"""Versions and gc on hand-made datasets, on a local directory and on a real S3 bucket.

Time is moved with ``collect(now=...)`` instead of sleeping: an object written "now" is
young; two hours later it is older than the default one-hour grace period.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import (
    Manifest,
    ObjectInfo,
    ReplicaSet,
    RowGroupInfo,
    ShardInfo,
    TokenizerInfo,
    commit,
    digest_bytes,
    quarantine_name,
    shard_name,
    store_versions,
    tokenizer_name,
    version_name,
)
from storage.admin.gc import GcError, collect
from storage.admin.scrub import verify
from storage.admin.versions import history
from storage.format.layout import MANIFEST, parse_version_name
from storage.io.listing import list_tree

LATER = 2 * 3600.0  # past the default grace period


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReplicaSet]:
    if request.param == "local":
        yield ReplicaSet.from_urls([str(tmp_path / "ds")])
    else:
        bucket = request.getfixturevalue("s3_bucket")
        yield ReplicaSet.from_urls([f"{bucket.url}/datasets/ds"], bucket.storage_options)


def _shard(store: ReplicaSet, index: int, body: bytes) -> ShardInfo:
    sha = digest_bytes(body)
    info = ShardInfo(shard_name(index, sha), rows=1, tokens=3, bytes=len(body), sha256=sha,
                     row_groups=(RowGroupInfo(rows=1, tokens=3),))
    store.put(info.path, body)
    return info


def write_version(store: ReplicaSet, shards: list[bytes], tok: bytes = b'{"tok": 1}',
             quarantine: bytes | None = None) -> Manifest:
    """Write the objects of a version (as a rebuild does) and return its manifest."""
    tsha = digest_bytes(tok)
    store.put(tokenizer_name(tsha), tok)
    q = ()
    if quarantine is not None:
        qsha = digest_bytes(quarantine)
        q = (ObjectInfo(quarantine_name(0, qsha), len(quarantine), qsha),)
        store.put(q[0].path, quarantine)
    return Manifest(
        tokenizer=TokenizerInfo("t", tokenizer_name(tsha), tsha, 100, 0, "<eos>", len(tok)),
        shards=tuple(_shard(store, i, b) for i, b in enumerate(shards)),
        schema={"doc_id": "string", "input_ids": "binary<uint16le>"}, quarantine=q)


def _names(store: ReplicaSet) -> set[str]:
    return set(list_tree(store.primary))


def _everything_named(store: ReplicaSet, m: Manifest) -> None:
    names = _names(store)
    for path, _size, _sha in m.objects():
        assert path in names, path


def test_content_addressed_names() -> None:
    sha = digest_bytes(b"x")
    assert shard_name(7, sha) == f"shards/part-00007-{sha[:16]}.parquet"
    assert quarantine_name(7, sha) == f"quarantine/part-00007-{sha[:16]}.jsonl"
    assert tokenizer_name(sha) == f"tokenizer-{sha[:16]}.json"
    assert version_name(12, sha) == f"_versions/00000012-{sha[:16]}.json"
    assert parse_version_name(version_name(12, sha)) == (12, sha[:16])
    assert parse_version_name("_versions/notes.txt") is None
    assert parse_version_name(f"shards/00000012-{sha[:16]}.json") is None
    with pytest.raises(ValueError):
        shard_name(1, "not-a-sha")


def test_commit_records_each_new_manifest_once(store: ReplicaSet) -> None:
    v1 = write_version(store, [b"a", b"b"])
    assert commit(store, v1) is not None
    assert commit(store, v1) is None  # an identical rerun adds no version
    v2 = write_version(store, [b"b", b"c"], tok=b'{"tok": 2}')
    record = commit(store, v2)
    assert record is not None and record.sequence == 2
    versions = store_versions(store)
    assert [v.sequence for v in versions] == [1, 2]
    assert store.get(versions[0].path) == v1.to_json().encode()
    assert store.get(MANIFEST) == store.get(versions[1].path) == v2.to_json().encode()
    assert all(v.mtime is not None and abs(v.mtime - time.time()) < 600 for v in versions)
    rows = history(store)
    assert [(e.version.sequence, e.current, e.shards) for e in rows if e.version] == \
        [(1, False, 2), (2, True, 2)]
    _everything_named(store, v1)  # the old version's objects are all still there
    assert store.read_manifest() == v2


def test_gc_keeps_what_kept_versions_name_and_removes_the_rest(store: ReplicaSet) -> None:
    v1 = write_version(store, [b"shared", b"only in v1"], quarantine=b"q1\n")
    commit(store, v1)
    v2 = write_version(store, [b"shared", b"only in v2"], tok=b'{"tok": 2}')
    commit(store, v2)
    v3 = write_version(store, [b"shared", b"only in v3"], tok=b'{"tok": 2}')
    commit(store, v3)
    dry = collect(store, keep=2, now=time.time() + LATER, dry_run=True)
    before = _names(store)
    report = collect(store, keep=2, now=time.time() + LATER)
    assert _names(store) == before - {r.path for r in dry.removed}  # dry run: the same plan
    assert [r.path for r in report.removed] == [r.path for r in dry.removed]
    assert [parse_version_name(r.path)[0] for r in report.versions] == [1]
    assert {v.sequence for v in store_versions(store)} == {2, 3}
    gone = {r.path for r in report.objects}
    assert gone == {v1.shards[1].path, v1.tokenizer.path, v1.quarantine[0].path}
    assert report.bytes == sum(r.bytes for r in report.removed) > 0
    _everything_named(store, v2)
    _everything_named(store, v3)
    assert verify(store).ok
    again = collect(store, keep=2, now=time.time() + LATER)  # idempotent
    assert again.removed == []
    assert collect(store, keep=1, now=time.time() + LATER).objects[0].path == \
        v2.shards[1].path
    _everything_named(store, v3)
    assert verify(store).ok and store.read_manifest() == v3


def test_gc_never_removes_a_fresh_object(store: ReplicaSet) -> None:
    commit(store, write_version(store, [b"v1"]))
    v2 = write_version(store, [b"v2"])
    commit(store, v2)
    # A rebuild in progress: objects written, nothing committed yet.
    rebuild = write_version(store, [b"being written"], tok=b'{"tok": 9}')
    store.put("_work/p1/abc.done.json", b"{}")
    report = collect(store, keep=1)  # now: everything is younger than the hour of grace
    assert report.removed == [] and report.work_in_progress and report.young == 2
    assert "younger than 3600 s" in report.render()
    _everything_named(store, rebuild)
    # Two hours on, the rebuild was abandoned: its objects and _work/ go, v2 stays.
    report = collect(store, keep=1, now=time.time() + LATER)
    names = _names(store)
    assert not any(n.startswith("_work/") for n in names)
    assert rebuild.shards[0].path not in names and rebuild.tokenizer.path not in names
    _everything_named(store, v2)
    assert verify(store).ok


def test_gc_keeps_a_version_superseded_within_the_grace_period(tmp_path: Path) -> None:
    """Old objects, but their version was current a minute ago: a reader may be mid-epoch."""
    store = ReplicaSet.from_urls([str(tmp_path / "ds")])
    v1 = write_version(store, [b"v1"])
    commit(store, v1)
    long_ago = time.time() - 10 * 3600
    for name in _names(store):
        os.utime(store.primary.path(name), (long_ago, long_ago))
    commit(store, write_version(store, [b"v2"]))  # superseded v1 just now
    report = collect(store, keep=1)
    assert report.removed == [] and report.kept_versions == [1, 2]
    report = collect(store, keep=1, now=time.time() + LATER)
    assert v1.shards[0].path in {r.path for r in report.objects}


def test_gc_on_an_older_dataset_without_records_keeps_the_manifest(tmp_path: Path) -> None:
    store = ReplicaSet.from_urls([str(tmp_path / "ds")])
    m = write_version(store, [b"x"])
    store.put(MANIFEST, m.to_json().encode())  # committed before versions were recorded
    stray = _shard(store, 5, b"stray")
    report = collect(store, keep=1, now=time.time() + LATER)
    assert [r.path for r in report.removed] == [stray.path]
    _everything_named(store, m)
    assert [e.current for e in history(store)] == [True]


def test_gc_refuses_when_a_manifest_cannot_be_read(tmp_path: Path) -> None:
    store = ReplicaSet.from_urls([str(tmp_path / "ds")])
    commit(store, write_version(store, [b"x"]))
    commit(store, write_version(store, [b"y"]))
    (tmp_path / "ds" / MANIFEST).write_text("[1, 2, 3]")
    before = _names(store)
    with pytest.raises(GcError, match="manifest.json"):
        collect(store, keep=1, now=time.time() + LATER)
    assert _names(store) == before


def test_gc_on_replicas_needs_every_replica(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    store = ReplicaSet.from_urls([str(a), str(b)])
    v1 = write_version(store, [b"one"])
    commit(store, v1)
    commit(store, write_version(store, [b"two"]))
    report = collect(store, keep=1, now=time.time() + LATER)
    assert {r.replica for r in report.objects} == {r.name for r in store.replicas}
    assert len(report.objects) == 2  # v1's shard, on each replica (the tokenizer is v2's too)
    assert verify(store).ok
    unreachable = ReplicaSet.from_urls([str(a), f"s3://no-such-bucket-{secrets.token_hex(4)}"],
                                       {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
                                        "key": "k", "secret": "s",
                                        "config_kwargs": {"connect_timeout": 1,
                                                          "retries": {"max_attempts": 1}}})
    with pytest.raises(GcError, match="needs every replica"):
        collect(unreachable, keep=1, now=time.time() + LATER)


def test_a_rebuild_over_an_older_dataset_records_it_first(tmp_path: Path) -> None:
    """A live manifest without a record (written before versions were) becomes version 1
    when a new one is committed, so a reader mid-epoch on it is protected like any other."""
    store = ReplicaSet.from_urls([str(tmp_path / "ds")])
    old = write_version(store, [b"legacy"])
    store.put(MANIFEST, old.to_json().encode())
    new = write_version(store, [b"rebuilt"], tok=b'{"tok": 2}')
    assert commit(store, new).sequence == 2
    versions = store_versions(store)
    assert [v.sequence for v in versions] == [1, 2]
    assert store.get(versions[0].path) == old.to_json().encode()
    assert collect(store, keep=1).removed == []  # superseded just now: kept
    report = collect(store, keep=1, now=time.time() + LATER)
    assert {r.path for r in report.objects} == {old.shards[0].path, old.tokenizer.path}


def test_gc_aborts_unfinished_uploads_once_they_are_old(s3_bucket) -> None:  # type: ignore[no-untyped-def]
    """A cancelled or killed write's multipart upload: its parts are listed by no object
    listing; gc aborts it once older than the grace period, as it removes an object."""
    from storage.io import multipart

    store = ReplicaSet.from_urls([f"{s3_bucket.url}/datasets/ds"], s3_bucket.storage_options)
    commit(store, write_version(store, [b"v1"]))
    loc = store.primary
    fs = multipart.s3_filesystem(loc)
    bucket, key, _ = fs.split_path(loc.path("index/idx-0123.sfidx"))
    upload = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]
    fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload, PartNumber=1,
               Body=b"x" * 4096)
    _, foreign_key, _ = fs.split_path(loc.path("notes/big.bin"))  # not gc's: left alone
    foreign = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=foreign_key)["UploadId"]
    young = collect(store, keep=1)  # a writer may still be sending it
    assert young.uploads == [] and young.young_uploads == 1
    assert "left 1 started less than 3600 s ago" in young.render()
    dry = collect(store, keep=1, now=time.time() + LATER, dry_run=True)
    assert [r.path for r in dry.uploads] == [f"index/idx-0123.sfidx (upload {upload})"]
    assert sorted(u.upload_id for u in multipart.open_uploads(loc)) == sorted([upload, foreign])
    report = collect(store, keep=1, now=time.time() + LATER)
    assert len(report.uploads) == 1 and "aborted 1 unfinished multipart upload(s)" in \
        report.render()
    assert [u.upload_id for u in multipart.open_uploads(loc)] == [foreign]
    assert verify(store).ok
