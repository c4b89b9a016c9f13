"""Fixtures shared by the loader tests."""

from __future__ import annotations

import pytest

from storage.io.range_file import RangeFile


@pytest.fixture
def no_python_file_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any decode that goes through :class:`storage.io.range_file.RangeFile`, a Python
    file object pyarrow calls back into for every read (a GIL round trip per row group): the
    loader decodes local, cached and fetched pieces from mappings."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a row group was decoded through a Python file object")

    monkeypatch.setattr(RangeFile, "readinto", refuse)
