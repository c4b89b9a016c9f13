"""``--mixture FILE``: the file's checks (one line naming the file and the key), the shares
the metrics carry, and real runs: a ramp trained through the CLI, logged and plotted, and a
run resumed mid-ramp on another world size training on the batches of the straight one."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.trainer._torchrun import run_trainer
from trainer.config import ConfigError
from trainer.metrics import read_jsonl
from trainer.mixture import MixtureFileError, MixtureMeter, read_mixture_file

MODEL = ["--layers", "1", "--width", "32", "--heads", "2", "--seq-len", "32", "--device",
         "cpu", "--global-batch-size", "8", "--warmup-steps", "1", "--lr", "3e-3"]

GOOD = """\
ramp = "linear"

[components]
web = "{a}"
code = "{b}"

[[schedule]]
step = 0
weights = {{ web = 9, code = 1 }}

[[schedule]]
step = {ramp_end}
weights = {{ web = 1, code = 1 }}
"""


def _write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_good_file_is_read_in_order(tmp_path: Path) -> None:
    mixture = read_mixture_file(_write(tmp_path / "m.toml", GOOD.format(
        a="s3://b/web", b="data/code", ramp_end=1000)))
    assert mixture.names == ("web", "code") and mixture.urls == ("s3://b/web", "data/code")
    assert mixture.schedule.steps == (0, 1000) and mixture.schedule.ramp == "linear"
    assert mixture.schedule.weights == ((9.0, 1.0), (1.0, 1.0))
    assert mixture.record()["schedule"][1] == {"step": 1000,
                                               "weights": {"web": 1.0, "code": 1.0}}


def test_a_component_may_be_off_for_a_while_and_one_point_is_fixed(tmp_path: Path) -> None:
    off = read_mixture_file(_write(tmp_path / "off.toml", """\
ramp = "step"
[components]
a = "x"
b = "y"
[[schedule]]
step = 0
weights = { a = 1, b = 0 }
[[schedule]]
step = 100
weights = { a = 1, b = 1.5 }
"""))
    assert off.schedule.weights[0] == (1.0, 0.0) and off.schedule.ramp == "step"
    fixed = read_mixture_file(_write(tmp_path / "fixed.toml", """\
[components]
a = "x"
b = "y"
[[schedule]]
step = 0
weights = { a = 3, b = 1 }
"""))
    assert fixed.schedule.constant and fixed.schedule.ramp == "linear"  # the default


BAD = [
    ("weight = 3\n", "weight: unknown key (a mixture file has components, schedule, ramp)"),
    ("ramp = 'cubic'\n", "ramp: 'cubic' is not one of 'step', 'linear'"),
    ("[[schedule]]\nstep = 0\nweights = { a = 1 }\n", "components: missing or empty"),
    ("[components]\n", "components: missing or empty"),
    ("[components]\na = 3\n", "components.a: 3 is not a dataset URL"),
    ("[components]\na = ''\n", "components.a: '' is not a dataset URL"),
    ("[components]\na = 'x'\n", "schedule: missing or empty"),
    ("schedule = [1]\n[components]\na = 'x'\n", "schedule[0]: not a table"),
    ("[components]\na = 'x'\n[[schedule]]\nstep = 5\nweights = { a = 1 }\n",
     "schedule[0].step: is 5: the first point must be at step 0"),
    ("[components]\na = 'x'\n[[schedule]]\nweights = { a = 1 }\n",
     "schedule[0].step: None is not a step"),
    ("[components]\na = 'x'\n[[schedule]]\nstep = 0.5\nweights = { a = 1 }\n",
     "schedule[0].step: 0.5 is not a step"),
    ("[components]\na = 'x'\n[[schedule]]\nstep = true\nweights = { a = 1 }\n",
     "schedule[0].step: True is not a step"),
    ("[components]\na = 'x'\n[[schedule]]\nstep = 0\nweights = { a = 1 }\n[[schedule]]\n"
     "step = 10\nweights = { a = 1 }\n[[schedule]]\nstep = 10\nweights = { a = 2 }\n",
     "schedule[2].step: 10 does not come after the previous point's 10 (steps must increase)"),
    ("[components]\na = 'x'\n[[schedule]]\nstep = 0\nweights = { a = 1 }\n[[schedule]]\n"
     "step = -4\nweights = { a = 1 }\n", "schedule[1].step: -4 is not a step"),
    ("[components]\na = 'x'\n[[schedule]]\nstep = 0\nweight = { a = 1 }\n",
     "schedule[0].weight: unknown key (a point has step and weights)"),
    ("[components]\na = 'x'\n[[schedule]]\nstep = 0\n",
     "schedule[0].weights: missing or not a table"),
    ("[components]\na = 'x'\nb = 'y'\n[[schedule]]\nstep = 0\nweights = { a = 1, c = 1 }\n",
     "schedule[0].weights.c: no such component (components: a, b)"),
    ("[components]\na = 'x'\nb = 'y'\n[[schedule]]\nstep = 0\nweights = { a = 1 }\n",
     "schedule[0].weights: no weight for component 'b' (give 0 to leave it out"),
    ("[components]\na = 'x'\n[[schedule]]\nstep = 0\nweights = { a = -1 }\n",
     "schedule[0].weights.a: -1 is not a finite weight >= 0"),
    ("[components]\na = 'x'\n[[schedule]]\nstep = 0\nweights = { a = nan }\n",
     "schedule[0].weights.a: nan is not a finite weight"),
    ("[components]\na = 'x'\n[[schedule]]\nstep = 0\nweights = { a = inf }\n",
     "schedule[0].weights.a: inf is not a finite weight"),
    ("[components]\na = 'x'\n[[schedule]]\nstep = 0\nweights = { a = '1' }\n",
     "schedule[0].weights.a: '1' is not a number"),
    ("[components]\na = 'x'\n[[schedule]]\nstep = 0\nweights = { a = true }\n",
     "schedule[0].weights.a: True is not a number"),
    ("[components]\na = 'x'\nb = 'y'\n[[schedule]]\nstep = 0\nweights = { a = 1, b = 0 }\n"
     "[[schedule]]\nstep = 9\nweights = { a = 0, b = 0 }\n",
     "schedule[1].weights: every weight is 0"),
    ("[components]\na = 'x'\nb = 'y'\n[[schedule]]\nstep = 0\nweights = { a = 1, b = 0 }\n",
     "components.b: weight 0 at every point of the schedule"),
    ("[components]\na = 'x'\nb = 'y'\n[[schedule]]\nstep = 0\n"
     "weights = { a = 1e308, b = 1e308 }\n", "schedule[0].weights: the weights' sum overflows"),
    ("[components\na = 'x'\n", "not TOML ("),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_files_are_one_line_naming_the_file_and_key(tmp_path: Path, text: str,
                                                        message: str) -> None:
    path = _write(tmp_path / "m.toml", text)
    with pytest.raises(MixtureFileError) as caught:
        read_mixture_file(path)
    line = str(caught.value)
    assert line.startswith(f"mixture file {path}: ") and "\n" not in line
    assert message in line, line
    assert isinstance(caught.value, ConfigError)  # the CLI's one-line errors


def test_what_is_not_a_readable_regular_file_is_refused_by_name(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    cases = {str(fifo): "is a FIFO (named pipe), not a regular file",
             str(tmp_path): "is a directory, not a regular file",
             str(tmp_path / "nope.toml"): "cannot read",
             _write(tmp_path / "big.toml", "#" * (2 << 20)): "longer than",
             str(tmp_path / "latin1.toml"): "not UTF-8 text"}
    (tmp_path / "latin1.toml").write_bytes(b"# caf\xe9\n")
    for path, message in cases.items():
        with pytest.raises(MixtureFileError,
                           match=f"^mixture file {re.escape(path)}: .*{re.escape(message)}"):
            read_mixture_file(path)


def test_the_cli_says_one_line_and_makes_no_run_dir(tmp_path: Path, capsys) -> None:
    from trainer.cli import main

    path = _write(tmp_path / "m.toml", "[components]\na = 'x'\n")
    assert main(["--mixture", path, "--run-dir", str(tmp_path / "run"), "--device",
                 "cpu"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: mixture file {path}: schedule: missing or empty: one or more " \
                  "[[schedule]] tables, each with step and weights\n"
    assert not (tmp_path / "run").exists()
    good = _write(tmp_path / "g.toml", GOOD.format(a=tmp_path / "no-a", b=tmp_path / "no-b",
                                                   ramp_end=10))
    assert main(["--mixture", good, "--run-dir", str(tmp_path / "run"), "--device",
                 "cpu"]) == 2
    assert "error: no dataset" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_meter_gives_each_interval_s_shares() -> None:
    """Sample ids below 100 are component 0's, the rest component 1's (a mixture's offsets)."""
    meter = MixtureMeter(["a", "b"], lambda ids: (ids >= 100).astype(np.int64),
                         lambda first, end: [0.9 - 0.01 * first, 0.1 + 0.01 * first])
    meter.add(torch.tensor([[1, 2, 150, 3]]))
    meter.add(torch.tensor([5, 6, 7, 101]))
    got = meter.interval(0, 2, torch.device("cpu"))
    assert got == {"mixture": {"a": 0.75, "b": 0.25}, "mixture_scheduled": {"a": 0.9, "b": 0.1}}
    meter.add(torch.tensor([100, 101]))
    assert meter.interval(2, 3, torch.device("cpu"))["mixture"] == {"a": 0.0, "b": 1.0}


def test_the_plot_draws_shares_beside_the_imbalance_panel(tmp_path: Path) -> None:
    from trainer.imbalance import analyze, record
    from trainer.metrics import JsonlWriter
    from trainer.plot import plot_run

    with JsonlWriter(tmp_path / "metrics.jsonl") as w:
        for step in (10, 20, 30):
            web = 0.9 - step / 100
            w.write({"step": step, "loss": 3.0, "tokens_per_s": 100.0, "data_wait_frac": 0.1,
                     "data_wait_frac_max": 0.2, "mixture": {"web": web, "code": 1 - web},
                     "mixture_scheduled": {"web": web + 0.01, "code": 0.99 - web}})
            w.write(record(analyze([[10, 0.1, 0.5, 0.1, 0.2, 1.0],
                                    [10, 0.9, 0.5, 0.1, 0.0, 1.0]], step)))
    out = plot_run(tmp_path)
    assert out.stat().st_size > 10_000


# -- real runs ------------------------------------------------------------------------------

RAMP_END, STEPS = 16, 40  # the tiny mixture's epoch is 33 steps: the run crosses one


@pytest.fixture(scope="module")
def mixture_file(tiny_vocab_dataset: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("mixture")
    return _write(root / "mix.toml", GOOD.format(a=tiny_vocab_dataset, b=tiny_vocab_dataset,
                                                 ramp_end=RAMP_END))


@pytest.fixture(scope="module")
def straight(mixture_file: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted single-process run over the ramp, a record every 4 steps."""
    run_dir = tmp_path_factory.mktemp("straight")
    run_trainer(["--mixture", mixture_file, "--steps", str(STEPS), "--log-every", "4",
              "--run-dir", str(run_dir), "--deterministic", *MODEL])
    return run_dir


def test_a_mixture_run_logs_its_shares_and_plots_them(straight: Path, mixture_file: str
                                                      ) -> None:
    from trainer.cli import main as cli_main

    records = [r for r in read_jsonl(straight / "metrics.jsonl") if "kind" not in r]
    assert [r["step"] for r in records] == list(range(4, STEPS + 1, 4))
    expected = read_mixture_file(mixture_file)
    for r in records:  # 4 steps of 8 samples: within 4 samples of the schedule
        assert set(r["mixture"]) == set(r["mixture_scheduled"]) == {"web", "code"}
        assert sum(r["mixture"].values()) == pytest.approx(1.0)
        assert abs(r["mixture"]["web"] - r["mixture_scheduled"]["web"]) <= 4 / 32 + 1e-9
    assert records[0]["mixture_scheduled"]["web"] == pytest.approx(0.9 - 0.4 * 1.5 / 16)
    assert records[-1]["mixture"] == records[-1]["mixture_scheduled"] == {"web": 0.5,
                                                                          "code": 0.5}
    assert records[-1]["epoch"] == 1  # the ramp continued into the next epoch
    config = json.loads((straight / "config.json").read_text())
    assert config["train"]["mixture"] == mixture_file and config["train"]["data"] is None
    assert config["mixture"] == expected.record()
    assert cli_main(["plot", str(straight), "--out", str(straight / "plot.png")]) == 0
    assert (straight / "plot.png").read_bytes().startswith(b"\x89PNG")


def test_a_resume_mid_ramp_on_another_world_size_trains_the_same_batches(
        straight: Path, mixture_file: str, tmp_path: Path) -> None:
    """Two ranks under torchrun to step 8 (mid-ramp), a checkpoint; one process from there:
    every step's samples are the straight run's."""
    run_dir, ck = tmp_path / "run", tmp_path / "ck"
    common = ["--mixture", mixture_file, "--log-every", "4", "--run-dir", str(run_dir),
              "--checkpoint-dir", str(ck), "--checkpoint-every", "8", "--deterministic",
              *MODEL]
    run_trainer([*common, "--steps", "8"], nproc=2)
    proc = run_trainer([*common, "--steps", str(STEPS)])
    assert "resumed from" in proc.stdout and "at step 8" in proc.stdout

    def by_step(path: Path) -> dict[int, list[int]]:
        return {r["step"]: r["sample_ids"] for r in read_jsonl(path)}

    want = by_step(straight / "rank0_samples.jsonl")
    r0, r1 = by_step(run_dir / "rank0_samples.jsonl"), by_step(run_dir / "rank1_samples.jsonl")
    assert sorted(r1) == list(range(1, 9))
    got = {s: r0[s] + r1.get(s, []) for s in r0}
    assert got == want
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "kind" not in r]
    assert [r["step"] for r in records] == list(range(4, STEPS + 1, 4))
    assert all("mixture" in r for r in records)
