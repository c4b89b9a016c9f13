"""Finding and building a recipe entry's step: built-ins by name, users' by import path,
each failure one error naming the step; ``python -m pipeline steps`` lists them all."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.steps.checks import import_steps, resolved
from pipeline.steps.contract import StepError
from pipeline.steps.recipe import Recipe, spec
from pipeline.steps.registry import BUILTINS, build, check_options, step_class

REPO = Path(__file__).resolve().parents[3]
HERE = "tests.pipeline.steps.test_registry"


class NoVersion:
    name = "nv"

    def __call__(self, doc: object) -> object:
        return doc


class NotCallable:
    name = "nc"
    version = "1"


class Loads:
    """Counts how often it is built (a model scorer must not load in the driver)."""

    name = "loads"
    version = "2"
    built = 0

    def __init__(self, model: str) -> None:
        Loads.built += 1

    def __call__(self, doc: object) -> object:
        return doc


@pytest.mark.parametrize("use, message", [
    ("clen", "unknown step 'clen'"),
    ("no_such_module_xyz:Step", "cannot import 'no_such_module_xyz'"),
    (f"{HERE}:Missing", "has no 'Missing'"),
    (f"{HERE}:REPO", "is not a class"),
    (f"{HERE}:NoVersion", "needs a string class attribute 'version'"),
    (f"{HERE}:NotCallable", "is not callable on a document"),
])
def test_a_step_that_cannot_be_found_is_named(use: str, message: str) -> None:
    with pytest.raises(StepError, match=message):
        step_class(use)
    assert message in (import_steps([use]) or "")


def test_options_are_checked_without_building_the_step() -> None:
    entry = spec(f"{HERE}:Loads", model="m.bin")
    before = Loads.built
    assert resolved(Recipe((entry,))) == [{"use": f"{HERE}:Loads", "name": "loads",
                                           "mode": "filter", "model": "m.bin", "version": "2"}]
    assert Loads.built == before
    with pytest.raises(StepError, match=r"step 'loads' \(.*Loads\): bad options: .*'model'"):
        check_options(spec(f"{HERE}:Loads"))
    with pytest.raises(StepError, match="step 'c4' .*unknown option 'nope'"):
        build(spec("c4", nope=1))
    with pytest.raises(StepError, match="step 'clean' .*has no 'annotate' mode"):
        build(spec("clean", mode="annotate"))
    with pytest.raises(StepError, match="step 'langid' .*unknown language code 'xx'"):
        build(spec("langid", languages=["xx"]))


def test_a_built_in_takes_the_recipe_name() -> None:
    step = build(spec("gopher_quality", "gq", "annotate"))
    assert step.name == "gq" and "n_words" in step.signals


def test_the_steps_command_lists_every_built_in_with_options_and_signals() -> None:
    out = subprocess.run([sys.executable, "-m", "pipeline", "steps", "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    entries = {e["name"]: e for e in json.loads(out.stdout)}
    assert set(entries) == set(BUILTINS)
    assert entries["gopher_quality"]["modes"] == ["filter", "annotate"]
    assert entries["gopher_quality"]["signals"]["n_words"] == "int64"
    assert entries["clean"]["options"]["min_chars"] == "1"
    text = subprocess.run([sys.executable, "-m", "pipeline", "steps"], cwd=REPO,
                          capture_output=True, text=True, timeout=120).stdout
    assert "c4.n_sentences (int64)" in text and 'use = "module:Class"' in text
    assert "steps" in subprocess.run([sys.executable, "-m", "pipeline", "--help"], cwd=REPO,
                                     capture_output=True, text=True, timeout=120).stdout
