"""The loader reads a local shard only where it lies inside the dataset (issue 22, item 2).

A shard's bytes are checked against the index's digests, so a symlinked shard could not feed
a trainer other tokens; but the reader would still open, map and read files outside the dataset
that the dataset's owner chose. It refuses that, by the shard's name and the link's, while a
symlink that stays inside the dataset reads as before.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from loaders import build_dataloader
from storage.io.local.paths import UnsafeSymlinkError

SEQ = 255


def _epoch(url: str, **kw) -> list[np.ndarray]:
    return [b["input_ids"].numpy().copy() for b in build_dataloader(url, 4, SEQ, **kw)]


def test_a_shard_folder_symlinked_out_of_the_dataset_is_refused(tiny_dataset: str,
                                                                tmp_path: Path) -> None:
    ds, outside = tmp_path / "ds", tmp_path / "outside"
    shutil.copytree(tiny_dataset, ds)
    outside.mkdir()
    shutil.move(str(ds / "shards"), outside / "shards")
    (ds / "shards").symlink_to(outside / "shards", target_is_directory=True)

    with pytest.raises(UnsafeSymlinkError) as caught:
        _epoch(str(ds))
    message = str(caught.value)
    assert "shards is a symlink" in message and str(outside / "shards") in message
    assert "shards/part-" in message  # the shard that was to be read


def test_a_symlink_out_fails_over_to_a_replica_without_one(tiny_dataset: str,
                                                           tmp_path: Path) -> None:
    """A replica's symlinked shard is that copy's problem: the read moves on to another."""
    bad, outside = tmp_path / "bad", tmp_path / "outside"
    shutil.copytree(tiny_dataset, bad)
    outside.mkdir()
    shutil.move(str(bad / "shards"), outside / "shards")
    (bad / "shards").symlink_to(outside / "shards", target_is_directory=True)
    want = _epoch(tiny_dataset)
    got = _epoch(str(bad), replicas=[tiny_dataset])
    assert len(got) == len(want) > 10
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_shard_folder_symlinked_inside_the_dataset_reads_as_before(tiny_dataset: str,
                                                                    tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    shutil.copytree(tiny_dataset, ds)
    shutil.move(str(ds / "shards"), ds / "shards-disk2")
    (ds / "shards").symlink_to(ds / "shards-disk2", target_is_directory=True)
    want = _epoch(tiny_dataset)
    got = _epoch(str(ds))
    assert len(got) == len(want) > 10
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
