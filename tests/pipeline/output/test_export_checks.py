"""``pipeline export`` makes ``storage verify``'s checks of every shard (pipeline/output/export.py):
an index whose checksums were recomputed over crafted counts was refused by verify and the
loader but exported, its bytes taken for what the index said they were."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from storage import ReplicaSet
from storage.admin.scrub import verify
from tests.storage.admin.test_verify import craft

REPO = Path(__file__).resolve().parents[3]


def _export(ds: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", "export", str(ds), str(out),
                           "--format", "jsonl", "--no-progress"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("change, fix, says", [
    ({"tokens": {0: 5000}}, True, "row group 0: tokens 5,000 in the index"),
    ({"footer_length": {0: 0}}, True, "no footer location recorded"),
    ({"offset": {0: 4}}, False, "row group 0"),
])
def test_export_refuses_what_verify_refuses(tiny_dataset: str, tmp_path: Path,
                                            change: dict, fix: bool, says: str) -> None:
    ds = tmp_path / "ds"
    shutil.copytree(tiny_dataset, ds)
    craft(ds, change, fix_totals=fix)
    report = verify(ReplicaSet.from_urls([str(ds)]))
    assert not report.ok
    out = _export(ds, tmp_path / "out")
    assert out.returncode == 2, (out.stdout, out.stderr[-2000:])
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
    assert says in out.stderr and "storage verify" in out.stderr, out.stderr


def test_a_dataset_verify_passes_exports_as_before(tiny_dataset: str, tmp_path: Path) -> None:
    assert verify(ReplicaSet.from_urls([tiny_dataset])).ok
    out = _export(Path(tiny_dataset), tmp_path / "out")
    assert out.returncode == 0, out.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "out").iterdir())[0] == "part-00000.jsonl"
