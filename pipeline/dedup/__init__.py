"""Deduplication: keys per document (pure), and which documents the keys condemn (pure).

Exact dedup keys a document by a 128-bit hash of its cleaned text; near-dup (MinHash LSH)
adds one key per band of its MinHash signature. Keys are shuffled into buckets by hash on the
Dask workers (see ``pipeline.dedup.shuffle``); in each bucket, among the documents that share an
exact key, the one with the smallest ``(partition, position)`` survives. Band keys connect
documents instead: of each connected component of documents linked by shared bands (chains
included, ``pipeline.dedup.components``), the smallest ``(partition, position)`` survives.
A band key only makes two documents *candidates*: the edge counts when their MinHash sketches
(kept by phase 1) estimate a Jaccard similarity at the threshold (``pipeline.dedup.verify``).
Both rules name the same survivors whatever the partitioning, workers, buckets or retries.
"""

from pipeline.dedup.keys import (
    ENTRY,
    KIND_EXACT,
    KIND_NEAR,
    MinHasher,
    content_key,
    entries,
    sketch,
)
from pipeline.dedup.resolve import DROP, merge_drops, resolve, split_by_bucket

__all__ = ["DROP", "ENTRY", "KIND_EXACT", "KIND_NEAR", "MinHasher", "content_key", "entries",
           "merge_drops", "resolve", "sketch", "split_by_bucket"]
