"""URL block-list: drop documents whose URL's host (or any parent domain of it) or whole URL
is listed. The list is a text file (local or any fsspec URL): one domain or URL per line,
``#`` comments; read once per worker process."""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import urlsplit


def parse_blocklist(text: str) -> frozenset[str]:
    out = set()
    for line in text.splitlines():
        item = line.split("#", 1)[0].strip().lower()
        if item:
            out.add(item.rstrip("/") if "://" in item else item.lstrip("*.").rstrip("."))
    return frozenset(out)


@functools.lru_cache(maxsize=4)
def load_blocklist(url: str, options_key: str = "", options: Any = None) -> frozenset[str]:
    from storage import resolve

    loc = resolve(url, options)
    with loc.fs.open(loc.root, "rb") as fh:
        return parse_blocklist(fh.read().decode("utf-8", errors="replace"))


def blocked(url: str | None, blocklist: frozenset[str]) -> bool:
    """Whether ``url`` is on the list: its host, a parent domain of it, or the URL itself."""
    if not url or not blocklist:
        return False
    lowered = url.strip().lower()
    if lowered.rstrip("/") in blocklist:
        return True
    try:
        host = (urlsplit(lowered).hostname or "").rstrip(".")
    except ValueError:
        return False
    parts = host.split(".")
    return any(".".join(parts[i:]) in blocklist for i in range(len(parts)))
