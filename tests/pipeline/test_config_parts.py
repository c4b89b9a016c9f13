"""PipelineConfig is composed of the small flag dataclasses that live next to their code: the
flags are the same flat set, each declared once, each part checking its own."""

from __future__ import annotations

from dataclasses import fields

import pytest

from pipeline.config import _PARTS, PipelineConfig, cli_fields
from pipeline.dedup.flags import DedupFlags
from pipeline.output.shards import ShardFlags
from pipeline.steps.cleaning import CleaningFlags
from pipeline.steps.web import PiiFlags

#: where each part is declared: next to the code it configures
HOMES = {"CleaningFlags": "pipeline.steps.cleaning", "LanguageFlags": "pipeline.steps.web",
         "UrlBlocklistFlags": "pipeline.steps.web", "PiiFlags": "pipeline.steps.web",
         "DecontaminateFlags": "pipeline.steps.decontaminate",
         "RuleSetFlags": "pipeline.steps.rules", "RecipeFlags": "pipeline.steps.recipe",
         "DedupFlags": "pipeline.dedup.flags", "TokenizerFlags": "pipeline.tasks.tokenizing",
         "ShardFlags": "pipeline.output.shards", "CarbonFlags": "pipeline.driver.carbon",
         "RecordLimitFlags": "pipeline.tasks.record_steps", "InputFlags": "pipeline.config",
         "ExecutionFlags": "pipeline.config", "OutputFlags": "pipeline.config"}


def test_every_field_comes_from_exactly_one_part() -> None:
    own = [f.name for part in _PARTS for f in fields(part)]
    assert len(own) == len(set(own)), "a flag is declared by two parts"
    assert [f.name for f in fields(PipelineConfig)] == own  # and in the parts' order
    assert {p.__name__: p.__module__ for p in _PARTS} == HOMES
    assert set(_PARTS) == set(PipelineConfig.__mro__[1:-1])


def test_the_step_flags_keep_their_names() -> None:
    names = {f.name for f in cli_fields()}
    for flag in ("fix_mojibake", "min_chars", "max_chars", "min_alpha_frac",
                 "max_repeated_line_frac", "languages", "min_lang_score", "filters",
                 "filter_options", "annotate", "url_blocklist", "pii", "steps", "dedup",
                 "near_dup", "dedup_signals", "tokenizer", "row_group_tokens",
                 "shard_compression", "record_cpu_s", "carbon_signal"):
        assert flag in names


@pytest.mark.parametrize(("part", "options", "message"), [
    (DedupFlags, {"dedup": "fuzzy"}, "dedup must be 'exact' or 'none'"),
    (DedupFlags, {"dedup": "none", "dedup_signals": True}, "nothing to count"),
    (ShardFlags, {"shard_compression": "gzip"}, "shard compression must be one of"),
    (PiiFlags, {"pii": "hash"}, "pii must be 'mask' or 'none'"),
])
def test_a_part_checks_its_own_flags_alone_and_in_the_config(part, options, message) -> None:
    checks = [getattr(part, n) for n in vars(part) if n.startswith("check_")]
    with pytest.raises(ValueError, match=message):
        for check in checks:
            check(part(**options))
    with pytest.raises(ValueError, match=message):
        PipelineConfig(**options)


def test_a_part_gives_its_code_what_it_needs() -> None:
    cfg = PipelineConfig(min_chars=7, max_repeated_line_frac=0.5)
    assert cfg.cleaning == CleaningFlags(min_chars=7, max_repeated_line_frac=0.5).cleaning
    assert cfg.cleaning.min_chars == 7
