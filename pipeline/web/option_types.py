"""``--filter-options`` values checked against the rule sets' field types, in the driver.

The rule sets (:mod:`pipeline.web.gopher`, ``c4``, ``fineweb``) are frozen dataclasses whose
fields are the options; ``{"gopher_quality.min_doc_words": "many"}`` used to reach the
workers as it was and fail there, a traceback per task. Here each value must be what its
field's annotation says (``int | None``, ``float``, ``bool``, ``tuple[str, ...]``,
``tuple[tuple[int, float], ...]``), and is converted the way the rule expects (a JSON list
becomes a tuple, an int given for a float becomes a float). Numbers must be finite; an n-gram
size (the ``int`` of ``top_n_grams`` and ``dup_n_grams`` pairs) must lie in
:data:`NGRAM_SIZES` (0 looped forever, 10^9 held 10^9 copies of a page's words), and a list
hold at most :data:`MAX_ITEMS` items. Every error names the option and the expected type.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any

#: an n-gram size of ``top_n_grams`` / ``dup_n_grams`` (datatrove's are 2 to 10)
NGRAM_SIZES = range(1, 101)
#: the longest list an option may hold (stop words, n-gram rules)
MAX_ITEMS = 10_000
#: an int option's bound (the rules compare counts and lengths with it)
_INT_LIMIT = 2**63 - 1


class _Wrong(Exception):
    """A value that is not of the expected type."""


def describe(hint: Any) -> str:
    """A type annotation in words: ``int | None`` -> "a whole number or null"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of ({describe(args[0])})"
        return "a list [" + ", ".join(describe(a) for a in args) + "]"
    return {type(None): "null", bool: "true or false", int: "a whole number",
            float: "a finite number", str: "a string"}.get(hint, str(hint))


def _convert(value: Any, hint: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return _convert(value, arg)
            except _Wrong:
                continue
        raise _Wrong
    if hint is type(None):
        if value is None:
            return None
        raise _Wrong
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _Wrong
    if isinstance(value, bool):
        raise _Wrong  # true is no number
    if hint is int:
        if isinstance(value, int) and abs(value) <= _INT_LIMIT:
            return value
        raise _Wrong
    if hint is float:
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
        raise _Wrong
    if hint is str:
        if isinstance(value, str):
            return value
        raise _Wrong
    if origin is tuple and isinstance(value, (list, tuple)) and len(value) <= MAX_ITEMS:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0]) for v in value)
        if len(value) == len(args):
            return tuple(_convert(v, a) for v, a in zip(value, args, strict=True))
    raise _Wrong


def _shown(value: Any) -> str:
    import json

    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def typed_option(key: str, value: Any, rule_set: type) -> Any:
    """``value`` for the option ``key`` (``rule_set.field``) of ``rule_set``, checked and
    converted; ``ValueError`` naming the option and the type expected otherwise."""
    name = key.partition(".")[2]
    hint = typing.get_type_hints(rule_set)[name]
    try:
        out = _convert(value, hint)
    except (_Wrong, RecursionError):
        raise ValueError(f"filter_options: {key} must be {describe(hint)}, not "
                         f"{_shown(value)}") from None
    if name.endswith("_n_grams") and any(n not in NGRAM_SIZES for n, _ in out):
        raise ValueError(f"filter_options: {key}: n-gram sizes must be "
                         f"{NGRAM_SIZES.start} to {NGRAM_SIZES.stop - 1}, not {_shown(value)}")
    return out
