"""Lines of a byte range of a (possibly compressed) file, snapped to line boundaries.

A line belongs to the range that holds its first byte. A range starting at ``start > 0``
therefore begins at the first line start at or after ``start`` (found by looking at byte
``start - 1``) and ends with the last line that starts before ``end``; that line may run past
``end``. Lines longer than the record limit are skipped in chunks, never held in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

_CHUNK = 1 << 20
_WS = b" \t\r\x0b\x0c"


@dataclass(frozen=True)
class Line:
    """One line without its newline; ``data`` is only the first KiB when ``too_long``."""

    offset: int
    lineno: int | None
    data: bytes
    too_long: bool = False
    length: int = 0


def _skip_rest_of_line(fh: BinaryIO) -> int:
    """Consume up to and including the next newline; the number of bytes consumed."""
    n = 0
    while True:
        chunk = fh.readline(_CHUNK)
        n += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return n


def first_line_start(fh: BinaryIO, start: int, end: int = -1) -> int | None:
    """The offset of the first line that starts in ``[start, end)`` (fh is left there), or
    None when no line starts there (``end == -1``: no bound).

    The search stops at ``end``: a range inside one long line (a file without newlines, a
    huge record) owns nothing, and finding that out costs its own bytes, not a read to the
    end of the file. Without the bound, every range of a 1 GiB one-line file read on to the
    end of the file: k ranges, k*k/2 reads.
    """
    if start <= 0:
        return 0  # a freshly opened stream (compressed ones cannot seek at all)
    fh.seek(start - 1)
    if fh.read(1) == b"\n":
        return start if end < 0 or start < end else None
    pos = start
    while end < 0 or pos < end - 1:  # a newline at end - 1 would start a line at end
        want = _CHUNK if end < 0 else min(_CHUNK, end - 1 - pos)
        chunk = fh.readline(want)
        if not chunk:
            return None  # the end of the file: no line starts after ``start``
        pos += len(chunk)
        if chunk.endswith(b"\n"):
            return pos if end < 0 or pos < end else None
    return None


def previous_line_blank(fh: BinaryIO, line_start: int) -> bool:
    """Whether the line before ``line_start`` is blank (only ASCII whitespace), or there is none.

    Reads backwards from the newline that ends that line; stops at the first non-blank byte.
    """
    pos = line_start - 1  # the newline ending the previous line
    while pos > 0:
        lo = max(0, pos - 4096)
        fh.seek(lo)
        window = fh.read(pos - lo)
        for b in reversed(window):
            if b == 0x0A:
                return True
            if b not in _WS:
                return False
        pos = lo
    return True


def iter_lines(fh: BinaryIO, start: int, end: int, max_bytes: int) -> Iterator[Line]:
    """Lines whose first byte lies in ``[start, end)`` (``end == -1``: to the end).

    Line numbers are known only when the range starts at the beginning of the file.
    """
    first = first_line_start(fh, start, end)
    if first is None:
        return
    pos = first
    if start > 0:
        fh.seek(pos)
    lineno: int | None = 1 if start <= 0 else None
    while end < 0 or pos < end:
        line = fh.readline(max_bytes + 1)
        if not line:
            return
        if len(line) > max_bytes and not line.endswith(b"\n"):
            extra = _skip_rest_of_line(fh)
            yield Line(pos, lineno, line[:1024], too_long=True, length=len(line) + extra)
            pos += len(line) + extra
        else:
            yield Line(pos, lineno, line.rstrip(b"\r\n") if line.endswith(b"\n") else line,
                       length=len(line))
            pos += len(line)
        if lineno is not None:
            lineno += 1
