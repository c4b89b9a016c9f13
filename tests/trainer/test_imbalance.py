"""The load-imbalance verdict (trainer/imbalance.py): pure, property-tested."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.imbalance import PHASES, WIDTH, PhaseMeter, analyze, format_report, record

SECONDS = st.floats(0.0, 10.0, allow_nan=False)


@st.composite
def rows(draw: st.DrawFn) -> list[list[float]]:
    world = draw(st.integers(1, 8))
    steps = draw(st.integers(1, 100))
    return [[float(steps), *(draw(SECONDS) for _ in PHASES), draw(SECONDS)]
            for _ in range(world)]


@settings(max_examples=300, deadline=None)
@given(rows())
def test_scores_spread_and_the_slowest_rank(table: list[list[float]]) -> None:
    r = analyze(table, step=10)
    own = [x["own"] for x in r.per_rank]
    assert own[r.slowest_rank] == max(own)
    assert r.slowest_rank == own.index(max(own))  # ties: the lowest rank
    assert all(0.0 < s <= 1.0 for s in r.scores)
    assert r.scores[own.index(min(own))] == 1.0
    assert r.spread_pct >= 0.0 and math.isfinite(r.spread_pct)
    assert (r.spread_pct == 0.0) == (max(own) == min(own))
    assert r.culprit in ("data", "compute", "optimizer") and r.culprit_excess_s >= 0
    rec = record(r)
    assert json.loads(json.dumps(rec))["slowest_rank"] == r.slowest_rank
    assert rec["kind"] == "imbalance" and rec["spread_pct"] == r.spread_pct
    assert f"slowest rank {r.slowest_rank}" in format_report(r)


@settings(max_examples=200, deadline=None)
@given(rows(), st.data())
def test_a_rank_slowed_in_one_phase_is_named_with_that_phase(table: list[list[float]],
                                                              data: st.DataObject) -> None:
    world = len(table)
    slow = data.draw(st.integers(0, world - 1))
    phase = data.draw(st.sampled_from(["data", "compute", "optimizer"]))
    steps = table[0][0]
    for row in table:
        row[0] = steps
    # a delay larger than any rank's whole own work, in one phase of one rank
    table[slow][1 + PHASES.index(phase)] += 3 * 10.0 * 3
    r = analyze(table, step=5)
    assert r.slowest_rank == slow
    assert r.culprit == phase
    if world > 1:
        assert r.spread_pct > 100.0
        assert r.scores[slow] < 0.5


@given(rows(), st.randoms())
def test_relabelling_ranks_relabels_the_verdict(table: list[list[float]], rnd) -> None:
    order = list(range(len(table)))
    rnd.shuffle(order)
    a, b = analyze(table, 1), analyze([table[i] for i in order], 1)
    assert [a.scores[i] for i in order] == b.scores
    assert a.spread_pct == b.spread_pct
    assert a.per_rank[a.slowest_rank]["own"] == b.per_rank[b.slowest_rank]["own"]


def test_the_meter_sums_an_interval() -> None:
    m = PhaseMeter()
    m.add("data", 0.5)
    m.add("compute", 1.0)
    m.add("collective", -1.0)  # clock jitter never makes a phase negative
    m.add_step(2.0)
    m.add_step(2.0)
    assert m.row() == [2.0, 0.5, 1.0, 0.0, 0.0, 4.0] and len(m.row()) == WIDTH
    m.reset()
    assert m.row() == [0.0] * WIDTH
    with pytest.raises(ValueError):
        m.add("lunch", 1.0)
    with pytest.raises(ValueError):
        analyze([[1.0, 2.0]], 1)


def test_plot_draws_an_imbalance_panel(tmp_path) -> None:
    from trainer.metrics import JsonlWriter
    from trainer.plot import plot_run

    with JsonlWriter(tmp_path / "metrics.jsonl") as w:
        for step in (10, 20):
            w.write({"step": step, "loss": 3.0, "tokens_per_s": 100.0, "data_wait_frac": 0.1,
                     "data_wait_frac_max": 0.2})
            w.write(record(analyze([[10, 0.1, 0.5, 0.1, 0.2, 1.0],
                                    [10, 0.9, 0.5, 0.1, 0.0, 1.0]], step)))
    out = plot_run(tmp_path)
    assert out.stat().st_size > 10_000


def test_an_idle_fastest_rank_keeps_every_score_positive() -> None:
    """Found by hypothesis in CI: a rank with no own work beside one with some."""
    r = analyze([[1.0, 0.0, 0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]], step=10)
    assert r.scores[0] == 1.0 and 0.0 < r.scores[1] <= 1e-6
    assert r.slowest_rank == 1 and r.spread_pct > 0
