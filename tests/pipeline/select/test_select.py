"""``python -m pipeline select`` end to end on the web test dataset: a view with
``lang = 'en'`` keeps exactly the source's English documents, shares its shard objects,
verifies, exports what a filtered export of the source gives, inspects with its source and
expression; a view of a view composes; bad expressions and hostile view manifests are one
error line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from loaders import build_dataloader
from pipeline.output.export import export
from pipeline.select.build import select
from storage import ReplicaError, ReplicaSet, UnsafePathError, read_manifest, shards_of
from storage.admin.scrub import verify
from storage.io import view_store
from tests.pipeline.select import web_views

REPO = Path(__file__).resolve().parents[3]


def _cli(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def _store(path: Path) -> ReplicaSet:
    return ReplicaSet.from_urls([str(path)])


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return web_views.build(tmp_path_factory.mktemp("views"), shared=tmp_path_factory)


@pytest.fixture(scope="module")
def web_en(web: Path) -> Path:
    out = web.parent / "web-en"
    proc = _cli("pipeline", "select", str(web), "--where", "lang = 'en'", "--output", str(out),
                "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "selected 60 of 120 documents (50.0%)" in proc.stdout
    return out


def _rows(path: Path, tmp: Path, name: str) -> pa.Table:
    out = tmp / name
    export(_store(path), str(out), "parquet-list", progress=False)
    return pa.concat_tables(pq.read_table(p) for p in sorted(out.glob("*.parquet")))


def test_the_view_keeps_exactly_the_english_documents(web: Path, web_en: Path,
                                                      tmp_path: Path) -> None:
    source = _rows(web, tmp_path, "src")
    view = _rows(web_en, tmp_path, "view")
    english = source.filter(pc.equal(source.column("lang"), "en"))
    assert 0 < view.num_rows == english.num_rows < source.num_rows
    assert view.equals(english)  # every column, every row, in order
    m = read_manifest(str(web_en))
    assert (m.total_rows, m.total_tokens) == (
        english.num_rows, sum(len(x) for x in english.column("input_ids").to_pylist()))


def test_the_view_shares_the_source_shards_and_writes_only_its_own_small_objects(
        web: Path, web_en: Path) -> None:
    m, src = read_manifest(str(web_en)), read_manifest(str(web))
    assert [s.path for s in shards_of(str(web_en), m)] == [s.path for s in
                                                           shards_of(str(web), src)]
    files = sorted(str(p.relative_to(web_en)) for p in web_en.rglob("*") if p.is_file())
    assert sorted({f.split("/")[0] for f in files}) == [
        "_versions", "card", "index", "manifest.json", "masks"]
    assert not (web_en / "shards").exists()
    # the view's data objects (its card is documentation, like the source's)
    own = sum((web_en / f).stat().st_size for f in files
              if not f.startswith(("_versions", "card/")))
    assert own < 0.2 * src.total_bytes  # 512-token row groups; benchmarks/ measures real ones
    assert m.view is not None and m.view.source == "web" and m.view.where == "lang = 'en'"
    pins = list((web / "_views" / "web-en").glob("*.json"))
    assert [json.loads(p.read_text())["source_version"] for p in pins] == [
        m.view.source_version]


def test_the_view_verifies_and_inspects_with_its_source_and_expression(
        web_en: Path) -> None:
    report = verify(_store(web_en))
    assert report.ok, report.render()
    proc = _cli("pipeline", "inspect", str(web_en), "--signal-rows", "0")
    assert proc.returncode == 0, proc.stderr
    assert "view of     web (beside this dataset" in proc.stdout
    assert "where       lang = 'en'" in proc.stdout
    assert "keeps       60 of 120 documents" in proc.stdout


def test_verify_finds_a_damaged_source_shard_and_a_lying_mask(web: Path, web_en: Path,
                                                              tmp_path: Path) -> None:
    shutil.copytree(web, tmp_path / "web")
    shutil.copytree(web_en, tmp_path / "web-en")
    m = read_manifest(str(tmp_path / "web-en"))
    shard = shards_of(str(tmp_path / "web-en"), m)[1].path
    raw = bytearray((tmp_path / "web" / shard).read_bytes())
    raw[100] ^= 0xFF
    (tmp_path / "web" / shard).write_bytes(bytes(raw))
    report = verify(_store(tmp_path / "web-en"))
    assert [(p.path, p.kind) for p in report.problems] == [(shard, "corrupt")]


def test_a_view_of_a_view_composes_on_the_original_shards(web: Path, web_en: Path,
                                                          tmp_path: Path) -> None:
    long_en = web.parent / "web-en-long"
    select(_store(web_en), '"gopher_quality.n_words" > 100', _store(long_en), progress=False)
    direct = web.parent / "web-en-long-direct"
    select(_store(web), "lang = 'en' AND \"gopher_quality.n_words\" > 100", _store(direct),
           progress=False)
    m = read_manifest(str(long_en))
    assert m.view is not None and m.view.source == "web"
    assert m.view.where == "(lang = 'en') AND (\"gopher_quality.n_words\" > 100)"
    assert 0 < m.total_rows < read_manifest(str(web_en)).total_rows
    assert _rows(long_en, tmp_path, "a").equals(_rows(direct, tmp_path, "b"))
    assert verify(_store(long_en)).ok


@pytest.mark.parametrize("where,message", [
    ("nope = 1", "unknown column 'nope'"),
    ("lang = ", "cannot parse"),
    ("upper(lang) = 'EN'", "is not supported"),
    ("input_ids IS NULL", "holds the token ids"),
])
def test_bad_expressions_are_one_error_line_and_rc_2(web: Path, where: str,
                                                     message: str) -> None:
    proc = _cli("pipeline", "select", str(web), "--where", where, "--output",
                str(web.parent / "bad"), "--no-progress")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --where: ") and message in lines[0]
    assert not (web.parent / "bad").exists()


def test_a_view_must_live_beside_its_source(web: Path, tmp_path: Path) -> None:
    proc = _cli("pipeline", "select", str(web), "--where", "lang = 'en'", "--output",
                str(tmp_path / "elsewhere" / "en"), "--no-progress")
    assert proc.returncode == 2 and "a view lives beside its source" in proc.stderr


def test_select_never_writes_over_a_dataset(web: Path, web_en: Path, tmp_path: Path) -> None:
    plain = web.parent / "plain"
    shutil.copytree(web, plain, ignore=shutil.ignore_patterns("_views"))
    with pytest.raises(ValueError, match="holds a dataset of its own shards"):
        select(_store(web), "lang = 'de'", _store(plain), progress=False)
    with pytest.raises(ValueError, match="holds a view of 'web'"):
        select(_store(plain), "lang = 'de'", _store(web_en), progress=False)
    assert read_manifest(str(plain)).view is None


@pytest.mark.parametrize("source", ["../web", "s3://another-bucket/web", "x/../web", "/etc"])
def test_hostile_view_manifests_are_refused_by_every_reader(web: Path, web_en: Path,
                                                            tmp_path: Path, source: str) -> None:
    hostile = tmp_path / "web-en"
    shutil.copytree(web_en, hostile)
    doc = json.loads((hostile / "manifest.json").read_text())
    doc["view"]["source"] = source
    (hostile / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(UnsafePathError):
        build_dataloader(str(hostile), 2, 16, rank=0, world_size=1)
    for module, args in (("pipeline", ("inspect", str(hostile))),
                         ("pipeline", ("export", str(hostile), str(tmp_path / "x"))),
                         ("storage", ("verify", str(hostile)))):
        proc = _cli(module, *args)
        assert proc.returncode != 0 and "view.source" in proc.stdout + proc.stderr, args
    assert not (tmp_path / "x").exists()


def test_masks_that_do_not_match_the_view_are_refused(web_en: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(view_store, "_MASKS", OrderedDict())  # nothing read before counts
    hostile = tmp_path / "web-en"
    shutil.copytree(web_en, hostile)
    m = read_manifest(str(hostile))
    assert m.view is not None
    path = hostile / m.view.masks_path
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(ReplicaError, match="checksum"):
        build_dataloader(str(hostile), 2, 16, rank=0, world_size=1)
    report = verify(_store(hostile))
    assert {(p.path, p.kind) for p in report.problems} == {(m.view.masks_path, "corrupt")}


def test_a_second_select_takes_token_counts_from_the_source_cache(
        web: Path, web_en: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first select decoded the token counts of the shards it kept in part and cached
    them in the source (``_doclens/``); another threshold reads signal columns only, and a
    cache that does not add up to the index's counts is ignored and made again."""
    caches = sorted((web / "_doclens").glob("*.u4"))
    m = read_manifest(str(web))
    assert [c.stem for c in caches] == sorted(Path(s.path).stem for s in shards_of(str(web), m))
    uncached = tmp_path / "copy"
    shutil.copytree(web, uncached / "web", ignore=shutil.ignore_patterns("_doclens"))
    select(_store(uncached / "web"), "lang = 'de' OR lang_score < 0.9",
           _store(uncached / "de"), progress=False)
    want = read_manifest(str(uncached / "de"))

    real = pq.ParquetFile.read_row_groups

    def no_tokens(self, row_groups, columns=None, **kw):  # noqa: ANN001, ANN202
        assert "input_ids" not in (columns or []), "select decoded token ids"
        return real(self, row_groups, columns=columns, **kw)

    with monkeypatch.context() as patch:
        patch.setattr(pq.ParquetFile, "read_row_groups", no_tokens)
        select(_store(web), "lang = 'de' OR lang_score < 0.9", _store(web.parent / "de"),
               progress=False)
    got = read_manifest(str(web.parent / "de"))
    assert (got.total_rows, got.total_tokens) == (want.total_rows, want.total_tokens)
    assert got.index == want.index  # the same index bytes, counts and all
    # a cache that lies about its counts: ignored, the counts decoded again and re-cached
    needed = sorted((uncached / "web" / "_doclens").glob("*.u4"))  # what this select decodes
    assert needed
    lying = web / "_doclens" / needed[0].name
    good = lying.read_bytes()
    lying.write_bytes(good[:-4] + b"\x01\x00\x00\x00")
    select(_store(web), "lang = 'de' OR lang_score < 0.9", _store(web.parent / "de"),
           progress=False)
    assert read_manifest(str(web.parent / "de")).index == want.index
    assert lying.read_bytes() == good == needed[0].read_bytes()
