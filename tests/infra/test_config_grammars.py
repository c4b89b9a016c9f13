"""The small grammars of flag values (``--adapt MIN:MAX``, comma lists, a JSON object) are
parsed by the config layer's types (infra/config.py): the dataclass gets the typed value from
a flag, a ``--config`` file or the environment alike, and a bad value is one error line that
names the flag; the manifest records them as the text it always had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.config import byte_size, comma_list, json_object_text, min_max
from pipeline.cli import config_from_argv
from pipeline.config import PipelineConfig


def test_the_grammars() -> None:
    assert min_max("1:8") == (1, 8) and min_max("0:1") == (0, 1)
    for bad in ("3", "4:2", "-1:2", "0:0", "a:b", "1:2:3", ""):
        with pytest.raises(ValueError, match="MIN:MAX"):
            min_max(bad)
    assert comma_list(" en, de,,fr ") == ("en", "de", "fr") and comma_list("") == ()
    assert comma_list(["en", "de,fr"]) == ("en", "de", "fr")  # a config file's list
    assert json_object_text('{"a.b": 1}') == {"a.b": 1}
    with pytest.raises(ValueError, match="not JSON"):
        json_object_text("{x")
    with pytest.raises(ValueError, match="expected a JSON object"):
        json_object_text("[1]")
    assert byte_size("16G") == 16 << 30 and byte_size("500m") == 500 << 20
    assert byte_size("1024") == 1024
    for bad in ("0", "-1G", "lots", "inf", "nan", ""):
        with pytest.raises(ValueError):
            byte_size(bad)


def test_the_trainer_sizes_are_typed_by_the_same_layer(capsys: pytest.CaptureFixture[str]) -> None:
    from trainer.config import parse_args

    assert parse_args(["--data", "d", "--cache-bytes", "2G"]).cache_bytes == 2 << 30
    with pytest.raises(SystemExit) as caught:
        parse_args(["--data", "d", "--readahead-bytes", "inf"])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and err.startswith("error: Invalid value for --readahead-bytes")


def test_flags_file_and_environment_give_typed_values(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config_from_argv(["--adapt", "1:4", "--languages", "en, de", "--filters", "gopher,c4",
                            "--filter-options", '{"c4.filter_no_terminal_punct": false}',
                            "--annotate", "fineweb"])
    assert cfg.adapt_range == (1, 4) and cfg.languages == ("en", "de")
    assert cfg.filters == ("gopher", "c4") and cfg.annotate == ("fineweb",)
    assert cfg.filter_options == {"c4.filter_no_terminal_punct": False}
    toml = tmp_path / "c.toml"
    toml.write_text('adapt = "0:2"\nlanguages = ["en", "de"]\nfilters = "c4"\n'
                    'filter_options = { "c4.filter_no_terminal_punct" = false }\n')
    cfg = config_from_argv(["--config", str(toml)])
    assert (cfg.adapt, cfg.languages, cfg.filters) == ((0, 2), ("en", "de"), ("c4",))
    assert cfg.filter_options == {"c4.filter_no_terminal_punct": False}
    monkeypatch.setenv("SHARDFLOW_PIPELINE_LANGUAGES", "fr,it")
    monkeypatch.setenv("SHARDFLOW_PIPELINE_ADAPT", "2:3")
    cfg = config_from_argv([])
    assert (cfg.adapt, cfg.languages) == ((2, 3), ("fr", "it"))


@pytest.mark.parametrize(("flag", "value"), [
    ("--adapt", "3"), ("--filter-options", "{x"), ("--filter-options", "[1]"),
])
def test_a_bad_value_is_one_line_naming_the_flag(
        flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        config_from_argv([flag, value])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: Invalid value for {flag}: "), err


def test_python_callers_may_still_give_the_text() -> None:
    cfg = PipelineConfig(adapt="1:2", languages="en, DE", filters="gopher", annotate="c4",
                         filter_options='{"gopher_quality.min_doc_words": 20}')
    assert cfg.adapt == (1, 2) and cfg.languages == ("en", "DE")
    assert cfg.language_codes == ("de", "en")
    assert cfg.filter_options == {"gopher_quality.min_doc_words": 20}
    with pytest.raises(ValueError, match="MIN:MAX"):
        PipelineConfig(adapt="3")


def test_the_manifest_records_the_text_it_always_had() -> None:
    """Typed in the config, recorded as before: a rerun's record (and the partition keys
    hashed from it) keeps its bytes."""
    options = {"gopher_quality.min_doc_words": 20}
    recorded = PipelineConfig(languages="en,de", filters="gopher", annotate="c4",
                              filter_options=json.dumps(options)).for_manifest()
    assert recorded["languages"] == "en,de" and recorded["filters"] == "gopher"
    assert recorded["filter_options"] == json.dumps(options)
    plain = PipelineConfig(url_blocklist="x").for_manifest()
    assert plain["filters"] == "" and plain["languages"] is None
    assert plain["filter_options"] is None
