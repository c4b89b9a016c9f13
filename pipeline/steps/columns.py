"""The columns a shard gets beside ``input_ids``: the web metadata (url, date, source, lang,
lang_score) and the steps' signals (``<step>.<signal>``), gathered per kept document.

A shard's signal columns are fixed at its first batch: the steps' declared signals, then the
keys seen so far in the order first seen. A key a later document adds that is not declared,
or a value of another type than its column's, is a :class:`StepError` naming the step:
a shard's columns and types never depend on which document came first (beyond that batch),
and a type that changes is a bug in the step that the user should hear about."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from pipeline.steps.contract import SIGNAL_TYPES, StepError, signal_type

#: the web metadata columns, in the shard's order
META_COLUMNS = ("url", "date", "source", "lang", "lang_score")
_ARROW = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}


def arrow_type(kind: type) -> pa.DataType:
    return _ARROW[kind]


def type_name(kind: type) -> str:
    return SIGNAL_TYPES[kind]


class Columns:
    """Rows of metadata and signals for the documents kept, taken a batch at a time."""

    def __init__(self, metadata: bool, declared: dict[str, type] | None = None) -> None:
        self.metadata = metadata
        self.types: dict[str, type] = dict(declared or {})
        self.fixed = False
        self._meta: list[list[Any]] = [[] for _ in META_COLUMNS]
        self._rows: list[dict[str, Any]] = []

    def add(self, meta: tuple[Any, ...] | None, signals: dict[str, Any]) -> None:
        """One kept document's metadata row (in :data:`META_COLUMNS` order) and signals."""
        if self.metadata and meta is not None:
            for column, value in zip(self._meta, meta, strict=True):
                column.append(value)
        for key, value in signals.items():
            known = self.types.get(key)
            step = key.partition(".")[0]
            if known is None:
                if self.fixed:
                    raise StepError(f"step {step!r} wrote signal {key!r} first after this "
                                    "shard's columns were fixed (at its first batch): "
                                    "declare it in the step's 'signals' attribute")
                self.types[key] = signal_type(step, key, value)
            elif value is not None and signal_type(step, key, value) is not known:
                kind = signal_type(step, key, value)
                if known is float and kind is int:
                    continue  # an int in a float column is that float
                if known is int and kind is float and not self.fixed:
                    self.types[key] = float  # promoted while the columns are not fixed
                    continue
                raise StepError(f"step {step!r} wrote signal {key!r} as {kind.__name__} "
                                f"after {known.__name__}")
        self._rows.append(signals)

    @property
    def any(self) -> bool:
        """Whether the shard gets columns besides ``doc_id`` and ``input_ids``."""
        return self.metadata or bool(self.types)

    def take(self) -> dict[str, pa.Array] | None:
        """The columns of the documents added since the last call (``None``: no columns
        besides the tokens); the first call fixes the signal columns."""
        self.fixed = True
        if not self.any:
            self._rows.clear()
            return None
        out: dict[str, pa.Array] = {}
        if self.metadata:
            out.update(zip(META_COLUMNS, self._meta, strict=True))
            self._meta = [[] for _ in META_COLUMNS]
        rows, self._rows = self._rows, []
        for key, kind in self.types.items():
            out[key] = pa.array([row.get(key) for row in rows], arrow_type(kind))
        return out

    def described(self) -> dict[str, str]:
        """Signal column -> its Parquet type's name (the manifest's record)."""
        return {key: type_name(kind) for key, kind in self.types.items()}
