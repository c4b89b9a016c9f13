"""The default recipe changes nothing: the demo corpus (``make run``) and a filtered WARC run
give the shards the fixed pipeline gave before recipes (``data/shards_before_recipes.json``,
written by that code: each shard's content digest, and its file's sha256 where this pyarrow
is the one that wrote them, since the footer names the writer's version, and, for the WARC
run, the checkout is where it was: a record's ``source`` names its file's whole path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow
import pytest

from tests.pipeline.steps._shard_digest import dataset_digests

REPO = Path(__file__).resolve().parents[3]
BEFORE = json.loads((Path(__file__).parent / "data" / "shards_before_recipes.json").read_text())
WARCS = ["tests/pipeline/readers/data/dolma/sample-0000.warc.gz",
         "tests/pipeline/readers/data/dolma/sample-0001.warc.gz",
         "tests/pipeline/readers/data/warcio/example.warc.gz"]
RUNS = {
    "demo": [],
    "web": ["--filters", "gopher,c4,fineweb", "--pii", "mask", "--languages", "en,de,fr",
            *WARCS],
}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_the_default_recipe_writes_the_shards_it_wrote_before(run: str, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "pipeline", "run", "--no-progress", "--output",
                          str(tmp_path / run), *RUNS[run]], cwd=REPO, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert out.returncode == 0, out.stderr[-3000:]
    now = dataset_digests(tmp_path / run, str(REPO))
    before = BEFORE[run]
    assert {k: v["content"] for k, v in now.items()} == \
        {k: v["content"] for k, v in before.items()}
    if pyarrow.__version__ == BEFORE["pyarrow"] and (run == "demo" or str(REPO) == BEFORE["repo"]):
        # the same writer (and, for web records, whose source names their file's whole path,
        # the same checkout path): the same bytes
        assert {k: v["sha256"] for k, v in now.items()} == \
            {k: v["sha256"] for k, v in before.items()}
    manifest = json.loads((tmp_path / run / "manifest.json").read_text())
    assert "signals" not in manifest["stats"]  # no step writes a column by default
    assert [s["use"] for s in manifest["config"]["steps"]][-1] == \
        ("clean" if run == "demo" else "pii")
