"""Config: flags, config-file keys and environment overrides are the same names; precedence
flags > --config file > environment > defaults; what the manifest records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import config_from_argv
from pipeline.config import PipelineConfig, cli_fields


def _help(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "pipeline", *args, "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_every_config_key_is_a_documented_flag() -> None:
    help_text = _help("run")
    for f in cli_fields():
        assert "--" + f.name.replace("_", "-") in help_text, f.name
        if f.type == "bool":
            assert "--no-" + f.name.replace("_", "-") in help_text, f.name
    for flag in ("INPUT", "--config", "--output", "-o", "--replica", "--replica-config",
                 "--storage-options", "--no-progress"):
        assert flag in help_text
    assert "--no-no-progress" not in help_text


def test_toml_then_flags(tmp_path: Path) -> None:
    toml = tmp_path / "pipeline.toml"
    toml.write_text('inputs = ["a/*.jsonl"]\noutput = "out/ds"\ntext-field = "body"\n'
                    'near_dup = true\nmin-chars = 20\nworkers = 3\n'
                    'storage_options = { key = "AKIA", secret = "s3cr3t" }\n')
    cfg = config_from_argv(["--config", str(toml), "--min-chars", "5", "--no-near-dup"])
    assert cfg.inputs == ["a/*.jsonl"] and cfg.text_field == "body"
    assert cfg.min_chars == 5 and cfg.near_dup is False and cfg.workers == 3
    assert cfg.output.endswith("out/ds")
    assert cfg.storage_options == {"key": "AKIA", "secret": "s3cr3t"}
    recorded = cfg.for_manifest()
    assert recorded["text_field"] == "body" and recorded["min_chars"] == 5
    text = repr(recorded)
    for secret_or_volatile in ("s3cr3t", "AKIA", "workers", "scheduler", "dashboard", "retries"):
        assert secret_or_volatile not in text


@pytest.mark.parametrize("suffix", [".toml", ".yaml", ".json"])
def test_precedence_flags_file_environment_defaults(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str) -> None:
    values = {"min-chars": 20, "text_field": "body", "inputs": ["x.jsonl"], "replica": ["r2"]}
    path = tmp_path / f"pipeline{suffix}"
    if suffix == ".toml":
        path.write_text('min-chars = 20\ntext_field = "body"\ninputs = ["x.jsonl"]\n'
                        'replica = ["r2"]\n')
    elif suffix == ".yaml":
        path.write_text("min-chars: 20\ntext_field: body\ninputs: [x.jsonl]\nreplica: [r2]\n")
    else:
        path.write_text(json.dumps(values))
    monkeypatch.setenv("SHARDFLOW_PIPELINE_MIN_CHARS", "30")
    monkeypatch.setenv("SHARDFLOW_PIPELINE_MAX_CHARS", "500")
    monkeypatch.setenv("SHARDFLOW_PIPELINE_NEAR_DUP", "true")
    default = PipelineConfig()
    # environment over defaults
    cfg = config_from_argv([])
    assert (cfg.min_chars, cfg.max_chars, cfg.near_dup) == (30, 500, True)
    assert cfg.text_field == default.text_field
    # file over environment, environment still over defaults where the file is silent
    cfg = config_from_argv(["--config", str(path)])
    assert (cfg.min_chars, cfg.max_chars, cfg.text_field) == (20, 500, "body")
    assert cfg.inputs == ["x.jsonl"] and cfg.replicas == ["r2"]
    # flags over the file
    cfg = config_from_argv(["--config", str(path), "--min-chars", "5", "y.jsonl",
                            "--replica", "r3", "--no-near-dup"])
    assert (cfg.min_chars, cfg.text_field, cfg.near_dup) == (5, "body", False)
    assert cfg.inputs == ["y.jsonl"] and cfg.replicas == ["r3"]


def test_defaults_are_stated_once() -> None:
    cfg = config_from_argv([])
    assert dict(cfg.for_manifest(), inputs=[]) == PipelineConfig().for_manifest()
    assert cfg.output.endswith("data/shakespeare") and cfg.storage_options == {}


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as caught:
        config_from_argv(list(argv))
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_config_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("no_such_key = 1\n")
    err = _fails(capsys, "--config", str(bad))
    assert "unknown key 'no_such_key'" in err and "min_chars" in err
    bad.write_text("min_chars = [\n")
    assert str(bad) in _fails(capsys, "--config", str(bad))
    assert "--min-chars" in _fails(capsys, "--min-chars", "many")
    assert "--no-such-flag" in _fails(capsys, "--no-such-flag")
    # the config's own checks (__post_init__) also end in one line, not a traceback
    assert "MIN:MAX" in _fails(capsys, "--adapt", "3")
    assert "dedup" in _fails(capsys, "--dedup", "fuzzy")


def test_packing_is_recorded_only_when_not_the_default() -> None:
    """As --inputs-from and --shard-compression: a manifest of files too big to pack is the
    same bytes as before packing existed (a rerun is 'unchanged' and finds its work, whose
    keys hash this record), and a run that asked for other packing says so."""
    assert "files_per_partition" not in PipelineConfig().for_manifest()
    assert PipelineConfig(files_per_partition=1).for_manifest()["files_per_partition"] == 1


@pytest.mark.parametrize("ttl", [2, 0, -1, float("nan"), float("inf"), 301])
def test_a_worker_ttl_out_of_bounds_is_an_error_naming_the_flag(ttl: float) -> None:
    with pytest.raises(ValueError, match="--worker-ttl"):
        PipelineConfig(inputs=["x"], output="/tmp/out", worker_ttl=ttl)
    assert PipelineConfig(inputs=["x"], output="/tmp/out", worker_ttl=5).worker_ttl == 5
