"""A read-only file object of which one verified byte range exists: how a row group is decoded
from the bytes fetched for it, by the loader and by ``storage verify`` alike.

pyarrow decodes a Parquet row group from a file object, asking for the footer's byte ranges;
handing it only the range the index locates (and whose digest was checked) means a footer that
points anywhere else fails loudly instead of reading unverified bytes.
"""

from __future__ import annotations

import io
from typing import Any


class RangeFile(io.RawIOBase):
    """A file of ``size`` bytes of which only ``[start, start + len(data))`` can be read;
    ``name`` goes into the error of a read outside it."""

    def __init__(self, size: int, start: int, data: bytes, name: str = "") -> None:
        self._size, self._start, self._data, self._name, self._pos = size, start, data, name, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = {0: 0, 1: self._pos, 2: self._size}[whence] + offset
        return self._pos

    def size(self) -> int:
        return self._size

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self._size - self._pos)
        lo = self._pos - self._start
        if lo < 0 or lo + want > len(self._data):
            where = f"{self._name}: " if self._name else ""
            raise OSError(f"{where}read of [{self._pos}, {self._pos + want}) outside the row "
                          "group located by the index (index and shard disagree)")
        buffer[:want] = self._data[lo:lo + want]
        self._pos += want
        return want
