"""Throughput and data-wait accounting, and the metrics log.

The arithmetic (:class:`IntervalMeter`) is pure: it is fed durations and counts and never
reads a clock, so it can be tested exactly. The loop owns the clock and feeds it.

Definitions (per logging interval):

* step time    = wall time between consecutive step ends, so nothing between steps is lost
                 (logging, epoch changes and the first batch's wait all count);
* data wait    = time blocked in ``next(iterator)`` / total step time;
* tokens/s     = tokens consumed by all ranks / total step time on rank 0;
* mixture      = with ``--mixture``: each component's share of the samples all ranks trained
                 on in the interval (``mixture``), and the shares its schedule set for those
                 steps (``mixture_scheduled``), by component name (:mod:`trainer.mixture`);
* energy       = joules of all ranks in the interval (:class:`StepEnergy`, summed over ranks by
                 the loop): ``energy_j``, ``energy_j_per_step``, ``energy_j_per_token``,
                 ``energy_source`` (``rapl``, ``nvml``, ``rapl+nvml`` or ``estimate``) and, with
                 ``--grid-intensity``, ``gco2e``. Counters are read once per logging interval,
                 never per step.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, TextIO

from infra.energy import Accumulator, Energy, grams, snapshot
from infra.energy.rapl import find_zones


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
    energy_j: float = 0.0
    energy_source: str = ""
    gco2e: float | None = None

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

    def add_energy(self, record: dict[str, Any]) -> None:
        """Add an interval's energy fields (:func:`energy_fields`)."""
        if "energy_j" not in record:
            return
        self.energy_j += record["energy_j"]
        src = record["energy_source"]
        self.energy_source = src if self.energy_source in ("", src) else "estimate"
        if "gco2e" in record:
            self.gco2e = (self.gco2e or 0.0) + record["gco2e"]

    def summary(self) -> dict[str, Any]:
        energy: dict[str, Any] = {}
        if self.energy_source:
            energy = {"energy_j": self.energy_j, "energy_source": self.energy_source,
                      "energy_j_per_token": self.energy_j / self.tokens if self.tokens else 0.0}
            if self.gco2e is not None:
                energy["gco2e"] = self.gco2e
        return {
            **energy,
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
        + (f" | {rec['energy_j_per_step']:.1f} J/step"
           f"{' (est.)' if rec['energy_source'] == 'estimate' else ''}"
           if "energy_j_per_step" in rec else "")
        + (" | mix " + " ".join(f"{name} {100 * share:.1f}%"
                                for name, share in rec["mixture"].items())
           if rec.get("mixture") else "")
    )


def format_summary(s: dict[str, Any]) -> str:
    return (
        f"done: {s['steps']} steps | final loss {s['final_loss']:.4f} "
        f"| mean tok/s {s['mean_tokens_per_s']:,.0f} "
        f"| mean data-wait {s['mean_data_wait_pct']:.1f}%"
        + (f" | energy {s['energy_j']:,.0f} J ({s['energy_source']}), "
           f"{s['energy_j_per_token'] * 1e3:.3f} mJ/token" if "energy_j" in s else "")
        + (f", {s['gco2e']:.3f} gCO2e" if "gco2e" in s else "")
    )


class StepEnergy:
    """This rank's joules per logging interval (:mod:`infra.energy`).

    The host's RAPL package counters are read by its first rank only (``local_rank`` 0; they
    cover every rank on the host), and where they are readable the other ranks add no CPU
    estimate. Each rank reads its own GPU's NVML counter (``gpu``: NVML's index). Without
    counters, the estimate is this process's CPU time x ``watts_per_core``. A RAPL counter
    that wraps twice within one interval (hundreds of kJ) is undercounted: log more often.
    """

    def __init__(self, local_rank: int = 0, gpu: int | None = None,
                 watts_per_core: float | None = None) -> None:
        self.with_rapl = local_rank == 0
        host_measured = bool(find_zones())
        watts = watts_per_core if watts_per_core is not None else Accumulator().watts_per_core
        self.acc = Accumulator(0.0 if host_measured and not self.with_rapl else watts)
        self.gpus: tuple[int, ...] = () if gpu is None else (gpu,)
        self.last = self.acc.add([self._snap()])

    def _snap(self) -> dict[str, Any]:
        return snapshot(gpus=self.gpus, with_rapl=self.with_rapl)

    def interval(self) -> Energy:
        """The energy since the last call (or since construction)."""
        total = self.acc.add([self._snap()])
        d, self.last = total - self.last, total
        return d


def nvml_index(cuda_index: int, visible: str | None = None) -> int:
    """NVML's index of CUDA device ``cuda_index`` (``CUDA_VISIBLE_DEVICES`` renumbers CUDA's
    devices; NVML's follow the bus)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    ids = [v.strip() for v in (visible or "").split(",") if v.strip()]
    if cuda_index < len(ids) and ids[cuda_index].isdigit():
        return int(ids[cuda_index])
    return cuda_index


def energy_fields(joules: float, source: str, steps: int, tokens: int,
                  g_per_kwh: float | None = None) -> dict[str, Any]:
    """The metrics record's energy fields for an interval of ``steps`` steps and ``tokens``
    tokens (all ranks) that took ``joules`` (all ranks)."""
    out: dict[str, Any] = {
        "energy_j": joules, "energy_source": source,
        "energy_j_per_step": joules / steps if steps else 0.0,
        "energy_j_per_token": joules / tokens if tokens else 0.0,
    }
    if g_per_kwh is not None:
        out["gco2e"] = grams(joules, g_per_kwh)
    return out


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
