"""``--where``: SQL WHERE text through sqlglot into a pyarrow expression, evaluated with SQL's
null rules; everything off the whitelist refused with one error naming it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.select.expression import ExpressionError, parse

SCHEMA = {"lang": pa.string(), "lang_score": pa.float32(), "fasttext.hq": pa.float64(),
          "n": pa.int64(), "flag": pa.bool_(), "input_ids": pa.binary()}
TABLE = pa.table({"lang": ["en", "de", None, "en", "fr"],
                  "lang_score": pa.array([0.9, 0.8, 0.7, 0.2, None], pa.float32()),
                  "fasttext.hq": [0.1, 0.6, 0.9, None, 0.5],
                  "n": [1, 2, 3, 4, None], "flag": [True, False, None, True, False]})


def _keep(text: str) -> list[bool]:
    return parse(text, SCHEMA).keep(TABLE).to_pylist()


@pytest.mark.parametrize("text,want", [
    ("lang = 'en'", [True, False, False, True, False]),
    ("lang <> 'en'", [False, True, False, False, True]),  # NULL <> 'en' is unknown: dropped
    ("lang = 'en' AND lang_score > 0.5", [True, False, False, False, False]),
    ('"fasttext.hq" > 0.5 OR n IN (1, 4)', [True, True, True, True, False]),
    ("fasttext.hq >= 0.5", [False, True, True, False, True]),  # unquoted dotted name
    ("fasttext.hq IS NULL", [False, False, False, True, False]),
    ("lang IS NOT NULL", [True, True, False, True, True]),
    ("n BETWEEN 2 AND 3", [False, True, True, False, False]),
    ("NOT flag", [False, True, False, False, True]),
    ("n * 2 - 1 >= 3 AND -n < 0", [False, True, True, True, False]),
    ("lang LIKE 'e%'", [True, False, False, True, False]),
    ("lang ILIKE 'E_'", [True, False, False, True, False]),
    ("n IN (-1, 2.5, 3)", [False, False, True, False, False]),
    ("lang NOT IN ('en', 'fr')", [False, True, False, False, False]),
    ("(n > 1) AND (n < 4 OR lang = 'en')", [False, True, True, True, False]),
    ("TRUE", [True] * 5),
])
def test_expressions_keep_what_sql_keeps(text: str, want: list[bool]) -> None:
    assert _keep(text) == want


def test_a_selection_reads_only_the_columns_it_names() -> None:
    sel = parse("lang = 'en' AND \"fasttext.hq\" > 0.5 OR lang = 'de'", SCHEMA)
    assert sel.columns == ("lang", "fasttext.hq")
    assert sel.sql == "lang = 'en' AND \"fasttext.hq\" > 0.5 OR lang = 'de'"


@pytest.mark.parametrize("text,message", [
    ("nope = 1", "unknown column 'nope'"),
    ("input_ids = 'x'", "holds the token ids"),
    ("length(lang) > 1", "is not supported"),
    ("CAST(n AS TEXT) = '1'", "is not supported"),
    ("n IN (SELECT 1)", "is not supported"),
    ("SELECT * FROM t", "is not supported"),
    ("lang > 5", "does not evaluate over the columns' types"),
    ("n + 1", "not a condition"),
    ("n >", "cannot parse"),
    ("n IN (n, 1)", "IN takes a list of literals"),
    ("lang LIKE lang", "LIKE takes a string pattern"),
    ("  ", "empty expression"),
    ("__import__('os').system('true')", "is not supported"),
])
def test_bad_expressions_are_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(ExpressionError, match="^--where: .*" + message.replace("(", r"\(")):
        parse(text, SCHEMA)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(-50, 50)),
                          st.sampled_from(["a", "b", "c"])), min_size=1, max_size=30),
       st.integers(-60, 60), st.sampled_from(["a", "b", "c"]), st.booleans())
def test_comparisons_agree_with_python(rows, threshold: int, value: str, use_or: bool) -> None:  # noqa: ANN001
    table = pa.table({"n": [r[0] for r in rows], "s": [r[1] for r in rows]})
    op = "OR" if use_or else "AND"
    sel = parse(f"n > {threshold} {op} s = '{value}'", {"n": pa.int64(), "s": pa.string()})
    want = []
    for n, s in rows:
        left = None if n is None else n > threshold
        right = s == value
        both = (left or right) if use_or else (left and right)
        want.append(bool(both))  # unknown (None) is not kept
    assert sel.keep(table).to_pylist() == want
