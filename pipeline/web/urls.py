"""URL block-list: drop documents whose URL's host (or any parent domain of it) or whole URL
is listed. The list is a text file (local or any fsspec URL): one domain or URL per line,
``#`` comments; read once per worker process (and once by the driver, so that a missing,
special or oversized file is one clear error before any work starts)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from infra.user_files import UserFileError, read_file_of


def parse_blocklist(text: str) -> frozenset[str]:
    out = set()
    for line in text.splitlines():
        item = line.split("#", 1)[0].strip().lower()
        if item:
            out.add(item.rstrip("/") if "://" in item else item.lstrip("*.").rstrip("."))
    return frozenset(out)


#: the longest list read (the largest public block-lists, millions of domains, are ~100 MB)
BLOCKLIST_LIMIT = 512 << 20
#: lists read in this process, by (URL, storage options as JSON); a few at most
_LOADED: dict[tuple[str, str], frozenset[str]] = {}


def load_blocklist(url: str, options: dict[str, Any] | None = None) -> frozenset[str]:
    """The list at ``url``, read once per worker process for each (URL, storage options).

    Cached by the options' JSON, not by the dict: ``functools.lru_cache`` given the dict
    raised ``TypeError: unhashable type`` in every task, so ``--url-blocklist`` failed every
    run."""
    key = (url, json.dumps(options or {}, sort_keys=True, default=repr))
    if key not in _LOADED:
        from storage import resolve

        loc = resolve(url, options)
        try:
            data = read_file_of(loc.fs, loc.root, "--url-blocklist", BLOCKLIST_LIMIT,
                                local=loc.is_local)
        except FileNotFoundError:
            raise UserFileError(f"--url-blocklist {url}: no such file") from None
        listed = parse_blocklist(data.decode("utf-8", errors="replace"))
        if len(_LOADED) >= 4:
            _LOADED.clear()
        _LOADED[key] = listed
    return _LOADED[key]


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
