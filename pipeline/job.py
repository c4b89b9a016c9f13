"""The pipeline job: plan partitions, run them on Dask, commit the manifest, summarise."""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from distributed import as_completed

from pipeline import tokenizing
from pipeline.cluster import dask_client
from pipeline.config import PipelineConfig
from pipeline.progress import ProgressBar
from pipeline.shards import SCHEMA_DESCRIPTION
from pipeline.sources import default_corpus, discover
from pipeline.stages import PartitionResult, process_partition
from storage import MANIFEST, TOKENIZER, Manifest, TokenizerInfo, display_url


@dataclass
class RunSummary:
    output: str
    partitions: int
    shards: int
    docs_in: int
    docs_out: int
    dropped: dict[str, int]
    quarantined: dict[str, int]
    tokens: int
    bytes: int
    wall_s: float
    dashboard: str | None = None
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def render(self) -> str:
        def reasons(d: dict[str, int]) -> str:
            return ", ".join(f"{k}={v}" for k, v in sorted(d.items())) or "none"
        return "\n".join([
            f"dataset      {self.output}",
            f"partitions   {self.partitions} -> {self.shards} shards",
            f"documents    {self.docs_in} in, {self.docs_out} out",
            f"dropped      {reasons(self.dropped)}",
            f"quarantined  {reasons(self.quarantined)}",
            f"tokens       {self.tokens:,}",
            f"bytes        {self.bytes:,} (Parquet, zstd)",
            f"wall time    {self.wall_s:.2f} s",
            f"throughput   {self.tokens_per_s:,.0f} tokens/s",
        ])


def build_manifest(cfg: PipelineConfig, tok: tokenizing.TokenizerSpec,
                   results: list[PartitionResult]) -> Manifest:
    """The manifest from the partition results, in partition order (never completion order)."""
    results = sorted(results, key=lambda r: r.index)
    dropped: Counter[str] = Counter()
    quarantined: Counter[str] = Counter()
    for r in results:
        dropped.update(r.dropped)
        quarantined.update(r.quarantined)
    shards = tuple(r.shard for r in results if r.shard is not None)
    stats = {
        "documents_in": sum(r.docs_in for r in results),
        "documents_out": sum(r.docs_out for r in results),
        "dropped": dict(sorted(dropped.items())),
        "quarantined": dict(sorted(quarantined.items())),
        "tokens": sum(s.tokens for s in shards),
        "bytes": sum(s.bytes for s in shards),
        "partitions": len(results),
    }
    return Manifest(
        tokenizer=TokenizerInfo(name=tok.name, path=TOKENIZER, sha256=tok.sha256,
                                vocab_size=tok.vocab_size, eos_id=tok.eos_id,
                                eos_token=tok.eos_token, bytes=len(tok.json.encode("utf-8"))),
        shards=shards, schema=dict(SCHEMA_DESCRIPTION), config=cfg.for_manifest(),
        stats=stats,
        quarantine=tuple(r.quarantine for r in results if r.quarantine),
    )


def run(cfg: PipelineConfig, log: TextIO | None = None, progress: bool = True) -> RunSummary:
    """Run the whole job and commit the dataset; returns the summary that the CLI prints."""
    log = log or sys.stderr
    start = time.perf_counter()
    if not cfg.inputs:
        cfg.inputs = default_corpus()
    partitions = discover(cfg.inputs, cfg.storage_options)
    tok = tokenizing.load(cfg.tokenizer)
    store = cfg.output_store()
    # Un-commit any earlier dataset here first: while shards are rewritten, readers must not
    # see an old manifest pointing at new bytes.
    store.delete(MANIFEST)
    where = " + ".join(display_url(r.loc.url) for r in store.replicas)
    print(f"shardflow: {len(partitions)} partitions -> {where} "
          f"(tokenizer {tok.name}, vocab {tok.vocab_size})", file=log)

    results: list[PartitionResult] = []
    with dask_client(cfg.n_workers, cfg.scheduler, cfg.dashboard_address) as client:
        dashboard = client.dashboard_link
        n = len(client.scheduler_info(n_workers=-1).get("workers", {}))
        print(f"dask: {n} workers, dashboard {dashboard}", file=log)
        tok_future = client.scatter(tok.json, broadcast=True, hash=True)
        futures = [
            client.submit(process_partition, part, store, tok_future, tok.eos_id,
                          cfg.text_field, cfg.row_group_tokens, cfg.encode_batch_docs,
                          cfg.storage_options, key=f"partition-{part.index:05d}-{tok.sha256[:8]}",
                          pure=False)
            for part in partitions
        ]
        bar = ProgressBar(len(futures), enabled=progress, stream=log)
        for fut in as_completed(futures):
            result: PartitionResult = fut.result()
            results.append(result)
            bar.update(1, result.tokens)

    store.put(TOKENIZER, tok.json.encode("utf-8"))
    manifest = build_manifest(cfg, tok, results)
    store.put(MANIFEST, manifest.to_json().encode("utf-8"))  # the commit: last, atomic
    stats = manifest.stats
    return RunSummary(
        output=where, partitions=len(partitions), shards=len(manifest.shards),
        docs_in=stats["documents_in"], docs_out=stats["documents_out"],
        dropped=stats["dropped"], quarantined=stats["quarantined"], tokens=stats["tokens"],
        bytes=stats["bytes"], wall_s=time.perf_counter() - start, dashboard=dashboard,
    )
