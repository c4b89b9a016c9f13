"""Sources of samples: what a loader reads from. One dataset and a mixture are both one.

A :class:`Source` answers two questions, and nothing else:

- *which* samples: ``lane_samples(epoch, lanes, lo, hi)``, the sample ids of lanes
  ``lo .. hi - 1`` of an epoch (``[hi - lo, lane_length(lanes)]``), a pure function of the
  source's plan (see :mod:`loaders.plan`); a rank or worker asks only for its own lanes.
  ``lane_plan`` gives the same lanes a range of columns at a time (see :func:`rank_stream`):
  a dataset computes only those columns, so a rank never needs its whole epoch in memory;
- *what* they hold: ``windows(samples)``, their token windows (``seq_len + 1`` each), in
  order, read ahead; closing the iterator stops the read-ahead at once.

Everything a caller uses is in the protocol: the loader never probes a source for optional
methods.

Ranks, workers, batches and progress are the loader's (:mod:`loaders.dataloader`); a source
holds no position. :class:`DatasetSource` is one Shardflow dataset; a mixture of sources is
:class:`loaders.mixture.MixtureSource`.
"""

from __future__ import annotations

import copy
from collections.abc import Generator
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

from infra.process.local import ProcessLocal, none
from loaders import plan, shared_index
from loaders.cache import ChunkCache
from loaders.coalesce import run_per_lane_bytes
from loaders.prefetch import PrefetchingWindows, decoded_group_bytes
from loaders.reader import RowGroupIndex, TokenReader
from loaders.settings import LoaderSettings
from loaders.state import PLAN_DEFAULTS, check_state
from storage import Manifest, ReplicaSet
from storage.io.view_store import read_masks, source_store


class Windows(Protocol):
    """Token windows in order; the iterator is a generator, so ``close()`` stops its
    read-ahead now rather than when garbage collection gets to it."""

    def __iter__(self) -> Generator[np.ndarray, None, None]: ...


@runtime_checkable
class Source(Protocol):
    seq_len: int
    eos_id: int | None
    #: the tokenizer's sha256 (sources mixed together must agree on it); None if unknown
    tokenizer_sha256: str | None
    #: samples in one epoch of the source (before the lanes' padding)
    n_samples: int

    def plan_identity(self, lanes: int) -> dict[str, Any]:
        """What fixes this source's order over ``lanes`` lanes (saved in loader states,
        compared on load)."""
        ...

    def lane_length(self, lanes: int) -> int: ...

    def lane_samples(self, epoch: int, lanes: int, lane_lo: int, lane_hi: int
                     ) -> np.ndarray: ...

    def lane_plan(self, epoch: int, lanes: int, lane_lo: int, lane_hi: int
                  ) -> plan.LaneColumns: ...

    def windows(self, samples: np.ndarray) -> Windows: ...

    def metrics(self) -> dict[str, float]: ...


def adopting_saved_plan(source: Source, state: Any) -> Source:
    """``source`` on the plan a saved loader state was taken on, where the source's settings
    left a choice open (``run_blocks`` unset): sources without :meth:`adopting` (a custom
    one) as they are. The state is outside input: anything but a dict changes nothing (the
    state check names it)."""
    saved = state.get("plan") if isinstance(state, dict) else None
    adopt = getattr(source, "adopting", None)
    return adopt(saved) if isinstance(saved, dict) and adopt is not None else source


def resume_on_saved_plan(source: Source, state: Any, lanes: int
                         ) -> tuple[Source, plan.Progress]:
    """The source to continue ``state`` on (:func:`adopting_saved_plan`) and the progress in
    it, checked against that source's plan over ``lanes`` lanes
    (:class:`loaders.state.LoaderStateError` naming any difference). Nothing is changed:
    the caller takes the source only once all its own checks have passed."""
    adopted = adopting_saved_plan(source, state)
    identity = {**adopted.plan_identity(lanes), "lanes": lanes}
    return adopted, check_state(state, identity)


def rank_stream(source: Source, layout: plan.Layout, progress: plan.Progress,
                lanes: tuple[int, int] | None = None,
                chunk_samples: int = plan.STREAM_CHUNK) -> plan.RankStream:
    """This rank's samples still to come in the epoch of ``progress``, a chunk of global steps
    at a time (the same sequence as ``plan.sequence(source.lane_samples(...), ...)``).

    ``lanes``: absolute lane range (default: the rank's). A dataset generates only the
    chunk's columns; a mixture (its per-lane slot permutation is drawn whole) has its lanes
    materialised once and sliced.
    """
    lo, hi = lanes if lanes is not None else layout.rank_lanes()
    m = source.lane_length(layout.lanes)
    columns = source.lane_plan(progress.epoch, layout.lanes, lo, hi).columns
    return plan.RankStream(columns, m, layout, progress, chunk_samples)


class GroupPlan:
    """The plan half of a dataset source: tokens per row group -> lanes (pure, no I/O).

    Holds one compact per-row-group array (samples per row group, in the smallest unsigned
    type that holds them: a dataset source maps it from the host's shared copy); what a rank
    computes from it is one chunked pass over the permuted sizes from the nearer end of the
    epoch (at most half of them, stopping past its lanes), one chunked prefix sum up to its
    last row group, plus O(its samples). ``first_sample``, when given, only gives the total
    (the prefix sums are not looked up at scattered row groups: each lookup would make a
    large folio of the mapping resident).
    ``benchmarks/plan_scale.py`` runs exactly this from a synthetic index."""

    def __init__(self, group_tokens: np.ndarray | None, settings: LoaderSettings,
                 group_samples: np.ndarray | None = None,
                 first_sample: np.ndarray | None = None) -> None:
        self.settings = settings
        self.seq_len = settings.seq_len
        if group_samples is None:  # else given: samples per row group, already counted
            assert group_tokens is not None
            group_samples = self.count_samples(group_tokens, self.seq_len)
        self.group_samples = group_samples
        self.first_sample = first_sample
        self.n_samples = (int(first_sample[-1]) if first_sample is not None
                          else int(self.group_samples.sum(dtype=np.int64)))

    @staticmethod
    def count_samples(group_tokens: np.ndarray, seq_len: int) -> np.ndarray:
        """Samples per row group in the smallest of uint8/uint16/uint32/int64 that holds
        them (at the default sizes, ~127 per row group: one byte each)."""
        tokens = np.asarray(group_tokens)
        top = int(tokens.max()) // (seq_len + 1) if len(tokens) else 0
        dtype = smallest_uint(top)
        if tokens.dtype.kind == "u" and tokens.dtype.itemsize <= 4:
            return np.floor_divide(tokens, seq_len + 1).astype(dtype)  # no int64 copy
        return plan.group_samples(tokens, seq_len).astype(dtype)

    def plan_identity(self, lanes: int) -> dict[str, Any]:
        p = self.settings.plan.resolved(len(self.group_samples), lanes)
        identity = {"n_samples": self.n_samples, "seq_len": self.seq_len, "seed": p.seed,
                    "shuffle": p.shuffle, "window_blocks": p.window_blocks,
                    "row_groups": len(self.group_samples)}
        if p.run_blocks != 1:  # absent = 1: states saved before the setting existed still load
            identity["run_blocks"] = p.run_blocks
        return identity

    def adopting(self, saved: dict[str, Any]) -> GroupPlan:
        """This plan, its unset ``run_blocks`` taken from a saved state's plan (absent there:
        1, what every state before the default chose runs meant). A resume continues the order
        it started with, whatever the default has become since; a value set on purpose is
        kept (and a state on another one is refused, by :func:`loaders.state.check_state`)."""
        k = saved.get("run_blocks", PLAN_DEFAULTS["run_blocks"])
        # A state is outside input: a run longer than the dataset (its permutation's domain
        # is padded to whole runs, so 10**9 would make a plan scan a billion empty slots) is
        # not adopted, and the state check names it.
        if (self.settings.plan.run_blocks is not None or not isinstance(k, int)
                or isinstance(k, bool) or not 1 <= k <= max(1, len(self.group_samples))):
            return self
        adopted = copy.copy(self)
        adopted.settings = replace(self.settings,
                                   plan=replace(self.settings.plan, run_blocks=k))
        return adopted

    def lane_length(self, lanes: int) -> int:
        return plan.lane_length(self.n_samples, lanes)

    def lane_samples(self, epoch: int, lanes: int, lane_lo: int, lane_hi: int) -> np.ndarray:
        return plan.lane_samples(self.group_samples, self.settings.plan, epoch, lanes,
                                 lane_lo, lane_hi)

    def lane_plan(self, epoch: int, lanes: int, lane_lo: int, lane_hi: int) -> plan.LanePlan:
        """The same lanes, a range of columns at a time (nothing per sample up front)."""
        return plan.LanePlan(self.group_samples, self.settings.plan, epoch, lanes, lane_lo,
                             lane_hi)


def samples_from_starts(starts: np.ndarray, seq_len: int,
                        chunk: int = plan.CHUNK * 16) -> dict[str, np.ndarray]:
    """``group_samples`` (:meth:`GroupPlan.count_samples` of the row groups' tokens) and its
    exclusive prefix sums ``first_sample`` (int64, ``n + 1``), from the token offsets
    ``starts`` a chunk at a time: no int64 temporary over all row groups."""
    n = len(starts) - 1
    top = 0
    for lo in range(0, n, chunk):
        top = max(top, int(np.diff(starts[lo:min(lo + chunk, n) + 1]).max()))
    counts = np.empty(n, dtype=smallest_uint(top // (seq_len + 1)))
    first = np.empty(n + 1, dtype=np.int64)
    first[0] = 0
    carry = 0
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        part = np.diff(starts[lo:hi + 1]) // (seq_len + 1)
        counts[lo:hi] = part
        np.cumsum(part, out=first[lo + 1:hi + 1])
        first[lo + 1:hi + 1] += carry
        carry = int(first[hi])
    return {"group_samples": counts, "first_sample": first}


def smallest_uint(top: int) -> type[np.integer]:
    """The smallest unsigned NumPy type holding ``0 .. top`` (int64 past uint32)."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(dtype).max:
            return dtype
    return np.int64


class DatasetSource(ProcessLocal):
    """One dataset: its manifest, row-group index, plan and (per process) reader."""

    #: open files and caches stay in the process that made them
    _process_local = {"_reader": none}

    def __init__(self, url: str, settings: LoaderSettings, *,
                 storage_options: dict[str, Any] | None = None,
                 replicas: list[str] | None = None,
                 replica_options: list[dict[str, Any] | None] | None = None,
                 manifest: Manifest | None = None) -> None:
        self.url = url
        self.settings = settings
        self.seq_len = settings.seq_len
        # All reads go through the replica set: the first URL is preferred, the others are
        # failover copies (each may have its own storage options: endpoint, credentials).
        self.store = ReplicaSet.from_urls([url, *(replicas or [])], storage_options,
                                          replica_options)
        self.manifest = manifest or self.store.read_manifest()
        # A view (storage.format.view): its index counts the kept documents, its shards are
        # its source's, beside each replica, and each row group is masked as it is decoded.
        self.shards = source_store(self.store, self.manifest)
        self.masks = (read_masks(self.store, self.manifest) if self.manifest.view is not None
                      else None)
        self.eos_id = self.manifest.eos_id
        self.tokenizer_sha256: str | None = self.manifest.tokenizer.sha256
        if settings.return_position_ids and self.eos_id is None:
            raise ValueError("position_ids need the tokenizer's EOS id; the manifest has none")
        # The plan's column of the index (v2; a v1 manifest's inline shards otherwise), once,
        # through the local cache when one is set; the read columns come on the first read.
        # A large index's arrays are mapped from this host's one copy (loaders.shared_index).
        shared = shared_index.index_dir(settings.read.cache_dir)
        self.index = RowGroupIndex.open(self.store, self.manifest, self._cache(), shared)
        ref, index = self.manifest.index, self.index

        def samples() -> dict[str, np.ndarray]:
            return samples_from_starts(index.starts, self.seq_len)

        if ref is not None and ref.bytes >= shared_index.MIN_INDEX_BYTES:
            n = len(index)
            arrays = shared_index.shared_arrays(
                shared, f"{ref.sha256[:16]}-samples2-{self.seq_len}", samples,
                shared_index.expect({"group_samples": n, "first_sample": n + 1}))
        else:
            arrays = samples()
        self.plan = GroupPlan(None, settings, arrays["group_samples"],
                              arrays["first_sample"])
        self.n_samples = self.plan.n_samples
        self.first_sample = arrays["first_sample"]
        self._reader: TokenReader | None = None

    def plan_identity(self, lanes: int) -> dict[str, Any]:
        return self.plan.plan_identity(lanes)

    def readahead_advice(self, lanes_per_reader: int, lanes: int) -> str | None:
        """Why and how to raise ``readahead_bytes``, when from an object store it cannot hold
        a whole run of each of the ``lanes_per_reader`` lanes one reader serves (a run then
        costs two or more GETs: ``loaders.coalesce.run_per_lane_bytes``); None when it can,
        or when nothing is remote or there are no runs."""
        if all(r.loc.is_local for r in self.shards.replicas) or not len(self.index):
            return None
        read = self.settings.read
        run = plan.run_length(self.settings.plan.resolved(len(self.index), lanes),
                              len(self.index))
        need = run_per_lane_bytes(lanes_per_reader, run, read.lookahead_groups,
                                  decoded_group_bytes(self.index))
        if run <= 1 or read.readahead_bytes >= need:
            return None
        have, want = read.readahead_bytes / 2**20, -(-need * 10 // 2**20) / 10
        return (f"readahead_bytes={have:.1f} MiB holds less than a run of {run} row groups for "
                f"each of the {lanes_per_reader} lanes a reader serves, so from "
                f"{self.shards.replicas[0].name} a run takes two or more requests; "
                f"readahead_bytes={want:.1f} MiB (memory held per reader) keeps one request "
                "per run, fewer lanes per rank or worker need less")

    def adopting(self, saved: dict[str, Any]) -> DatasetSource:
        """This source on a saved state's plan where its own settings left a choice open
        (:meth:`GroupPlan.adopting`); itself when nothing changes."""
        group_plan = self.plan.adopting(saved)
        if group_plan is self.plan:
            return self
        adopted = copy.copy(self)  # the reader, per process, is made again on first use
        adopted.plan, adopted.settings = group_plan, group_plan.settings
        return adopted

    def lane_length(self, lanes: int) -> int:
        return self.plan.lane_length(lanes)

    def lane_samples(self, epoch: int, lanes: int, lane_lo: int, lane_hi: int) -> np.ndarray:
        return self.plan.lane_samples(epoch, lanes, lane_lo, lane_hi)

    def lane_plan(self, epoch: int, lanes: int, lane_lo: int, lane_hi: int) -> plan.LanePlan:
        return self.plan.lane_plan(epoch, lanes, lane_lo, lane_hi)

    def sample_starts(self, samples: np.ndarray) -> np.ndarray:
        """Token offset of each sample in the dataset's token stream."""
        samples = np.asarray(samples, dtype=np.int64)
        g = np.searchsorted(self.first_sample, samples, side="right") - 1
        return self.index.starts[g] + (samples - self.first_sample[g]) * (self.seq_len + 1)

    def _cache(self) -> ChunkCache | None:
        read = self.settings.read
        return ChunkCache(read.cache_dir, read.cache_bytes) if read.cache_dir else None

    @property
    def reader(self) -> TokenReader:
        if self._reader is None:
            self._reader = TokenReader(self.store, self.index, self._cache(),
                                       shards=self.shards, masks=self.masks)
        return self._reader

    def windows(self, samples: np.ndarray) -> PrefetchingWindows:
        """The token windows (``seq_len + 1`` each) of ``samples``, in order, read ahead."""
        read = self.settings.read
        return PrefetchingWindows(self.reader, self.sample_starts(samples), self.seq_len,
                                  read.lookahead_groups, read.read_threads,
                                  readahead_bytes=read.readahead_bytes)

    def metrics(self) -> dict[str, float]:
        """``bytes_read``/``row_groups_read`` count the store only; pieces served by the local
        cache count in ``cache_hits`` (``cache_misses``: looked up, then fetched);
        ``footers_read``: shards' footers fetched and parsed (0 where the index records the
        shards' codecs)."""
        reader = self._reader
        cache = reader.cache if reader else None
        return {
            "bytes_read": float(reader.bytes_read if reader else 0),
            "row_groups_read": float(reader.groups_read if reader else 0),
            "requests": float(reader.requests if reader else 0),
            "footers_read": float(reader.footers_read if reader else 0),
            "failovers": float(self.store.failovers + (
                self.shards.failovers if self.shards is not self.store else 0)),
            "cache_hits": float(cache.hits if cache else 0),
            "cache_misses": float(cache.misses if cache else 0),
            "cache_corrupt": float(cache.corrupt if cache else 0),
        }
