"""HTML to main text with Resiliparse (``extract_plain_text(main_content=True)``), with a
complexity check first.

Chosen over Trafilatura (datatrove's and FineWeb's extractor) for speed: on the Debian HTML
manuals of the tests it is ~40x faster per page (benchmarks/README.md, ``web_pipeline.py``),
with the same kind of output (paragraphs as lines, list items as "• " lines, navigation,
footers, forms and user comments left out). DCLM's pipeline made the same choice for the
same reason.

**Why a check.** Parsing is linear, but the main-content extraction is not: its cost grows
with the depth of every block element (a chain of 2,000 nested ``<div>`` takes 0.14 s, 10,000
take 2 s, 40,000 take 61 s), and it holds the GIL all along. One page of 1,000,000 nested
``<div>`` (5 MB, under ``--max-record-bytes``) stopped its worker's heartbeats until Dask
dropped it, four times, and the run failed with ``KilledWorker``. :func:`refusal` measures
nesting on the parsed tree, so it is the parser's own (implied end tags, foreign content,
stray end tags ignored, as the extractor sees them), with lexbor's selector engine, in C:

- a page with fewer than :data:`CHECKED_FROM_TAGS` ``<`` is admitted unparsed;
- one with no element at depth :data:`DEEP` (``html`` is at 1) is admitted;
- one with an element deeper than :data:`MAX_DEPTH` (Chromium's parser nests at most 512:
  no page needs more to render) or more than :data:`MAX_DEEP_ELEMENTS` elements at depth
  :data:`DEEP` or more is refused, saying which.

Measured: none of the 244 Debian pages on the test machine is refused (they nest 30 deep at
most). Over the 243 under ``--max-record-bytes``, the check adds 0.54 ms to each of the 75
with 2,048 tags or more (8 % of their extraction time, on a tree extraction then uses) and
nothing to the others: 1.5 % of the web steps' time per page (four rule sets, language, PII).
The worst admitted page, 8 MB of 125-deep chains, extracts in 2.3 s;
1 M nested ``<div>`` is refused in 0.2 s (its parse) where extraction would take hours.
Resiliparse has no depth or time limit of its own: a record's time is bounded around all of
its steps (:mod:`pipeline.tasks.record_steps`).
"""

from __future__ import annotations

from typing import Any

#: depth from which elements count as deep (``html`` is at depth 1)
DEEP = 128
#: more deeply nested than this and a page is refused (Chromium's HTML parser stops at 512)
MAX_DEPTH = 512
#: more elements than this at depth DEEP or more and a page is refused
MAX_DEEP_ELEMENTS = 4096
#: a page with fewer ``<`` than this is not checked: it has fewer elements, and the costliest
#: such page (2,000 ``<p>`` each in a ``<div>`` inside the last) extracts in 0.3 s
CHECKED_FROM_TAGS = 2048


class TooComplex(ValueError):
    """A page nested too deeply for the main-content extraction (see :func:`refusal`)."""


def _chain(depth: int) -> str:
    """A selector matching the elements at ``depth`` or deeper (``html`` is at depth 1)."""
    return " > ".join(["*"] * depth)


_AT_DEEP = _chain(DEEP)
_PAST_MAX = _chain(MAX_DEPTH + 1)
#: the last page checked and its tree, reused by html_to_text (one page at a time)
_parsed: tuple[str, Any] | None = None


def _tree(html: str) -> Any:
    from resiliparse.parse.html import HTMLTree

    return HTMLTree.parse(html)


# Resiliparse's trees and nodes must be freed on the thread that made them. A frame that
# Dask's profiler sampled (10 times a second, in every worker) outlives its call with its
# locals, which were then freed on another thread: "HTMLTreePy is unsendable, but is being
# dropped on another thread", and the tree leaked. So each function here drops the trees and
# nodes it holds before it returns.


def refusal(html: str) -> str | None:
    """Why the page is too complex to extract (``None``: it is not). The parsed tree is kept
    for :func:`html_to_text` of the same string, so a checked page is parsed once."""
    global _parsed
    _parsed = None
    if html.count("<") < CHECKED_FROM_TAGS:
        return None
    tree = _tree(html)
    try:
        why = _nesting(tree)
        if why is None:
            _parsed = (html, tree)
        return why
    finally:
        del tree


def _nesting(tree: Any) -> str | None:
    root = tree.document
    try:
        if root is None or root.query_selector(_AT_DEEP) is None:
            return None
        if root.query_selector(_PAST_MAX) is not None:
            return f"elements nested more than {MAX_DEPTH} deep"
        deep = len(root.query_selector_all(_AT_DEEP))
        if deep > MAX_DEEP_ELEMENTS:
            return f"{deep} elements nested {DEEP} or more deep (at most {MAX_DEEP_ELEMENTS})"
        return None
    finally:
        del root, tree


def forget() -> None:
    """Drop the tree kept by :func:`refusal` (on this thread, see above)."""
    global _parsed
    _parsed = None


def html_to_text(html: str) -> str:
    """The main text of an HTML page; ``""`` when it has none. Raises on a page the parser
    cannot take and on one :func:`refusal` refuses (:class:`TooComplex`): both are counted
    as ``extract_failed`` by the web steps, where phase 1 has not quarantined it before."""
    global _parsed
    from resiliparse.extract.html2text import extract_plain_text

    if _parsed is None or _parsed[0] is not html:
        why = refusal(html)
        if why is not None:
            raise TooComplex(why)
    tree = _parsed[1] if _parsed is not None else _tree(html)
    _parsed = None
    try:
        return extract_plain_text(tree, main_content=True, alt_texts=False, comments=False,
                                  form_fields=False, noscript=False).strip()
    finally:
        del tree
