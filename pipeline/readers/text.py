"""Plain text: one document per blank-line separated paragraph, named ``file:first_line``.

For plays this makes one speech (speaker plus lines) or one stage direction a document: a
natural unit of meaning, and many of them, so documents spread evenly over shards, ranks and
loader workers. A paragraph belongs to the byte range holding its first byte: a range that
starts mid-paragraph skips to the next paragraph start, and the range before reads past its
end to finish its last paragraph.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO

from pipeline.readers.lines import first_line_start, iter_lines, previous_line_blank
from pipeline.records import Document, Rejected, raw_preview

if TYPE_CHECKING:
    from pipeline.planning.plan import Partition
    from pipeline.readers import ReadOptions


def _where(name: str, lineno: int | None, offset: int) -> str:
    return f"{name}:{lineno}" if lineno is not None else f"{name}@{offset}"


def read(fh: BinaryIO, part: Partition, name: str, opts: ReadOptions,
         position: list[int]) -> Iterator[Document | Rejected]:
    prev_blank = True
    if part.start > 0:
        first = first_line_start(fh, part.start, part.end)
        if first is None:
            return  # no line, so no paragraph, starts in this range
        prev_blank = previous_line_blank(fh, first)
    block: list[bytes] = []
    size = 0
    too_long = False
    src = ""
    limit = opts.max_record_bytes

    def flush() -> Document | Rejected:
        if too_long:
            return Rejected(src, "record_too_large",
                            f"paragraph over --max-record-bytes {limit}",
                            raw_preview(b"\n".join(block)))
        data = b"\n".join(block)
        try:
            return Document(src, data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return Rejected(src, "invalid_utf8", f"byte {exc.start} of the paragraph: "
                            f"{exc.reason}", raw_preview(data))

    for line in iter_lines(fh, part.start, -1, limit):
        position[0] = line.offset
        blank = not line.too_long and not line.data.strip()
        if blank:
            if block or too_long:
                yield flush()
                block, size, too_long = [], 0, False
            prev_blank = True
            continue
        if not block and not too_long:
            if part.end >= 0 and line.offset >= part.end:
                return  # past the range with no paragraph of its own started: done
            if not prev_blank:
                continue  # the tail of a paragraph that the previous range owns
            src = _where(name, line.lineno, line.offset)
        prev_blank = False
        size += line.length
        if line.too_long or size > limit:
            too_long = True
            if len(block) == 0:
                block = [line.data[:1024]]
            continue
        if not too_long:
            block.append(line.data)
    if block or too_long:
        yield flush()
