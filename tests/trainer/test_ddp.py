"""End to end: ``python -m trainer`` under torchrun (2 processes, gloo) and alone, on datasets
made by the real pipeline and read by the real loader."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.metrics import read_jsonl

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = ["--layers", "2", "--width", "64", "--heads", "2", "--seq-len", "64",
              "--batch-size", "4", "--device", "cpu"]

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_trainer(args: list[str], nproc: int | None, timeout: float = 300
                ) -> subprocess.CompletedProcess[str]:
    """``python -m trainer ARGS``, under torchrun when ``nproc`` is given. One OpenMP thread
    per process: two ranks plus their loader workers already fill two cores."""
    launcher = [sys.executable]
    if nproc is not None:
        launcher += ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                     "--master-port", str(free_port())]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*launcher, "-m", "trainer", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"trainer failed ({proc.returncode}):\n{proc.stdout}\n" \
                                 f"{proc.stderr[-5000:]}"
    return proc


def rows_by_epoch(path: Path) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for rec in read_jsonl(path):
        out.setdefault(rec["epoch"], []).extend(rec["rows"])
    return out


def test_ddp_two_ranks_learn_on_different_data(tiny_dataset: str, tmp_path: Path) -> None:
    from loaders import TokenDataset

    run_dir = tmp_path / "run"
    proc = run_trainer(["--data", tiny_dataset, "--steps", "30", "--log-every", "1",
                        "--lr", "3e-3", "--warmup-steps", "3", "--run-dir", str(run_dir),
                        *TINY_MODEL], nproc=2)

    config = json.loads((run_dir / "config.json").read_text())
    assert (config["world_size"], config["backend"]) == (2, "gloo")

    records = read_jsonl(run_dir / "metrics.jsonl")  # rank 0 only writes it
    assert [r["step"] for r in records] == list(range(1, 31))
    assert all(r["tokens"] == 2 * 4 * 64 for r in records)  # global: both ranks' tokens
    first, last = [r["loss"] for r in records[:5]], [r["loss"] for r in records[-5:]]
    assert sum(last) / 5 < sum(first) / 5 - 0.5, (first, last)
    assert all(0.0 <= r["data_wait_frac"] <= r["data_wait_frac_max"] <= 1.0 for r in records)
    assert "done: 30 steps" in proc.stdout and proc.stdout.count("done:") == 1

    # Each rank logged what it trained on; in any epoch the ranks' samples are disjoint up
    # to the loader's padding (repeats that give every rank as many batches as the others).
    r0 = read_jsonl(run_dir / "rank0_samples.jsonl")
    r1 = read_jsonl(run_dir / "rank1_samples.jsonl")
    assert len(r0) == len(r1) == 30
    assert all(a["rows"] != b["rows"] for a, b in zip(r0, r1, strict=True))
    padding = TokenDataset(tiny_dataset, 64, rank=0, world_size=2).padding
    e0, e1 = rows_by_epoch(run_dir / "rank0_samples.jsonl"), rows_by_epoch(
        run_dir / "rank1_samples.jsonl")
    for epoch in e0:
        assert len(set(e0[epoch]) & set(e1[epoch])) <= padding


def test_ddp_crosses_epochs_without_hanging(tiny_vocab_dataset: str, tmp_path: Path) -> None:
    """A dataset of a few batches per rank: both ranks must move to the next epoch together
    (equal batch counts, ``set_epoch`` on each) and see a new order there."""
    run_dir = tmp_path / "run"
    run_trainer(["--data", tiny_vocab_dataset, "--steps", "40", "--log-every", "10",
                 "--lr", "3e-3", "--run-dir", str(run_dir), *TINY_MODEL], nproc=2, timeout=240)
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert records[-1]["step"] == 40 and records[-1]["epoch"] >= 2
    assert records[-1]["loss"] < 0.6 * records[0]["loss"], records

    per_rank = [read_jsonl(run_dir / f"rank{r}_samples.jsonl") for r in (0, 1)]
    for r in (0, 1):
        epochs = [s["epoch"] for s in per_rank[r]]
        assert epochs == sorted(epochs) and epochs[-1] == records[-1]["epoch"]
        by_epoch = rows_by_epoch(run_dir / f"rank{r}_samples.jsonl")
        assert by_epoch[0] != by_epoch[1]  # set_epoch(1) gave a different order
    # Both ranks changed epoch at the same step.
    assert [s["epoch"] for s in per_rank[0]] == [s["epoch"] for s in per_rank[1]]


def test_single_process_run_and_plot(tiny_vocab_dataset: str, tmp_path: Path) -> None:
    """Without torchrun: world size 1, no process group; then the ``plot`` subcommand."""
    run_dir = tmp_path / "run"
    proc = run_trainer(["--data", tiny_vocab_dataset, "--steps", "6", "--log-every", "3",
                        "--num-workers", "0", "--run-dir", str(run_dir), *TINY_MODEL],
                       nproc=None)
    assert "world size 1 (no process group)" in proc.stdout
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["world_size"], config["backend"]) == (1, None)
    assert config["model"]["vocab_size"] == 28  # from the manifest, not a flag
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [3, 6]
    assert not (run_dir / "rank1_samples.jsonl").exists()

    out = subprocess.run([sys.executable, "-m", "trainer", "plot", str(run_dir)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (run_dir / "metrics.png").read_bytes().startswith(b"\x89PNG")
