"""Range boundaries of line-based inputs: a range inside one long line reads only its bytes."""

from __future__ import annotations

import io

from pipeline.planning.plan import Partition
from pipeline.readers import ReadOptions
from pipeline.readers import text as text_reader
from pipeline.readers.lines import first_line_start, iter_lines
from pipeline.records import Document


class CountingReader(io.BytesIO):
    """A file that counts the bytes handed out (what a range costs in I/O)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        out = super().read(size)
        self.bytes_read += len(out)
        return out

    def readline(self, size: int | None = -1) -> bytes:
        out = super().readline(size)
        self.bytes_read += len(out)
        return out


MiB = 1 << 20
# a 64 MiB "file" with no newline in its middle (a sparse or binary file, one huge record)
ONE_LINE = b"x" * (64 * MiB) + b"\nlast line\n"


def test_a_range_inside_one_long_line_owns_nothing_and_reads_only_its_bytes() -> None:
    fh = CountingReader(ONE_LINE)
    assert first_line_start(fh, 8 * MiB, 9 * MiB) is None
    assert fh.bytes_read <= MiB + 1  # before: read on to the newline 55 MiB later

    fh = CountingReader(ONE_LINE)
    assert list(iter_lines(fh, 8 * MiB, 9 * MiB, MiB)) == []
    assert fh.bytes_read <= MiB + 1


def test_the_range_holding_the_next_line_start_finds_it() -> None:
    nl = ONE_LINE.index(b"\n")  # the line after it starts at nl + 1
    assert first_line_start(io.BytesIO(ONE_LINE), nl - 5, nl + 2) == nl + 1
    assert first_line_start(io.BytesIO(ONE_LINE), nl - 5, nl + 1) is None  # starts at end
    lines = list(iter_lines(io.BytesIO(ONE_LINE), nl - 5, nl + 2, MiB))
    assert [(ln.offset, ln.data) for ln in lines] == [(nl + 1, b"last line")]


def test_a_text_range_inside_one_long_paragraph_reads_only_its_bytes() -> None:
    """Paragraphs: a range in the tail of a paragraph that started before it stops at its
    end (before: it read on to the next blank line, however far)."""
    para = b"".join(b"line %d of one endless speech\n" % i for i in range(400_000))  # ~12 MiB
    data = b"First.\n" + para + b"\nLast words.\n"
    part = Partition(0, "p.txt", "txt", None, 4 * MiB, 5 * MiB)
    fh = CountingReader(data)
    docs = list(text_reader.read(fh, part, "p.txt", ReadOptions(), [0]))
    assert docs == []
    assert fh.bytes_read <= 2 * MiB, fh.bytes_read
    whole = [d for d in text_reader.read(io.BytesIO(data), Partition(0, "p.txt", "txt", None,
                                                                     0, -1),
                                         "p.txt", ReadOptions(max_record_bytes=64 * MiB), [0])
             if isinstance(d, Document)]
    assert [d.text for d in whole][-1] == "Last words."
