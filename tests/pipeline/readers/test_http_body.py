"""HTTP bodies as browsers see them: chunked framing undone, content codings decided by the
bytes, every output bounded. Property tests over random bodies and framings, and the
quirks real crawls have (plain pages under a gzip header, raw deflate, bare-LF headers)."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import brotli
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.readers.http_body import (
    BodyTooLarge,
    UndecodableBody,
    dechunk,
    decode_body,
    decode_content,
)
from pipeline.readers.http_response import MalformedHead, split_response

LIMIT = 8 << 20


def chunked(body: bytes, sizes: list[int], extension: bool = False) -> bytes:
    """``body`` in chunks of the given sizes (the rest in one), as a server frames it."""
    out, at = [], 0
    for size in [*sizes, len(body)]:
        piece = body[at:at + size]
        if not piece:
            continue
        ext = b";name=value" if extension else b""
        out.append(b"%x%s\r\n%s\r\n" % (len(piece), ext, piece))
        at += len(piece)
        if at >= len(body):
            break
    return b"".join(out) + b"0\r\n\r\n"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000), st.lists(st.integers(1, 700), max_size=8), st.booleans())
def test_dechunk_undoes_any_framing(body: bytes, sizes: list[int], extension: bool) -> None:
    assert dechunk(chunked(body, sizes, extension)) == body


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_dechunk_never_grows_and_keeps_unframed_bytes(data: bytes) -> None:
    out = dechunk(data)
    assert len(out) <= len(data)
    if b"\r\n" not in data[:64]:  # no size line at all: not chunked, taken as it is
        assert out == data


def test_dechunk_falls_back_where_the_framing_breaks() -> None:
    page = b"<html>the way most interviewees answer</html>"
    # the first chunk parses, then the server stopped framing
    assert dechunk(b"a\r\n" + page[:10] + b"\r\n" + page[10:]) == page
    assert dechunk(b"<html>plain body under a chunked header</html>") == \
        b"<html>plain body under a chunked header</html>"
    # cut off inside a chunk (a crawler's size limit): what arrived is kept
    assert dechunk(b"7ff7\r\n" + page) == page


@pytest.mark.parametrize("coding,encode", [
    ("gzip", gzip.compress),
    ("x-gzip", gzip.compress),
    ("deflate", zlib.compress),
    ("deflate", lambda b: zlib.compress(b)[2:-4]),  # raw deflate, as some servers send
    ("br", brotli.compress),
    ("zstd", lambda b: zstandard.ZstdCompressor().compress(b)),
])
@settings(max_examples=40, deadline=None)
@given(body=st.binary(min_size=1, max_size=5000))
def test_content_codings_round_trip(coding: str, encode, body: bytes) -> None:
    assert decode_content(encode(body), coding, LIMIT) == body


PAGE = b"<!doctype html><html><head><title>Example</title></head><body>" + b"x" * 500


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_a_plain_body_under_a_coding_header_is_kept(coding: str) -> None:
    """ClueWeb09 declares gzip and stores the page uncompressed: decided by the bytes."""
    assert decode_content(PAGE, coding, LIMIT) == PAGE


@pytest.mark.parametrize("coding,magic", [("gzip", b"\x1f\x8b"), ("zstd", b"\x28\xb5\x2f\xfd")])
def test_a_body_with_the_magic_that_does_not_decode_is_refused(coding: str, magic: bytes
                                                               ) -> None:
    """Compressed bytes are never handed on as text."""
    with pytest.raises(UndecodableBody, match=coding):
        decode_content(magic + b"\x00\xff garbage" * 20, coding, LIMIT)


def test_unknown_and_identity_codings_leave_the_bytes() -> None:
    assert decode_content(PAGE, "identity", LIMIT) == PAGE
    assert decode_content(PAGE, "compress", LIMIT) == PAGE


def test_a_cut_gzip_body_keeps_what_it_decoded() -> None:
    body = b"".join(b"line %d of a long page\n" % i for i in range(5000))
    got = decode_content(gzip.compress(body)[:4000], "gzip", LIMIT)
    assert 0 < len(got) < len(body) and body.startswith(got)


def test_chunked_gzip_is_dechunked_then_decompressed() -> None:
    body = b"Internet Assigned Numbers Authority " * 300
    raw = chunked(gzip.compress(body), [100, 333, 50])
    assert decode_body(raw, "chunked", "gzip", LIMIT) == body
    assert decode_body(raw, "Chunked", "GZIP", LIMIT) == body  # names are case-insensitive


def test_several_codings_are_undone_last_first() -> None:
    body = b"two layers " * 100
    raw = brotli.compress(gzip.compress(body))
    assert decode_body(raw, None, "gzip, br", LIMIT) == body


def _gzip_zeros(n: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join([*(c.compress(block) for _ in range(n >> 20)), c.flush()])


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_a_decompression_bomb_costs_the_limit_not_its_size(coding: str) -> None:
    """A body of 256 MiB of zeros (~250 KB compressed) against an 8 MiB limit."""
    raw = {"gzip": lambda: _gzip_zeros(256 << 20),
           "br": lambda: brotli.compress(bytes(256 << 20), quality=1),
           "zstd": lambda: zstandard.ZstdCompressor(level=1).compress(bytes(256 << 20))}[coding]()
    tracemalloc.start()
    try:
        with pytest.raises(BodyTooLarge, match="--max-record-bytes"):
            decode_body(raw, None, coding, LIMIT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * LIMIT, f"{coding}: {peak / 2**20:.0f} MiB held decoding a bomb"


def test_a_body_just_under_the_limit_passes() -> None:
    body = bytes(LIMIT)
    assert decode_body(gzip.compress(body), None, "gzip", LIMIT) == body
    with pytest.raises(BodyTooLarge):
        decode_body(gzip.compress(body + b"!"), None, "gzip", LIMIT)


# -- the header block ----------------------------------------------------------------------

def test_split_response_with_crlf_and_bare_lf_lines() -> None:
    for eol in (b"\r\n", b"\n"):
        head = eol.join([b"HTTP/1.1 200 OK", b"Content-Type: text/html; charset=EUC-JP",
                         b"Content-Encoding: gzip", b"", b""])
        r = split_response(head + b"<html>a: b\n\nc</html>")
        assert r.status == "HTTP/1.1 200 OK"
        assert r.mime == "text/html" and r.charset == "EUC-JP"
        assert r.field("Content-Encoding") == "gzip"
        assert r.body == b"<html>a: b\n\nc</html>"


def test_repeated_coding_fields_join_and_folded_lines_continue() -> None:
    r = split_response(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Encoding: br\r\n"
                       b"X-Long: one\r\n two\r\nContent-Type: text/html\r\n"
                       b"Content-Type: text/plain\r\n\r\nbody")
    assert r.field("content-encoding") == "gzip, br"
    assert r.field("x-long") == "one two"
    assert r.mime == "text/plain"


@pytest.mark.parametrize("payload,why", [
    (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n", "not ended"),
    (b"<html>no status line</html>\r\n\r\n", "status line"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000 + b"\r\n\r\n", "64 KiB"),
])
def test_a_broken_header_block_is_named(payload: bytes, why: str) -> None:
    with pytest.raises(MalformedHead, match=why):
        split_response(payload)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_split_response_admits_only_a_clean_error(payload: bytes) -> None:
    try:
        r = split_response(b"HTTP/1.1 200 OK\r\n" + payload)
    except MalformedHead:
        return
    assert payload.endswith(r.body)
