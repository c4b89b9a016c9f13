"""HTML to main text with Resiliparse (``extract_plain_text(main_content=True)``).

Chosen over Trafilatura (datatrove's and FineWeb's extractor) for speed: on the Debian HTML
manuals of the tests it is ~40x faster per page (docs/design.md), with the same kind of
output (paragraphs as lines, list items as "• " lines, navigation, footers, forms and user
comments left out). DCLM's pipeline made the same choice for the same reason.
"""

from __future__ import annotations


def html_to_text(html: str) -> str:
    """The main text of an HTML page; ``""`` when it has none. Raises on a page the parser
    cannot take (counted as ``extract_failed``)."""
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse(html)
    return extract_plain_text(tree, main_content=True, alt_texts=False, comments=False,
                              form_fields=False, noscript=False).strip()
