"""``trainer.json`` and the RNG files of a checkpoint are outside input: nonsense in them fails
a resume with one line naming the file and the field, rc != 0 — never a traceback, and never
a run that "finishes" 0 steps with rc 0. Checked on the functions and through the real CLI
(``python -m trainer`` on a checkpoint it wrote itself, then damaged)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loaders.state import LoaderStateError, progress_from_state
from tests._forked_python import ForkedPython
from trainer.checkpoint.checkpointer import FORMAT_VERSION, rng_state
from trainer.checkpoint.files import CheckpointFileError, check_rng_state, check_trainer_state

REPO = Path(__file__).resolve().parents[3]
GOOD_TRAINER = {"format": FORMAT_VERSION, "step": 4, "world_size": 1, "global_batch_size": 4,
                "batch_size": 4, "seq_len": 32, "seed": 0,
                "stream": {"epoch": 1, "batches_in_epoch": 1, "loader": {"version": 2}},
                "scheduler": {"last_epoch": 4, "_step_count": 5, "base_lrs": [0.003],
                              "_last_lr": [0.002]}}


def _set(path: str, value: Any) -> Callable[[dict], None]:
    def edit(obj: dict) -> None:
        *parents, last = path.split(".")
        for p in parents:
            obj = obj[p]
        if value is _DELETE:
            del obj[last]
        else:
            obj[last] = value
    return edit


_DELETE = object()


@pytest.mark.parametrize(("edit", "field"), [
    (_set("step", 10**30), "'step'"), (_set("step", -1), "'step'"), (_set("step", "4"), "'step'"),
    (_set("step", 4.0), "'step'"), (_set("step", True), "'step'"),
    (_set("step", _DELETE), "'step'"),
    (_set("step", 5), "directory is step 4"), (_set("step", 3), "directory is step 4"),
    (_set("format", 2), "format 2"), (_set("seq_len", 0), "'seq_len'"),
    (_set("stream", []), "'stream'"), (_set("stream.epoch", -3), "'stream.epoch'"),
    (_set("stream.batches_in_epoch", None), "'stream.batches_in_epoch'"),
    (_set("stream.loader", "x"), "'stream.loader'"),
    (_set("scheduler.last_epoch", 7), "'scheduler.last_epoch'"),
    (_set("scheduler.base_lrs", ["nan"]), "'scheduler.base_lrs'"),
    (_set("scheduler.base_lrs", [float("inf")]), "'scheduler.base_lrs'"),
])
def test_trainer_state_nonsense_is_named(edit: Callable[[dict], None], field: str) -> None:
    assert check_trainer_state(copy.deepcopy(GOOD_TRAINER), "ck/trainer.json",
                               format_version=FORMAT_VERSION, dir_step=4, max_step=10) == 4
    state = copy.deepcopy(GOOD_TRAINER)
    edit(state)
    with pytest.raises(CheckpointFileError, match=rf"^ck/trainer\.json: .*{field}"):
        check_trainer_state(state, "ck/trainer.json", format_version=FORMAT_VERSION,
                            dir_step=4, max_step=10)


def test_a_checkpoint_past_the_runs_end_is_refused() -> None:
    with pytest.raises(CheckpointFileError, match="past this run's --steps 3"):
        check_trainer_state(copy.deepcopy(GOOD_TRAINER), "t", format_version=FORMAT_VERSION,
                            max_step=3)


@pytest.mark.parametrize(("edit", "field"), [
    (_set("torch", "AAAA"), "'torch' holds 3 bytes"), (_set("torch", "!!"), "'torch' is not"),
    (_set("torch", 5), "'torch'"), (_set("cuda", ["AAAA"]), "'cuda\\[0\\]'"),
    (_set("cuda", {}), "'cuda'"), (_set("numpy.bit_generator", "PCG64"), "bit_generator"),
    (_set("numpy.key", [1, 2, 3]), "'numpy.key' holds 3"), (_set("numpy.pos", 625), "'numpy.pos'"),
    (_set("numpy.has_gauss", 2), "'numpy.has_gauss'"), (_set("numpy.gauss", None), "gauss"),
    (_set("python", [3, [0] * 625]), "'python'"), (_set("python", [2, [0] * 625, None]),
                                                   "'python\\[0\\]'"),
    (_set("python", [3, [0] * 624 + [625], None]), "'python\\[1\\]\\[-1\\]'"),
    (_set("python", [3, [-1] + [0] * 624, None]), "'python\\[1\\]' holds -1"),
    (_set("numpy", _DELETE), "'numpy' is missing"),
])
def test_rng_nonsense_is_named(edit: Callable[[dict], None], field: str) -> None:
    good = json.loads(json.dumps(rng_state()))
    check_rng_state(copy.deepcopy(good), "ck/rng/rank00000.json")
    edit(good)
    with pytest.raises(CheckpointFileError, match=rf"^ck/rng/rank00000\.json: .*{field}"):
        check_rng_state(good, "ck/rng/rank00000.json")


@pytest.mark.parametrize("state", [
    {"epoch": "1", "lane_pos": 0, "into_step": 0}, {"epoch": 0, "lane_pos": -4, "into_step": 0},
    {"epoch": 0, "lane_pos": 0}, {"epoch": 0, "lane_pos": 0, "into_step": 1,
                                  "mid_step_layout": [0, 4]},
    {"epoch": 0, "lane_pos": 2**60, "into_step": 0},
    {"epoch": 0, "lane_pos": 0, "into_step": 1, "mid_step_layout": "ab"},
])
def test_loader_progress_nonsense_is_a_loader_state_error(state: dict) -> None:
    with pytest.raises(LoaderStateError, match="loader state field"):
        progress_from_state(state)


# -- through the real CLI ------------------------------------------------------------------

TRAINER_ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ARGS = ["--layers", "1", "--width", "16", "--heads", "2", "--seq-len", "32", "--batch-size", "4",
        "--device", "cpu", "--warmup-steps", "1", "--log-every", "2", "--checkpoint-every", "2"]


def trainer(data: str, ck: Path, run: Path, steps: int,
            forked: ForkedPython | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m trainer`` resuming from ``ck``: a fresh interpreter, or a child forked
    from ``forked`` (torch and the trainer imported once for the many damaged resumes)."""
    argv = ["-m", "trainer", "--data", data, "--steps", str(steps), "--checkpoint-dir",
            str(ck), "--resume", "auto", "--run-dir", str(run), *ARGS]
    if forked is not None:
        return forked.run(argv, cwd=REPO, timeout=300)
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=TRAINER_ENV,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkedPython]:
    server = ForkedPython(["trainer.train", "trainer.config",
                           "trainer.checkpoint.checkpointer", "storage"],
                          env=TRAINER_ENV)
    yield server
    server.close()


@pytest.fixture(scope="module")
def written(tiny_vocab_dataset: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint directory with step-00000002 and step-00000004, written by the CLI."""
    root = tmp_path_factory.mktemp("written")
    proc = trainer(tiny_vocab_dataset, root / "ck", root / "run", 4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "ck"


def _json_edit(relative: str, edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(step: Path) -> None:
        obj = json.loads((step / relative).read_text())
        edit(obj)
        (step / relative).write_text(json.dumps(obj))
    return apply


@pytest.mark.parametrize(("damage", "expected"), [
    (_json_edit("trainer.json", _set("step", 10**30)), "trainer.json: field 'step' is 1000"),
    (_json_edit("trainer.json", _set("stream.epoch", "one")), "field 'stream.epoch'"),
    (_json_edit("trainer.json", _set("stream.loader.lane_pos", "x")),
     "field 'stream.loader': loader state field 'lane_pos'"),
    (lambda step: (step / "trainer.json").write_text('{"format": 1, "step": '),
     "trainer.json: not JSON"),
    (_json_edit("rng/rank00000.json", _set("torch", "AAAA")),
     "rng/rank00000.json: field 'torch' holds 3 bytes"),
    (_json_edit("rng/rank00000.json", _set("python", [3, [7] * 10, None])),
     "rng/rank00000.json: field 'python[1]' holds 10"),
])
def test_resume_on_a_damaged_file_fails_with_one_line(
        written: Path, tiny_vocab_dataset: str, forked: ForkedPython, tmp_path: Path,
        damage: Callable[[Path], None], expected: str) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(written, ck)
    damage(ck / "step-00000004")
    proc = trainer(tiny_vocab_dataset, ck, tmp_path / "run", 8, forked)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], proc.stderr[-3000:]
    assert "done:" not in proc.stdout
