"""Recipes: entries checked with errors naming the entry, the flags' shorthand, a recipe and
step flags together refused, ``[[steps]]`` from a TOML config file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.cli import config_from_argv
from pipeline.config import PipelineConfig
from pipeline.steps.recipe import parse_entries, parse_recipe_json, spec


def test_entries_become_specs_with_their_options() -> None:
    specs = parse_entries([{"use": "clean", "min_chars": 20},
                           {"use": "mypkg.tags:DomainTagger", "mode": "annotate", "top": [1, 2],
                            "weights": {"b": 2, "a": 1}}])
    assert specs[0] == spec("clean", min_chars=20)
    assert specs[1].name == "domain_tagger" and specs[1].mode == "annotate"
    assert specs[1].kwargs() == {"top": [1, 2], "weights": {"a": 1, "b": 2}}
    assert parse_entries([s.as_dict() for s in specs]) == specs  # the manifest's form reads


@pytest.mark.parametrize("entries, message", [
    ({"use": "clean"}, "must be a list of tables"),
    (["clean"], r"steps\[0\] must be a table"),
    ([{"name": "x"}], r"steps\[0\]: 'use' must be"),
    ([{"use": "a b:C"}], r"steps\[0\]: 'use' must be"),
    ([{"use": "clean"}, {"use": "clean", "name": "bad-name"}], r"steps\[1\]: 'name' must be"),
    ([{"use": "c4", "mode": "drop"}], r"steps\[0\]: 'mode' must be 'filter' or 'annotate'"),
    ([{"use": "clean"}, {"use": "clean"}], "step name 'clean' is used twice"),
    ([{"use": "clean", "x": float("nan")}], r"steps\[0\]: options must be JSON values"),
])
def test_a_bad_entry_is_named(entries: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_entries(entries)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=3)
                    | st.dictionaries(st.text(max_size=4), kids, max_size=3), max_leaves=8))
def test_any_json_parses_or_is_one_value_error(value: object) -> None:
    try:
        specs = parse_recipe_json(json.dumps(value))
    except ValueError as exc:
        assert str(exc).startswith("steps")
        return
    assert all(s.use and s.name for s in specs)


def test_the_flags_build_the_default_recipe() -> None:
    assert [s.use for s in PipelineConfig().recipe.steps] == ["clean"]
    web = PipelineConfig(filters="gopher", annotate="c4,fineweb", languages="en", pii="mask",
                         web_inputs=True).recipe
    assert [(s.name, s.mode) for s in web.steps] == [
        ("extract", "filter"), ("clean", "filter"), ("langid", "filter"), ("c4", "annotate"),
        ("fineweb", "annotate"), ("gopher_repetition", "filter"), ("gopher_quality", "filter"),
        ("pii", "filter")]
    assert web.metadata
    with pytest.raises(ValueError, match="--filters and --annotate both name c4"):
        PipelineConfig(filters="c4", annotate="c4")
    with pytest.raises(ValueError, match="unknown rule set in --annotate 'c5'"):
        PipelineConfig(annotate="c5")


def test_a_recipe_and_step_flags_are_not_mixed() -> None:
    steps = json.dumps([{"use": "clean"}])
    assert [s.use for s in PipelineConfig(steps=steps).recipe.steps] == ["clean"]
    with pytest.raises(ValueError, match="--min-chars, --filters: with a recipe"):
        PipelineConfig(steps=steps, min_chars=5, filters="c4")


def test_steps_tables_in_a_toml_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "recipe.toml"
    cfg.write_text('[[steps]]\nuse = "clean"\nmin_chars = 10\n\n'
                   '[[steps]]\nuse = "gopher_quality"\nmode = "annotate"\nname = "gq"\n'
                   'min_doc_words = 20\n')
    recipe = config_from_argv(["--config", str(cfg), "x.txt"]).recipe
    assert [(s.use, s.name, s.mode) for s in recipe.steps] == [
        ("clean", "clean", "filter"), ("gopher_quality", "gq", "annotate")]
    assert recipe.steps[1].kwargs() == {"min_doc_words": 20}
    manifest = config_from_argv(["--config", str(cfg), "x.txt"]).for_manifest()["steps"]
    assert manifest[1] == {"use": "gopher_quality", "name": "gq", "mode": "annotate",
                           "version": "1", "min_doc_words": 20}


def test_inspect_shows_the_recipe_a_step_a_line() -> None:
    from pipeline.cli import _key_values

    text = _key_values({"dedup": "exact", "steps": [
        {"use": "clean", "name": "clean", "mode": "filter", "version": "1", "min_chars": 5},
        {"use": "c4", "name": "c4", "mode": "annotate", "version": "1"}]})
    lines = text.strip("\n").splitlines()
    assert lines[1].split() == ["steps", "2", "steps"]
    assert lines[2].strip() == "clean (clean v1, filter): min_chars=5"
    assert lines[3].strip() == "c4 (c4 v1, annotate)"
    assert "{" not in text
