"""The loader's settings, grouped by what they affect (frozen: a loader never changes them).

- :class:`loaders.plan.PlanParams` (``seed``, ``shuffle``, ``window_blocks``,
  ``run_blocks``): with ``seq_len``, the dataset and the lanes, they fix the order; saved in
  every state and checked on load (``run_blocks`` left unset is chosen from the dataset's
  size, and at a resume taken from the state).
- :class:`ReadSettings`: how row groups are fetched (read-ahead, threads, local cache); any
  value gives the same samples.
- ``return_sample_id`` / ``return_position_ids``: extra keys in each batch.

``LoaderSettings.from_kwargs`` maps the flat keyword arguments of ``build_dataloader`` and
``TokenDataset`` onto them, so both keep their keyword interface.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

from loaders.cache import DEFAULT_CACHE_BYTES
from loaders.coalesce import READAHEAD_BYTES
from loaders.plan import DEFAULT_WINDOW_BLOCKS, PlanParams

__all__ = ["DEFAULT_WINDOW_BLOCKS", "LoaderSettings", "ReadSettings"]


@dataclass(frozen=True)
class ReadSettings:
    """Row-group reads: ``read_threads`` fetch and decode ``lookahead_groups`` ahead;
    ``cache_dir`` keeps verified pieces on local disk, at most ``cache_bytes``;
    ``readahead_bytes`` bounds what requests to an object store may fetch early."""

    lookahead_groups: int = 16
    read_threads: int = 2
    cache_dir: str | None = None
    cache_bytes: int = DEFAULT_CACHE_BYTES
    #: decoded row groups a reader from an object store may hold ahead of their use, so that
    #: its requests can grow (``loaders.coalesce.AdaptiveWindow``) to a run per lane;
    #: local reads hold less
    readahead_bytes: int = READAHEAD_BYTES

    def __post_init__(self) -> None:
        if self.cache_bytes < 1:
            raise ValueError(f"cache_bytes must be >= 1, got {self.cache_bytes}")
        if self.readahead_bytes < 0:
            raise ValueError(f"readahead_bytes must be >= 0, got {self.readahead_bytes}")
        if self.cache_dir is not None and not isinstance(self.cache_dir, str):
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))


@dataclass(frozen=True)
class LoaderSettings:
    seq_len: int
    plan: PlanParams = field(default_factory=PlanParams)
    read: ReadSettings = field(default_factory=ReadSettings)
    return_sample_id: bool = False
    return_position_ids: bool = False

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {self.seq_len}")
        if self.plan.window_blocks < 1:
            raise ValueError(f"window_blocks must be >= 1, got {self.plan.window_blocks}")
        if self.plan.run_blocks is not None and self.plan.run_blocks < 1:
            raise ValueError(f"run_blocks must be >= 1 (or None: chosen from the dataset's "
                             f"size), got {self.plan.run_blocks}")

    @classmethod
    def given(cls, settings: LoaderSettings | None, seq_len: int | None,
              kwargs: dict[str, Any]) -> LoaderSettings:
        """The settings a caller meant: ``settings=`` or ``seq_len`` plus flat keywords."""
        if settings is None:
            if seq_len is None:
                raise TypeError("give seq_len or settings")
            return cls.from_kwargs(seq_len, **kwargs)
        if kwargs:
            raise TypeError(f"give settings= or keywords {sorted(kwargs)}, not both")
        return settings

    @classmethod
    def from_kwargs(cls, seq_len: int, **kwargs: Any) -> LoaderSettings:
        """Settings from flat keywords (``seed=``, ``read_threads=``, ``cache_dir=``, ...)."""
        groups: dict[str, dict[str, Any]] = {"plan": {}, "read": {}, "": {}}
        for key, value in kwargs.items():
            if key in _PLAN_KEYS:
                groups["plan"][key] = value
            elif key in _READ_KEYS:
                groups["read"][key] = value
            elif key in ("return_sample_id", "return_position_ids"):
                groups[""][key] = value
            else:
                raise TypeError(f"unknown loader setting {key!r}")
        return cls(seq_len, PlanParams(**groups["plan"]), ReadSettings(**groups["read"]),
                   **groups[""])


_PLAN_KEYS = {f.name for f in fields(PlanParams)}
_READ_KEYS = {f.name for f in fields(ReadSettings)}
