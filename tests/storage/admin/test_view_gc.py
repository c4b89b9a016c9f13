"""gc and views: gc of a source with ``--keep 1`` after a rebuild leaves every object a view
names (the pins under ``_views/``), a pin no view uses any more goes, gc of a view removes only
its own objects, and a hostile pin makes gc remove nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loaders import build_dataloader
from pipeline.select.build import select
from storage import ReplicaSet, read_manifest, shards_of
from storage.admin.gc import GcError, collect
from storage.admin.scrub import verify
from storage.admin.view_pins import Pin, decide
from tests.pipeline.select import web_views

REPO = Path(__file__).resolve().parents[3]


def _store(path: Path) -> ReplicaSet:
    return ReplicaSet.from_urls([str(path)])


def _files(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``web`` (version 1), its view ``web-en`` of version 1, then ``web`` rebuilt from two
    of its three inputs (version 2: one shard of version 1 is named by no version but 1)."""
    root = tmp_path_factory.mktemp("gc")
    web = web_views.build(root, shared=tmp_path_factory)
    select(_store(web), "lang = 'en'", _store(root / "web-en"), progress=False)
    web_views.rebuild(root)
    return root


def _view_objects(view: Path) -> set[str]:
    m = read_manifest(str(view))
    return ({s.path for s in shards_of(str(view), m)}
            | {p for p, _, _ in m.source_objects()})


def _only_version_1(root: Path) -> set[str]:
    v2 = read_manifest(str(root / "web"))
    return (_view_objects(root / "web-en") - {s.path for s in shards_of(str(root / "web"), v2)}
            - {v2.tokenizer.path})


def test_gc_of_the_source_after_a_rebuild_leaves_every_object_a_view_names(
        rebuilt: Path, tmp_path: Path) -> None:
    root = tmp_path / "r"
    shutil.copytree(rebuilt, root)
    assert _only_version_1(root)  # the test means something: version 2 dropped a shard
    proc = subprocess.run([sys.executable, "-m", "storage", "gc", str(root / "web"), "--keep",
                           "1", "--min-age", "0"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "kept versions: 1, 2 (--keep 1;" in proc.stdout
    assert all((root / "web" / p).is_file() for p in _view_objects(root / "web-en"))
    assert all((root / "web" / "_doclens" / f"{Path(p).stem}.u4").is_file()
               for p in _view_objects(root / "web-en") if p.startswith("shards/"))
    assert verify(_store(root / "web-en")).ok
    n = sum(1 for _ in build_dataloader(str(root / "web-en"), 2, 16, rank=0, world_size=1))
    assert n > 10


def test_without_the_pin_gc_would_break_the_view(rebuilt: Path, tmp_path: Path) -> None:
    root = tmp_path / "r"
    shutil.copytree(rebuilt, root)
    shutil.rmtree(root / "web" / "_views")
    collect(_store(root / "web"), keep=1, min_age_s=0)
    gone = _only_version_1(root)
    assert gone and not any((root / "web" / p).exists() for p in gone)
    assert not verify(_store(root / "web-en")).ok


def test_a_pin_no_view_uses_goes_and_gc_of_a_view_removes_only_its_own(
        rebuilt: Path, tmp_path: Path) -> None:
    root = tmp_path / "r"
    shutil.copytree(rebuilt, root)
    old = _only_version_1(root)
    select(_store(root / "web"), "lang = 'en'", _store(root / "web-en"), progress=False)
    source_before = _files(root / "web")
    report = collect(_store(root / "web-en"), keep=1, min_age_s=0)
    assert _files(root / "web") == source_before  # the view's gc never touches its source
    # the view's first version, its index, masks and card: nothing of the source's
    assert {r.path.split("/")[0] for r in report.removed} == {"_versions", "index", "masks",
                                                             "card"}
    report = collect(_store(root / "web"), keep=1, min_age_s=0)
    assert report.kept_versions == [2]
    removed = {r.path for r in report.removed}
    assert old <= removed and any(p.startswith("_views/web-en/") for p in removed)
    # select's token-count cache goes with its shard, and stays with the others
    gone = {f"_doclens/{Path(p).stem}.u4" for p in old if p.startswith("shards/")}
    assert gone and gone <= removed
    assert {p.name for p in (root / "web" / "_doclens").glob("*.u4")} == {
        f"{Path(s.path).stem}.u4" for s in shards_of(str(root / "web"),
                                                     read_manifest(str(root / "web")))}
    assert len(list((root / "web" / "_views" / "web-en").glob("*.json"))) == 1
    assert verify(_store(root / "web-en")).ok


@pytest.mark.parametrize("view", ["../web", "a/b"])
def test_a_hostile_pin_makes_gc_remove_nothing(rebuilt: Path, tmp_path: Path,
                                               view: str) -> None:
    root = tmp_path / "r"
    shutil.copytree(rebuilt, root)
    pin = root / "web" / "_views" / "evil" / "0000000000000000.json"
    pin.parent.mkdir(parents=True)
    pin.write_text(json.dumps({"view": view, "source_version": "0" * 64}))
    before = _files(root / "web")
    with pytest.raises(GcError, match="view pin"):
        collect(_store(root / "web"), keep=1, min_age_s=0)
    assert _files(root / "web") == before


def test_decide_keeps_what_a_view_uses_or_may_use() -> None:
    a, b = "a" * 64, "b" * 64
    pins = [Pin("_views/x/a.json", "x", a), Pin("_views/x/b.json", "x", b),
            Pin("_views/y/a.json", "y", a), Pin("_views/z/b.json", "z", b)]
    kept, stale = decide(pins, {"x": {a}, "y": None, "z": set()}, young={"_views/z/b.json"})
    assert kept == {a, b} and stale == ["_views/x/b.json"]
    kept, stale = decide(pins, {"x": set(), "y": set(), "z": set()}, young=set())
    assert kept == set() and len(stale) == 4


def test_repair_restores_a_view_replica_s_own_objects(rebuilt: Path, tmp_path: Path) -> None:
    from pipeline.select.build import view_replicas
    from storage.admin.scrub import repair

    for name in ("a", "b"):
        shutil.copytree(rebuilt / "web", tmp_path / name / "web")
    src = ReplicaSet.from_urls([str(tmp_path / "a" / "web"), str(tmp_path / "b" / "web")])
    view = view_replicas(src, str(tmp_path / "a" / "web-en"))
    select(src, "lang = 'de'", view, progress=False)
    masks = next((tmp_path / "b" / "web-en" / "masks").iterdir())
    masks.unlink()
    assert [p.kind for p in verify(view).problems] == ["missing"]
    assert repair(view).repaired and masks.is_file()
    assert verify(view).ok
