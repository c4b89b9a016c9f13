"""``python -m trainer plot RUN_DIR``: RUN_DIR/metrics.jsonl -> RUN_DIR/metrics.png.

matplotlib is imported here only (and with the Agg backend, so it works on a headless node);
training never needs it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

from infra.config import make_app, parse
from trainer.metrics import read_jsonl


def plot_run(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path:
    """Draw loss, tokens/s, data-wait % and (where logged) energy per token, a mixture's
    shares and the load-imbalance reports against the step; returns the PNG's path."""
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit("the plot subcommand needs matplotlib: pip install matplotlib") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    everything = read_jsonl(run_dir / "metrics.jsonl")
    records = [r for r in everything if "kind" not in r]  # the per-interval training records
    reports = [r for r in everything if r.get("kind") == "imbalance"]
    if not records:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} has no records")
    steps = [r["step"] for r in records]
    panels = [
        ("loss", [r["loss"] for r in records], "loss"),
        ("tokens/s (global)", [r["tokens_per_s"] for r in records], "tokens/s"),
        ("data wait (% of step time)", [100 * r["data_wait_frac"] for r in records], "%"),
    ]
    if all("energy_j_per_token" in r for r in records):  # runs logged before energy: none
        how = ("ESTIMATE: CPU time x W/core" if any(r["energy_source"] == "estimate"
                                                    for r in records)
               else f"measured: {records[-1]['energy_source']}")
        panels.append((f"energy per token ({how})",
                       [1e3 * r["energy_j_per_token"] for r in records], "mJ/token"))
    mixture = all(r.get("mixture") for r in records)  # a --mixture run's records
    extra = (1 if reports else 0) + (1 if mixture else 0)  # load imbalance, mixture panels
    fig, axes = plt.subplots(len(panels) + extra, 1, figsize=(8, 8 + 2.7 * extra),
                             sharex=True)
    if reports:
        plot_imbalance(axes[-1], reports)
    if mixture:
        plot_mixture(axes[len(panels)], records)
    for ax, (title, values, ylabel) in zip(axes, panels, strict=False):
        ax.plot(steps, values, marker="o", markersize=3)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    if all("data_wait_frac_max" in r for r in records):
        axes[2].plot(steps, [100 * r["data_wait_frac_max"] for r in records],
                     linestyle="--", label="slowest rank")
        axes[2].plot([], [])  # keep colours distinct from the mean line
        axes[2].legend(["mean over ranks", "slowest rank"])
    axes[-1].set_xlabel("step")
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out_path = Path(out) if out is not None else run_dir / "metrics.png"
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def plot_imbalance(ax, reports: list[dict]) -> None:
    """Load-imbalance reports: one line per rank, its own work (data + compute + optimizer)
    in ms per step; a cross on the rank each report named slowest."""
    steps = [r["step"] for r in reports]
    ranks = max(len(r["own_s"]) for r in reports)
    for rank in range(ranks):
        ax.plot(steps, [1000 * r["own_s"][rank] if rank < len(r["own_s"]) else float("nan")
                        for r in reports], marker="o", markersize=3, label=f"rank {rank}")
    ax.scatter(steps, [1000 * r["own_s"][r["slowest_rank"]] for r in reports], marker="x",
               s=60, color="black", zorder=3, label="slowest")
    last = reports[-1]
    ax.set_title(f"load imbalance: own work per rank (last report: slowest rank "
                 f"{last['slowest_rank']}, spread {last['spread_pct']:.0f}%, most in "
                 f"{last.get('culprit', '?')})")
    ax.set_ylabel("ms/step")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", ncol=min(ranks + 1, 6))


def plot_mixture(ax, records: list[dict]) -> None:
    """A mixture run's shares: per component, the share of the samples trained on in each
    logging interval (solid, dots at the records) and the share its schedule set for those
    steps (dashed, the same colour)."""
    steps = [r["step"] for r in records]
    names = list(records[-1]["mixture"])
    for name in names:
        line, = ax.plot(steps, [100 * r["mixture"].get(name, float("nan")) for r in records],
                        marker="o", markersize=3, label=f"{name}")
        if all("mixture_scheduled" in r for r in records):
            ax.plot(steps, [100 * r["mixture_scheduled"].get(name, float("nan"))
                            for r in records], linestyle="--", color=line.get_color())
    ax.set_title("mixture: share of samples per interval (dashed: scheduled)")
    ax.set_ylabel("% of samples")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", ncol=min(len(names), 6))


app = make_app("python -m trainer plot", help="Plot a run's metrics.jsonl to metrics.png.",
               component=None)


@app.default
def _plot(run_dir: Annotated[str, Parameter(metavar="RUN_DIR",
                                            help="a --run-dir of a training run")], /, *,
          out: Annotated[str | None, Parameter(
              metavar="OUT", help="PNG path (default: RUN_DIR/metrics.png)")] = None) -> int:
    print(plot_run(run_dir, out))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer plot RUN_DIR [--out PNG]``; a bad flag prints one ``error:`` line
    and exits 2 (:func:`infra.config.parse`)."""
    import sys

    command, bound = parse(app, sys.argv[2:] if argv is None else argv)
    result = command(*bound.args, **bound.kwargs)
    return result if isinstance(result, int) else 0  # --help prints and returns None
