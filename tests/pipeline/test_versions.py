"""Snapshot isolation end to end: a rebuild into a live dataset's output, a reader mid-epoch
while it commits, a rebuild killed half-way, and gc afterwards.

What DESIGN.md promises: a committed version is immutable; a rebuild writes new objects and
swaps the manifest; readers finish the version they opened; gc removes only what no kept
version names.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loaders import build_dataloader
from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from storage import ReplicaSet, objects_of, read_manifest, store_versions
from storage.admin.versions import history
from storage.format.layout import card_tag
from tests.conftest import shakespeare_texts
from tests.pipeline._procs import ENV, REPO, done_markers, kill_tree, pipeline_cmd, wait_for

SEQ, BATCH = 64, 8


def _cfg(inputs: list[str], out: Path, **kw: object) -> PipelineConfig:
    return PipelineConfig(inputs=inputs, output=str(out), workers=1,
                          dashboard_address="127.0.0.1:0", **kw)  # type: ignore[arg-type]


def _loader(ds: Path):  # noqa: ANN202
    # One read thread, one group ahead: most reads of the epoch happen when they are asked for.
    return build_dataloader(str(ds), BATCH, SEQ, rank=0, world_size=1, seed=3,
                            return_sample_id=True, read_threads=1, lookahead_groups=1)


def _samples(batches) -> list[tuple[int, list[int]]]:  # noqa: ANN001
    out = []
    for batch in batches:
        out += list(zip(batch["sample_id"].tolist(), batch["input_ids"].tolist(), strict=True))
    return out


def _objects(ds: Path) -> dict[str, bytes]:
    m = read_manifest(str(ds))
    return {path: (ds / path).read_bytes() for path, _size, _sha in objects_of(str(ds), m)}


def _verify(ds: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "storage", "verify", str(ds)], cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=120)


def test_a_reader_finishes_its_epoch_on_the_version_it_opened(tmp_path: Path) -> None:
    plays = shakespeare_texts()
    ds = tmp_path / "ds"
    v1_cfg = _cfg([str(plays / "hamlet_gut.txt")], ds, row_group_tokens=1024,
                  partition_bytes=40_000)
    assert run(v1_cfg, progress=False).version.startswith("1 (_versions/00000001-")
    v1 = (ds / "manifest.json").read_bytes()
    want = _samples(_loader(ds))
    assert len(want) > 100

    again = run(v1_cfg, progress=False)  # the same command: the same bytes, no new version
    assert again.version == "" and "unchanged" in again.render()
    assert (ds / "manifest.json").read_bytes() == v1
    assert [v.sequence for v in store_versions(ReplicaSet.from_urls([str(ds)]))] == [1]

    reader = iter(_loader(ds))
    got = _samples(next(reader) for _ in range(len(want) // BATCH // 3))
    # Other input and other settings, into the same output: shards 0, 1, ... all change.
    run(_cfg([str(plays / "macbeth_gut.txt")], ds, row_group_tokens=2048,
             partition_bytes=30_000, tokenizer="train:2000"), progress=False)
    assert (ds / "manifest.json").read_bytes() != v1
    got += _samples(reader)  # no ChecksumMismatchError: the old version's objects are intact
    assert got == want

    entries = history(ReplicaSet.from_urls([str(ds)]))
    assert [(e.version.sequence, e.current) for e in entries if e.version] == \
        [(1, False), (2, True)]
    fresh = _samples(_loader(ds))
    assert fresh != want and read_manifest(str(ds)).vocab_size == 2000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~1 MB of JSONL from two plays, every paragraph twice (dedup drops the second)."""
    root = tmp_path_factory.mktemp("versions_corpus")
    for name in ("hamlet_gut.txt", "othello_gut.txt"):
        paras = [p for p in (shakespeare_texts() / name).read_text().split("\n\n") if p.strip()]
        lines = [json.dumps({"text": p, "id": f"{name}-{i}"}) for i, p in enumerate(paras)]
        (root / f"{name}.jsonl").write_text("\n".join(lines * 2) + "\n")
    return root


def test_a_killed_rebuild_leaves_the_live_version_and_a_rerun_completes(
        corpus: Path, tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    inputs = [str(corpus / "*.jsonl")]
    run(_cfg(inputs, ds, id_field="id", partition_bytes=150_000), progress=False)
    v1_manifest = (ds / "manifest.json").read_bytes()
    v1_objects = _objects(ds)
    v1_samples = _samples(_loader(ds))

    # v2: other partitions and row groups, killed once a few partitions are done.
    v2_args = [*inputs, "--output", str(ds), "--id-field", "id", "--partition-bytes", "60000",
               "--row-group-tokens", "4096"]
    proc = subprocess.Popen(pipeline_cmd(*v2_args, "--workers", "1"), cwd=REPO, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(done_markers(ds)) >= 3 or proc.poll() is not None, 180,
                 "three finished partitions of the rebuild")
        assert proc.poll() is None, "the rebuild ended before the kill: it proved nothing"
        kill_tree(proc.pid)
    finally:
        kill_tree(proc.pid)
    assert (ds / "_work").exists()

    # v1 is untouched: the same manifest, every object intact, verify-clean, same samples.
    assert (ds / "manifest.json").read_bytes() == v1_manifest
    assert _objects(ds) == v1_objects
    check = _verify(ds)
    assert check.returncode == 0 and "OK" in check.stdout, check.stdout + check.stderr
    assert _samples(_loader(ds)) == v1_samples

    again = subprocess.run(pipeline_cmd(*v2_args, "--workers", "2"), cwd=REPO, env=ENV,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert int(again.stdout.split("shards (")[1].split()[0]) >= 3  # finished partitions reused
    clean = tmp_path / "clean"
    run(_cfg(inputs, clean, id_field="id", partition_bytes=60_000, row_group_tokens=4096),
        progress=False)
    assert (ds / "manifest.json").read_bytes() == (clean / "manifest.json").read_bytes()
    assert _objects(ds) == _objects(clean)  # byte-identical, killed or not, 1 or 2 workers
    assert not (ds / "_work").exists()
    assert [v.sequence for v in store_versions(ReplicaSet.from_urls([str(ds)]))] == [1, 2]
    assert all((ds / p).read_bytes() == b for p, b in v1_objects.items())  # v1 still there

    # Drop v1: what only it named goes, v2 stays verify-clean and readable.
    gc = subprocess.run([sys.executable, "-m", "storage", "gc", str(ds), "--keep", "1",
                         "--min-age", "0"], cwd=REPO, env=ENV, capture_output=True, text=True,
                        timeout=120)
    assert gc.returncode == 0, gc.stderr
    v2_objects = _objects(ds)
    left = {str(p.relative_to(ds)) for p in ds.rglob("*") if p.is_file()}
    kept = store_versions(ReplicaSet.from_urls([str(ds)]))
    cards = {p for p in left if card_tag(p) is not None}  # the kept versions' cards only
    assert {card_tag(p) for p in cards} == {v.tag for v in kept}, cards
    assert left - cards == {*v2_objects, "manifest.json", *(v.path for v in kept)}
    assert len(left - cards) == len(v2_objects) + 2  # + manifest.json and its record
    assert _verify(ds).returncode == 0
    assert len(_samples(_loader(ds))) > 0
