"""Typed reading of untrusted JSON objects, with errors that name the field.

A manifest comes from a store that anyone with write access may have edited, so its shape is
checked field by field as it is read: ``[1, 2, 3]``, ``null`` or a string where a count
belongs give a :class:`FieldError` naming the file and the field path
(``shards[3].row_groups[0].tokens``), never a raw ``AttributeError`` or ``TypeError`` from deep
inside a reader.
"""

from __future__ import annotations

from typing import Any

_MISSING: Any = object()


class FieldError(ValueError):
    """A JSON value of the wrong shape; the message names the field path."""


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


class Fields:
    """One JSON object, read key by key with type checks; ``where`` is its path for errors."""

    def __init__(self, value: Any, where: str = "") -> None:
        if not isinstance(value, dict):
            raise FieldError(f"{where or 'the top level'} must be an object, not {_kind(value)}")
        self.value = value
        self.where = where

    def _path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _get(self, key: str, default: Any) -> Any:
        if key in self.value:
            return self.value[key]
        if default is _MISSING:
            raise FieldError(f"{self._path(key)} is missing")
        return default

    def integer(self, key: str, default: Any = _MISSING, minimum: int | None = 0) -> int:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise FieldError(f"{self._path(key)} must be an integer, not {_kind(value)}")
        if minimum is not None and value < minimum:
            raise FieldError(f"{self._path(key)} must be >= {minimum}, not {value}")
        return value

    def optional_integer(self, key: str) -> int | None:
        if self.value.get(key) is None:
            return None
        return self.integer(key, minimum=None)

    def string(self, key: str, default: Any = _MISSING) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise FieldError(f"{self._path(key)} must be a string, not {_kind(value)}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: Any = _MISSING) -> str:
        """A string that must be one of ``choices``."""
        value = self.string(key, default)
        if value not in choices:
            raise FieldError(f"{self._path(key)} must be one of {', '.join(choices)}, "
                             f"not {value!r}")
        return value

    def optional_string(self, key: str) -> str | None:
        return None if self.value.get(key) is None else self.string(key)

    def hex_digest(self, key: str, default: Any = _MISSING, length: int = 64) -> str:
        """A lower-case hex digest of ``length`` characters (or empty when defaulted to '')."""
        value = self.string(key, default)
        if value == "" and default == "":
            return value
        if len(value) != length or any(c not in "0123456789abcdef" for c in value):
            raise FieldError(f"{self._path(key)} must be {length} lower-case hex digits")
        return value

    def child(self, key: str) -> Fields:
        return Fields(self._get(key, _MISSING), self._path(key))

    def mapping(self, key: str, default: Any = _MISSING) -> dict[str, Any]:
        value = self._get(key, default)
        if not isinstance(value, dict):
            raise FieldError(f"{self._path(key)} must be an object, not {_kind(value)}")
        return dict(value)

    def string_mapping(self, key: str) -> dict[str, str]:
        value = self.mapping(key)
        for k, v in value.items():
            if not isinstance(v, str):
                raise FieldError(f"{self._path(key)}.{k} must be a string, not {_kind(v)}")
        return value

    def objects(self, key: str, default: Any = _MISSING) -> list[Fields]:
        """A list of objects, each as :class:`Fields` with its index in the path."""
        value = self._get(key, default)
        if not isinstance(value, list):
            raise FieldError(f"{self._path(key)} must be a list, not {_kind(value)}")
        return [Fields(item, f"{self._path(key)}[{i}]") for i, item in enumerate(value)]
