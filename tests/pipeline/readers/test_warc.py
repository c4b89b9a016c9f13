"""The WARC/WET reader on files written by warcio from Debian's HTML manuals, with broken
records cut and forged by hand: each broken record is one reject at its offset, and every
good record around it arrives."""

from __future__ import annotations

import gzip
import io
import tracemalloc
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.readers import ReadOptions, warc
from pipeline.records import Document, Rejected
from tests.pipeline.web import warcs


@pytest.fixture(scope="module")
def pages() -> list[tuple[str, bytes]]:
    return warcs.debian_pages(5)


def read(data: bytes, opts: ReadOptions | None = None) -> list[Document | Rejected]:
    return list(warc.read(io.BytesIO(data), "t.warc.gz", opts or ReadOptions(), [0]))


def offsets(records: list[bytes]) -> list[int]:
    out, at = [], 0
    for r in records:
        out.append(at)
        at += len(r)
    return out


def test_records_arrive_with_url_date_and_offset(pages: list[tuple[str, bytes]]) -> None:
    records = [warcs.warcinfo(), *(warcs.response(u, h) for u, h in pages)]
    got = read(b"".join(records))
    assert [d.url for d in got] == [u for u, _ in pages]
    assert [d.source for d in got] == [f"t.warc.gz@{o}" for o in offsets(records)[1:]]
    assert all(d.kind == "html" and d.date == "2024-05-01T12:00:00Z" for d in got)
    assert all(d.doc_id.startswith("<urn:uuid:") for d in got)
    assert got[0].text == pages[0][1].decode("utf-8")


@pytest.mark.parametrize("damage", ["cut_member", "bad_header", "garbage"])
def test_a_broken_member_costs_only_itself(pages: list[tuple[str, bytes]], damage: str) -> None:
    a, b, c = (warcs.response(u, h) for u, h in pages[:3])
    bad = {"cut_member": b[: len(b) // 2], "bad_header": warcs.bad_header_member(),
           "garbage": b"this is not gzip at all"}[damage]
    got = read(a + bad + c)
    assert [type(x).__name__ for x in got] == ["Document", "Rejected", "Document"]
    assert got[1].source == f"t.warc.gz@{len(a)}" and got[1].reason == "malformed_record"
    assert [got[0].url, got[2].url] == [pages[0][0], pages[2][0]]
    assert got[2].source == f"t.warc.gz@{len(a) + len(bad)}"
    assert got[2].text == pages[2][1].decode("utf-8")


def test_a_truncated_last_member_is_a_truncated_input(pages: list[tuple[str, bytes]]) -> None:
    a, b = (warcs.response(u, h) for u, h in pages[:2])
    got = read(a + b[:-200])
    assert isinstance(got[0], Document)
    assert isinstance(got[1], Rejected) and got[1].reason == "truncated_input"
    assert got[1].source == f"t.warc.gz@{len(a)}" and "WARC/1.0" in got[1].raw


def test_plain_warc_resynchronises_after_a_bad_header(pages: list[tuple[str, bytes]]) -> None:
    a, b = (warcs.response(u, h, gz=False) for u, h in pages[:2])
    bad = b"WARC/1.0\r\nWARC-Type: response\r\n\r\n"  # no Content-Length
    got = read(a + bad + b + a[:3000])
    assert [type(x).__name__ for x in got] == ["Document", "Rejected", "Document", "Rejected"]
    assert got[1].reason == "malformed_record" and got[1].source == f"t.warc.gz@{len(a)}"
    assert got[2].url == pages[1][0]
    assert got[3].reason == "truncated_input"


def test_non_utf8_bodies_are_decoded_by_their_charset() -> None:
    body = ("<html><body><p>Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e, na\u00efve "
            "fa\u00e7ade.</p></body></html>")
    declared = warcs.response("http://a/", body.encode("cp1252"), "text/html; charset=cp1252")
    sniffed = warcs.response("http://b/", ("<html><head><meta charset='iso-8859-1'></head>"
                                           + body[6:]).encode("latin-1"), "text/html")
    got = read(declared + sniffed)
    assert all("Caf\u00e9 cr\u00e8me" in d.text for d in got)


def test_wet_conversions_and_other_types(pages: list[tuple[str, bytes]]) -> None:
    wet = warcs.conversion("http://w/", "Plain text from a WET file.\nSecond line.")
    pdf = warcs.response("http://p/", b"%PDF-1.4 ...", "application/pdf")
    got = read(wet + pdf)
    assert got[0].kind == "text" and got[0].text.startswith("Plain text") and \
        got[0].url == "http://w/"
    assert got[1].kind == "other:application/pdf"


def test_an_oversized_member_is_rejected_and_reading_goes_on(
        pages: list[tuple[str, bytes]]) -> None:
    small = warcs.response("http://s/", b"<p>small page</p>")
    big = warcs.response("http://b/", b"<p>" + b"x" * 50_000 + b"</p>")
    got = read(big + small, ReadOptions(max_record_bytes=10_000))
    assert isinstance(got[0], Rejected) and got[0].reason == "record_too_large"
    assert got[1].url == "http://s/"


def test_a_whole_file_gzip_of_several_records_is_read(pages: list[tuple[str, bytes]]) -> None:
    plain = b"".join(warcs.response(u, h, gz=False) for u, h in pages[:3])
    got = read(gzip.compress(plain))
    assert [d.url for d in got] == [u for u, _ in pages[:3]]


def test_from_s3_as_from_local_disk(s3_bucket, pages: list[tuple[str, bytes]],  # noqa: ANN001
                                    tmp_path) -> None:  # noqa: ANN001
    """The same .warc.gz and .warc.wet.gz, with a cut member, read through read_partition
    from a bucket on the loopback S3 server and from local disk: the same items."""
    from pipeline.planning.discovery import discover
    from pipeline.planning.plan import plan_partitions
    from pipeline.readers import read_partition
    from storage import resolve

    a, b, c = (warcs.response(u, h) for u, h in pages[:3])
    files = {"x.warc.gz": a + b[:100] + c,
             "y.warc.wet.gz": warcs.conversion("http://w/", "Some text.\nMore text.")}
    remote = resolve(s3_bucket.url, s3_bucket.storage_options)
    for name, data in files.items():
        remote.fs.pipe_file(remote.path(f"cc/{name}"), data)
        (tmp_path / name).write_bytes(data)

    def items(pattern: str, opts: dict | None) -> list[tuple]:
        parts = plan_partitions(discover([pattern], opts), 1 << 20)
        assert [q.fmt for p in parts for q in p.pieces()] == ["warc", "warc"]
        return [(type(i).__name__, getattr(i, "source", ""), getattr(i, "url", ""),
                 getattr(i, "text", ""), getattr(i, "reason", ""))
                for p in parts for i in read_partition(p, ReadOptions(), opts)]

    got = items(f"{s3_bucket.url}/cc/*.gz", s3_bucket.storage_options)
    local = items(str(tmp_path / "*.gz"), None)
    # ``source`` is each file's whole URL @ offset (files of one name in two folders differ)
    assert all(g[1].startswith(f"{s3_bucket.url}/cc/") for g in got)
    assert all(g[1].startswith(f"{tmp_path}/") for g in local)
    assert [(g[0], g[1].rsplit("/", 1)[1], *g[2:]) for g in got] == \
        [(g[0], g[1].rsplit("/", 1)[1], *g[2:]) for g in local]
    assert [g[0] for g in got] == ["Document", "Rejected", "Document", "Document"]
    assert got[1][1:] == (f"{s3_bucket.url}/cc/x.warc.gz@{len(a)}", "", "", "malformed_record")


@pytest.fixture(scope="module")
def members() -> list[bytes]:
    return [warcs.response(f"http://m/{i}", f"<p>page {i}</p>".encode() * (i + 1))
            for i in range(6)]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_damage_anywhere_loses_only_the_damaged_member(members: list[bytes],
                                                        data: st.DataObject) -> None:
    """Garbage inserted at any byte, or the file cut at any byte: every member untouched by
    the damage arrives (before it, and after it for an insertion), at its offset."""
    blob = b"".join(members)
    starts = offsets(members)
    at = data.draw(st.integers(0, len(blob) - 1))
    cut = data.draw(st.booleans())
    junk = data.draw(st.binary(min_size=1, max_size=40))
    damaged = blob[:at] if cut else blob[:at] + junk + blob[at:]
    got = read(damaged)
    docs = {d.source: d.url for d in got if isinstance(d, Document)}
    for i, start in enumerate(starts):
        end = start + len(members[i])
        if end <= at:  # wholly before the damage
            assert docs.get(f"t.warc.gz@{start}") == f"http://m/{i}"
        elif not cut and start > at:  # wholly after an insertion, shifted by it
            assert docs.get(f"t.warc.gz@{start + len(junk)}") == f"http://m/{i}"
    assert all(isinstance(x, Rejected) for x in got if not isinstance(x, Document))


@pytest.mark.parametrize("junk", [
    b"\x1f\x8b\x08",  # a bare gzip magic (the case the property test above found)
    b"\x1f\x8b\x08\x04" + bytes(6) + b"\xff\xff",  # FEXTRA: a 64 KiB field over what follows
    b"\x1f\x8b\x08\x08" + bytes(6) + b"no NUL here",  # FNAME: a name running to the next NUL
])
@pytest.mark.parametrize("where", ["before member 1", "inside member 2's tail"])
def test_a_fake_gzip_header_does_not_swallow_the_members_after_it(
        members: list[bytes], junk: bytes, where: str) -> None:
    """A damaged header whose fields run over the next members' headers: the reader ran to
    the end of the file inside it and called the rest one truncated member."""
    blob = b"".join(members)
    starts = offsets(members)
    at = starts[1] if where == "before member 1" else starts[3] - 18
    got = read(blob[:at] + junk + blob[at:])
    docs = {d.source: d.url for d in got if isinstance(d, Document)}
    first_after = 1 if where == "before member 1" else 3
    for i in range(first_after, len(members)):
        assert docs.get(f"t.warc.gz@{starts[i] + len(junk)}") == f"http://m/{i}", got
    rejects = [r for r in got if isinstance(r, Rejected)]
    assert rejects and all(r.reason == "malformed_record" for r in rejects)
    assert rejects[0].source == f"t.warc.gz@{at if where == 'before member 1' else starts[2]}"


@pytest.fixture(scope="module")
def plain_members() -> list[bytes]:
    return [warcs.response(f"http://m/{i}", f"<p>page {i}</p>".encode() * (i + 1), gz=False)
            for i in range(6)]


def read_plain(data: bytes) -> list[Document | Rejected]:
    return list(warc.read(io.BytesIO(data), "t.warc", ReadOptions(), [0]))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_damage_anywhere_in_a_plain_warc_loses_only_the_damaged_record(
        plain_members: list[bytes], data: st.DataObject) -> None:
    """The plain-file twin of the gzip property: garbage (sometimes a fake version line or
    an empty line) inserted at any byte, or the file cut at any byte."""
    blob = b"".join(plain_members)
    starts = offsets(plain_members)
    at = data.draw(st.integers(0, len(blob) - 1))
    cut = data.draw(st.booleans())
    junk = data.draw(st.sampled_from([b"", b"WARC/1.0\r\n", b"\r\n\r\n"])) + data.draw(
        st.binary(min_size=1, max_size=40))
    got = read_plain(blob[:at] if cut else blob[:at] + junk + blob[at:])
    docs = {d.source: d.url for d in got if isinstance(d, Document)}
    for i, start in enumerate(starts):
        if start + len(plain_members[i]) <= at:
            assert docs.get(f"t.warc@{start}") == f"http://m/{i}"
        elif not cut and start > at:
            assert docs.get(f"t.warc@{start + len(junk)}") == f"http://m/{i}"
    assert all(isinstance(x, Rejected) for x in got if not isinstance(x, Document))


@pytest.mark.parametrize("case", ["junk line in a header", "version line in a trailer"])
def test_a_plain_record_whose_length_runs_over_the_next_is_rejected_not_merged(
        plain_members: list[bytes], case: str) -> None:
    """Both found by the sweep behind the property above: a junk line after Content-Length
    made the HTTP headers part of the WARC header, the block then took the next record's
    start (accepted, the next record lost); a version line in a record's trailer began a
    header that ran into the next record's (which arrived under the junk's offset)."""
    blob = b"".join(plain_members)
    starts = offsets(plain_members)
    if case == "junk line in a header":
        at = blob.index(b"\r\n", blob.index(b"Content-Length")) + 2
        junk = b"c\xcb\x04\x8f-\\\xf5\xc9Dj\r"
        damaged_record = 0
    else:
        at, junk, damaged_record = starts[2] - 2, b"WARC/1.0\r\nX\xa3}\x89", 1
    got = read_plain(blob[:at] + junk + blob[at:])
    docs = {d.source: d.url for d in got if isinstance(d, Document)}
    for i, start in enumerate(starts):
        if i != damaged_record:
            shifted = start + (len(junk) if start > at else 0)
            assert docs.get(f"t.warc@{shifted}") == f"http://m/{i}", got
    rejects = [r for r in got if isinstance(r, Rejected)]
    assert rejects and {r.reason for r in rejects} == {"malformed_record"}


# -- bodies and bounds (the published files: test_published_warcs.py) ----------------------

def test_chunked_and_compressed_bodies_arrive_decoded(pages: list[tuple[str, bytes]]) -> None:
    url, html = pages[0]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(html[i:i + 700]), html[i:i + 700])
                      for i in range(0, len(html), 700)) + b"0\r\n\r\n"
    records = [warcs.response(url, framed, http_headers=[("Transfer-Encoding", "chunked")]),
               warcs.response(url, gzip.compress(html), http_headers=[("Content-Encoding",
                                                                        "gzip")]),
               warcs.response(url, html, http_headers=[("Content-Encoding", "gzip")])]
    got = read(b"".join(records))
    assert [d.text for d in got] == [html.decode("utf-8")] * 3


def _bomb_member(n_bytes: int) -> bytes:
    """One gzip member: a WARC record of ``n_bytes`` zeros (~1/1000 of that compressed)."""
    head = (b"WARC/1.0\r\nWARC-Type: resource\r\nWARC-Target-URI: http://bomb/\r\n"
            b"Content-Length: %d\r\n\r\n" % n_bytes)
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join([c.compress(head), *(c.compress(block) for _ in range(n_bytes >> 20)),
                     c.compress(b"\r\n\r\n"), c.flush()])


def test_a_gzip_member_bomb_costs_the_record_limit(pages: list[tuple[str, bytes]]) -> None:
    """256 MiB of zeros in a 256 KB member: rejected, held to a few MiB, reading goes on."""
    bomb = _bomb_member(256 << 20)
    good = warcs.response(*pages[0])
    tracemalloc.start()
    try:
        got = read(bomb + good, ReadOptions(max_record_bytes=4 << 20))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [getattr(r, "reason", "doc") for r in got] == ["record_too_large", "doc"]
    assert peak < 32 << 20, f"{peak / 2**20:.0f} MiB held reading a member bomb"


def test_a_body_bomb_is_rejected(pages: list[tuple[str, bytes]]) -> None:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = b"".join([*(c.compress(bytes(1 << 20)) for _ in range(64)), c.flush()])
    got = read(warcs.response("http://bomb/", body, http_headers=[("Content-Encoding", "gzip")])
               + warcs.response(*pages[1]), ReadOptions(max_record_bytes=4 << 20))
    assert [getattr(r, "reason", "doc") for r in got] == ["record_too_large", "doc"]
    assert "--max-record-bytes" in got[0].detail


def test_a_content_length_past_the_member_is_truncated(pages: list[tuple[str, bytes]]) -> None:
    """A gzip-framed record claiming 10^12 bytes was accepted with what the member held."""
    forged = gzip.compress(b"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: http://x/\r\n"
                           b"Content-Type: application/http; msgtype=response\r\n"
                           b"Content-Length: 1000000000000\r\n\r\nHTTP/1.1 200 OK\r\n"
                           b"Content-Type: text/html\r\n\r\n<html>a page</html>\r\n\r\n")
    got = read(forged + warcs.response(*pages[2]))
    assert [getattr(r, "reason", "doc") for r in got] == ["truncated_input", "doc"]
    assert "Content-Length 1000000000000" in got[0].detail


def test_http_header_block_without_an_end_is_rejected(pages: list[tuple[str, bytes]]) -> None:
    payload = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n<html>no empty line</html>"
    record = gzip.compress(b"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: http://x/\r\n"
                           b"Content-Type: application/http; msgtype=response\r\n"
                           b"Content-Length: %d\r\n\r\n%s\r\n\r\n" % (len(payload), payload))
    got = read(record + warcs.response(*pages[0]))
    assert [getattr(r, "reason", "doc") for r in got] == ["malformed_record", "doc"]
    assert got[0].detail == "HTTP header block not ended by an empty line"
