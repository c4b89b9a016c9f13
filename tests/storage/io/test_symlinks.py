"""No admin operation follows a symlink out of a local dataset (issue 22, item 2).

The datasets are real ones (``tiny_dataset``, built by the pipeline), copied and then tampered
with the way an attacker who hands over a dataset directory could: a folder of the dataset
replaced by a symlink to a directory outside it. ``python -m storage`` runs in a subprocess,
as users run it; what lies outside is compared byte for byte before and after.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import STORAGE_OPTIONS_ENV
from storage import ReplicaSet, resolve, write_atomic
from storage.format.layout import UnsafePathError
from storage.io.local.paths import UnsafeSymlinkError

REPO = Path(__file__).resolve().parents[3]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != STORAGE_OPTIONS_ENV}
    return subprocess.run([sys.executable, "-m", "storage", *args], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=env)


def _copy(tiny_dataset: str, tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    shutil.copytree(tiny_dataset, out)
    return out


def _snapshot(top: Path) -> dict[str, bytes]:
    """Every file under ``top`` with its bytes: what must not change."""
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*"))
            if p.is_file()}


def _link_out(dataset: Path, folder: str, outside: Path) -> Path:
    """Move ``dataset/folder`` to ``outside/folder`` (or make it there, empty) and leave a
    symlink to it in its place; returns the folder outside."""
    target = outside / folder
    target.parent.mkdir(parents=True, exist_ok=True)
    if (dataset / folder).exists():
        shutil.move(str(dataset / folder), target)
    else:
        target.mkdir()
    (dataset / folder).parent.mkdir(parents=True, exist_ok=True)
    (dataset / folder).symlink_to(target, target_is_directory=True)
    return target


# -- the reproduction: repair, gc and verify through the real CLI --------------------------------

def test_repair_does_not_write_through_a_symlinked_shards_folder(tiny_dataset: str,
                                                                 tmp_path: Path) -> None:
    """The report's case: ``shards/`` of the dataset points outside, a shard is missing there,
    and the other replica has it. Repair used to write it into the folder outside."""
    victim, other = _copy(tiny_dataset, tmp_path, "a"), _copy(tiny_dataset, tmp_path, "b")
    outside = tmp_path / "outside"
    target = _link_out(victim, "shards", outside)
    removed = sorted(target.glob("*.parquet"))[0]
    removed.unlink()
    before = _snapshot(outside)

    run = _cli("repair", str(victim), "--replica", str(other))

    assert _snapshot(outside) == before, "repair wrote outside the dataset"
    assert not removed.exists()
    assert run.returncode != 0, run.stdout + run.stderr
    said = run.stdout + run.stderr
    assert "UNREPAIRABLE" in said and f"shards/{removed.name}" in said
    assert "symlink" in said and str(target) in said  # the link and where it leads
    assert (victim / "shards").is_symlink()  # left as it was, for a person to look at


def test_gc_refuses_a_dataset_with_a_symlinked_folder(tiny_dataset: str, tmp_path: Path) -> None:
    """gc used to take the ``shards`` link for an unnamed object and delete it (the dataset
    then had no shards); it now removes nothing and names the link."""
    ds = _copy(tiny_dataset, tmp_path, "ds")
    outside = tmp_path / "outside"
    target = _link_out(ds, "shards", outside)
    before, inside = _snapshot(outside), _snapshot(ds)

    run = _cli("gc", str(ds), "--keep", "1", "--min-age", "0")

    assert run.returncode != 0, run.stdout + run.stderr
    assert "shards" in run.stderr and "symlink" in run.stderr and str(target) in run.stderr
    assert "removes nothing" in run.stderr
    assert _snapshot(outside) == before and _snapshot(ds) == inside
    assert (ds / "shards").is_symlink()


def test_verify_does_not_read_a_manifest_through_a_symlink_out(tiny_dataset: str,
                                                               tmp_path: Path) -> None:
    ds = _copy(tiny_dataset, tmp_path, "ds")
    elsewhere = tmp_path / "outside" / "manifest.json"
    elsewhere.parent.mkdir()
    shutil.move(str(ds / "manifest.json"), elsewhere)
    (ds / "manifest.json").symlink_to(elsewhere)

    run = _cli("verify", str(ds))

    said = run.stdout + run.stderr  # an error, or a problem line: either names the link
    assert run.returncode != 0, said
    assert "manifest.json is a symlink" in said and str(elsewhere) in said


# -- write_atomic: every folder of the layout ---------------------------------------------------

@pytest.mark.parametrize("folder, relative", [
    ("shards", "shards/part-00000-0123456789abcdef.parquet"),
    ("_degraded", "_degraded/0123456789abcdef0123.json"),
    ("_versions", "_versions/00000001-0123456789abcdef.json"),
    ("_work", "_work/p1/k.rows.parquet"),
    ("_work/p1", "_work/p1/k.rows.parquet"),
    ("index", "index/0123456789abcdef.sfidx"),
])
def test_write_atomic_refuses_a_symlinked_folder_out_of_the_root(
        tmp_path: Path, folder: str, relative: str) -> None:
    ds, outside = tmp_path / "ds", tmp_path / "outside"
    ds.mkdir()
    target = _link_out(ds, folder, outside)
    with pytest.raises(UnsafeSymlinkError) as caught:
        write_atomic(resolve(str(ds)), relative, b"chosen by the attacker")
    assert _snapshot(outside) == {}, "written outside the dataset"
    message = str(caught.value)
    assert f"{folder} is a symlink" in message and str(target) in message
    assert relative in message
    assert isinstance(caught.value, UnsafePathError)  # callers that refuse unsafe paths
    again = pickle.loads(pickle.dumps(caught.value))  # as a Dask task's error travels
    assert type(again) is UnsafeSymlinkError and str(again) == message


def test_write_atomic_refuses_a_symlinked_folder_even_inside_the_root(tmp_path: Path) -> None:
    """``shards -> index`` would make a write named ``shards/x`` land at ``index/x``: a write
    never goes through a symlinked folder, wherever it leads."""
    ds = tmp_path / "ds"
    (ds / "index").mkdir(parents=True)
    (ds / "shards").symlink_to(ds / "index", target_is_directory=True)
    with pytest.raises(UnsafeSymlinkError, match="shards is a symlink"):
        write_atomic(resolve(str(ds)), "shards/x.parquet", b"x")
    assert list((ds / "index").iterdir()) == []


def test_write_atomic_replaces_a_symlinked_file_and_never_links_one(tmp_path: Path) -> None:
    """A symlink as the *name* written is replaced by the rename (its target untouched); a
    symlink as ``same_as`` is not hard-linked (that would alias the file it points to, or the
    link itself, into the dataset): the bytes are written instead."""
    ds, secret = tmp_path / "ds", tmp_path / "secret"
    secret.write_bytes(b"secret")
    (ds / "shards").mkdir(parents=True)
    (ds / "shards" / "a.parquet").symlink_to(secret)
    (ds / "_work").mkdir()
    (ds / "_work" / "rows.parquet").symlink_to(secret)
    loc = resolve(str(ds))

    write_atomic(loc, "shards/a.parquet", b"real bytes")
    write_atomic(loc, "shards/b.parquet", b"secret", same_as="_work/rows.parquet")

    assert secret.read_bytes() == b"secret"
    for name, data in (("a.parquet", b"real bytes"), ("b.parquet", b"secret")):
        path = ds / "shards" / name
        assert not path.is_symlink() and path.read_bytes() == data
        assert path.stat().st_ino != secret.stat().st_ino, f"{name} aliases the file outside"


def test_a_replica_set_write_through_a_symlinked_folder_fails_and_names_it(
        tmp_path: Path) -> None:
    ds, outside = tmp_path / "ds", tmp_path / "outside"
    ds.mkdir()
    target = _link_out(ds, "shards", outside)
    store = ReplicaSet.from_urls([str(ds)])
    with pytest.raises(OSError, match="shards is a symlink") as caught:
        store.put("shards/a.parquet", b"x")
    assert str(target) in str(caught.value)
    assert _snapshot(outside) == {}


# -- the dataset filesystem: reads, listings and removals ------------------------------------------

def test_dataset_reads_follow_a_symlink_inside_the_root_only(tmp_path: Path) -> None:
    ds, outside = tmp_path / "ds", tmp_path / "outside"
    (ds / "shards-v1").mkdir(parents=True)
    (ds / "shards-v1" / "a.parquet").write_bytes(b"inside")
    (ds / "shards").symlink_to(ds / "shards-v1", target_is_directory=True)
    (outside / "index").mkdir(parents=True)
    (outside / "index" / "i.sfidx").write_bytes(b"outside")
    (ds / "index").symlink_to(outside / "index", target_is_directory=True)
    (ds / "tokenizer.json").symlink_to(outside / "index" / "i.sfidx")
    store = ReplicaSet.from_urls([str(ds)])
    loc = store.primary

    assert loc.fs.cat_file(loc.path("shards/a.parquet")) == b"inside"
    assert store.get("shards/a.parquet") == b"inside"
    for relative, link in (("index/i.sfidx", "index"), ("tokenizer.json", "tokenizer.json")):
        with pytest.raises(UnsafeSymlinkError, match=f"{link} is a symlink") as caught:
            loc.fs.cat_file(loc.path(relative))
        assert str(outside) in str(caught.value)
        with pytest.raises(OSError, match=f"{link} is a symlink"):
            store.get(relative)


def test_dataset_removals_never_go_through_a_symlinked_folder(tmp_path: Path) -> None:
    ds, outside = tmp_path / "ds", tmp_path / "outside"
    ds.mkdir()
    target = _link_out(ds, "_work", outside)
    (target / "run").mkdir()
    (target / "run" / "k.keys").write_bytes(b"k")
    (target / "x").write_bytes(b"x")
    before = _snapshot(outside)
    loc = ReplicaSet.from_urls([str(ds)]).primary

    for remove in (lambda: loc.fs.rm(loc.path("_work/run"), recursive=True),
                   lambda: loc.fs.rm_file(loc.path("_work/x")),
                   lambda: loc.fs.rm([loc.path("_work/x")])):
        with pytest.raises(UnsafeSymlinkError, match="_work is a symlink"):
            remove()
    assert _snapshot(outside) == before

    loc.fs.rm(loc.path("_work"), recursive=True)  # the link itself: only the link goes
    assert not (ds / "_work").exists() and _snapshot(outside) == before
