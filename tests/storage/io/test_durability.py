"""What reaches the disk before a write returns: synced objects (shards, manifest) are flushed
with their folder entry, scratch (``sync=False``) is left to the kernel's writeback.

``os.fsync`` is wrapped, not replaced: each call still syncs, and the wrapper notes which file
or folder it was given (by the descriptor's ``/proc`` link), so the tests see what a power
loss would find.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import ReplicaSet, resolve, write_atomic
from storage.io import atomic


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    paths: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    yield paths


def _synced_files(paths: list[str], root: Path) -> set[str]:
    """Synced paths relative to ``root`` (a file's bytes are synced under its temporary
    name, before the rename)."""
    return {os.path.relpath(p, root) for p in paths}


def test_a_synced_write_flushes_the_bytes_and_the_name(tmp_path: Path, synced: list[str]) -> None:
    write_atomic(resolve(str(tmp_path)), "shards/a.parquet", b"x" * 100)
    assert (tmp_path / "shards/a.parquet").read_bytes() == b"x" * 100
    names = _synced_files(synced, tmp_path)
    assert "shards" in names  # the folder: the rename is durable
    temporary = [n for n in names if n.startswith("shards/.tmp-")]
    assert len(temporary) == 1  # the bytes, synced before the rename put them in place


def test_scratch_writes_are_not_synced_but_their_writeback_starts(
        tmp_path: Path, synced: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []
    real = atomic.start_writeback

    def spy(fd: int) -> None:
        started.append(os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), tmp_path))
        real(fd)

    monkeypatch.setattr(atomic, "start_writeback", spy)
    write_atomic(resolve(str(tmp_path)), "_work/p1/k.keys.npy", b"k" * 100, sync=False)
    ReplicaSet.from_urls([str(tmp_path)], sync=False).put("_work/p1/k.done.json", b"{}")
    assert (tmp_path / "_work/p1/k.keys.npy").read_bytes() == b"k" * 100
    assert (tmp_path / "_work/p1/k.done.json").read_bytes() == b"{}"
    assert synced == []
    assert len(started) == 2 and all(s.startswith("_work/p1/.tmp-") for s in started)


def test_starting_writeback_where_it_cannot_be_started_is_harmless(tmp_path: Path) -> None:
    """A pipe (ESPIPE), a folder (EBADF/EINVAL): the kernel refuses, the write goes on."""
    read_end, write_end = os.pipe()
    folder = os.open(tmp_path, os.O_RDONLY)
    try:
        for fd in (read_end, write_end, folder):
            atomic.start_writeback(fd)
    finally:
        for fd in (read_end, write_end, folder):
            os.close(fd)


def test_linking_unsynced_scratch_into_the_dataset_syncs_it(tmp_path: Path,
                                                            synced: list[str]) -> None:
    """Phase 2 links a work file written without fsync: the link must flush its bytes (same
    inode) and the new name before the caller's marker says the shard is done."""
    loc = resolve(str(tmp_path))
    write_atomic(loc, "_work/p1/k.rows.parquet", b"rows" * 50, sync=False)
    assert synced == []
    write_atomic(loc, "shards/part-1.parquet", b"rows" * 50, same_as="_work/p1/k.rows.parquet")
    shard = tmp_path / "shards/part-1.parquet"
    assert shard.stat().st_ino == (tmp_path / "_work/p1/k.rows.parquet").stat().st_ino
    assert _synced_files(synced, tmp_path) == {"shards/part-1.parquet", "shards"}


def test_a_replica_set_syncs_by_default(tmp_path: Path, synced: list[str]) -> None:
    ReplicaSet.from_urls([str(tmp_path / "a"), str(tmp_path / "b")]).put("manifest.json", b"{}")
    names = _synced_files(synced, tmp_path)
    assert {"a", "b"} <= names  # both replicas' folders
    assert len(names) == 4  # and both temporary files


def test_a_filesystem_refusing_to_sync_folders_still_gets_synced_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some FUSE and network filesystems answer EINVAL to ``fsync`` on a folder; that is no
    reason to fail a commit. A file's refused sync still is."""
    import errno
    import stat

    real = os.fsync

    def refuse(kind: int) -> object:
        def fsync(fd: int) -> None:
            if stat.S_IFMT(os.fstat(fd).st_mode) == kind:
                raise OSError(errno.EINVAL, "Invalid argument")
            real(fd)
        return fsync

    loc = resolve(str(tmp_path))
    monkeypatch.setattr(os, "fsync", refuse(stat.S_IFDIR))
    write_atomic(loc, "manifest.json", b"{}")
    assert (tmp_path / "manifest.json").read_bytes() == b"{}"
    monkeypatch.setattr(os, "fsync", refuse(stat.S_IFREG))
    with pytest.raises(OSError, match="Invalid argument"):
        write_atomic(loc, "manifest.json", b"{ }")
    assert (tmp_path / "manifest.json").read_bytes() == b"{}"  # the old one, untouched
    assert not list(tmp_path.glob(".tmp-*"))
