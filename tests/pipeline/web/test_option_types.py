"""``--filter-options`` values are checked against the rule sets' field types in the driver
(pipeline/web/option_types.py): a string for a number, a number for a flag, NaN, an n-gram
size of 0 were passed to the workers as they were and failed there (a traceback per task,
or a loop without end for the n-gram size 0)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.cleaning import CleaningConfig
from pipeline.records import Document
from pipeline.steps.chain import StepChain
from pipeline.steps.shorthand import recipe_of
from pipeline.web import parse_filter_options
from pipeline.web.steps import RULE_SETS, WebConfig

REPO = Path(__file__).resolve().parents[3]
PAGE = ("The committee met on Tuesday to review the plan. It agreed that the budget must be "
        "cut... The members will meet again next week, and the week after that.\n" * 6)


def test_values_of_the_right_type_are_taken_and_converted() -> None:
    opts = parse_filter_options(
        '{"gopher_quality.min_doc_words": null, "gopher_quality.min_avg_word_length": 3, '
        '"c4.filter_no_terminal_punct": false, "gopher_repetition.top_n_grams": [[2, 0.3]], '
        '"gopher_quality.stop_words": ["the", "and"]}')
    assert dict(opts) == {
        "gopher_quality.min_doc_words": None, "gopher_quality.min_avg_word_length": 3.0,
        "c4.filter_no_terminal_punct": False, "gopher_repetition.top_n_grams": ((2, 0.3),),
        "gopher_quality.stop_words": ("the", "and")}
    rules = dict(WebConfig(filters=("gopher_quality", "gopher_repetition", "c4"),
                           filter_options=opts).rules())
    assert rules["gopher_repetition"].top_n_grams == ((2, 0.3),)


@pytest.mark.parametrize("text, says", [
    ('{"gopher_quality.min_doc_words": "many"}',
     'gopher_quality.min_doc_words must be a whole number or null, not "many"'),
    ('{"c4.filter_policy": 1}', "c4.filter_policy must be true or false, not 1"),
    ('{"c4.min_num_sentences": true}', "c4.min_num_sentences must be a whole number, not true"),
    ('{"fineweb.line_punct_thr": NaN}', "fineweb.line_punct_thr must be a finite number"),
    ('{"fineweb.new_line_ratio": 1e999}', "fineweb.new_line_ratio must be a finite number"),
    ('{"gopher_quality.stop_words": "the"}', "gopher_quality.stop_words must be a list of"),
    ('{"gopher_repetition.top_n_grams": [[2]]}', "gopher_repetition.top_n_grams must be"),
    ('{"gopher_repetition.dup_n_grams": [[0, 0.1]]}', "n-gram sizes must be 1 to 100"),
    ('{"gopher_repetition.top_n_grams": [[1000000000, 0.1]]}', "n-gram sizes must be 1 to"),
    ('{"c4.max_word_length": ' + "9" * 30 + "}", "c4.max_word_length must be a whole number"),
    ("[" * 100_000, "filter_options: not JSON"),
])
def test_wrong_types_are_errors_naming_the_option(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="^filter_options: ") as err:
        parse_filter_options(text)
    assert says in str(err.value), err.value


def test_a_wrong_type_on_the_command_line_is_one_error_line(tmp_path: Path) -> None:
    """The code before started the run; its workers failed on the value, task after task."""
    (tmp_path / "a.txt").write_text("A page of text that is long enough to be a document.\n")
    out = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(tmp_path / "a.txt"), "--no-progress",
         "-o", str(tmp_path / "ds"), "--workers", "1", "--dashboard-address", "127.0.0.1:0",
         "--retries", "0", "--filters", "gopher",
         "--filter-options", '{"gopher_quality.min_doc_words": "many"}'],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr == ("error: filter_options: gopher_quality.min_doc_words must be a "
                          'whole number or null, not "many"\n'), out.stderr[-3000:]


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4), max_leaves=8)
_KEYS = st.sampled_from(sorted(f"{rule}.{f}" for rule, cls in RULE_SETS.items()
                               for f in cls.__dataclass_fields__))


@settings(max_examples=500, deadline=None)
@given(options=st.dictionaries(_KEYS, _VALUES, max_size=4))
def test_any_option_values_give_rules_that_build_or_one_value_error(options: dict) -> None:
    import json

    try:
        parsed = parse_filter_options(json.dumps(options))
    except ValueError as exc:
        assert str(exc).startswith("filter_options: ")
        return
    steps = StepChain(recipe_of(CleaningConfig(), WebConfig(filters=tuple(RULE_SETS),
                                                            filter_options=parsed)))
    for text in (PAGE, "", "a\n\nb\n\na a a a"):  # what a worker does with them
        steps(Document("id", text, kind="text"))
