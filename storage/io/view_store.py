"""A view on the store: where its source's objects are, and its keep-masks, read verified.

A view names its source as a sibling folder (:func:`storage.format.view.source_name`), so each
replica of the view finds the source beside it: replica ``s3://a/d/web-en`` reads shards from
``s3://a/d/web``, replica ``/mnt/b/web-en`` from ``/mnt/b/web``, with the same filesystem and
credentials. Nothing a manifest says can point a reader at another bucket or above the view's
own parent folder.
"""

from __future__ import annotations

import posixpath
import threading
from collections import OrderedDict
from dataclasses import replace

from storage.format.manifest import Manifest, ManifestError, ShardInfo
from storage.format.view import MaskFormatError, Masks, source_name
from storage.io.local.files import LocalFiles
from storage.io.replicas.replica_set import ReplicaSet
from storage.io.urls import Location


def sibling(loc: Location, name: str) -> Location:
    """The location of folder ``name`` beside ``loc``'s (same parent, same filesystem)."""
    name = source_name(name)
    root = loc.root.rstrip("/")
    parent = posixpath.dirname(root)
    if not parent or parent == root:
        raise ManifestError(f"{loc.url}: a view at the top of a store has no sibling folder "
                            "to find its source in")
    url_base = loc.url.rstrip("/")
    url = f"{url_base.rsplit('/', 1)[0]}/{name}"
    new_root = f"{parent}/{name}"
    if loc.is_local:  # a filesystem confined to the source's root (ReplicaSet confines it)
        return Location(new_root, LocalFiles(None), new_root)
    return replace(loc, url=url, root=new_root)


def source_store(store: ReplicaSet, manifest: Manifest) -> ReplicaSet:
    """The replica set of a view's source: each of ``store``'s replicas' sibling folder."""
    if manifest.view is None:
        return store
    return ReplicaSet([sibling(r.loc, manifest.view.source) for r in store.replicas],
                      write_quorum=1)


def view_store_of(source: ReplicaSet, view_name: str) -> ReplicaSet:
    """The replica set of the view ``view_name`` beside each of ``source``'s replicas (what a
    source's pin names, read by ``gc``)."""
    return ReplicaSet([sibling(r.loc, view_name) for r in source.replicas], write_quorum=1)


_MASKS: OrderedDict[str, Masks] = OrderedDict()
_LOCK = threading.Lock()
_KEPT = 4


def read_masks(store: ReplicaSet, manifest: Manifest) -> Masks:
    """A view's keep-masks, verified against its manifest (size and sha256), parsed and
    checked against its index's row-group count; cached per sha256 (a few per process)."""
    view = manifest.view
    if view is None:
        raise ValueError("not a view: no keep-masks")
    with _LOCK:
        if view.masks_sha256 in _MASKS:
            _MASKS.move_to_end(view.masks_sha256)
            return _MASKS[view.masks_sha256]
    data = store.get(view.masks_path, sha256=view.masks_sha256)
    if len(data) != view.masks_bytes:
        raise ManifestError(f"{view.masks_path}: {len(data)} bytes, the manifest says "
                            f"{view.masks_bytes}")
    try:
        masks = Masks(data, view.masks_path)
    except MaskFormatError as exc:
        raise ManifestError(str(exc)) from None
    if len(masks) != manifest.counts.row_groups:
        raise ManifestError(f"{view.masks_path}: masks for {len(masks)} row groups, the view "
                            f"has {manifest.counts.row_groups}")
    with _LOCK:
        _MASKS[view.masks_sha256] = masks
        while len(_MASKS) > _KEPT:
            _MASKS.popitem(last=False)
    return masks


def physical_shard(shard: ShardInfo, masks: Masks, first: int) -> ShardInfo:
    """A view's shard as its source's index has it: the source's rows and tokens per row group
    (from the masks, ``first`` being the shard's first row group in the view's index), what a
    check of the shard's bytes (``storage.admin.verify.check_object``) compares them with."""
    groups = tuple(replace(g, rows=int(masks.source_rows[first + i]),
                           tokens=int(masks.source_tokens[first + i]))
                   for i, g in enumerate(shard.row_groups))
    return replace(shard, row_groups=groups, rows=sum(g.rows for g in groups),
                   tokens=sum(g.tokens for g in groups))
