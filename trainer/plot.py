"""``python -m trainer plot RUN_DIR``: RUN_DIR/metrics.jsonl -> RUN_DIR/metrics.png.

matplotlib is imported here only (and with the Agg backend, so it works on a headless node);
training never needs it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from trainer.metrics import read_jsonl


def plot_run(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> Path:
    """Draw loss, tokens/s, data-wait % and (where logged) energy per token against the step;
    returns the PNG's path."""
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit("the plot subcommand needs matplotlib: pip install matplotlib") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_jsonl(run_dir / "metrics.jsonl")
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
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 8), sharex=True)
    for ax, (title, values, ylabel) in zip(axes, panels, strict=True):
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer plot",
                                description="Plot a run's metrics.jsonl to metrics.png.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a --run-dir of a training run")
    p.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/metrics.png)")
    args = p.parse_args(argv)
    print(plot_run(args.run_dir, args.out))
    return 0
