"""Carbon-aware scheduling replayed on a week of real grid intensity, on a simulated clock.

The trace: CAISO's hourly average carbon intensity, 2022-01-01 to 2022-01-07 UTC (168 hours,
benchmarks/data/caiso_2022-01-01_7d_hourly.csv: from the U.S. EIA-930 hourly generation by
fuel, as computed in HewlettPackard/dc-rl; the file's header says exactly). Its diurnal shape
is solar's: ~135-200 g/kWh at midday Pacific time, ~300-370 at night.

The job: 8 hours of work at a constant power, due 24 hours after it is submitted, cut into
tasks of ``--task-min`` minutes (default 5): a task, once admitted, runs to its end, as a
Dask task does. For every submission hour whose deadline lies inside the trace (145 of them):

- ``at once``: start at submission, run 8 hours straight;
- ``carbon-aware``: the pipeline's own admission gate (``pipeline.driver.carbon.CarbonGate``, the
  planner and the margin ``pipeline run --carbon-signal --deadline 24h`` uses: plan for 1.5x
  the work left + 60 s, the work left estimated from progress as the pipeline does), asked
  before each task on a simulated clock; the forecast is the trace itself (``perfect``) or
  a day-ahead persistence forecast (``persistence``: each future hour forecast as the same
  hour a day earlier; the current hour known), since real forecasts err.

gCO2e are integrated on the actual trace. ``saving_pct`` is 100 x (1 - carbon-aware total /
at-once total) over all submission hours (perfect forecast); ``missed_deadlines`` counts runs
of either forecast that finished after their deadline.

Also measured (``overhead``): what the energy accounting costs where it runs: one
``infra.energy.snapshot()`` (read on the driver, on every worker per sample and on each rank
per logging interval), the gate's decision per admitted task, and one ``client.run`` sample of
a 2-worker LocalCluster (every 30 s in a pipeline run), medians, against the interval each is
paid once per.

    python benchmarks/carbon_replay.py --json         # JSON + plot in benchmarks/results/
    python benchmarks/carbon_replay.py --no-overhead  # the replay alone (a second)
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_utils import RESULTS, write_results  # noqa: E402
from infra.energy import Segment, snapshot  # noqa: E402
from pipeline.driver.carbon import CarbonGate  # noqa: E402

TRACE = Path(__file__).resolve().parent / "data" / "caiso_2022-01-01_7d_hourly.csv"
H = 3600.0
NEED_H, DEADLINE_H = 8, 24


def load_trace(path: Path = TRACE) -> list[float]:
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    return [float(ln.split(",")[1]) for ln in lines[1:]]


class Feed:
    """A forecast as seen at the simulated time ``clock()``."""

    def __init__(self, trace: list[float], kind: str, clock: Any) -> None:
        self.trace, self.kind, self.clock = trace, kind, clock

    def forecast(self) -> list[Segment]:
        now_h = int(self.clock() // H)
        out = []
        for h, g in enumerate(self.trace):
            if self.kind == "persistence" and h > now_h and h >= 24:
                g = self.trace[h - 24]
            out.append(Segment(h * H, (h + 1) * H, g))
        return out


def emissions(trace: list[float], t0: float, t1: float) -> float:
    """g per kW of constant power between t0 and t1 (kWh x g/kWh)."""
    g, t = 0.0, t0
    while t < t1 - 1e-9:
        h = int(t // H)
        end = min(t1, (h + 1) * H)
        g += (end - t) / H * trace[h]
        t = end
    return g


def replay(trace: list[float], submit_h: int, kind: str, task_s: float) -> dict[str, float]:
    """One carbon-aware run through the pipeline's gate on a simulated clock."""
    now = [submit_h * H]
    need = NEED_H * H
    deadline = now[0] + DEADLINE_H * H
    left = [need]

    def sleep(s: float) -> None:
        now[0] += s

    gate = CarbonGate(Feed(trace, kind, lambda: now[0]), deadline, None, io.StringIO(),
                      prior_s=need, clock=lambda: now[0], sleep=sleep, recheck_s=H / 4)
    gate.progress = lambda: 1 - left[0] / need
    grams = 0.0
    while left[0] > 1e-9:
        gate(True)  # blocks (on the simulated clock) until a task may start
        dt = min(task_s, left[0])
        grams += emissions(trace, now[0], now[0] + dt)
        now[0] += dt
        left[0] -= dt
    return {"grams": grams, "end": now[0], "deadline": deadline, "waited_h": gate.waited_s / H}


def run_replay(trace: list[float], task_s: float) -> dict[str, Any]:
    starts = list(range(0, len(trace) - DEADLINE_H + 1))
    rows = []
    for s in starts:
        base = emissions(trace, s * H, s * H + NEED_H * H)
        row: dict[str, Any] = {"submit_h": s, "at_once_g": base}
        for kind in ("perfect", "persistence"):
            r = replay(trace, s, kind, task_s)
            row[f"{kind}_g"] = r["grams"]
            row[f"{kind}_waited_h"] = r["waited_h"]
            row[f"{kind}_missed"] = r["end"] > r["deadline"] + 1e-6
        rows.append(row)
    base = sum(r["at_once_g"] for r in rows)
    out: dict[str, Any] = {"submissions": len(rows), "need_h": NEED_H, "deadline_h": DEADLINE_H,
                           "task_min": task_s / 60, "rows": rows}
    for kind in ("perfect", "persistence"):
        tot = sum(r[f"{kind}_g"] for r in rows)
        per = [100 * (1 - r[f"{kind}_g"] / r["at_once_g"]) for r in rows]
        out[kind] = {"saving_pct": 100 * (1 - tot / base),
                     "median_saving_pct": statistics.median(per),
                     "min_saving_pct": min(per),
                     "missed_deadlines": sum(r[f"{kind}_missed"] for r in rows),
                     "median_waited_h": statistics.median(r[f"{kind}_waited_h"] for r in rows)}
    out["saving_pct"] = out["perfect"]["saving_pct"]
    out["missed_deadlines"] = out["perfect"]["missed_deadlines"] + \
        out["persistence"]["missed_deadlines"]
    return out


def measure_overhead(reps: int = 2000) -> dict[str, Any]:
    def med(fn: Any, n: int) -> float:
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    snap_s = med(snapshot, reps)
    trace = load_trace()
    now = [30 * H]
    gate = CarbonGate(Feed(trace, "perfect", lambda: now[0]), now[0] + 24 * H, None,
                      io.StringIO(), prior_s=8 * H, clock=lambda: now[0])

    def admit() -> None:
        gate._decision = None  # re-plan every time: the worst case (it caches for a second)
        gate(False)

    gate_s = med(admit, 500)
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0",
                      processes=True) as cluster, Client(cluster) as client:
        client.run(snapshot)
        sample_s = med(lambda: client.run(snapshot), 30)
    return {
        "snapshot_s": snap_s, "gate_decision_s": gate_s, "cluster_sample_s": sample_s,
        # paid once per 30 s sampling period (and per stage boundary) by a pipeline run
        "pipeline_sampling_pct": 100 * sample_s / 30.0,
        # paid once per admitted task; a task is a partition (seconds to minutes): vs 1 s
        "gate_per_1s_task_pct": 100 * gate_s / 1.0,
        # paid per logging interval by each rank; vs a 1 s interval (10 steps of 100 ms)
        "trainer_per_1s_interval_pct": 100 * snap_s / 1.0,
    }


def plot(res: dict[str, Any], trace: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    fig, (a, b) = plt.subplots(2, 1, figsize=(10, 7))
    a.step(range(len(trace)), trace, where="post", color="tab:gray")
    a.set_title("CAISO carbon intensity, 2022-01-01..07 UTC (EIA-930 via dc-rl)")
    a.set_ylabel("gCO2e/kWh")
    a.set_xlabel("hour of the week")
    a.grid(True, alpha=0.3)
    xs = [r["submit_h"] for r in rows]
    b.plot(xs, [r["at_once_g"] / 1000 for r in rows], label="at once")
    b.plot(xs, [r["perfect_g"] / 1000 for r in rows],
           label=f"carbon-aware, perfect forecast ({res['perfect']['saving_pct']:.1f}% less)")
    b.plot(xs, [r["persistence_g"] / 1000 for r in rows], linestyle="--",
           label=f"carbon-aware, day-ahead persistence "
                 f"({res['persistence']['saving_pct']:.1f}% less)")
    b.set_title(f"an 8 h job due in 24 h, by submission hour; missed deadlines: "
                f"{res['missed_deadlines']}")
    b.set_ylabel("kgCO2e per kW")
    b.set_xlabel("submission hour")
    b.legend(fontsize="small")
    b.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="write benchmarks/results/"
                    "carbon_replay.json and .png")
    ap.add_argument("--task-min", type=float, default=5.0, help="minutes per task")
    ap.add_argument("--no-overhead", action="store_true", help="skip the overhead measurement")
    args = ap.parse_args(argv)
    trace = load_trace()
    t0 = time.perf_counter()
    res = run_replay(trace, args.task_min * 60)
    res["replay_s"] = time.perf_counter() - t0
    res["trace"] = {"file": str(TRACE.relative_to(RESULTS.parents[1])), "hours": len(trace),
                    "min": min(trace), "max": max(trace),
                    "mean": statistics.fmean(trace)}
    if not args.no_overhead:
        res["overhead"] = measure_overhead()
    for kind in ("perfect", "persistence"):
        k = res[kind]
        print(f"{kind:12s} saving {k['saving_pct']:5.1f}% (median {k['median_saving_pct']:.1f}%,"
              f" min {k['min_saving_pct']:.1f}%), missed deadlines {k['missed_deadlines']}, "
              f"median wait {k['median_waited_h']:.1f} h over {res['submissions']} submissions")
    if "overhead" in res:
        o = res["overhead"]
        print(f"overhead: snapshot {o['snapshot_s'] * 1e6:.0f} us, gate decision "
              f"{o['gate_decision_s'] * 1e6:.0f} us, cluster sample "
              f"{o['cluster_sample_s'] * 1e3:.1f} ms -> {o['pipeline_sampling_pct']:.3f}% of "
              "a 30 s period")
    if args.json:
        path = write_results("carbon_replay", res)
        plot(res, trace, path.with_suffix(".png"))
        print(path, path.with_suffix(".png"))
    print(json.dumps({k: res[k] for k in ("saving_pct", "missed_deadlines")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
