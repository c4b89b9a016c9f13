"""Crafted datasets for the readers' tests: an index whose checksums all hold but whose
piece for a row group names another row group's bytes; an index as written before it
recorded each shard's codec."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.bench_utils import drop_shard_codecs
from storage import read_manifest
from storage.format.index import read_index
from tests.storage.admin.test_verify import craft


def piece_moved_to_the_next_group(dataset: str, into: Path, codecs: bool = True) -> Path:
    """A copy of ``dataset`` whose index gives the first row group the offset, length and
    digest of the second (same shard): its piece verifies, while the footer still places the
    first row group's tokens where they are. ``codecs=False``: the index lacks
    ``shard_codec`` too (a reader decodes under the shard's footer)."""
    ds = into / "moved"
    if codecs:
        shutil.copytree(dataset, ds)
    else:
        without_codecs(dataset, into).rename(ds)
    m = read_manifest(str(ds))
    assert m.index is not None
    cols = read_index((ds / m.index.path).read_bytes())
    g0 = int(cols["first_group"][0])
    assert int(cols["first_group"][1]) > g0 + 1, "the first shard needs two row groups"
    craft(ds, {name: {g0: cols[name][g0 + 1]} for name in ("offset", "length", "digest")})
    return ds


def without_codecs(dataset: str, into: Path) -> Path:
    """A copy of ``dataset`` whose index lacks the ``shard_codec`` column, as every index
    written before it did: a reader must fetch and parse each shard's footer."""
    ds = into / "no-codecs"
    shutil.copytree(dataset, ds)
    drop_shard_codecs(ds)
    return ds
