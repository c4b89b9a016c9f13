"""The WARC reader on WARC files that warcio, Resiliparse and Dolma publish as their own test
data (``data/README.md``): every page gives the text that warcio's decoding, then the same
charset and extraction steps, gives. Before bodies were decoded, warcio's chunked IANA page
read ``'001c37 Internet Assigned Numbers Authority...'``, its gzip page was one document of
compressed bytes, six of Dolma's pages had chunk sizes inside words, and ClueWeb09's pages
lost their first 10 KB to FastWARC's header parser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from pipeline.readers import ReadOptions, warc
from pipeline.records import Document, Rejected
from pipeline.web.extract import html_to_text

DATA = Path(__file__).parent / "data"
FILES = sorted(p.relative_to(DATA).as_posix() for p in DATA.glob("*/*.warc*"))
#: files damaged on purpose, and what becomes of them here (checked below, one by one)
DAMAGED = {"resiliparse/clipped.warc.gz", "warcio/example-wrong-chunks.warc.gz",
           "warcio/example-bad-non-chunked.warc.gz", "warcio/example-trunc.warc"}
_CHARSET = re.compile(r"charset\s*=\s*\"?([^\";\s]+)", re.IGNORECASE)


def ours(name: str) -> list[Document | Rejected]:
    with open(DATA / name, "rb") as fh:
        return list(warc.read(fh, name, ReadOptions(), [0]))


def warcio_pages(name: str) -> list[tuple[str, str, str]]:
    """``(url, kind, text)`` of each response record as warcio decodes it (to its first
    error: warcio stops reading a file there)."""
    out = []
    try:
        with open(DATA / name, "rb") as fh:
            for record in ArchiveIterator(fh):
                if record.rec_type != "response" or not record.http_headers:
                    continue
                content_type = record.http_headers.get_header("Content-Type") or ""
                mime = (record.rec_headers.get_header("WARC-Identified-Payload-Type")
                        or content_type).split(";")[0].strip().lower()
                url = record.rec_headers.get_header("WARC-Target-URI")
                if mime in warc.HTML_TYPES:
                    found = _CHARSET.search(content_type)
                    body = record.content_stream().read()
                    out.append((url, "html", warc._decode(body, found and found.group(1))))
                else:
                    out.append((url, f"other:{mime}", ""))
    except Exception:  # warcio's ArchiveLoadFailed on a damaged file
        pass
    return out


def pages(items: list[Document | Rejected]) -> list[tuple[str, str, str]]:
    return [(d.url, d.kind, d.text) for d in items if isinstance(d, Document)]


def test_the_corpus_is_here() -> None:
    assert len(FILES) == 16
    assert all((DATA / folder / "LICENSE").is_file() for folder in ("warcio", "resiliparse",
                                                                     "dolma"))


@pytest.mark.parametrize("name", [f for f in FILES if f not in DAMAGED])
def test_pages_are_warcios_pages(name: str) -> None:
    got = ours(name)
    assert not [r for r in got if isinstance(r, Rejected)]
    mine, reference = pages(got), warcio_pages(name)
    assert [(u, k) for u, k, _ in mine] == [(u, k) for u, k, _ in reference]
    for (url, kind, text), (_, _, expected) in zip(mine, reference, strict=True):
        assert text == expected, url
        if kind == "html":
            assert html_to_text(text) == html_to_text(expected), url


def test_the_issues_pages_read_as_text() -> None:
    """The three reproductions of the issue, as text a person would read."""
    iana = pages(ours("warcio/example-iana.org-chunked.warc"))[0][2]
    assert html_to_text(iana).startswith("Internet Assigned Numbers Authority")
    example = pages(ours("warcio/example.warc.gz"))[0][2]
    assert "This domain is established to be used for illustrative examples" in example
    chunk_size = re.compile(r"\b[0-9a-f]{3,4}\r?\n")
    dolma = [t for f in ("dolma/sample-0000.warc.gz", "dolma/sample-0001.warc.gz")
             for _, _, t in pages(ours(f))]
    assert len(dolma) == 37
    assert not [t for t in dolma if chunk_size.search(t[-200:]) or t.rstrip().endswith("0")]


def test_wget_bracketed_uris_are_plain_urls() -> None:
    got = [d for d in ours("warcio/example-wget-bad-target-uri.warc.gz")
           if isinstance(d, Document)]
    assert [d.url for d in got] == ["http://example.com/"]


def test_clueweb_pages_keep_their_whole_text() -> None:
    """Declared gzip, stored plain; HTTP header lines ending in a bare LF."""
    got = pages(ours("resiliparse/clueweb-quirk.warc.gz"))
    assert len(got) == 29
    assert all(t.startswith("<html>\n<head>\n<title>") for _, _, t in got)


def test_damaged_files_lose_only_their_damaged_records() -> None:
    # a gzip member cut by the end of the file: quarantined (warcio yields the cut page)
    clipped = ours("resiliparse/clipped.warc.gz")
    assert [(type(r).__name__, getattr(r, "reason", "")) for r in clipped] == [
        ("Rejected", "truncated_input")]
    # one record split over two gzip members (warcio stops with an error): both quarantined
    wrong = ours("warcio/example-wrong-chunks.warc.gz")
    assert [r.reason for r in wrong if isinstance(r, Rejected)] == [
        "truncated_input", "malformed_record"]
    assert "Content-Length 1613" in wrong[0].detail and not pages(wrong)
    # a whole file compressed as one gzip stream: warcio refuses it, the page arrives here
    whole = pages(ours("warcio/example-bad-non-chunked.warc.gz"))
    assert whole == pages(ours("warcio/example.warc.gz"))
    # a plain file whose last record is cut: the good page as warcio reads it, then a reject
    trunc = ours("warcio/example-trunc.warc")
    assert pages(trunc) == warcio_pages("warcio/example-trunc.warc")
    assert [r.reason for r in trunc if isinstance(r, Rejected)] == ["malformed_record"]
