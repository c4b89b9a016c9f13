"""Dedup signals (``--dedup-signals``): the exact-duplicate count and the near-duplicate
cluster of each kept document, decided in the distributed shuffle, through the real job."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import PipelineConfig
from pipeline.dedup import components, shuffle
from pipeline.dedup import signals as sig
from pipeline.driver.job import run
from pipeline.tasks import work
from storage import ReplicaSet, read_manifest, shards_of
from tests.pipeline.dedup._partitions import Doc, flaky, write_partitions

DEDUP_COLUMNS = [sig.EXACT_COUNT, sig.CLUSTER_ID, sig.CLUSTER_SIZE]

def _notes_through_the_store(store: ReplicaSet, docs: list[Doc], cuts: list[int],
                             buckets: int, target: int, rnd: random.Random
                             ) -> tuple[dict[tuple[int, int], int], dict[int, tuple[int, int]]]:
    """``({(document, kind): value}, {document: (exact_count, cluster_size)} of the kept
    ones)``, documents numbered in input order, ``cuts`` the partition sizes."""
    bounds, names, per_part = write_partitions(store, docs, cuts)
    where = shuffle.run(flaky(rnd), store, f"run{rnd.random()}", names, per_part, buckets,
                        target, signals=True).drops
    notes, kept = {}, {}
    for p, (lo, hi) in enumerate(bounds):
        got = shuffle.pick_notes(store, where[p]) if p in where else np.zeros(0, sig.NOTE)
        dropped = shuffle.pick(store, where[p])["pos"] if p in where else []
        assert (got["part"] == p).all()
        assert got.tolist() == sig.merge_notes(got).tolist()  # one per document and kind
        for n in got:
            notes[(lo + int(n["pos"]), int(n["kind"]))] = int(n["value"])
        cols = sig.columns(p, hi - lo, got, tuple(DEDUP_COLUMNS))
        for i in sorted(set(range(hi - lo)) - {int(d) for d in dropped}):
            kept[lo + i] = (int(cols[sig.EXACT_COUNT][i]), int(cols[sig.CLUSTER_SIZE][i]))
            assert cols[sig.CLUSTER_ID][i] == (p << 32) | i
    return notes, kept


def _roots(docs: list[Doc]) -> dict[int, int]:
    """``{document: the smallest of its component}`` of the shared-band graph (union-find in
    memory; documents without a shared band are absent)."""
    first_band: dict[int, int] = {}
    a, b = [], []
    for i, (_text, bands) in enumerate(docs):
        for band in bands:
            if band not in first_band:
                first_band[band] = i
            else:
                a.append(i)
                b.append(first_band[band])
    return components.components_reference(np.array(a, np.uint64), np.array(b, np.uint64))


def _reference(docs: list[Doc]) -> dict[tuple[int, int], int]:
    """Exact: the first document of a text held by several, with how many hold it; near: the
    smallest document of each component of the shared-band graph, with its other members."""
    roots = _roots(docs)
    out: dict[tuple[int, int], int] = {}
    for x, root in roots.items():
        if x != root:
            out[(root, sig.NOTE_CLUSTER)] = out.get((root, sig.NOTE_CLUSTER), 0) + 1
    by_text: dict[int, list[int]] = {}
    for i, (text, _bands) in enumerate(docs):
        by_text.setdefault(text, []).append(i)
    for held in by_text.values():
        if len(held) > 1:
            out[(held[0], sig.NOTE_EXACT)] = len(held)
    return dict(sorted(out.items()))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.frozensets(st.integers(0, 25), max_size=3)),
                max_size=40),
       st.lists(st.integers(1, 12), max_size=6), st.integers(1, 7), st.integers(1, 60),
       st.randoms(use_true_random=False))
def test_notes_are_the_counts_and_components_whatever_the_partitioning_and_failures(
        tmp_path_factory: pytest.TempPathFactory, docs: list[Doc], cuts: list[int],
        buckets: int, target: int, rnd: random.Random) -> None:
    """Exact counts and component sizes summed from the buckets' partial notes are those of
    counting in memory, for any partitioning, buckets, key groups, task order and reruns;
    every kept document is its component's survivor (its size is the component's)."""
    store = ReplicaSet.from_urls([str(tmp_path_factory.mktemp("notes"))])
    notes, kept = _notes_through_the_store(store, docs, cuts, buckets, target, rnd)
    assert dict(sorted(notes.items())) == _reference(docs)
    ref = _roots(docs)
    size = {r: sum(1 for root in ref.values() if root == r) for r in set(ref.values())}
    texts = [t for t, _b in docs]
    for i, (exact, cluster) in kept.items():
        assert exact == texts.count(texts[i])
        assert ref.get(i, i) == i  # not a leaf
        assert cluster == size.get(i, 1)


def _write(folder: Path, name: str, docs: list[tuple[str, str]]) -> None:
    (folder / f"{name}.jsonl").write_text(
        "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs))


def _words(prefix: str, n: int = 300) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two files (partitions): ``same`` 3 times across both; ``near`` with two edits of it
    (one a file later, one behind an exact copy of the first edit), ``pair`` with one edit;
    unique documents between them."""
    root = tmp_path_factory.mktemp("signals-corpus")
    same, near, pair = _words("s"), _words("n"), _words("p")
    near1, near2 = near.replace("n100", "x"), near.replace("n200", "y")
    _write(root, "a", [("a0", same), ("a1", _words("u")), ("a2", near), ("a3", same),
                       ("a4", pair), ("a5", near1)])
    _write(root, "b", [("b0", _words("v")), ("b1", same), ("b2", near1), ("b3", near2),
                       ("b4", pair.replace("p150", "z")), ("b5", _words("w"))])
    return root


def _run(corpus: Path, out: Path, **kw: object) -> Path:
    run(PipelineConfig(inputs=[str(corpus / "*.jsonl")], output=str(out),
                       workers=kw.pop("workers", 1), dashboard_address="127.0.0.1:0",
                       id_field="id", files_per_partition=1, **kw),  # type: ignore[arg-type]
        progress=False)
    return out


def _tables(ds: Path) -> list:
    return [pq.read_table(ds / s.path) for s in shards_of(str(ds), read_manifest(str(ds)))]


def _shards(ds: Path) -> dict[str, bytes]:
    return {s.path: (ds / s.path).read_bytes()
            for s in shards_of(str(ds), read_manifest(str(ds)))}


@pytest.fixture(scope="module")
def near_signals(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(corpus, tmp_path_factory.mktemp("ds") / "near", near_dup=True,
                dedup_signals=True)


def test_near_dup_signals_count_copies_and_clusters(near_signals: Path) -> None:
    m = read_manifest(str(near_signals))
    assert m.config["dedup_signals"] is True
    assert {c: m.schema.get(c) for c in DEDUP_COLUMNS} == dict.fromkeys(DEDUP_COLUMNS, "int64")
    assert {k: v for k, v in m.stats["signals"].items() if k.startswith("dedup.")} == {
        c: {"type": "int64", "step": "dedup"} for c in DEDUP_COLUMNS}
    assert m.stats["dropped"] == {"duplicate": 3, "near_duplicate": 3}
    rows = {}
    for p, table in enumerate(_tables(near_signals)):
        # an --id-field run keeps each document's source (file:line) beside its id: lineage
        assert table.column_names == ["doc_id", "input_ids", "source", *DEDUP_COLUMNS]
        for d in table.to_pylist():
            rows[d["doc_id"]] = (d[sig.EXACT_COUNT], d[sig.CLUSTER_SIZE], d[sig.CLUSTER_ID], p)
    # kept: a0 (3 copies, its cluster: itself and them), a2 (its cluster: its two edits and
    # the copy of the first), a4 (one edit); the unique ones alone
    assert sorted(rows) == ["a0", "a1", "a2", "a4", "b0", "b5"]
    assert {d: r[:2] for d, r in rows.items()} == {
        "a0": (3, 3), "a1": (1, 1), "a2": (1, 4), "a4": (1, 2), "b0": (1, 1), "b5": (1, 1)}
    # the id: the survivor's (partition << 32 | its row in phase 1's rows), itself
    row_of = {"a0": 0, "a1": 1, "a2": 2, "a4": 4, "b0": 0, "b5": 5}
    assert {d: r[2] for d, r in rows.items()} == {d: (r[3] << 32) | row_of[d]
                                                  for d, r in rows.items()}
    assert len({r[2] for r in rows.values()}) == len(rows)  # distinct across clusters


def test_the_worker_count_does_not_change_a_byte(near_signals: Path, corpus: Path,
                                                 tmp_path: Path) -> None:
    two = _run(corpus, tmp_path / "two", near_dup=True, dedup_signals=True, workers=2)
    assert _shards(two) == _shards(near_signals)
    assert (two / "manifest.json").read_bytes() == (near_signals / "manifest.json").read_bytes()


def test_without_the_flag_no_column_and_the_same_rows(near_signals: Path, corpus: Path,
                                                      tmp_path: Path) -> None:
    """Off (the default): no dedup column, not in the manifest's config; the rows kept are
    the same, and the signals run's shards are those rows plus its columns. Exact alone:
    the count only."""
    off = _run(corpus, tmp_path / "off", near_dup=True)
    m = read_manifest(str(off))
    assert "dedup_signals" not in m.config and "signals" not in m.stats
    assert not set(DEDUP_COLUMNS) & set(m.schema)
    plain = _tables(off)
    assert [t.column_names for t in plain] == [["doc_id", "input_ids", "source"]] * 2
    assert [t.drop_columns(DEDUP_COLUMNS) for t in _tables(near_signals)] == plain
    exact = _run(corpus, tmp_path / "exact", dedup_signals=True)
    counts = {d["doc_id"]: d[sig.EXACT_COUNT] for t in _tables(exact) for d in t.to_pylist()}
    assert [t.column_names for t in _tables(exact)] == [
        ["doc_id", "input_ids", "source", sig.EXACT_COUNT]] * 2
    assert set(read_manifest(str(exact)).stats["signals"]) == {sig.EXACT_COUNT}
    assert counts == {"a0": 3, "a1": 1, "a2": 1, "a4": 1, "a5": 2, "b0": 1, "b3": 1, "b4": 1,
                      "b5": 1}


def test_a_rerun_folds_the_columns_from_phase_two_markers() -> None:
    """A resumed run's manifest names the columns phase 2 added from its markers alone; an
    older marker without the field adds none."""
    two = work.PhaseTwo(3, None, signals=dict.fromkeys(DEDUP_COLUMNS, sig.TYPE))
    stored = json.loads(json.dumps(work.marker(two)))
    folded = work.PhaseTwoResults()
    folded.add(work.PhaseTwo.from_dict({"index": 1, "shard": None}))
    folded.add(work.PhaseTwo.from_dict(stored))
    assert list(folded.signals) == DEDUP_COLUMNS
    assert sig.names(exact=True, near=False) == (sig.EXACT_COUNT,)
    assert sig.names(exact=False, near=True) == (sig.CLUSTER_ID, sig.CLUSTER_SIZE)


def test_dedup_signals_without_any_dedup_is_refused() -> None:
    from pipeline.config import PipelineConfig

    with pytest.raises(ValueError, match="--dedup-signals needs --dedup exact or --near-dup"):
        PipelineConfig(dedup_signals=True, dedup="none")
    assert PipelineConfig(dedup_signals=True, dedup="none", near_dup=True).dedup_signals
