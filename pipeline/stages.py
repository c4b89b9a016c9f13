"""The work one Dask task does for one partition: parse → clean → tokenize → write the shard.

Runs inside worker processes; it returns only small counts and the shard's manifest entry,
never the documents, so the driver's memory does not grow with the data.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline import tokenizing
from pipeline.cleaning import Cleaner
from pipeline.shards import write_quarantine, write_shard
from pipeline.sources import Document, Partition, Rejected, read_partition
from storage import ObjectInfo, ReplicaSet, ShardInfo, quarantine_name, shard_name


@dataclass
class PartitionResult:
    index: int
    shard: ShardInfo | None
    docs_in: int = 0
    docs_out: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)
    quarantine: ObjectInfo | None = None
    tokens: int = 0


def process_partition(part: Partition, store: ReplicaSet, tokenizer_json: str, eos_id: int | None,
                      text_field: str, row_group_tokens: int, encode_batch_docs: int,
                      storage_options: dict[str, Any] | None = None) -> PartitionResult:
    cleaner = Cleaner()
    rejected: list[dict[str, str]] = []
    doc_ids: list[str] = []
    texts: list[str] = []
    docs_in = 0
    for item in read_partition(part, text_field, storage_options):
        if isinstance(item, Rejected):
            rejected.append(asdict(item))
            continue
        assert isinstance(item, Document)
        docs_in += 1
        cleaned = cleaner(item.text)
        if cleaned is not None:
            doc_ids.append(item.doc_id)
            texts.append(cleaned)
    ids = []
    for lo in range(0, len(texts), encode_batch_docs):
        ids.extend(tokenizing.encode(tokenizer_json, eos_id, texts[lo:lo + encode_batch_docs]))
    shard = (write_shard(store, shard_name(part.index), doc_ids, ids, row_group_tokens)
             if ids else None)
    quarantine = (write_quarantine(store, quarantine_name(part.index), rejected)
                  if rejected else None)
    return PartitionResult(
        index=part.index, shard=shard, docs_in=docs_in + len(rejected), docs_out=len(ids),
        dropped=dict(cleaner.dropped),
        quarantined=dict(Counter(r["reason"] for r in rejected)),
        quarantine=quarantine, tokens=shard.tokens if shard else 0,
    )
