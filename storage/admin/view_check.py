"""``verify`` of a view: the source objects it names and its keep-masks.

``storage verify`` checks a view's own objects (manifest, index, keep-masks) on each of its
replicas like any dataset's. This adds what only a view has:

- the keep-masks agree with the index: per row group, the documents a mask keeps are the
  index's ``rows``;
- every source object the view names (the tokenizer, each shard) on each source replica beside
  a view replica, checked the way a reader uses it (:func:`storage.admin.verify.check_object`)
  against the source's own counts (the masks record them);
- each row group's kept documents hold the index's ``tokens`` (what the loader's plan counts):
  the shard read once, verified whole, its token column decoded and masked.

A problem names the replica and the object, like the rest of ``verify``'s report.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from storage.admin.verify import check_object
from storage.format import tokens
from storage.format.checksums import PIECE_DIGEST, SHA256
from storage.format.manifest import Manifest, ManifestError, ShardInfo
from storage.format.view import Masks
from storage.io.index_store import shards_of
from storage.io.replicas.replica_set import ReplicaError, ReplicaSet
from storage.io.view_store import physical_shard, read_masks, source_store


@dataclass
class ViewProblem:
    replica: str
    path: str
    kind: str
    detail: str = ""


def check_view(store: ReplicaSet, manifest: Manifest) -> tuple[int, list[ViewProblem]]:
    """Objects checked in the source and the problems found (see the module docstring)."""
    view = manifest.view
    assert view is not None and manifest.index is not None
    try:
        masks = read_masks(store, manifest)
        shards = shards_of(store, manifest)
    except (ManifestError, OSError, ReplicaError, ValueError) as exc:
        return 0, [ViewProblem("view", view.masks_path, "corrupt", str(exc)[:300])]
    problems: list[ViewProblem] = []
    kept = masks.kept_rows()
    algorithm = manifest.index.digest if manifest.index.digest in (PIECE_DIGEST, SHA256) \
        else SHA256
    encoding = manifest.schema.get("input_ids", tokens.LEGACY_LIST)
    source = source_store(store, manifest)
    checked = 0
    for path, size, sha in manifest.source_objects():
        checked += 1
        for replica in source.replicas:
            finding = check_object(replica.loc, path, size, sha)
            if finding is not None:
                problems.append(ViewProblem(replica.name, path, finding.kind, finding.detail))
    first = 0
    for shard in shards:
        checked += 1
        n = len(shard.row_groups)
        rows = np.array([g.rows for g in shard.row_groups], dtype=np.int64)
        bad = np.flatnonzero(kept[first:first + n] != rows)
        if len(bad):
            g = int(bad[0])
            problems.append(ViewProblem(
                "view", view.masks_path, "corrupt",
                f"{shard.path} row group {g}: the mask keeps {int(kept[first + g]):,} "
                f"documents, the index says {int(rows[g]):,}"))
        physical = physical_shard(shard, masks, first)
        found = False
        for replica in source.replicas:
            finding = check_object(replica.loc, shard.path, shard.bytes, shard.sha256, physical,
                                   algorithm, encoding)
            if finding is not None:
                found = True
                problems.append(ViewProblem(replica.name, shard.path, finding.kind,
                                            finding.detail))
        if not found and not len(bad):
            problem = _kept_tokens(source, shard, masks, first, encoding)
            if problem is not None:
                problems.append(ViewProblem("view", view.masks_path, "corrupt", problem))
        first += n
    return checked, problems


def _kept_tokens(source: ReplicaSet, shard: ShardInfo, masks: Masks, first: int,
                 encoding: str) -> str | None:
    """Where a row group's kept documents do not hold the tokens the view's index says."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = source.get(shard.path, sha256=shard.sha256)
    parquet = pq.ParquetFile(io.BytesIO(data))
    for g, info in enumerate(shard.row_groups):
        table = parquet.read_row_group(g, columns=["input_ids"], use_threads=False)
        column = table.column(0).filter(pa.array(masks.group(first + g)))
        count = len(tokens.unpack(column, encoding))
        if count != info.tokens:
            return (f"{shard.path} row group {g}: the kept documents hold {count:,} tokens, "
                    f"the view's index says {info.tokens:,}")
    return None
