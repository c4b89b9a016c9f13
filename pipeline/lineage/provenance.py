"""The manifest's ``lineage``: what made a version, so a document's steps can be named.

``steps``: each step of the recipe as it ran, with its version, mode and resolved options,
and ``config_sha256``, the sha256 of that entry's canonical JSON (two datasets whose step
entries have the same hash ran the same step the same way). ``tokenizer``: name, sha256,
vocabulary. ``inputs``: how many files and the sha256 of their listing (URL, size, version:
the same listing gives the same hash). ``code``: the package version and git commit
(:mod:`pipeline.lineage.code_version`). ``source``: where a document's source is: ``doc_id``
(the id *is* ``file:line`` / ``file@offset`` / ``file#row``: nothing stored twice) or
``column`` (a ``source`` column: web runs, ``--id-field`` runs).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

#: where a document's source is read (the manifest's ``lineage.source``)
IN_DOC_ID, IN_COLUMN = "doc_id", "column"
#: the recipe entry's keys that are not its options
_ENTRY = ("use", "name", "mode", "version")


def config_sha256(entry: dict[str, Any]) -> str:
    """The sha256 of a step entry's canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def step_records(resolved: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The resolved recipe (``config["steps"]``) as ``lineage.steps``."""
    out = []
    for entry in resolved:
        out.append({"name": entry.get("name"), "use": entry.get("use"),
                    "version": entry.get("version"), "mode": entry.get("mode"),
                    "options": {k: v for k, v in sorted(entry.items()) if k not in _ENTRY},
                    "config_sha256": config_sha256(entry)})
    return out


def listing_sha256(files: Any) -> tuple[int, str]:
    """``(files, sha256)`` of an input listing (a :class:`pipeline.planning.filetable.FileTable`
    or a sequence of ``(url, size, version)``): one ``url\\tsize\\tversion\\n`` line each."""
    h = hashlib.sha256()
    n = len(files)
    for i in range(n):
        if hasattr(files, "url"):
            url, size, version = files.url(i), int(files.sizes[i]), files.version(i)
        else:
            url, size, version = files[i]
        h.update(f"{url}\t{size}\t{version}\n".encode())
    return n, h.hexdigest()


def lineage(steps: list[dict[str, Any]], tokenizer: dict[str, Any],
            inputs: tuple[int, str], code: dict[str, Any], source: str) -> dict[str, Any]:
    """The manifest's ``lineage`` object."""
    return {"steps": step_records(steps), "tokenizer": tokenizer,
            "inputs": {"files": inputs[0], "sha256": inputs[1]}, "code": code,
            "source": source}
