"""The load-imbalance report, the pure part: per-rank phase times in, a verdict out.

Each rank splits its steps into four phases (:data:`PHASES`): ``data`` (blocked on the
loader), ``compute`` (forward, backward and the rest of the step's own work), ``optimizer``
(``optimizer.step``) and ``collective`` (waiting on the gradient all-reduce after its own
backward finished). Every N steps the ranks exchange their sums (one ``all_gather`` of
:data:`WIDTH` floats, :mod:`trainer.imbalance_probe`) and :func:`analyze` compares them.

Scores: a rank's *own work* per step is ``data + compute + optimizer`` (its collective wait is
time it spent waiting for the others, so it is left out). The slowest rank is the one with the
most own work; its relative score is 1.0 for the fastest rank and ``fastest / own`` for the
others (0.5: it takes twice as long); ``spread_pct`` is how much longer the slowest rank's own
work is than the fastest's. The report names the slowest rank and the phase where it loses
most against the median of the other ranks.

Nothing here reads a clock or talks to other processes, so it is tested directly.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PHASES = ("data", "compute", "optimizer", "collective")
#: One row per rank: steps, the four phase sums (seconds), the wall time of those steps.
WIDTH = 2 + len(PHASES)
_LABELS = {"data": "data wait", "compute": "compute", "optimizer": "optimizer",
           "collective": "collective wait"}


class PhaseMeter:
    """Sums of phase seconds since the last report (one per rank)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.wall = 0.0
        self.sums = dict.fromkeys(PHASES, 0.0)

    def add(self, phase: str, seconds: float) -> None:
        if phase not in self.sums:
            raise ValueError(f"unknown phase {phase!r}")
        self.sums[phase] += max(0.0, seconds)

    def add_step(self, wall_seconds: float) -> None:
        self.steps += 1
        self.wall += max(0.0, wall_seconds)

    def row(self) -> list[float]:
        return [float(self.steps), *(self.sums[p] for p in PHASES), self.wall]


@dataclass(frozen=True)
class Report:
    step: int
    steps: int
    #: per rank, per phase: mean seconds per step; plus "own" and "wall"
    per_rank: list[dict[str, float]]
    scores: list[float]
    slowest_rank: int
    spread_pct: float
    #: the slowest rank's phase furthest above the other ranks' median, by how much (s/step)
    culprit: str
    culprit_excess_s: float


def analyze(rows: Sequence[Sequence[float]], step: int) -> Report:
    """The verdict over one interval; ``rows[r]`` is rank r's :meth:`PhaseMeter.row`."""
    if not rows:
        raise ValueError("no ranks")
    per_rank = []
    for row in rows:
        if len(row) != WIDTH:
            raise ValueError(f"a row of {len(row)} values, expected {WIDTH}")
        steps = max(int(row[0]), 1)
        phases = {p: max(0.0, float(v)) / steps for p, v in zip(PHASES, row[1:-1],
                                                                  strict=True)}
        phases["own"] = phases["data"] + phases["compute"] + phases["optimizer"]
        phases["wall"] = max(0.0, float(row[-1])) / steps
        per_rank.append(phases)
    own = [r["own"] for r in per_rank]
    fastest, slowest_time = min(own), max(own)
    slowest = own.index(slowest_time)  # ties: the lowest rank
    # A fastest rank with no own work at all (an idle interval) is floored, like the spread's
    # divisor, so that every score stays in (0, 1] (a CI run's hypothesis example: [0, 1] s).
    floor = max(fastest, slowest_time * 1e-6)
    scores = [1.0 if o <= 0 else min(1.0, floor / o) for o in own]
    spread = 0.0 if slowest_time <= 0 else 100.0 * (slowest_time - fastest) / floor
    others = [r for i, r in enumerate(per_rank) if i != slowest]
    excess = {p: per_rank[slowest][p] - (statistics.median(r[p] for r in others)
                                         if others else 0.0)
              for p in ("data", "compute", "optimizer")}
    culprit = max(excess, key=lambda p: (excess[p], -PHASES.index(p)))
    return Report(step=step, steps=int(max(r[0] for r in rows)), per_rank=per_rank,
                  scores=scores, slowest_rank=slowest, spread_pct=spread, culprit=culprit,
                  culprit_excess_s=max(0.0, excess[culprit]))


def format_report(r: Report) -> str:
    """The one log line of a report."""
    me = r.per_rank[r.slowest_rank]
    parts = ", ".join(f"{_LABELS[p]} {1000 * me[p]:.1f}" for p in PHASES)
    fastest = min(x["own"] for x in r.per_rank)
    return (f"imbalance @ step {r.step}: slowest rank {r.slowest_rank} "
            f"({1000 * me['own']:.1f} ms/step of own work vs {1000 * fastest:.1f} fastest, "
            f"spread {r.spread_pct:.0f}%), most in {_LABELS[r.culprit]} "
            f"(+{1000 * r.culprit_excess_s:.1f} ms vs the others' median); its ms/step: {parts}; "
            f"scores {' '.join(f'{s:.2f}' for s in r.scores)}")


def record(r: Report) -> dict[str, Any]:
    """The ``metrics.jsonl`` record of a report (``kind: imbalance``)."""
    return {
        "kind": "imbalance",
        "step": r.step,
        "interval_steps": r.steps,
        "slowest_rank": r.slowest_rank,
        "spread_pct": r.spread_pct,
        "culprit": r.culprit,
        "scores": r.scores,
        **{f"{p}_s": [x[p] for x in r.per_rank] for p in (*PHASES, "own", "wall")},
    }
