"""Dedup's options as ``pipeline run`` flags, checked together (bands x rows must fit in the
permutations; dedup signals need some dedup to count)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config_field import flag


@dataclass
class DedupFlags:
    """Exact and near-duplicate removal, and dedup's own signal columns."""

    dedup: str = flag("exact", "'exact': drop documents whose cleaned text repeats an earlier "
                      "one (the first by partition and position survives); 'none'")
    near_dup: bool = flag(False, "also drop near-duplicates found by MinHash LSH")
    near_dup_threshold: float = flag(0.7, "near-dup: estimated Jaccard similarity (of word "
                                     "shingles) at which two documents are near-duplicates; "
                                     "LSH candidates below it are not (0: keep every candidate)")
    minhash_perms: int = flag(256, "MinHash permutations (near-dup): all verify a candidate "
                              "pair, bands x rows of them make the LSH bands")
    minhash_bands: int = flag(21, "LSH bands (near-dup)")
    minhash_rows: int = flag(5, "MinHash values per LSH band (near-dup; 0: perms/bands)")
    shingle_words: int = flag(5, "words per shingle (near-dup)")
    dedup_signals: bool = flag(False, "dedup's own columns on every kept document: "
                               "dedup.exact_count (with --dedup exact: documents with its "
                               "exact text, itself included), dedup.cluster_id and "
                               "dedup.cluster_size (with --near-dup: its near-duplicate "
                               "cluster, id = its survivor's partition << 32 | row, size = its "
                               "documents); every shard is then re-encoded in phase 2",
                               manifest=False)  # see PipelineConfig.for_manifest
    dedup_buckets: int = flag(0, "hash buckets for the dedup shuffle (0: one per 512 Ki keys, "
                              "~50 MiB of worker memory, at most 4096); never changes the "
                              "result", manifest=False)

    def check_dedup(self) -> None:
        if self.dedup not in ("exact", "none"):
            raise ValueError(f"dedup must be 'exact' or 'none', not {self.dedup!r}")
        if self.dedup_signals and self.dedup == "none" and not self.near_dup:
            raise ValueError("--dedup-signals needs --dedup exact or --near-dup: with no dedup "
                             "there is nothing to count")
        rows = self.minhash_rows or self.minhash_perms // max(1, self.minhash_bands)
        if self.minhash_bands < 1 or rows < 1 or self.minhash_bands * rows > self.minhash_perms:
            raise ValueError(f"minhash: {self.minhash_bands} bands x {rows} rows need at least "
                             f"that many permutations, not {self.minhash_perms}")
        if not 0 <= self.near_dup_threshold <= 1:
            raise ValueError("near_dup_threshold must be in [0, 1]")
