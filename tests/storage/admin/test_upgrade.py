"""Manifest format 2 and ``python -m storage upgrade``: a v1 dataset (shards inline) loads,
upgrades to the same bytes the pipeline writes, loads the same samples after, twice is a
no-op; gc and scrub see the index and the shards it names; the manifest stays a few KB."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import storage.io.index_store
from loaders import TokenDataset
from storage import (
    FORMAT_V1,
    FORMAT_V2,
    Manifest,
    ManifestError,
    ReplicaSet,
    UnsafePathError,
    commit,
    read_manifest,
    resolve,
    shards_of,
    store_versions,
    write_manifest,
)
from storage.admin.cli import main as storage_main
from storage.admin.gc import GcError, collect
from storage.admin.scrub import repair, verify
from storage.format.index import read_index
from storage.io.index_store import fetch_columns
from storage.io.listing import list_tree

LATER = 2 * 3600.0


def write_v1(dataset: str) -> Manifest:
    """Rewrite a v2 dataset as ``shardflow.dataset/1`` (shards inline with full row-group
    sha256s, as the pipeline wrote them before the index) and remove its index object."""
    m = read_manifest(dataset)
    assert m.index is not None
    full = []
    for s in shards_of(dataset, m):
        data = (Path(dataset) / s.path).read_bytes()
        groups = tuple(replace(g, sha256=hashlib.sha256(
            data[g.offset:g.offset + g.length]).hexdigest(), blake3="") for g in s.row_groups)
        full.append(replace(s, row_groups=groups))
    v1 = replace(m, shards=tuple(full), format=FORMAT_V1, index=None, totals=None)
    write_manifest(resolve(dataset), v1)
    (Path(dataset) / m.index.path).unlink()
    return v1


def _samples(dataset: str) -> list[np.ndarray]:
    ds = TokenDataset(dataset, 64, rank=0, world_size=1, batch_size=4, seed=3)
    return [x["input_ids"].numpy() for x in ds]


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and not p.relative_to(root).as_posix().startswith("_versions")}


@pytest.fixture()
def copy(tiny_dataset: str, tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    shutil.copytree(tiny_dataset, out)
    return out


def test_v1_loads_upgrades_to_the_pipelines_bytes_and_loads_the_same_samples(
        copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = str(copy)
    v2_bytes = (copy / "manifest.json").read_bytes()
    want = _samples(ds)
    v1 = write_v1(ds)
    v1_bytes = (copy / "manifest.json").read_bytes()
    assert read_manifest(ds) == v1 and v1.format == FORMAT_V1
    assert Manifest.from_json(v1_bytes).to_json().encode() == v1_bytes  # v1 re-serialises
    got = _samples(ds)
    assert len(got) == len(want) and all(map(np.array_equal, got, want))
    assert storage_main(["verify", ds]) == 0
    shards_before = {p: b for p, b in _files(copy).items() if p.startswith("shards/")}
    mtimes = {p: (copy / p).stat().st_mtime_ns for p in shards_before}
    capsys.readouterr()

    assert storage_main(["upgrade", ds]) == 0
    out = capsys.readouterr().out
    assert f"upgraded {FORMAT_V1} -> {FORMAT_V2}" in out and "shards untouched" in out
    # The same manifest as the pipeline wrote, but for the index: a v1 manifest records
    # SHA-256s of the row groups only, and upgrading never reads the shards, so the index keeps
    # those (the pipeline now records BLAKE3s: storage.format.checksums).
    up_bytes = (copy / "manifest.json").read_bytes()
    up, pipeline_made = read_manifest(ds), Manifest.from_json(v2_bytes)
    assert pipeline_made.index.digest == "blake3" and up.index.digest == "sha256"
    assert ({k: v for k, v in up.to_dict().items() if k != "index"}
            == {k: v for k, v in pipeline_made.to_dict().items() if k != "index"})
    storage.io.index_store._SHARDS.clear()
    for shard, old in zip(shards_of(ds, up), v1.shards, strict=True):
        assert [g.sha256 for g in shard.row_groups] == [g.sha256[:32] for g in old.row_groups]
    assert len(up_bytes) < len(v1_bytes)
    assert {p: b for p, b in _files(copy).items() if p.startswith("shards/")} == shards_before
    assert {p: (copy / p).stat().st_mtime_ns for p in shards_before} == mtimes
    got = _samples(ds)
    assert len(got) == len(want) and all(map(np.array_equal, got, want))
    assert storage_main(["verify", ds]) == 0
    versions = store_versions(ReplicaSet.from_urls([ds]))

    files = _files(copy)
    assert storage_main(["upgrade", ds]) == 0  # idempotent
    assert "already shardflow.dataset/2" in capsys.readouterr().out
    assert _files(copy) == files and store_versions(ReplicaSet.from_urls([ds])) == versions
    # The v1 manifest was recorded before the swap (it had no record): gc protects it.
    store = ReplicaSet.from_urls([ds])
    tags = [v.tag for v in versions]
    assert tags[-1] == hashlib.sha256(up_bytes).hexdigest()[:16]
    assert hashlib.sha256(v1_bytes).hexdigest()[:16] in tags
    report = collect(store, keep=1, now=time.time() + LATER)
    assert not [r for r in report.objects if r.path.startswith(("shards/", "index/"))]
    assert verify(store).ok


def test_upgrade_refuses_a_v1_manifest_without_row_group_locations(copy: Path) -> None:
    v1 = write_v1(str(copy))
    s = v1.shards[0]
    old = replace(v1, shards=(replace(s, footer_length=0, footer_sha256=""), *v1.shards[1:]))
    write_manifest(resolve(str(copy)), old)
    assert storage_main(["upgrade", str(copy)]) == 2
    assert read_manifest(str(copy)) == old


def test_gc_keeps_the_index_and_its_shards_and_removes_an_unnamed_index(copy: Path) -> None:
    store = ReplicaSet.from_urls([str(copy)])
    m = read_manifest(str(copy))
    stray = copy / "index" / "0123456789abcdef.sfidx"
    stray.write_bytes(b"not named by any manifest")
    report = collect(store, keep=1, now=time.time() + LATER)
    assert [r.path for r in report.objects] == ["index/0123456789abcdef.sfidx"]
    assert (copy / m.index.path).exists() and verify(store).ok
    # An index that cannot be read: gc cannot tell which shards are in use, removes nothing.
    (copy / m.index.path).write_bytes(b"rotten")
    (copy / "shards" / "part-99999-0123456789abcdef.parquet").write_bytes(b"orphan")
    with pytest.raises(GcError, match="index .* cannot be read"):
        collect(store, keep=1, now=time.time() + LATER)
    assert (copy / "shards" / "part-99999-0123456789abcdef.parquet").exists()


def test_scrub_checks_the_index_and_repairs_it_from_a_good_replica(
        copy: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(copy, other)
    m = read_manifest(str(copy))
    good = (copy / m.index.path).read_bytes()
    (copy / m.index.path).write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    store = ReplicaSet.from_urls([str(copy), str(other)])
    report = verify(store)
    assert [(p.path, p.kind, p.replica) for p in report.problems] == [
        (m.index.path, "corrupt", store.replicas[0].name)]
    # Readers fail over to the good copy meanwhile.
    assert len(shards_of(store, m)) == m.counts.shards
    assert not repair(store).unrepairable
    assert (copy / m.index.path).read_bytes() == good and verify(store).ok
    # Gone everywhere: verify says so instead of crashing, and cannot list the shards.
    for root in (copy, other):
        (root / m.index.path).unlink()
    storage.io.index_store._SHARDS.clear()  # the process's cache of shard lists, by index sha256
    report = verify(ReplicaSet.from_urls([str(copy), str(other)]))
    assert "unreadable" in {p.kind for p in report.problems}
    assert storage_main(["verify", str(copy)]) == 1


def test_v2_manifest_fields_are_checked(copy: Path) -> None:
    text = (copy / "manifest.json").read_text()
    for change, match in (
            (lambda d: d.__setitem__("shards", []), r"shards: a shardflow.dataset/2 manifest"),
            (lambda d: d.pop("index"), r"index is missing"),
            (lambda d: d["totals"].__setitem__("tokens", "many"),
             r"totals\.tokens must be an integer"),
            (lambda d: d["index"].__setitem__("sha256", "xyz"),
             r"index\.sha256 must be 64 lower-case hex"),
            (lambda d: d["index"].__setitem__("digest", "md5"),
             r"index\.digest must be one of sha256, blake3, not 'md5'"),
            (lambda d: d.__setitem__("format", "shardflow.dataset/9"), r"expected one of")):
        bad = json.loads(text)
        change(bad)
        with pytest.raises(ManifestError, match=match):
            Manifest.from_json(json.dumps(bad), source="ds/manifest.json")
    bad = json.loads(text)
    bad["index"]["path"] = "../elsewhere/index.sfidx"
    with pytest.raises(UnsafePathError, match="ds/manifest.json: index.path"):
        Manifest.from_json(json.dumps(bad), source="ds/manifest.json")
    # Totals that disagree with the index: the loader refuses before planning anything.
    bad = json.loads(text)
    bad["totals"]["tokens"] += 1
    (copy / "manifest.json").write_text(json.dumps(bad))
    with pytest.raises(ManifestError, match="add up to"):
        TokenDataset(str(copy), 64, rank=0, world_size=1)


def test_the_loader_reads_the_index_through_its_cache(copy: Path, tmp_path: Path) -> None:
    m = read_manifest(str(copy))
    cache = tmp_path / "cache"
    want = _samples(str(copy))
    ds = TokenDataset(str(copy), 64, rank=0, world_size=1, batch_size=4, seed=3,
                      cache_dir=str(cache))
    assert (cache / m.index.sha256[:2] / m.index.sha256).exists()  # small: cached whole
    (copy / m.index.path).unlink()  # a second rank on this host needs the cache only
    again = TokenDataset(str(copy), 64, rank=0, world_size=1, batch_size=4, seed=3,
                         cache_dir=str(cache))
    got = [x["input_ids"].numpy() for x in again]
    assert all(map(np.array_equal, got, want)) and len(got) == len(want) == len(list(ds))


def _synthetic(root: Path, n_groups: int) -> Manifest:
    """A v2 dataset of ``n_groups`` row groups: index and manifest only, no shard data."""
    root_dir = str(Path(__file__).resolve().parents[3])
    if root_dir not in sys.path:
        sys.path.insert(0, root_dir)
    from benchmarks.plan_scale import make_index, write_manifest_for

    root.mkdir(parents=True, exist_ok=True)
    path = root / "synthetic.sfidx"
    make_index(n_groups, path)
    return write_manifest_for(path, root)


def test_manifest_stays_a_few_kb_at_200k_row_groups(tmp_path: Path) -> None:
    n = 200_000
    m = _synthetic(tmp_path / "big", n)
    manifest_bytes = (tmp_path / "big" / "manifest.json").stat().st_size
    assert m.counts.row_groups == n and manifest_bytes < 4096, manifest_bytes
    # 36 B per row group plus ~140 B per shard (16 row groups per shard here): under 48
    assert m.index is not None and m.index.bytes / n < 48, m.index.bytes / n
    store = ReplicaSet.from_urls([str(tmp_path / "big")])
    # Over WHOLE_OBJECT_BYTES: the plan reads the header and its two columns only.
    reads: list[tuple[int | None, int | None]] = []
    fs = store.replicas[0].loc.fs
    cat = fs.cat_file

    def counting(path, start=None, end=None, **kw):  # type: ignore[no-untyped-def]
        reads.append((start, end))
        return cat(path, start=start, end=end, **kw)

    fs.cat_file = counting  # type: ignore[method-assign]
    try:
        cols = fetch_columns(store, m.index, ["tokens", "first_group"])
    finally:
        del fs.cat_file
    read = sum(e - s for s, e in reads if s is not None and e is not None)
    assert len(reads) == 3 and read <= 4 * n + 8 * (n // 16 + 1) + 4096  # of 8.9 MB
    whole = read_index((tmp_path / "big" / m.index.path).read_bytes(), m.index.header_sha256)
    assert np.array_equal(cols["tokens"], whole["tokens"])
    assert int(cols["tokens"].sum(dtype=np.uint64)) == m.counts.tokens


def test_a_v2_manifest_for_a_synthetic_index_commits_like_any(tmp_path: Path) -> None:
    m = _synthetic(tmp_path / "s", 1000)
    store = ReplicaSet.from_urls([str(tmp_path / "s")])
    commit(store, m)  # the live manifest, not recorded yet, is recorded; the same: no new one
    assert store.read_manifest() == m and len(store_versions(store)) == 1
    assert m.index is not None and m.index.path in set(list_tree(store.primary))


def test_upgrade_records_the_shards_codecs_of_an_older_index(
        copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        index_footers: None) -> None:
    """An index written before shard codecs were recorded: upgrade reads each shard's footer
    once and records its codec (the pipeline's own index bytes again), after which a loader
    reads no footer and the same samples; a second upgrade is a no-op."""
    from loaders import build_dataloader
    from tests.loaders._crafted import without_codecs

    made = read_manifest(str(copy))
    old = without_codecs(str(copy), tmp_path)
    ds = str(old)

    def epoch() -> tuple[list[np.ndarray], float]:
        loader = build_dataloader(ds, 4, 64, read_threads=1)
        return [b["input_ids"].numpy().copy() for b in loader], loader.metrics()["footers_read"]

    want, footers = epoch()
    assert footers > 0
    capsys.readouterr()
    assert storage_main(["upgrade", ds]) == 0
    out = capsys.readouterr().out
    n = len(shards_of(str(copy), made))
    assert f"recorded the codec of {n} shards" in out and "shards untouched" in out
    up = read_manifest(ds)
    assert up.index == made.index  # the same index the pipeline wrote, byte for byte
    got, footers = epoch()
    assert footers == 0 and len(got) == len(want) > 10
    assert all(map(np.array_equal, got, want))
    assert storage_main(["verify", ds]) == 0
    versions = store_versions(ReplicaSet.from_urls([ds]))
    assert storage_main(["upgrade", ds]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert store_versions(ReplicaSet.from_urls([ds])) == versions


def _corrupt_footer(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF  # inside the footer's Thrift bytes
    shard.write_bytes(bytes(data))


def test_upgrade_refuses_a_footer_that_does_not_match_its_checksum(
        copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A shard whose footer bytes differ from the index's footer_sha256: the upgrade stops
    naming the shard and swaps nothing."""
    from tests.loaders._crafted import without_codecs

    old = without_codecs(str(copy), tmp_path)
    before = read_manifest(str(old))
    shard = shards_of(str(old), before)[0]
    _corrupt_footer(old / shard.path)
    capsys.readouterr()
    assert storage_main(["upgrade", str(old)]) == 2
    err = capsys.readouterr().err
    assert f"{shard.path}: its footer cannot be read" in err and "Traceback" not in err
    assert read_manifest(str(old)) == before


def test_upgrade_reads_no_footer_of_list_int32_shards(
        copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Token columns stored as ``list<int32>`` (from long before binary ones) always decode
    under their footers, so an upgrade has no codec to record and reads none of their footers
    (here every footer is corrupt: reading one would fail the upgrade, as it does for binary
    shards above); the dataset is left alone."""
    from tests.loaders._crafted import without_codecs

    old = without_codecs(str(copy), tmp_path)
    manifest_path = old / "manifest.json"
    doc = json.loads(manifest_path.read_text())
    doc["schema"]["input_ids"] = "list<int32>"
    manifest_path.write_text(json.dumps(doc))
    before = read_manifest(str(old))
    for shard in shards_of(str(old), before):
        _corrupt_footer(old / shard.path)
    capsys.readouterr()
    assert storage_main(["upgrade", str(old)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert read_manifest(str(old)) == before
