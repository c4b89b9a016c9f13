"""The complexity check before extraction (pipeline.web.extract.refusal): every real page the
tests have is admitted and extracts as before; pages nested past the limits are refused in
about the time of their parse, whatever HTML trick builds the nesting, since the check reads
the parser's own tree."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.html import HTMLTree

from pipeline.web import extract
from pipeline.web.extract import (
    CHECKED_FROM_TAGS,
    DEEP,
    MAX_DEEP_ELEMENTS,
    MAX_DEPTH,
    TooComplex,
    html_to_text,
    refusal,
)
from tests.pipeline.web import warcs


def _page(body: str) -> str:
    return f"<!DOCTYPE html><html><head><title>t</title></head><body>{body}</body></html>"


def _unchecked(html: str) -> str:
    """Extraction as it was before the check."""
    return extract_plain_text(HTMLTree.parse(html), main_content=True, alt_texts=False,
                              comments=False, form_fields=False, noscript=False).strip()


def test_every_real_page_is_admitted_and_extracts_as_before() -> None:
    """All of Debian's HTML manuals on this machine (the web tests' pages, Node's 8 MB
    all.html among them): none refused, the same text as without the check."""
    pages = warcs.debian_pages(limit=100_000, min_bytes=0)
    checked = 0
    for url, raw in pages:
        html = raw.decode("utf-8", "replace")
        assert refusal(html) is None, url
        assert html_to_text(html) == _unchecked(html), url
        checked += html.count("<") >= CHECKED_FROM_TAGS
    assert len(pages) > 100 and checked > 20  # the tree check ran on many of them


def test_a_million_nested_divs_are_refused_in_the_time_of_their_parse() -> None:
    """The page of the issue (5 MB, under --max-record-bytes): extraction would take hours
    holding the GIL; the check refuses it in well under a few seconds."""
    html = _page("<div>" * 1_000_000 + "deep")
    started = time.perf_counter()
    why = refusal(html)
    took = time.perf_counter() - started
    assert why == f"elements nested more than {MAX_DEPTH} deep"
    assert took < 60, took  # a stall bound: ~1 s here, extraction of the page would take hours
    with pytest.raises(TooComplex, match="nested more than 512"):
        html_to_text(html)


@pytest.mark.parametrize("body", [
    "<span></div>" * 20_000,  # stray end tags the parser ignores: 20,000 nested spans
    "<div/>" * 20_000,  # "/>" does not close an HTML element
    "<ul><li>" * 20_000,  # a list in each item
    "<table><tr><td>" * 5_000,  # a table in each cell
    "<b><i><u>" * 7_000,  # formatting elements
    "<x-y>" * 20_000,  # custom elements
])
def test_nesting_is_the_parsers_whatever_builds_it(body: str) -> None:
    assert refusal(_page(body)) == f"elements nested more than {MAX_DEPTH} deep"


@pytest.mark.parametrize("body", [
    "<p>para" * 20_000,  # <p> closes the open <p>
    "<li>item" * 20_000,  # <li> closes the open <li>
    "<svg>" + '<path d="M0 0"/>' * 20_000 + "</svg>",  # self-closing in SVG
    "<br><img src=x>" * 20_000,  # void elements
    "<div>" * (DEEP - 5) + "<p>t</p>" * 3000 + "</div>" * (DEEP - 5),  # deep, under DEEP
    "<div>" * 300 + "x" + "</div>" * 300 + "<p>t</p>" * 3000,  # a few elements past DEEP
])
def test_wide_or_moderately_deep_pages_are_admitted(body: str) -> None:
    html = _page(body)
    assert html.count("<") >= CHECKED_FROM_TAGS  # the tree check ran
    assert refusal(html) is None
    assert html_to_text(html) == _unchecked(html)


def test_many_deep_elements_are_refused_with_their_count() -> None:
    depth = DEEP + 10
    body = "<div>" * depth + "<p>t</p>" * (MAX_DEEP_ELEMENTS + 100) + "</div>" * depth
    why = refusal(_page(body))
    assert why is not None and why.endswith(f"{DEEP} or more deep (at most {MAX_DEEP_ELEMENTS})")
    assert int(why.split()[0]) > MAX_DEEP_ELEMENTS


def test_small_pages_are_not_parsed_twice() -> None:
    """Below CHECKED_FROM_TAGS nothing is parsed for the check; above it, html_to_text
    extracts from the tree the check made (the cache holds that page only)."""
    small = _page("<p>hello</p>")
    assert refusal(small) is None and extract._parsed is None
    big = _page("<p>t</p>" * CHECKED_FROM_TAGS)
    assert refusal(big) is None and extract._parsed is not None and extract._parsed[0] is big
    assert html_to_text(big) == _unchecked(big)
    assert extract._parsed is None


def test_trees_are_freed_on_their_own_thread() -> None:
    """Dask's profiler holds the frames it samples: a tree left in a sampled frame was freed
    on the profiler's thread, which Resiliparse refuses (RuntimeError "unsendable, but is
    being dropped on another thread", and the tree leaks). Here another thread keeps every
    frame of this module's functions on the checking thread and lets go of them after it is
    done. (Not the frames of the Python code Resiliparse itself calls while it makes nodes,
    weakref's ``KeyedRef.__new__``: those hold a node as an argument for microseconds, which
    no code here can drop; keeping them for the whole run failed ~1 in 30 runs on a loaded
    machine.)"""
    pages = [_page("<div>" * 200_000 + "x"), _page("<p>t</p>" * 50_000)]
    held = []

    def check() -> None:
        for html in pages:
            refusal(html)
            html_to_text(pages[1])

    worker = threading.Thread(target=check)
    worker.start()
    while worker.is_alive():
        frame = sys._current_frames().get(worker.ident)  # type: ignore[arg-type]
        while frame is not None:
            if frame.f_code.co_filename == extract.__file__:
                held.append(frame)
            frame = frame.f_back
        time.sleep(0.002)
    worker.join()
    assert {f.f_code.co_name for f in held} & {"refusal", "_nesting", "html_to_text"}
    refused: list[str] = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: refused.append(str(u.exc_value))
    try:
        held.clear()  # the frames' locals go now, on this thread
    finally:
        sys.unraisablehook = hook
    assert refused == []  # was: "... HTMLTreePy is unsendable, but is being dropped on ..."
