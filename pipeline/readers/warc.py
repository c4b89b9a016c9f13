"""WARC and WET (``.warc[.gz]``, ``.warc.wet.gz``): one document per HTML response or text
conversion record, with its URL, date and ``file@offset``.

Records are framed here and parsed by FastWARC (Resiliparse's WARC library: 2x warcio's
speed on the same files, benchmarks/README.md). Framing is ours so that a broken record costs only
itself: a ``.gz`` file is read one gzip member at a time (Common Crawl writes one record per
member, and the member's compressed offset is what its index names), a plain ``.warc`` one
header block + Content-Length at a time. A member whose deflate data breaks, a truncated last
member, a header block FastWARC refuses or a record over ``--max-record-bytes`` becomes a
reject at its offset, and reading goes on at the next gzip member (or ``WARC/`` line), so the
good records around it all arrive.

HTML bodies are decoded here (HTTP charset, else Resiliparse's detection; bytes that are not
valid in it are dropped, never a failure) and tagged ``kind="html"`` for the extraction step;
WET conversions are plain text already. Other response types arrive as ``kind="other"`` so
the extraction step counts them (``not_html``) instead of losing them silently.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO

from pipeline.readers.http_body import BodyTooLarge, UndecodableBody, decode_body
from pipeline.readers.http_response import MalformedHead, split_response
from pipeline.records import Document, Rejected, raw_preview

if TYPE_CHECKING:
    from pipeline.readers import ReadOptions

GZIP_MAGIC = b"\x1f\x8b\x08"
CHUNK = 1 << 20
HTML_TYPES = ("text/html", "application/xhtml+xml")


def read(fh: BinaryIO, name: str, opts: ReadOptions, position: list[int]
         ) -> Iterator[Document | Rejected]:
    """The documents and rejects of one WARC/WET file, given as its raw (compressed) bytes."""
    head = fh.read(3)
    raw = _Pushback(fh)
    raw.unread(head)
    # gzip by its magic, or by its name when the first member is damaged (a plain WARC file
    # starts with its version line, whatever its name)
    gz = head == GZIP_MAGIC or (name.lower().endswith(".gz") and not head.startswith(b"WAR"))
    frames = _members(raw, opts.max_record_bytes, position) if gz else \
        _plain(raw, opts.max_record_bytes, position)
    for offset, frame in frames:
        src = f"{name}@{offset}"
        if isinstance(frame, tuple):
            reason, detail, preview = frame
            yield Rejected(src, reason, detail, raw_preview(preview))
            continue
        yield from _records(frame, src, opts.max_record_bytes)


class _Pushback:
    """A file read by lines and counts, with bytes already read put back in front
    (``unread``): the sniffed head of every file, and the bytes a plain record took past
    the start of the next one."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.buf = fh, b""

    def unread(self, data: bytes) -> None:
        self.buf = data + self.buf

    def readline(self, limit: int) -> bytes:
        if not self.buf:
            return self.fh.readline(limit)
        cut = self.buf.find(b"\n", 0, limit)
        if cut >= 0 or len(self.buf) >= limit:
            end = cut + 1 if cut >= 0 else limit
            out, self.buf = self.buf[:end], self.buf[end:]
            return out
        out, self.buf = self.buf, b""
        return out + self.fh.readline(limit - len(out))

    def read(self, n: int) -> bytes:
        out, self.buf = self.buf[:n], self.buf[n:]
        return out + (self.fh.read(n - len(out)) if n > len(out) else b"")


Frame = bytes | tuple[str, str, bytes]


def _members(fh: _Pushback, limit: int, position: list[int]) -> Iterator[tuple[int, Frame]]:
    """``(compressed offset, decompressed member)`` for each gzip member, or a reject tuple
    ``(reason, detail, preview)`` for one that cannot be read; reading resumes at the next
    gzip header after a broken member."""
    pending = b""  # read, not yet fed to a decompressor
    offset = 0  # file offset of pending[0]
    at_eof = False

    def more() -> bool:
        nonlocal pending, at_eof
        if at_eof:
            return False
        chunk = fh.read(CHUNK)
        if not chunk:
            at_eof = True
            return False
        pending += chunk
        return True

    while pending or more():
        if not pending.startswith(GZIP_MAGIC):
            while len(pending) < 3 and more():
                pass
            if pending.startswith(GZIP_MAGIC):
                continue
            skip = _resync(pending, 1)
            while skip < 0 and more():
                skip = _resync(pending, 1)
            bad = pending if skip < 0 else pending[:skip]
            yield offset, ("malformed_record", f"{len(bad)} bytes that are not a gzip member",
                           bad[:64])
            offset += len(bad)
            pending = pending[len(bad):]
            continue
        start = offset
        position[0] = start
        d = zlib.decompressobj(31)
        out: list[bytes] = []
        size = consumed = 0
        error: str | None = None
        # The member's raw bytes, while no more than ``limit``: a damaged header can swallow
        # the next members whole (an FEXTRA or FNAME field runs on for up to 64 KiB or to the
        # next NUL byte), and only these bytes let reading go on at the next gzip header.
        kept: list[bytes] | None = []
        kept_size = 0
        while not d.eof:
            if not pending and not more():
                break
            feed, pending = pending, b""
            consumed += len(feed)
            if kept is not None:
                kept.append(feed)
                kept_size += len(feed)
                if kept_size > limit:
                    kept = None
            try:
                # at most CHUNK bytes out per call: a member of 1 GiB of zeros costs CHUNK,
                # not the GiB, on its way to being called too large
                piece = d.decompress(feed, CHUNK)
                while True:
                    size += len(piece)
                    if size <= limit:
                        out.append(piece)
                    else:
                        out.clear()
                    if not d.unconsumed_tail or d.eof:
                        break
                    piece = d.decompress(d.unconsumed_tail, CHUNK)
            except zlib.error as exc:
                error = f"gzip data error: {exc}"
                if kept is not None:  # resynchronise anywhere in the member
                    pending, consumed = b"".join(kept), 0
                else:  # resynchronise inside what was fed
                    pending = feed
                    consumed -= len(feed)
                break
        if error is not None:
            # the broken member's own bytes up to the next gzip header are skipped
            first = 1 if consumed == 0 else 0  # the member's own header is not a restart
            skip = _resync(pending, first)
            while skip < 0 and more():
                skip = _resync(pending, first)
            skipped = consumed + (len(pending) if skip < 0 else skip)
            yield start, ("malformed_record", error, b"".join(out)[:1024])
            pending = b"" if skip < 0 else pending[skip:]
            offset = start + skipped
            continue
        if not d.eof:
            member = b"".join(kept) if kept is not None else b""
            restart = _resync(member, 1)
            if restart > 0:  # the file goes on with another member after this one's header
                yield start, ("malformed_record", "gzip member not ended before the gzip "
                              f"header at byte {start + restart}", b"".join(out)[:1024])
                pending, offset = member[restart:], start + restart
                continue
            yield start, ("truncated_input", f"gzip member cut off after {size} decompressed "
                          "bytes (end of file)", b"".join(out)[:1024])
            return
        rest = d.unused_data
        pending = rest + pending
        offset = start + consumed - len(rest)
        if size > limit:
            yield start, ("record_too_large", f"gzip member of {size} bytes > --max-record-bytes "
                          f"{limit} (a WARC file should have one member per record)", b"")
            continue
        yield start, b"".join(out)


def _resync(data: bytes, start: int) -> int:
    """Where the next gzip member starts in ``data`` at or after ``start`` (-1: not yet)."""
    return data.find(GZIP_MAGIC, start)


#: what ends every WARC record after its block (the spec's two CRLFs)
RECORD_END = b"\r\n\r\n"


def _plain(src: _Pushback, limit: int, position: list[int]) -> Iterator[tuple[int, Frame]]:
    """``(offset, header block + content)`` for each record of an uncompressed WARC file;
    a header block that does not parse is a reject, and reading resumes at the next line
    that starts with ``WARC/``; so does a record whose Content-Length ran over the start of
    the next one (it is not followed by its empty line)."""
    offset = 0
    line = src.readline(1 << 16)
    while line:
        if not line.strip():
            offset += len(line)
            line = src.readline(1 << 16)
            continue
        start = offset
        position[0] = start
        block = [line]
        offset += len(line)
        length = -1
        ok = line.startswith(b"WARC/")
        interrupted = False  # by another record's version line: never a header field
        while ok:
            line = src.readline(1 << 16)
            if line.startswith(b"WARC/"):
                interrupted = True
                break
            offset += len(line)
            if not line:
                break
            block.append(line)
            if not line.strip():
                break
            key, _, value = line.partition(b":")
            if key.strip().lower() == b"content-length":
                try:
                    length = int(value.strip())
                except ValueError:
                    length = -1
        header = b"".join(block)
        if not ok or length < 0 or not line or interrupted:
            why = ("no WARC/ version line" if not ok else
                   "header block interrupted by another record's WARC/ line" if interrupted
                   else "no valid Content-Length" if line
                   else "header block cut off (end of file)")
            yield start, ("malformed_record", why, header[:1024])
            if interrupted:
                continue  # ``line`` is that record's first line, ``offset`` its start
            line = src.readline(1 << 16)
            while line and not line.startswith(b"WARC/"):
                offset += len(line)
                line = src.readline(1 << 16)
            continue
        if length > limit:
            yield start, ("record_too_large", f"record of {length} bytes > --max-record-bytes "
                          f"{limit}", header[:1024])
            _skip(src, length)
            offset += length
            line = src.readline(1 << 16)
            continue
        content = src.read(length)
        offset += len(content)
        if len(content) < length:
            yield start, ("truncated_input", f"record content cut off after {len(content)} of "
                          f"{length} bytes (end of file)", header[:1024])
            return
        trailer = src.read(4)
        if RECORD_END.startswith(trailer):  # whole, or cut by the end of the file
            offset += len(trailer)
        else:
            # Not followed by its empty line: the block's length is wrong (damage in the
            # header or content). Where a record starts inside what it took, the damage
            # swallowed it: this one is a reject and reading goes on there.
            taken = header + content + trailer
            nxt = taken.find(b"\nWARC/", len(block[0]) - 1)
            if nxt >= 0:
                yield start, ("malformed_record", "record not followed by an empty line: its "
                              f"Content-Length runs over the record at byte {start + nxt + 1}",
                              header[:1024])
                offset = start + nxt + 1
                src.unread(taken[nxt + 1:])
                line = src.readline(1 << 16)
                continue
            src.unread(trailer)
        yield start, header + content + RECORD_END
        line = src.readline(1 << 16)


def _skip(fh: _Pushback, n: int) -> None:
    while n > 0:
        got = fh.read(min(n, CHUNK))
        if not got:
            return
        n -= len(got)


def _records(data: bytes, src: str, limit: int) -> Iterator[Document | Rejected]:
    """The documents in one framed record (or member holding several)."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    wanted = WarcRecordType.response | WarcRecordType.conversion
    found = 0
    try:
        for record in ArchiveIterator(io.BytesIO(data), parse_http=False):
            found += 1
            if not record.headers.get("WARC-Type") or not record.headers.get(
                    "Content-Length", "").strip().isdigit():
                yield Rejected(src, "malformed_record", "WARC header block without a valid "
                               "WARC-Type and Content-Length", raw_preview(data[:1024]))
                return
            short = _missing_bytes(data, record)
            if short:
                yield Rejected(src, "truncated_input", f"Content-Length {record.content_length}"
                               f" but {record.content_length - short} bytes follow the header "
                               "block", raw_preview(data[:1024]))
                return
            if record.record_type & wanted:
                doc = _document(record, src, limit)
                if doc is not None:
                    yield doc
    except Exception as exc:  # FastWARC raises OSError/ValueError on a broken header block
        yield Rejected(src, "malformed_record", f"{type(exc).__name__}: {exc}"[:300],
                       raw_preview(data[:1024]))
        return
    if not found and data.strip():
        yield Rejected(src, "malformed_record", "no WARC record in it", raw_preview(data[:1024]))


def _missing_bytes(data: bytes, record: object) -> int:
    """How many bytes of the record's declared Content-Length are not in ``data`` (a frame
    holds whole records: a gzip member's record whose header claims 10^12 bytes is cut)."""
    start = record.stream_pos  # type: ignore[attr-defined]
    end = data.find(b"\r\n\r\n", start)
    present = len(data) - (end + 4) if end >= 0 else 0
    return max(0, record.content_length - present)  # type: ignore[attr-defined]


def target_uri(value: str | None) -> str | None:
    """The record's URL: WARC 1.0's grammar wraps it in angle brackets (``<https://...>``) and
    wget writes it so; 1.1 and most crawlers do not. Kept bracketed, the ``url`` column would
    hold ``<https://...>`` and no block-list entry could match it."""
    if not value:
        return None
    value = value.strip()
    if value.startswith("<") and value.endswith(">"):
        value = value[1:-1].strip()
    return value or None


def _document(record: object, src: str, limit: int) -> Document | Rejected | None:
    from fastwarc.warc import WarcRecordType

    headers = record.headers  # type: ignore[attr-defined]
    url = target_uri(headers.get("WARC-Target-URI"))
    date = headers.get("WARC-Date") or None
    doc_id = headers.get("WARC-Record-ID") or src
    if record.record_type == WarcRecordType.conversion:  # type: ignore[attr-defined]
        body = record.reader.read()  # type: ignore[attr-defined]
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Rejected(src, "invalid_utf8", f"byte {exc.start} of the WET text: "
                            f"{exc.reason}", raw_preview(body))
        return Document(doc_id, text, url=url, date=date, source=src)
    if not record.is_http:  # type: ignore[attr-defined]
        return None
    payload = record.reader.read()  # type: ignore[attr-defined]
    try:
        response = split_response(payload)
        body = decode_body(response.body, response.field("transfer-encoding"),
                           response.field("content-encoding"), limit)
    except (MalformedHead, UndecodableBody) as exc:
        return Rejected(src, "malformed_record", str(exc), raw_preview(payload[:1024]))
    except BodyTooLarge as exc:
        return Rejected(src, "record_too_large", str(exc), raw_preview(payload[:1024]))
    mime = (headers.get("WARC-Identified-Payload-Type") or response.mime).split(";")[0]
    mime = mime.strip().lower()
    if mime and mime not in HTML_TYPES:
        return Document(doc_id, "", url=url, date=date, source=src, kind=f"other:{mime}")
    return Document(doc_id, _decode(body, response.charset), url=url, date=date, source=src,
                    kind="html")


def _decode(body: bytes, charset: str | None) -> str:
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    try:
        return body.decode(charset or "utf-8")
    except (UnicodeDecodeError, LookupError):
        pass
    return bytes_to_str(body, detect_encoding(body))
