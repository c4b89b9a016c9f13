"""The one interface every step between reading and tokenizing has, built-in or a user's.

A step is a class built with its recipe entry's options as keyword arguments, with two class
attributes, ``name`` and ``version`` (strings: the version enters the partition keys, so a
changed step redoes its partitions on a rerun and an unchanged one reuses them), called with
one :class:`Doc` and returning:

- the document (kept; its ``text`` may have been replaced, ``signals`` added to),
- ``None`` (dropped, counted as ``<name>``), or
- ``(None, "reason")`` (dropped, counted as ``<name>.<reason>``).

A built-in step may also have ``report()``: what it found worth naming beyond counts, as
``{key: {"documents": int, "examples": [JSON objects]}}`` (``decontaminate``: per eval set, the
documents hit and the first of them with their matched n-grams); phase 1 sends it to the driver
with the partition's counts, which merges the partitions' in partition order
(:func:`merge_reports`).

Optional: a ``signals`` class attribute (``{"key": int | float | str | bool}``) declares the
signals a step may write (needed only for a key that the first documents of a shard may not
have: the shard's columns are fixed at its first batch), and ``close()``, called once the
step's partition is done. Why this small: a step is written in minutes, by people who know
their filter, not this pipeline; and whatever a step does, the pipeline alone decides the
bytes of the shard (its order, columns and types), so determinism does not depend on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

#: the Python types a signal may have, and the Parquet (Arrow) type of its column
SIGNAL_TYPES: dict[type, str] = {bool: "bool", int: "int64", float: "double", str: "string"}
#: examples a step's report keeps per key (the first ones, in partition and document order)
REPORT_EXAMPLES = 100
#: the keys of ``Doc.meta``
META_KEYS = ("url", "date", "source", "kind", "lang", "lang_score")


class StepError(RuntimeError):
    """A step broke its contract (returned something else, wrote a signal of another type
    than before, cannot be imported or built); the message names the step."""


class Doc:
    """One document as a step sees it.

    ``id``: the document id (``file:line``, ``file@offset``, or ``--id-field``'s value);
    ``text``: its text (a step may replace it with another ``str``); ``meta``: a read-only
    mapping of ``url``, ``date``, ``source``, ``kind``, ``lang``, ``lang_score`` (``None``
    where unknown); ``signals``: a dict a step adds ``int``, ``float``, ``str`` or ``bool``
    values to under its own keys, written as the columns ``<step name>.<key>``.
    """

    __slots__ = ("_meta", "_view", "id", "signals", "text")

    def __init__(self, doc_id: str, text: str, meta: dict[str, Any] | None = None) -> None:
        self.id = doc_id
        self.text = text
        if meta is None or len(meta) != len(META_KEYS):
            meta = dict.fromkeys(META_KEYS) | (meta or {})
        self._meta: dict[str, Any] = meta
        self.signals: dict[str, Any] = {}
        #: the pipeline's rule sets share one word split of the text while it is unchanged
        self._view: Any = None

    @property
    def meta(self) -> Mapping[str, Any]:
        return MappingProxyType(self._meta)

    def set_meta(self, key: str, value: Any) -> None:
        """For the pipeline's own steps (language ID sets ``lang``); a user step reads."""
        self._meta[key] = value

    def __repr__(self) -> str:
        return f"Doc(id={self.id!r}, text={self.text[:40]!r}..., signals={self.signals!r})"


def signal_type(step: str, key: str, value: Any) -> type:
    """The signal type of ``value`` (``bool`` before ``int``: a bool is an int in Python; a
    numpy float64 is a float); :class:`StepError` naming the step and key for anything else."""
    for kind in SIGNAL_TYPES:
        if isinstance(value, kind):
            return kind
    raise StepError(f"step {step!r} wrote signal {key!r} of type {type(value).__name__}; "
                    "a signal is an int, float, str or bool")


class Poisoned(Exception):
    """A record refused by a limit or by a step that raised on it: quarantined under
    ``reason`` with ``detail`` (the run goes on; ``--strict`` stops at it)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def merge_reports(into: dict[str, Any], more: dict[str, Any],
                  limit: int = REPORT_EXAMPLES) -> dict[str, Any]:
    """``more`` (one step's report of a later partition) folded into ``into``: documents
    summed per key, examples appended up to ``limit`` (``into``'s first). Returns ``into``."""
    for key, part in more.items():
        mine = into.setdefault(key, {"documents": 0, "examples": []})
        mine["documents"] += int(part.get("documents", 0))
        room = limit - len(mine["examples"])
        if room > 0:
            mine["examples"].extend(list(part.get("examples", []))[:room])
    return into
