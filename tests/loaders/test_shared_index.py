"""A large index's arrays are one file per host, memory-mapped by every process, checked on
every open: processes map the same inode and get the same plan; a corrupt copy is replaced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loaders import shared_index
from loaders.plan import Layout, Progress
from loaders.settings import LoaderSettings
from loaders.source import DatasetSource, rank_stream
from storage import ReplicaSet

ROOT = Path(__file__).resolve().parents[2]
SEQ = 127

CHILD = r"""
import json, os, sys
import loaders.shared_index as si
si.MIN_INDEX_BYTES = 0
from loaders.plan import Layout, Progress
from loaders.settings import LoaderSettings
from loaders.source import DatasetSource, rank_stream
source = DatasetSource(sys.argv[1], LoaderSettings(int(sys.argv[2])))
layout = Layout(8, 1, 2, int(sys.argv[3]), 4)
batch = next(rank_stream(source, layout, Progress()).batches())
maps = [line.split() for line in open("/proc/self/maps") if "shardflow-index-" in line]
print(json.dumps({"batch": batch.tolist(), "corrupt": si.corrupt,
                  "mapped": sorted({(m[5], int(m[4])) for m in maps})}))
"""


@pytest.fixture
def dataset(tmp_path: Path) -> str:
    from benchmarks.bench_utils import write_token_dataset

    tokens = np.random.default_rng(3).integers(0, 50_000, 40 * 2048, dtype=np.uint16)
    path = str(tmp_path / "ds")
    write_token_dataset(ReplicaSet.from_urls([path]), tokens, 4, row_group_tokens=2048,
                        doc_tokens=256)
    return path


def _child(dataset: str, index_dir: Path, rank: int) -> dict:
    env = {**os.environ, shared_index.ENV_DIR: str(index_dir), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", CHILD, dataset, str(SEQ), str(rank)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_processes_map_one_copy_and_get_the_same_plan(dataset: str, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    a, b = _child(dataset, index_dir, 0), _child(dataset, index_dir, 0)
    c = _child(dataset, index_dir, 1)
    files = sorted(Path(shared_index.private_folder(str(index_dir))).glob("*.bin"))
    assert [f.name.split("-", 3)[3] for f in files] == [f"samples2-{SEQ}.bin", "starts.bin"]
    inodes = sorted([str(f), f.stat().st_ino] for f in files)
    assert a["mapped"] == b["mapped"] == c["mapped"] == inodes  # the same files, mapped
    assert a["batch"] == b["batch"] and a["corrupt"] == b["corrupt"] == 0
    # the plan is the one built in process memory, with no shared copy
    private = DatasetSource(dataset, LoaderSettings(SEQ))
    for rank, got in ((0, a), (1, c)):
        want = next(rank_stream(private, Layout(8, 1, 2, rank, 4), Progress()).batches())
        assert got["batch"] == want.tolist()


def test_corrupt_copy_is_detected_and_rebuilt(dataset: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    index_dir = tmp_path / "index"
    monkeypatch.setattr(shared_index, "MIN_INDEX_BYTES", 0)
    monkeypatch.setenv(shared_index.ENV_DIR, str(index_dir))
    first = DatasetSource(dataset, LoaderSettings(SEQ))
    starts, group_tokens = np.array(first.index.starts), first.index.group_tokens()
    (path,) = Path(shared_index.private_folder(str(index_dir))).glob("*-starts.bin")
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # one bit flip in the payload (the last array: first_group)
    path.write_bytes(bytes(data))
    before = shared_index.corrupt
    again = DatasetSource(dataset, LoaderSettings(SEQ))
    assert shared_index.corrupt == before + 1
    assert np.array_equal(again.index.starts, starts)
    assert path.read_bytes() != bytes(data)  # replaced by a good copy
    path.write_bytes(b"SFIDXv1\n")  # truncated
    third = DatasetSource(dataset, LoaderSettings(SEQ))
    assert shared_index.corrupt == before + 2
    assert np.array_equal(third.index.group_tokens(), group_tokens)
