"""The command-line flags that name a replicated dataset: ``--replica``, ``--replica-config``
and ``--storage-options``, shared by ``python -m pipeline`` and ``python -m storage``.

Here rather than in :mod:`infra.config` because they are storage's own vocabulary (replica
sets, quorum writes); the mechanism that turns them into flags is :mod:`infra.config`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from cyclopts import Parameter

from infra.config import StorageOptions


@Parameter(name="*")
@dataclass
class ReplicaFlags:
    """The flags that name a replicated dataset (every command that reads or writes one)."""

    replica: Annotated[list[str], Parameter(
        negative="", metavar="URL", show_default=False)] = field(default_factory=list, metadata={
            "help": "another copy of the dataset (repeatable); reads fail over to it"})
    replica_config: Annotated[str | None, Parameter(metavar="FILE")] = field(
        default=None, metadata={
            "help": "TOML/JSON file with [[replica]] url, profile, storage_options per replica "
                    "and write_quorum (see storage/io/replicas/config.py)"})
    storage_options: StorageOptions = None

    @property
    def options(self) -> dict[str, Any]:
        return self.storage_options or {}

    def spec(self, url: str | None, write_quorum: int | None = None) -> Any:
        """The replicas named by ``url``, ``--replica`` and ``--replica-config``, in that
        order (a :class:`storage.io.replicas.config.ReplicaConfig`)."""
        from storage.io.replicas.config import ReplicaConfig, load_replica_config

        urls = ([url] if url else []) + list(self.replica)
        options: list[dict[str, Any] | None] = [None] * len(urls)
        if self.replica_config:
            cfg = load_replica_config(self.replica_config)
            urls += cfg.urls
            options += cfg.options
            write_quorum = write_quorum if write_quorum is not None else cfg.write_quorum
        if not urls:
            raise ValueError("no dataset URL given")
        return ReplicaConfig(urls, options, write_quorum)

    def store(self, url: str | None) -> Any:
        """The :class:`storage.ReplicaSet` these flags name, with ``url`` first."""
        from storage.io.replicas.replica_set import ReplicaSet

        spec = self.spec(url)
        return ReplicaSet.from_urls(spec.urls, self.options, spec.options,
                                    write_quorum=spec.write_quorum)
