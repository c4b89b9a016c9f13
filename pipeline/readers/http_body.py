"""An HTTP response body as a browser sees it: transfer coding undone, then content coding.

A WARC response record keeps the bytes as the server sent them. Before this module the reader
handed those to extraction as they were, so a ``Transfer-Encoding: chunked`` body put its
chunk sizes into the training text (``'the way most inte 7ff7 rviewees'``) and a
``Content-Encoding: gzip`` body became one document of compressed bytes.

Decoding follows what warcio (and browsers) do with real crawls, where headers lie:

- *chunked* framing is undone while it parses; where it stops parsing (a size line that is
  not hex, a chunk not followed by CRLF), the rest is taken as it is: servers do send plain
  bodies under a chunked header. A body cut off inside a chunk keeps what arrived.
- *content codings* (``gzip``/``x-gzip``, ``deflate`` with or without its zlib header,
  ``br``, ``zstd``; several, comma-separated, undone last first) are decided by the bytes: a
  body whose first bytes do not decode under the declared coding is taken as plain (some
  crawls declare gzip and store the page uncompressed, as Resiliparse's ``clueweb-quirk``
  file shows). A stream that breaks or ends part-way keeps what it decoded (a crawler cuts
  long bodies; Common Crawl at 1 MiB). ``identity`` and unknown codings leave the bytes alone.

Every step is bounded: output past ``limit`` bytes raises :class:`BodyTooLarge` as soon as it
is produced, so a 1 MB gzip body of 1 GiB zeros costs ``limit`` bytes, never the GiB.

Pure functions of bytes (no I/O): ``tests/pipeline/readers/test_http_body.py`` checks them
against warcio's decoding on published WARC files and property-tests the framing.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

#: the longest chunk-size line read before the framing is called broken (warcio: 64 bytes)
MAX_SIZE_LINE = 64
#: decoders are fed this much input at a time, so output is checked against the limit often
STEP = 1 << 16


class BodyTooLarge(ValueError):
    """The decoded body would exceed the record limit (``--max-record-bytes``)."""

    def __init__(self, coding: str, limit: int) -> None:
        super().__init__(f"{coding} body decodes to more than --max-record-bytes {limit}")
        self.coding = coding


def decode_body(raw: bytes, transfer_encoding: str | None, content_encoding: str | None,
                limit: int) -> bytes:
    """``raw`` (the HTTP payload as stored) decoded as a browser would, at most ``limit``
    bytes (:class:`BodyTooLarge` past that)."""
    body = raw
    if transfer_encoding and "chunked" in _codings(transfer_encoding):
        body = dechunk(body)
    for coding in reversed(_codings(content_encoding or "")):
        body = decode_content(body, coding, limit)
    if len(body) > limit:
        raise BodyTooLarge("the", limit)
    return body


def _codings(header: str) -> list[str]:
    return [c.strip().lower() for c in header.split(",") if c.strip()]


def dechunk(data: bytes) -> bytes:
    """``data`` with its chunked framing removed; from the first place where the framing does
    not parse, the bytes as they are (warcio's fallback). Never longer than ``data``."""
    out: list[bytes] = []
    pos, end = 0, len(data)
    while pos < end:
        eol = data.find(b"\r\n", pos, pos + MAX_SIZE_LINE)
        size = _chunk_size(data[pos:eol]) if eol >= 0 else None
        if size is None:
            out.append(data[pos:])  # not chunked from here on
            break
        start = eol + 2
        if size == 0:  # last chunk; trailer fields (rare) are not body
            break
        chunk = data[start:start + size]
        out.append(chunk)
        if len(chunk) < size:  # cut off inside the chunk: keep what arrived
            break
        pos = start + size
        if data[pos:pos + 2] != b"\r\n":
            out.append(data[pos:])  # the framing broke after a whole chunk
            break
        pos += 2
    return b"".join(out)


def _chunk_size(line: bytes) -> int | None:
    digits = line.split(b";", 1)[0].strip()
    if not digits or len(digits) > 16 or any(c not in b"0123456789abcdefABCDEF" for c in digits):
        return None
    return int(digits, 16)


class UndecodableBody(ValueError):
    """The body carries its coding's magic number but does not decode: no text to keep."""


#: the codings whose streams start with a magic number: with it, the body is that coding
#: (and one that does not decode is broken); without it, the body is taken as it is
MAGIC = {"gzip": b"\x1f\x8b", "x-gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd"}


def decode_content(data: bytes, coding: str, limit: int) -> bytes:
    """``data`` decoded from one content coding, or ``data`` itself when its first bytes are
    not in that coding (or the coding is ``identity`` or unknown)."""
    decoders = _DECODERS.get(coding)
    if decoders is None or not data:
        return data
    magic = MAGIC.get(coding)
    if magic is not None and not data.startswith(magic):
        return data
    for decode in decoders:
        decoded = decode(data, coding, limit)
        if decoded is not None:
            return decoded
    if magic is not None:
        raise UndecodableBody(f"{coding} body (by its magic number) that does not decode")
    return data


#: ``step(chunk, max_out) -> output``: decompresses ``chunk`` (``b""``: continue with what
#: it holds back) into at most ``max_out`` bytes; ``held() -> bool``: input held back
Step = Callable[[bytes, int], bytes]


def _drive(step: Step, held: Callable[[], bool], data: bytes, coding: str, limit: int,
           checked: bool) -> bytes | None:
    """Run one decoder over ``data`` with output capped at ``limit``. ``None`` when ``data``
    is not in this coding: its first bytes fail, or (``checked`` False: a coding without a
    header or checksum, where garbage can decode for a while) it fails anywhere. A checked
    stream that breaks or ends part-way keeps what it decoded."""
    out: list[bytes] = []
    size = 0
    try:
        for at in range(0, len(data), STEP):
            piece = step(data[at:at + STEP], limit + 1 - size)
            while True:
                size += len(piece)
                if size > limit:
                    raise BodyTooLarge(coding, limit)
                out.append(piece)
                if not piece or not held():
                    break
                piece = step(b"", limit + 1 - size)
    except BodyTooLarge:
        raise
    except Exception:  # zlib.error, brotli.error: the stream broke here
        if not size or not checked:
            return None
    return b"".join(out)


def _zlib(wbits: int, checked: bool) -> Callable[[bytes, str, int], bytes | None]:
    def decode(data: bytes, coding: str, limit: int) -> bytes | None:
        d = zlib.decompressobj(wbits)

        def step(chunk: bytes, max_out: int) -> bytes:
            return b"" if d.eof else d.decompress(d.unconsumed_tail + chunk, max_out)

        return _drive(step, lambda: bool(d.unconsumed_tail) and not d.eof, data, coding,
                      limit, checked)
    return decode


def _brotli(data: bytes, coding: str, limit: int) -> bytes | None:
    import brotli

    d = brotli.Decompressor()

    def step(chunk: bytes, max_out: int) -> bytes:
        return b"" if d.is_finished() else d.process(chunk, output_buffer_limit=max_out)

    return _drive(step, lambda: not d.is_finished() and not d.can_accept_more_data(), data,
                  coding, limit, checked=False)


def _zstd(data: bytes, coding: str, limit: int) -> bytes | None:
    import io

    import zstandard

    out: list[bytes] = []
    size = 0
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data),
                                                         read_across_frames=True) as reader:
            while piece := reader.read(min(STEP, limit + 1 - size)):
                size += len(piece)
                if size > limit:
                    raise BodyTooLarge(coding, limit)
                out.append(piece)
    except zstandard.ZstdError:
        if not size:
            return None
    return b"".join(out)


#: each coding's decoders, tried in order (deflate: zlib-wrapped as specified, then raw as
#: some servers send it)
_DECODERS: dict[str, tuple[Callable[[bytes, str, int], bytes | None], ...]] = {
    "gzip": (_zlib(16 + zlib.MAX_WBITS, checked=True),),
    "x-gzip": (_zlib(16 + zlib.MAX_WBITS, checked=True),),
    "deflate": (_zlib(zlib.MAX_WBITS, checked=True), _zlib(-zlib.MAX_WBITS, checked=False)),
    "br": (_brotli,),
    "zstd": (_zstd,),
}
