"""Web data: the steps between a WARC/WET record and a clean document (HTML to text,
language ID, the published heuristic rule sets, URL block-list, PII), each counting what it
drops and why. The readers for WARC/WET are :mod:`pipeline.readers.warc`.
"""

from pipeline.web.steps import (
    META_COLUMNS,
    WebConfig,
    parse_filter_options,
    parse_filters,
)

__all__ = ["META_COLUMNS", "WebConfig", "parse_filter_options", "parse_filters"]
