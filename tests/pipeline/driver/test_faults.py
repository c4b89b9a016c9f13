"""Killed workers, a killed driver, adaptive scaling: the result is byte-identical anyway.

Real processes are killed with SIGKILL mid-run; each result is compared with an undisturbed
run with another number of workers.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import psutil
import pytest

from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from storage import read_manifest, shards_of
from tests.conftest import shakespeare_texts
from tests.pipeline._procs import (
    ENV,
    REPO,
    dask_cluster,
    done_markers,
    kill_tree,
    pipeline_cmd,
    wait_for,
)

PARTITION = "100000"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~2.5 MB of JSONL from real plays (with their natural duplicate paragraphs)."""
    root = tmp_path_factory.mktemp("fault_corpus")
    for name in ("hamlet_gut.txt", "macbeth_gut.txt", "othello_gut.txt", "lear_gut.txt"):
        paras = [p for p in (shakespeare_texts() / name).read_text().split("\n\n") if p.strip()]
        lines = [json.dumps({"text": p, "id": f"{name}-{i}"}) for i, p in enumerate(paras)]
        lines = lines * 3  # exact duplicates across partitions: the survivor must not vary
        (root / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "ds"
    run(PipelineConfig(inputs=[str(corpus / "*.jsonl")], output=str(out), workers=1,
                       id_field="id", partition_bytes=int(PARTITION),
                       dashboard_address="127.0.0.1:0"), progress=False)
    return out


def assert_identical(ds: Path, ref: Path) -> None:
    assert (ds / "manifest.json").read_bytes() == (ref / "manifest.json").read_bytes()
    m = read_manifest(str(ref))
    shards = shards_of(str(ref), m)
    assert len(shards) > 10 and m.index is not None
    for obj in [*shards, *m.quarantine, m.index]:
        assert (ds / obj.path).read_bytes() == (ref / obj.path).read_bytes()
    assert not (ds / "_work").exists()


def _args(corpus: Path, out: Path) -> list[str]:
    return [str(corpus / "*.jsonl"), "--output", str(out), "--id-field", "id",
            "--partition-bytes", PARTITION]


def test_killed_driver_rerun_redoes_only_unfinished_partitions(
        corpus: Path, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    cmd = pipeline_cmd(*_args(corpus, out), "--workers", "2")
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: len(done_markers(out)) >= 3 or proc.poll() is not None, 120,
                 "three finished partitions")
        assert proc.poll() is None, "the run ended before the kill: it proved nothing"
        kill_tree(proc.pid)  # the driver and the LocalCluster it started, like a lost machine
    finally:
        kill_tree(proc.pid)
    finished = len(done_markers(out))
    assert not (out / "manifest.json").exists()
    assert 3 <= finished < 26

    again = subprocess.run(pipeline_cmd(*_args(corpus, out), "--workers", "1"), cwd=REPO,
                           env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    reused = int(again.stdout.split("shards (")[1].split()[0])
    assert reused >= finished  # every partition finished before the kill was not redone
    assert_identical(out, reference)


def test_rerun_after_a_power_loss_redoes_partitions_whose_work_files_were_lost(
        corpus: Path, reference: Path, tmp_path: Path) -> None:
    """Phase 1 writes its work files without fsync: a power loss can keep a ``done`` marker
    whose rows or keys never reached the disk (torn, zero-filled or absent). The rerun must
    notice, redo just those partitions and still write the reference dataset."""
    out = tmp_path / "ds"
    proc = subprocess.Popen(pipeline_cmd(*_args(corpus, out), "--workers", "2"), cwd=REPO,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: len(done_markers(out)) >= 4 or proc.poll() is not None, 120,
                 "four finished partitions")
        assert proc.poll() is None, "the run ended before the kill: it proved nothing"
    finally:
        kill_tree(proc.pid)
    markers = done_markers(out)
    assert not (out / "manifest.json").exists() and len(markers) >= 4
    torn_rows, zeroed_keys, lost_rows = (m.name.removesuffix(".done.json") for m in markers[:3])
    rows = out / "_work" / "p1" / f"{torn_rows}.rows.parquet"
    rows.write_bytes(rows.read_bytes()[: rows.stat().st_size // 2])
    keys = out / "_work" / "p1" / f"{zeroed_keys}.keys.npy"
    keys.write_bytes(b"\0" * keys.stat().st_size)
    (out / "_work" / "p1" / f"{lost_rows}.rows.parquet").unlink()

    again = subprocess.run(pipeline_cmd(*_args(corpus, out), "--workers", "1"), cwd=REPO,
                           env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    reused = int(again.stdout.split("shards (")[1].split()[0])
    assert reused == len(markers) - 3  # the intact ones reused, the three damaged redone
    assert_identical(out, reference)


def test_rerun_after_a_failed_commit_reads_no_work_file_again(
        corpus: Path, reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every partition's phase 2 finished but the commit did not: the shards are durable, so
    the rerun takes phase 1's counts from the markers and reads no work file again (at scale,
    re-reading them would be a second pass over the whole dataset). A work file damaged
    after its shard was made changes nothing."""
    import pipeline.driver.job as job

    out = tmp_path / "ds"
    cfg = PipelineConfig(inputs=[str(corpus / "*.jsonl")], output=str(out), workers=1,
                         id_field="id", partition_bytes=int(PARTITION),
                         dashboard_address="127.0.0.1:0")

    def refuse(*args: object) -> None:
        raise OSError("the store went away during the commit")

    with monkeypatch.context() as patch:
        patch.setattr(job, "commit", refuse)
        with pytest.raises(OSError, match="went away"):
            run(cfg, progress=False)
    markers = done_markers(out)
    assert not (out / "manifest.json").exists() and len(markers) > 10
    rows = out / "_work" / "p1" / markers[0].name.replace(".done.json", ".rows.parquet")
    rows.write_bytes(b"torn")

    from pipeline.planning.plan import PartitionPlan

    made: Counter[int] = Counter()  # the driver's key hashes, by partition
    key = PartitionPlan.key

    def counted(plan: PartitionPlan, i: int, salt: str) -> str:
        made[i] += 1
        return key(plan, i, salt)

    with monkeypatch.context() as patch:
        patch.setattr(PartitionPlan, "key", counted)
        summary = run(cfg, progress=False)
    assert summary.resumed == len(markers)  # no partition redone, none re-read
    assert_identical(out, reference)
    # Each key hashed twice at most (placing its marker, the run key), not again for a
    # partition whose kept counts are reused
    assert len(made) == summary.partitions and max(made.values()) == 2, made


def test_killed_worker_on_a_separate_dask_cluster(corpus: Path, reference: Path,
                                                  tmp_path: Path) -> None:
    out = tmp_path / "ds"
    with dask_cluster(tmp_path, workers=2) as cluster:
        proc = subprocess.Popen(pipeline_cmd(*_args(corpus, out), "--scheduler",
                                             cluster.address, "--retries", "1"),
                                cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: len(done_markers(out)) >= 2 or proc.poll() is not None, 120,
                     "two finished partitions")
            assert proc.poll() is None, "the run ended before the kill: it proved nothing"
            victim = cluster.workers[0]
            kill_tree(victim.pid)
            assert not psutil.pid_exists(victim.pid) or \
                psutil.Process(victim.pid).status() == psutil.STATUS_ZOMBIE
            stdout, stderr = proc.communicate(timeout=300)
        finally:
            kill_tree(proc.pid)
        assert proc.returncode == 0, stderr
        assert "dask: 2 workers" in stderr
    assert_identical(out, reference)


def test_adaptive_local_cluster(corpus: Path, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    run(PipelineConfig(inputs=[str(corpus / "*.jsonl")], output=str(out), adapt="1:2",
                       id_field="id", partition_bytes=int(PARTITION),
                       dashboard_address="127.0.0.1:0"), progress=False)
    assert_identical(out, reference)
