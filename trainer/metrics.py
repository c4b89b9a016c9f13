"""Throughput and data-wait accounting, and the metrics log.

The arithmetic (:class:`IntervalMeter`) is pure: it is fed durations and counts and never
reads a clock, so it can be tested exactly. The loop owns the clock and feeds it.

Definitions (per logging interval):

* step time    = wall time between consecutive step ends, so nothing between steps is lost
                 (logging, epoch changes and the first batch's wait all count);
* data wait    = time blocked in ``next(iterator)`` / total step time;
* tokens/s     = tokens consumed by all ranks / total step time on rank 0.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, TextIO


@dataclass(frozen=True)
class IntervalStats:
    steps: int
    seconds: float
    wait_seconds: float
    tokens: int

    @property
    def step_time(self) -> float:
        return self.seconds / self.steps if self.steps else 0.0

    @property
    def data_wait_frac(self) -> float:
        return self.wait_seconds / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class IntervalMeter:
    """Accumulates one logging interval; :meth:`flush` returns it and starts the next.

    ``tokens`` are whatever the caller counts (the loop passes the global count per step).
    The loss is not kept here: the loop sums it on the device and reduces it across ranks
    only when it logs, so that no step waits for a device-to-host copy.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.steps = 0
        self.seconds = 0.0
        self.wait_seconds = 0.0
        self.tokens = 0

    def add_wait(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"negative wait {seconds}")
        self.wait_seconds += seconds

    def add_step(self, seconds: float, tokens: int) -> None:
        if seconds < 0:
            raise ValueError(f"negative step time {seconds}")
        self.steps += 1
        self.seconds += seconds
        self.tokens += tokens

    def flush(self) -> IntervalStats:
        stats = IntervalStats(self.steps, self.seconds, self.wait_seconds, self.tokens)
        self._reset()
        return stats


@dataclass
class RunTotals:
    """Whole-run aggregates for the summary: totals, not a mean of interval means, so that
    intervals of different lengths weigh by their time."""

    steps: int = 0
    seconds: float = 0.0
    wait_seconds: float = 0.0
    tokens: int = 0
    final_loss: float = float("nan")

    def add(self, stats: IntervalStats, loss: float, data_wait_frac: float | None = None
            ) -> None:
        """Add one closed interval. ``data_wait_frac`` overrides the interval's own (the loop
        passes the mean over ranks, so the summary agrees with the logged lines)."""
        frac = stats.data_wait_frac if data_wait_frac is None else data_wait_frac
        self.steps += stats.steps
        self.seconds += stats.seconds
        self.wait_seconds += frac * stats.seconds
        self.tokens += stats.tokens
        self.final_loss = loss

    def summary(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "final_loss": self.final_loss,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "mean_tokens_per_s": self.tokens / self.seconds if self.seconds > 0 else 0.0,
            "mean_data_wait_pct": 100.0 * self.wait_seconds / self.seconds
            if self.seconds > 0 else 0.0,
        }


#: Dense bf16 peak FLOP/s per accelerator, from the vendors' data sheets (no sparsity).
PEAK_BF16_FLOPS: dict[str, float] = {
    "H200": 989e12, "H100": 989e12, "GH200": 989e12, "A100": 312e12, "A10G": 125e12,
    "L40S": 362e12, "L4": 121e12, "B200": 2250e12, "MI300X": 1307e12,
}


def peak_flops(device_name: str | None) -> float | None:
    """Peak dense bf16 FLOP/s for a device name as CUDA reports it (``NVIDIA H100 80GB HBM3``),
    or None when unknown (CPUs included: MFU is only reported where the peak is known)."""
    if not device_name:
        return None
    name = device_name.upper()
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):  # GH200 before H200
        if key in name:
            return PEAK_BF16_FLOPS[key]
    return None


def mfu(tokens_per_s: float, flops_per_token: float, world_size: int,
        peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved training FLOP/s over the peak of all devices."""
    if peak is None or peak <= 0 or world_size <= 0:
        return None
    return tokens_per_s * flops_per_token / (peak * world_size)


#: Loader counters in the metrics records, and how they combine over ranks.
LOADER_KEYS = {"bytes_read": "sum", "wait_s": "max", "samples_per_s": "sum", "failovers": "sum",
               "cache_hits": "sum", "cache_misses": "sum"}


def format_record(rec: dict[str, Any]) -> str:
    """The one human-readable line per logging interval."""
    return (
        f"step {rec['step']:>6}/{rec['total_steps']} | loss {rec['loss']:.4f} "
        f"| lr {rec['lr']:.2e} | tok/s {rec['tokens_per_s']:,.0f} "
        f"| step {rec['step_time_s'] * 1000:.1f} ms "
        f"| data-wait {100 * rec['data_wait_frac']:.1f}% (max rank "
        f"{100 * rec['data_wait_frac_max']:.1f}%) | epoch {rec['epoch']}"
        + (f" | MFU {100 * rec['mfu']:.1f}%" if rec.get("mfu") is not None else "")
    )


def format_summary(s: dict[str, Any]) -> str:
    return (
        f"done: {s['steps']} steps | final loss {s['final_loss']:.4f} "
        f"| mean tok/s {s['mean_tokens_per_s']:,.0f} "
        f"| mean data-wait {s['mean_data_wait_pct']:.1f}%"
    )


class JsonlWriter:
    """Append JSON lines, flushed per record, so a crashed run still leaves its metrics."""

    def __init__(self, path: str | os.PathLike[str], mode: str = "w") -> None:
        # "w" for a fresh run (re-using a run dir starts its logs afresh instead of mixing two
        # runs in one file); "a" for a resumed one, after truncate_jsonl.
        self.path = os.fspath(path)
        self._f: TextIO = open(self.path, mode, encoding="utf-8")  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, sort_keys=True) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def truncate_jsonl(path: str | os.PathLike[str], last_step: int) -> int:
    """Drop records with ``step > last_step`` (rewritten atomically); returns how many.

    A resumed run repeats the steps after its checkpoint: the records a killed run wrote for
    them describe work that was thrown away, so they go before the resumed run appends.
    """
    if not os.path.exists(path):
        return 0
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by the kill: that step is redone
                continue
    kept = [r for r in records if r.get("step", 0) <= last_step]
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in kept:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return len(records) - len(kept)
