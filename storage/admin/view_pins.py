"""The source's registry of its views: pins that ``gc`` of the source reads.

A view names objects of its source (shards, tokenizer) that the source's own versions may
stop naming after a rebuild, so the source's gc must know what its views use. ``select``
writes, before it commits the view, one pin in the source: ``_views/<view>/<sha16>.json``
(the view's folder name beside the source, and the source version it selected from):
``{"view": NAME, "source_version": SHA256}``. gc of the source keeps every version a pin
names, with every object that version names, for as long as the view uses it: while the
view's ``manifest.json`` or any of its ``_versions/`` records selects from that version.
A pin whose view no longer uses its version (the view was re-selected and its gc removed
the old versions, or the view was deleted) and that is older than ``--min-age`` is stale,
and gc removes it; a pin whose view cannot be read is kept (gc never guesses in the
direction of removing). A pin can only make gc keep more, never remove more.

The view is found the way a view finds its source: the sibling folder of that name on each
replica (:func:`storage.io.view_store.view_store_of`), so a pin cannot point gc anywhere else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from storage.format.fields import FieldError, Fields
from storage.format.layout import (
    MANIFEST,
    NAME_HASH,
    VIEWS_DIR,
    UnsafePathError,
    parse_version_name,
)
from storage.format.manifest import Manifest, ManifestError
from storage.format.view import source_name
from storage.io.listing import list_tree
from storage.io.replicas.replica_set import ReplicaSet
from storage.io.view_store import view_store_of


@dataclass(frozen=True)
class Pin:
    """One pin: the view (a sibling folder's name) and the source version it selects from."""

    path: str
    view: str
    source_version: str


def pin_name(view: str, source_version: str) -> str:
    return f"{VIEWS_DIR}/{source_name(view)}/{source_version[:NAME_HASH]}.json"


def pin_bytes(view: str, source_version: str) -> bytes:
    return (json.dumps({"view": source_name(view), "source_version": source_version},
                       sort_keys=True) + "\n").encode()


def write_pin(source: ReplicaSet, view: str, source_version: str) -> str:
    """Pin ``source_version`` of ``source`` for the view ``view`` (idempotent)."""
    path = pin_name(view, source_version)
    source.put(path, pin_bytes(view, source_version))
    return path


def parse_pin(path: str, data: bytes) -> Pin:
    """A pin's record, checked: its view is a sibling's name, its path says the same."""
    try:
        f = Fields(json.loads(data), path)
        pin = Pin(path, source_name(f.string("view")), f.hex_digest("source_version"))
    except (FieldError, UnsafePathError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path}: not a view pin ({exc})") from None
    if path != pin_name(pin.view, pin.source_version):
        raise ManifestError(f"{path}: names view {pin.view!r} and version "
                            f"{pin.source_version[:NAME_HASH]}, its path says otherwise")
    return pin


def is_pin_path(rel: str) -> bool:
    return rel.startswith(VIEWS_DIR + "/") and rel.endswith(".json")


def view_versions(source: ReplicaSet, view: str) -> set[str] | None:
    """The source versions (sha256) the view ``view`` selects from in its live manifest and its
    version records; ``None`` when it cannot be read (so its pins are kept). An absent view
    uses none."""
    store = view_store_of(source, view)
    used: set[str] = set()
    try:
        for replica in store.replicas:
            loc = replica.loc
            tree = list_tree(loc)
            for rel in tree:
                if rel == MANIFEST or parse_version_name(rel) is not None:
                    data = loc.fs.cat_file(loc.path(rel))
                    manifest = Manifest.from_json(data, source=f"{view}/{rel}")
                    if manifest.view is not None:
                        used.add(manifest.view.source_version)
    except FileNotFoundError:
        return used
    except (OSError, ValueError):
        return None
    return used


def decide(pins: list[Pin], uses: dict[str, set[str] | None], young: set[str]
           ) -> tuple[set[str], list[str]]:
    """Pure: which source versions (sha256) the pins keep, and which pins are stale.

    ``uses[view]``: the versions that view selects from (``None``: unknown, keep its pins);
    ``young``: pins written less than the grace period ago (a select in progress pins before
    it commits), always kept."""
    kept: set[str] = set()
    stale: list[str] = []
    for pin in pins:
        used = uses.get(pin.view)
        if used is None or pin.source_version in used or pin.path in young:
            kept.add(pin.source_version)
        else:
            stale.append(pin.path)
    return kept, stale


def read_pins(source: ReplicaSet, tree: dict[str, dict[str, Any]]) -> list[Pin]:
    """Every pin in a replica's listing ``tree`` (read from ``source``); an unreadable pin is
    an error: gc cannot tell what it protects."""
    out = []
    for rel in sorted(tree):
        if is_pin_path(rel):
            out.append(parse_pin(rel, source.get(rel)))
    return out

