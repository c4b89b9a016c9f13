"""WARC/WET files for tests, written with warcio at test time from the HTML manuals that
Debian's documentation packages install under /usr/share/doc, plus hand-made broken records."""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterable
from pathlib import Path

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

DOC_ROOT = Path("/usr/share/doc")


def debian_pages(limit: int = 40, min_bytes: int = 2000) -> list[tuple[str, bytes]]:
    """``(url, html)`` of real HTML pages from Debian documentation packages, sorted."""
    pages = []
    for path in sorted(DOC_ROOT.rglob("*.html")):
        if path.is_file() and path.stat().st_size >= min_bytes:
            url = "https://docs.example.org/" + str(path.relative_to(DOC_ROOT))
            pages.append((url, path.read_bytes()))
            if len(pages) >= limit:
                break
    if not pages:
        raise RuntimeError("no HTML under /usr/share/doc: the tests need Debian's doc pages")
    return pages


def response(url: str, body: bytes, content_type: str = "text/html; charset=utf-8",
             gz: bool = True, http_headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """One WARC response record (one gzip member when ``gz``); ``body`` as the server sent
    it (chunked or compressed when ``http_headers`` say so)."""
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=gz)
    headers = StatusAndHeaders("200 OK", [("Content-Type", content_type), *http_headers],
                               protocol="HTTP/1.1")
    writer.write_record(writer.create_warc_record(
        url, "response", payload=io.BytesIO(body), http_headers=headers,
        warc_headers_dict={"WARC-Date": "2024-05-01T12:00:00Z"}))
    return out.getvalue()


def conversion(url: str, text: str, gz: bool = True) -> bytes:
    """One WET conversion record (plain text)."""
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=gz)
    writer.write_record(writer.create_warc_record(
        url, "conversion", payload=io.BytesIO(text.encode("utf-8")),
        warc_content_type="text/plain",
        warc_headers_dict={"WARC-Date": "2024-05-01T12:00:00Z"}))
    return out.getvalue()


def warcinfo() -> bytes:
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=True)
    writer.write_record(writer.create_warcinfo_record("test.warc.gz", {"software": "tests"}))
    return out.getvalue()


def bad_header_member() -> bytes:
    """A gzip member whose WARC header block is not one."""
    return gzip.compress(b"WARC/1.0\r\nthis is not a header\r\nContent-Length: x\r\n\r\n\r\n\r\n")


def write(path: Path, records: Iterable[bytes]) -> Path:
    path.write_bytes(b"".join(records))
    return path
