"""The shared configuration mechanism (infra/config.py): one config-file loader for TOML,
YAML and JSON, the --storage-options converter, the environment names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.config import (
    STORAGE_OPTIONS_ENV,
    OptionsError,
    env_prefix,
    json_object,
    load_config_file,
    storage_options_default,
)

SECRET = "hunter2-" + "y" * 24
KNOWN = {"min_chars", "text_field", "inputs"}


@pytest.mark.parametrize("name, text", [
    ("c.toml", 'min-chars = 3\ntext_field = "body"\ninputs = ["a", "b"]\n'),
    ("c.yaml", "min-chars: 3\ntext_field: body\ninputs: [a, b]\n"),
    ("c.yml", "min-chars: 3\ntext_field: body\ninputs:\n  - a\n  - b\n"),
    ("c.json", '{"min-chars": 3, "text_field": "body", "inputs": ["a", "b"]}'),
])
def test_one_loader_for_toml_yaml_json(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert load_config_file(str(path), KNOWN) == {
        "min_chars": 3, "text_field": "body", "inputs": ["a", "b"]}


def test_unknown_keys_and_bad_files_are_errors_naming_them(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("min_chars: 3\nmin_charz: 4\n")
    with pytest.raises(ValueError, match=r"unknown key 'min_charz' \(known: inputs, min_chars, "
                                         r"text_field\)"):
        load_config_file(str(path), KNOWN)
    path.write_text("- a list\n")
    with pytest.raises(ValueError, match="expected a table"):
        load_config_file(str(path), KNOWN)
    path.write_text("a: [\n")
    with pytest.raises(ValueError, match=str(path)):
        load_config_file(str(path), KNOWN)
    with pytest.raises(ValueError, match="missing.toml"):
        load_config_file(str(tmp_path / "missing.toml"), KNOWN)


def test_storage_options_inline_file_and_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = {"key": "k", "secret": SECRET}
    f = tmp_path / "opts.json"
    f.write_text(json.dumps(opts))
    assert json_object(json.dumps(opts)) == opts and json_object(f"@{f}") == opts
    monkeypatch.delenv(STORAGE_OPTIONS_ENV, raising=False)
    assert storage_options_default({}) == {}
    monkeypatch.setenv(STORAGE_OPTIONS_ENV, f'["{SECRET}"]')
    with pytest.raises(OptionsError) as caught:
        json_object(storage_options_default())
    assert f"${STORAGE_OPTIONS_ENV} must be a JSON object" in str(caught.value)
    assert SECRET not in str(caught.value)
    with pytest.raises(OptionsError) as caught:
        json_object(f'{{"secret": "{SECRET}"')
    assert "is not valid JSON" in str(caught.value) and SECRET not in str(caught.value)


def test_environment_names() -> None:
    assert env_prefix("pipeline") == "SHARDFLOW_PIPELINE_"
    assert env_prefix("trainer") == "SHARDFLOW_TRAINER_"
    assert STORAGE_OPTIONS_ENV == "SHARDFLOW_STORAGE_OPTIONS"
