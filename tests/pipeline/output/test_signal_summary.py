"""``pipeline.output.signal_summary``'s pure parts: one column's summary (checked against numpy and
``collections.Counter`` on random columns with nulls and NaNs), its text and JSON, and the
row-group sampling plan."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.output.signal_summary import (
    Summary,
    bool_summary,
    describe,
    heading,
    numeric_summary,
    render,
    sample_plan,
    summarize,
    to_json,
    top_values,
)

INTS = st.lists(st.one_of(st.none(), st.integers(-(2**53), 2**53)), max_size=200)
FLOATS = st.lists(st.one_of(st.none(), st.just(math.nan),
                            st.floats(-1e12, 1e12, allow_nan=False)), max_size=200)
BOOLS = st.lists(st.one_of(st.none(), st.booleans()), max_size=200)
STRINGS = st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "c", "", "é", "long value"]),
                             st.text(max_size=3)), max_size=200)


def _chunked(values: list, kind: pa.DataType) -> pa.ChunkedArray:
    """The values split in up to three chunks, as a column read from several row groups is."""
    third = max(1, len(values) // 3)
    parts = [values[:third], values[third:2 * third], values[2 * third:]]
    return pa.chunked_array([pa.array(p, type=kind) for p in parts], type=kind)


@given(INTS)
def test_int_summary_is_numpys(values: list[int | None]) -> None:
    got = numeric_summary(_chunked(values, pa.int64()), "int64")
    known = [v for v in values if v is not None]
    assert got["nulls"] == values.count(None) and got["nans"] == 0
    if not known:
        assert got["min"] is got["median"] is got["max"] is None
        return
    assert got["min"] == min(known) and got["max"] == max(known)
    assert isinstance(got["min"], int) and isinstance(got["max"], int)
    assert got["median"] == pytest.approx(float(np.median(np.array(known, dtype=np.float64))),
                                          rel=1e-12, abs=1e-9)


@given(FLOATS)
def test_double_summary_is_numpys_without_nulls_and_nans(values: list[float | None]) -> None:
    got = numeric_summary(_chunked(values, pa.float64()), "double")
    known = np.array([v for v in values if v is not None], dtype=np.float64)
    nans = int(np.isnan(known).sum())
    finite = known[~np.isnan(known)]
    assert got["nulls"] == values.count(None) and got["nans"] == nans
    if len(finite) == 0:
        assert got["min"] is got["median"] is got["max"] is None
        return
    assert got["min"] == finite.min() and got["max"] == finite.max()
    assert got["median"] == pytest.approx(float(np.median(finite)), rel=1e-9, abs=1e-6)


@given(BOOLS)
def test_bool_summary_is_a_count(values: list[bool | None]) -> None:
    got = bool_summary(_chunked(values, pa.bool_()))
    counts = Counter(values)
    assert got == {"true": counts[True], "false": counts[False], "nulls": counts[None]}
    s = summarize("x.flag", "bool", "x", values)
    known = counts[True] + counts[False]
    assert s.true_share == (counts[True] / known if known else None)


@given(STRINGS, st.integers(1, 8))
def test_top_values_are_counters_most_common_ties_by_value(values: list[str | None],
                                                          k: int) -> None:
    top, distinct, nulls = top_values(_chunked(values, pa.string()), k)
    counts = Counter(v for v in values if v is not None)
    expected = sorted(counts.items(), key=lambda vc: (-vc[1], vc[0]))[:k]
    assert top == expected
    assert distinct == len(counts) and nulls == values.count(None)


@given(st.lists(st.integers(0, 50), max_size=60), st.integers(0, 3000))
def test_sample_plan_takes_min_of_limit_and_total_rows_in_order(rows: list[int],
                                                                limit: int) -> None:
    plan = sample_plan(rows, limit)
    assert sum(t for _, t in plan) == min(limit, sum(rows))
    picked = [i for i, _ in plan]
    assert picked == sorted(set(picked)), "indices increase, each once"
    assert all(0 < t <= rows[i] for i, t in plan)
    assert sample_plan(rows, limit) == plan, "deterministic"
    if sum(rows) <= limit:
        assert plan == [(i, r) for i, r in enumerate(rows) if r]


def test_sample_plan_spreads_evenly_over_the_dataset() -> None:
    assert sample_plan([10] * 100, 100) == [(i, 10) for i in range(5, 100, 10)]
    # uneven groups: still spread from the start to the end, never the first N rows
    rows = [1, 1000, 1, 1, 1, 1, 1, 1, 500, 1] * 10
    plan = sample_plan(rows, 3000)
    picked = [i for i, _ in plan]
    assert picked[0] < 25 and picked[-1] >= 75, picked
    assert sum(t for _, t in plan) == 3000
    assert sum(rows[i] for i in picked) < 2 * 3000, "about limit rows' worth of groups read"
    assert sample_plan([100], 30) == [(0, 30)]
    assert sample_plan([5, 5], 0) == [] and sample_plan([], 10) == []


def test_lines_name_type_step_and_summary() -> None:
    summaries = [
        summarize("gopher_quality.n_words", "int64", "gopher_quality",
                  [3, 245, 12034, None, 500]),
        summarize("fineweb.ratio", "double", "fineweb", [0.25, math.nan, 0.5, 0.125]),
        summarize("fasttext.hq", "bool", "fasttext", [True, False, True, True, None]),
        summarize("tag.label", "string", "tag", ["b", "a", "b", "c", "a", "b", None] +
                  [f"v{i}" for i in range(6)]),
        summarize("empty.x", "double", "empty", [None, None]),
    ]
    lines = render(summaries, 13, 100)
    assert lines[0] == "signals     5 columns (from 13 of 100 documents)"
    assert lines[1].split() == ["gopher_quality.n_words", "int64", "gopher_quality", "min", "3",
                                "median", "372.5", "max", "12,034", "nulls", "1"]
    assert lines[2].split() == ["fineweb.ratio", "double", "fineweb", "min", "0.125", "median",
                                "0.25", "max", "0.5", "NaN", "1"]
    assert lines[3].split()[3:] == ["true", "75.0%", "(3", "of", "4)", "nulls", "1"]
    assert lines[4].endswith('"b" 3, "a" 2, "c" 1, "v0" 1, "v1" 1 (9 distinct)  nulls 1')
    assert lines[5].endswith("no values  nulls 2")
    starts = {line.index(f" {s.type} ") for line, s in zip(lines[1:], summaries, strict=True)}
    assert len(starts) == 1, ("types not aligned", lines)
    assert heading(1, 7, 7) == "signals     1 column (7 documents)"
    assert describe(Summary("a.b", "int64", "a")) == "(not read)"


def test_json_is_finite_and_typed() -> None:
    s = [summarize("a.x", "double", "a", [1.0, math.inf, None]),
         summarize("a.f", "bool", "a", [True, False]),
         summarize("a.s", "string", "a", ["u", "u", "v"])]
    d = to_json(s, 3, 3)
    assert d["sampled"] is False and d["rows_read"] == 3 and d["documents"] == 3
    assert d["columns"]["a.x"] == {"type": "double", "step": "a", "rows": 3, "nulls": 1,
                                   "nans": 0, "min": 1.0, "median": "inf", "max": "inf"}
    assert d["columns"]["a.f"]["true_share"] == 0.5
    assert d["columns"]["a.s"]["top"] == [["u", 2], ["v", 1]]
    assert d["columns"]["a.s"]["distinct"] == 2
