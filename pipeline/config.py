"""The pipeline's resolved configuration: what the flags say, with defaults filled in."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from storage import ReplicaSet

DEFAULT_OUTPUT = "data/shakespeare"


@dataclass
class PipelineConfig:
    inputs: list[str] = field(default_factory=list)
    output: str = DEFAULT_OUTPUT
    text_field: str = "text"
    tokenizer: str = "gpt2"
    workers: int = 0  # 0: one per core
    scheduler: str | None = None
    dashboard_address: str = "127.0.0.1:8787"
    row_group_tokens: int = 256 * 1024
    encode_batch_docs: int = 1024
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)
    replicas: list[str] = field(default_factory=list)
    write_quorum: int | None = None
    replica_options: list[dict[str, Any] | None] | None = field(default=None, repr=False)

    def output_store(self) -> ReplicaSet:
        """Where the dataset goes: ``output`` first, then each ``--replica``."""
        urls = [self.output, *self.replicas]
        options = self.replica_options or [None] * len(urls)
        return ReplicaSet.from_urls(urls, self.storage_options, options,
                                    write_quorum=self.write_quorum)

    @property
    def n_workers(self) -> int:
        return self.workers or os.cpu_count() or 1

    def for_manifest(self) -> dict[str, Any]:
        """What the manifest records: the knobs that decide the output bytes.

        Not the output URL (a dataset may be copied elsewhere), not worker counts or the
        scheduler (they never change the result), and never storage options (credentials).
        """
        d = asdict(self)
        for key in ("output", "workers", "scheduler", "dashboard_address", "storage_options",
                    "replicas", "write_quorum", "replica_options"):
            d.pop(key)
        return d
