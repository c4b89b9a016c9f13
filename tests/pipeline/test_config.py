"""Config: flags and TOML keys are the same names; precedence; what the manifest records."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.cli import build_parser, config_from_args
from pipeline.config import PipelineConfig, cli_fields


def _cfg(*argv: str) -> PipelineConfig:
    return config_from_args(build_parser().parse_args(["run", *argv]))


def test_every_config_key_is_a_documented_flag() -> None:
    help_text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()  # type: ignore[union-attr]
    for f in cli_fields():
        assert "--" + f.name.replace("_", "-") in help_text


def test_toml_then_flags(tmp_path: Path) -> None:
    toml = tmp_path / "pipeline.toml"
    toml.write_text('inputs = ["a/*.jsonl"]\noutput = "out/ds"\ntext-field = "body"\n'
                    'near_dup = true\nmin-chars = 20\nworkers = 3\n'
                    'storage_options = { key = "AKIA", secret = "s3cr3t" }\n')
    cfg = _cfg("--config", str(toml), "--min-chars", "5", "--no-near-dup")
    assert cfg.inputs == ["a/*.jsonl"] and cfg.text_field == "body"
    assert cfg.min_chars == 5 and cfg.near_dup is False and cfg.workers == 3
    assert cfg.output.endswith("out/ds")
    recorded = cfg.for_manifest()
    assert recorded["text_field"] == "body" and recorded["min_chars"] == 5
    text = repr(recorded)
    for secret_or_volatile in ("s3cr3t", "AKIA", "workers", "scheduler", "dashboard", "retries"):
        assert secret_or_volatile not in text


def test_config_errors_are_clear(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("no_such_key = 1\n")
    with pytest.raises(ValueError, match="unknown key 'no_such_key'"):
        _cfg("--config", str(bad))
    with pytest.raises(ValueError, match="MIN:MAX"):
        _cfg("--adapt", "3")
    with pytest.raises(ValueError, match="dedup"):
        _cfg("--dedup", "fuzzy")
