"""Replica-set behaviour on local directories (the S3 versions live in test_s3.py)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from loaders import TokenDataset
from storage import (
    ChecksumMismatchError,
    DatasetNotFoundError,
    ManifestError,
    QuorumError,
    ReplicaError,
    ReplicaSet,
    digest_bytes,
    read_manifest,
    shards_of,
)
from storage.admin.cli import main as storage_main
from storage.admin.scrub import repair, verify
from storage.io.retry import PERMANENT, THROTTLE, TIMEOUT, TRANSIENT, Backoff, classify, is_throttle


@pytest.fixture()
def two_copies(tiny_dataset: str, tmp_path: Path) -> tuple[str, str]:
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(tiny_dataset, a)
    shutil.copytree(tiny_dataset, b)
    return str(a), str(b)


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_row_group_fails_over_to_the_good_copy(two_copies: tuple[str, str]) -> None:
    a, b = two_copies
    shard = shards_of(a, read_manifest(a))[0]
    _flip(Path(a) / shard.path, shard.row_groups[0].offset + 10)
    reference = [x["input_ids"] for x in TokenDataset(b, 64, shuffle=False, rank=0,
                                                        world_size=1)]
    ds = TokenDataset(a, 64, shuffle=False, rank=0, world_size=1, replicas=[b])
    got = [x["input_ids"] for x in ds]
    assert len(got) == len(reference) and all(map(lambda x, y: x.equal(y), got, reference))
    assert ds.source.store.failovers >= 1
    assert ds.source.store.errors["ChecksumMismatchError"] >= 1


def test_corrupt_copy_everywhere_is_a_clear_error(two_copies: tuple[str, str]) -> None:
    a, b = two_copies
    shard = shards_of(a, read_manifest(a))[0]
    g = shard.row_groups[0]
    good = (Path(a) / shard.path).read_bytes()[g.offset:g.offset + g.length]
    sha = hashlib.sha256(good).hexdigest()
    assert sha.startswith(g.sha256)  # the index keeps its first 128 bits
    for root in (a, b):
        _flip(Path(root) / shard.path, g.offset + 10)
    store = ReplicaSet.from_urls([a, b])
    with pytest.raises(ReplicaError, match=r"replica 0 .*ChecksumMismatchError.*replica 1"):
        store.get(shard.path, sha, g.offset, g.offset + g.length)
    single = ReplicaSet.from_urls([a])
    with pytest.raises(ReplicaError, match=ChecksumMismatchError.__name__):
        single.get(shard.path, sha, g.offset, g.offset + g.length)


def test_verify_names_the_object_and_repair_fixes_it(two_copies: tuple[str, str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    a, b = two_copies
    manifest = read_manifest(a)
    shard, tokenizer = shards_of(a, manifest)[1], manifest.tokenizer.path
    _flip(Path(b) / shard.path, 100)
    (Path(a) / tokenizer).unlink()
    assert storage_main(["verify", a, "--replica", b]) == 1
    out = capsys.readouterr().out
    assert f"corrupt        {shard.path}  on replica 1" in out
    assert f"missing        {tokenizer}  on replica 0" in out
    assert storage_main(["repair", a, "--replica", b]) == 0
    assert storage_main(["verify", a, "--replica", b]) == 0
    before = {p: p.read_bytes() for p in Path(b).rglob("*") if p.is_file()}
    report = repair(ReplicaSet.from_urls([a, b]))
    assert report.ok and not report.repaired  # a second repair changes nothing
    assert before == {p: p.read_bytes() for p in Path(b).rglob("*") if p.is_file()}


def test_write_missing_quorum_names_the_replica(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a directory should be")
    store = ReplicaSet.from_urls([str(tmp_path / "ok"), str(blocker / "ds")])
    with pytest.raises(QuorumError, match=r"reached 1 of 2 replicas.*replica 1 \(.*not-a-dir"):
        store.put("shards/x.parquet", b"data")


def test_degraded_write_is_recorded_and_repaired(tiny_dataset: str, tmp_path: Path) -> None:
    good = tmp_path / "good"
    shutil.copytree(tiny_dataset, good)
    lagging = tmp_path / "lagging"
    shutil.copytree(tiny_dataset, lagging)
    tokenizer = read_manifest(str(good)).tokenizer.path
    store = ReplicaSet.from_urls([str(good), str(tmp_path / "blocked" / "ds")], write_quorum=1)
    (tmp_path / "blocked").write_text("file")
    missed = store.put(tokenizer, (good / tokenizer).read_bytes())
    assert missed and "replica 1" in missed[0]
    assert list((good / "_degraded").glob("*.json"))
    (lagging / tokenizer).unlink()
    report = repair(ReplicaSet.from_urls([str(good), str(lagging)]))
    assert [p.path for p in report.repaired] == [tokenizer]
    assert not (good / "_degraded").exists()
    assert verify(ReplicaSet.from_urls([str(good), str(lagging)])).ok


def test_put_from_a_local_file_writes_its_bytes_and_records_a_missed_replica(
        tmp_path: Path) -> None:
    """An object sent from a local file (the row-group index, too big to hold): the same
    bytes on every replica written, the file's SHA-256 in the marker of a missed one."""
    data = os.urandom(3 << 20)
    local = tmp_path / "index.sfidx"
    local.write_bytes(data)
    (tmp_path / "blocked").write_text("file")
    store = ReplicaSet.from_urls([str(tmp_path / "a"), str(tmp_path / "b"),
                                  str(tmp_path / "blocked" / "ds")], write_quorum=2)
    missed = store.put("index/x.sfidx", local)
    assert len(missed) == 1 and "replica 2" in missed[0]
    for name in ("a", "b"):
        assert (tmp_path / name / "index" / "x.sfidx").read_bytes() == data
    marker = json.loads(next((tmp_path / "a" / "_degraded").glob("*.json")).read_text())
    assert digest_bytes(data) in json.dumps(marker)


def _s3_error(code: str, status: int, message: str = "") -> OSError:
    """What s3fs raises for an S3 error response: a translated OSError whose cause is botocore's
    ClientError (the code and status a classifier must look at)."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    error = ClientError({"Error": {"Code": code, "Message": message or code},
                         "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")
    try:
        raise translate_boto_error(error)
    except OSError as exc:
        return exc


def test_throttling_backs_off_on_the_same_replica(tmp_path: Path) -> None:
    """503 SlowDown means "ask again later": retried with back-off, not failed over."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    store = ReplicaSet.from_urls([a, b], backoff=Backoff(base_s=0.01, cap_s=0.05))
    calls: list[str] = []

    def fetch(loc) -> bytes:  # type: ignore[no-untyped-def]
        calls.append(loc.url)
        if len(calls) < 3:
            raise _s3_error("SlowDown", 503, "Please reduce your request rate.")
        return b"ok"

    assert store.read("x", fetch) == b"ok"
    assert calls == [a, a, a]
    assert store.failovers == 0 and not store.errors


@pytest.mark.parametrize("code,status", [
    ("SlowDown", 503), ("TooManyRequests", 429), ("RequestLimitExceeded", 400),
    ("Throttling", 400), ("ThrottlingException", 400), ("RequestThrottled", 400),
    ("ServiceUnavailable", 503), ("SomethingNew", 429)])
def test_throttling_is_told_by_error_code_or_status(code: str, status: int) -> None:
    assert classify(_s3_error(code, status)) == THROTTLE
    assert is_throttle(_s3_error(code, status))


def test_numbers_in_a_message_are_not_throttling() -> None:
    """The old check matched "503" anywhere in the text: a shard name or a port did it."""
    for exc in (OSError("cannot read shards/part-00503.parquet"),
                OSError("Cannot connect to host 127.0.0.1:50399 ssl:default"),
                OSError(5, "HTTP 503 mentioned in a message, not an S3 response"),
                _s3_error("AccessDenied", 403, "key part-00503.parquet: SlowDown 503"),
                _s3_error("NoSuchKey", 404, "reduce your request rate 503")):
        assert classify(exc) != THROTTLE, exc
        assert not is_throttle(exc)


def test_errors_are_classified_by_type_along_the_cause_chain() -> None:
    from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

    assert classify(ReadTimeoutError(endpoint_url="http://127.0.0.1:1")) == TIMEOUT
    assert classify(TimeoutError("socket read")) == TIMEOUT
    refused = EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
    assert classify(refused) == TRANSIENT
    assert classify(ConnectionResetError()) == TRANSIENT
    assert classify(_s3_error("InternalError", 500)) == TRANSIENT
    assert classify(_s3_error("AccessDenied", 403)) == PERMANENT
    assert classify(ChecksumMismatchError("x")) == PERMANENT
    try:  # an error raised while handling another keeps the first as its context
        try:
            raise refused
        except EndpointConnectionError:
            raise OSError("wrapped by a library") from None
    except OSError as wrapped:
        assert wrapped.__context__ is refused and classify(wrapped) == TRANSIENT


def test_a_503_in_a_message_fails_over_at_once(tmp_path: Path) -> None:
    """Not throttling, so not retried on the same replica: the next replica answers at once."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    store = ReplicaSet.from_urls([a, b], backoff=Backoff(base_s=1.0, cap_s=5.0))
    calls: list[str] = []

    def fetch(loc) -> bytes:  # type: ignore[no-untyped-def]
        calls.append(loc.url)
        if loc.url == a:
            raise OSError("[Errno 111] Connect call failed ('127.0.0.1', 50399) reading "
                          "shards/part-00503.parquet: 503")
        return b"ok"

    t0 = time.monotonic()
    assert store.read("shards/part-00503.parquet", fetch) == b"ok"
    assert calls == [a, b]  # no retry on a: a retry's jittered back-off could be short too
    assert time.monotonic() - t0 < 5  # a stall bound: no waiting for throttling to pass
    assert store.failovers == 1 and store.errors["OSError"] == 1
    assert [s["healthy"] for s in store.status()] == [False, True]


def test_a_single_replica_retries_a_transient_failure_once(tmp_path: Path) -> None:
    store = ReplicaSet.from_urls([str(tmp_path)], backoff=Backoff(base_s=0.01, cap_s=0.01))
    calls = []

    def refused(loc) -> bytes:  # type: ignore[no-untyped-def]
        calls.append(1)
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(ReplicaError, match="ConnectionRefusedError"):
        store.read("x", refused)
    assert len(calls) == 2  # one more pass after a back-off, then the error

    calls.clear()

    def timed_out(loc) -> bytes:  # type: ignore[no-untyped-def]
        calls.append(1)
        raise TimeoutError("read timeout")

    with pytest.raises(ReplicaError, match="TimeoutError"):
        store.read("x", timed_out)
    assert len(calls) == 1  # a timeout already waited its deadline: not waited for again


def _manifest_bytes(root: str) -> bytes:
    return (Path(root) / "manifest.json").read_bytes()


@pytest.mark.parametrize("bad", [b"[1, 2, 3]", b"null", b"{not json", b'"a string"'])
def test_read_manifest_fails_over_to_a_replica_whose_manifest_is_valid(
        two_copies: tuple[str, str], bad: bytes) -> None:
    a, b = two_copies
    good = read_manifest(b)
    (Path(a) / "manifest.json").write_bytes(bad)
    store = ReplicaSet.from_urls([a, b])
    assert store.read_manifest().to_json() == good.to_json()
    assert store.status()[0]["healthy"]  # the replica answered: its object is the problem
    with pytest.raises(ManifestError):
        ReplicaSet.from_urls([a]).read_manifest()


def test_no_valid_manifest_anywhere_raises_the_first_replicas_error(
        two_copies: tuple[str, str]) -> None:
    a, b = two_copies
    (Path(a) / "manifest.json").write_bytes(b"[1, 2, 3]")
    (Path(b) / "manifest.json").write_bytes(b"{not json")
    with pytest.raises(ManifestError) as caught:
        ReplicaSet.from_urls([a, b]).read_manifest()
    assert str(Path(a) / "manifest.json") in str(caught.value)
    (Path(b) / "manifest.json").unlink()  # missing on b, invalid on a: still a's error
    with pytest.raises(ManifestError, match=str(Path(a))):
        ReplicaSet.from_urls([a, b]).read_manifest()
    (Path(a) / "manifest.json").unlink()
    with pytest.raises(DatasetNotFoundError):
        ReplicaSet.from_urls([a, b]).read_manifest()


def test_backoff_is_full_jitter_under_a_growing_cap() -> None:
    import random

    rng = random.Random(0)
    policy = Backoff(base_s=0.1, cap_s=1.0)
    for attempt in range(8):
        delays = [policy.delay(attempt, rng) for _ in range(200)]
        ceiling = min(1.0, 0.1 * 2 ** attempt)
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > 0.8 * ceiling  # spread over the whole range, not fixed


def test_put_same_as_links_on_the_primary_and_writes_the_other_replicas(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    data = b"rows of a finished shard" * 100
    (a / "_work").mkdir(parents=True)
    (a / "_work" / "rows").write_bytes(data)
    store = ReplicaSet.from_urls([str(a), str(b)])
    assert store.put("shards/s.parquet", data, same_as="_work/rows") == []
    linked, written = a / "shards" / "s.parquet", b / "shards" / "s.parquet"
    assert linked.read_bytes() == data == written.read_bytes()
    assert linked.stat().st_ino == (a / "_work" / "rows").stat().st_ino  # no second copy
    assert written.stat().st_nlink == 1
    (a / "_work" / "rows").unlink()  # removing the work files leaves the shard whole
    assert linked.read_bytes() == data
    assert not list(a.glob("shards/.tmp-*")) and not list(b.glob("shards/.tmp-*"))


def test_put_same_as_writes_the_bytes_when_the_source_cannot_be_linked(tmp_path: Path) -> None:
    store = ReplicaSet.from_urls([str(tmp_path)])
    store.put("shards/s.parquet", b"the bytes", same_as="_work/missing")
    assert (tmp_path / "shards" / "s.parquet").read_bytes() == b"the bytes"
    assert not list(tmp_path.glob("shards/.tmp-*"))
