"""Replica-set behaviour on local directories (the S3 versions live in test_s3.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loaders import TokenDataset
from storage import ChecksumMismatchError, QuorumError, ReplicaError, ReplicaSet, read_manifest
from storage.cli import main as storage_main
from storage.retry import Backoff
from storage.scrub import repair, verify


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
    shard = read_manifest(a).shards[0]
    _flip(Path(a) / shard.path, shard.row_groups[0].offset + 10)
    reference = [x["input_ids"] for x in TokenDataset(b, 64, shuffle=False, rank=0,
                                                        world_size=1)]
    ds = TokenDataset(a, 64, shuffle=False, rank=0, world_size=1, replicas=[b])
    got = [x["input_ids"] for x in ds]
    assert len(got) == len(reference) and all(map(lambda x, y: x.equal(y), got, reference))
    assert ds.store.failovers >= 1
    assert ds.store.errors["ChecksumMismatchError"] >= 1


def test_corrupt_copy_everywhere_is_a_clear_error(two_copies: tuple[str, str]) -> None:
    a, b = two_copies
    shard = read_manifest(a).shards[0]
    for root in (a, b):
        _flip(Path(root) / shard.path, shard.row_groups[0].offset + 10)
    store = ReplicaSet.from_urls([a, b])
    g = shard.row_groups[0]
    with pytest.raises(ReplicaError, match=r"replica 0 .*ChecksumMismatchError.*replica 1"):
        store.get(shard.path, g.sha256, g.offset, g.offset + g.length)
    single = ReplicaSet.from_urls([a])
    with pytest.raises(ReplicaError, match=ChecksumMismatchError.__name__):
        single.get(shard.path, g.sha256, g.offset, g.offset + g.length)


def test_verify_names_the_object_and_repair_fixes_it(two_copies: tuple[str, str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    a, b = two_copies
    shard = read_manifest(a).shards[1]
    _flip(Path(b) / shard.path, 100)
    (Path(a) / "tokenizer.json").unlink()
    assert storage_main(["verify", a, "--replica", b]) == 1
    out = capsys.readouterr().out
    assert f"corrupt        {shard.path}  on replica 1" in out
    assert "missing        tokenizer.json  on replica 0" in out
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
    store = ReplicaSet.from_urls([str(good), str(tmp_path / "blocked" / "ds")], write_quorum=1)
    (tmp_path / "blocked").write_text("file")
    missed = store.put("tokenizer.json", (good / "tokenizer.json").read_bytes())
    assert missed and "replica 1" in missed[0]
    assert list((good / "_degraded").glob("*.json"))
    (lagging / "tokenizer.json").unlink()
    report = repair(ReplicaSet.from_urls([str(good), str(lagging)]))
    assert [p.path for p in report.repaired] == ["tokenizer.json"]
    assert not (good / "_degraded").exists()
    assert verify(ReplicaSet.from_urls([str(good), str(lagging)])).ok


def test_throttling_backs_off_on_the_same_replica(tmp_path: Path) -> None:
    """503 SlowDown means "ask again later": retried with back-off, not failed over."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    store = ReplicaSet.from_urls([a, b], backoff=Backoff(base_s=0.01, cap_s=0.05))
    calls: list[str] = []

    def fetch(loc) -> bytes:  # type: ignore[no-untyped-def]
        calls.append(loc.url)
        if len(calls) < 3:
            raise OSError("An error occurred (SlowDown) when calling the GetObject operation: "
                          "Please reduce your request rate.")
        return b"ok"

    assert store.read("x", fetch) == b"ok"
    assert calls == [a, a, a]
    assert store.failovers == 0 and not store.errors


def test_backoff_is_full_jitter_under_a_growing_cap() -> None:
    import random

    rng = random.Random(0)
    policy = Backoff(base_s=0.1, cap_s=1.0)
    for attempt in range(8):
        delays = [policy.delay(attempt, rng) for _ in range(200)]
        ceiling = min(1.0, 0.1 * 2 ** attempt)
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > 0.8 * ceiling  # spread over the whole range, not fixed
