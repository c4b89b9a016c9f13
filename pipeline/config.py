"""The pipeline's configuration: one dataclass that is the flags, the config-file keys, the
environment overrides and the manifest record, composed of the small dataclasses that live next
to the code they configure.

:class:`PipelineConfig` inherits its fields from those (cleaning's from
:mod:`pipeline.steps.cleaning`, dedup's from :mod:`pipeline.dedup.flags`, the tokenizer's from
:mod:`pipeline.tasks.tokenizing`, ...; the run's own inputs, execution and output are here), so
the flags stay one flat set with the names they always had, while each part's options and
checks sit with its code. Each field states its default once and carries its help text
(:func:`pipeline.config_field.flag`); ``python -m pipeline run`` (:mod:`pipeline.cli`) gets
``--flag-name`` for every field through the shared mechanism of :mod:`infra.config`,
``--config pipeline.toml|.yaml|.json`` accepts the same names (``text-field`` or
``text_field``) and ``SHARDFLOW_PIPELINE_TEXT_FIELD`` overrides the default. Fields marked
``NOT_A_FLAG`` are set by the CLI from its own flags (``INPUT``, ``--output``, the replica
flags). What a run resolved — defaults, environment, file and flags merged — is recorded in the
manifest, minus the knobs that cannot change the bytes (workers, scheduler, retries) and minus
anything secret.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Annotated, Any

from cyclopts import Parameter

# the flag types of the parts' fields: dataclasses resolve every part's annotations in this
# module (PipelineConfig's __init__ lives here), so each type a part names is imported here too
from infra.config import (  # noqa: F401
    CommaList,
    JsonObject,
    MinMax,
    OptionalCommaList,
    min_max,
)
from pipeline.config_field import NOT_A_FLAG, flag
from pipeline.dedup import signals as dedup_signals
from pipeline.dedup.flags import DedupFlags
from pipeline.driver.carbon import CarbonFlags
from pipeline.driver.worker_checks import WORKER_TTL_S
from pipeline.output import cluster
from pipeline.output.shards import DEFAULT_CODEC, ShardFlags
from pipeline.planning.plan import PACK_MAX_FILES
from pipeline.readers import DEFAULT_MAX_RECORD_BYTES, ReadOptions
from pipeline.steps.checks import resolved
from pipeline.steps.cleaning import CleaningFlags
from pipeline.steps.columns import META_COLUMNS
from pipeline.steps.decontaminate import DecontaminateFlags
from pipeline.steps.recipe import Recipe, RecipeFlags, parse_recipe_json
from pipeline.steps.registry import pinned
from pipeline.steps.rules import RuleSetFlags
from pipeline.steps.shorthand import parse_rule_sets, shorthand_recipe
from pipeline.steps.web import LanguageFlags, PiiFlags, UrlBlocklistFlags
from pipeline.tasks.record_steps import MAX_RECORD_S, RECORD_CPU_S, RECORD_WALL_S, RecordLimitFlags
from pipeline.tasks.tokenizing import TokenizerFlags
from pipeline.web import WebConfig, parse_filter_options, parse_filters
from pipeline.web.langid import check_languages
from storage import ReplicaSet, display_url
from storage.io.lease_record import positive_seconds

#: --worker-ttl's bounds: Dask's default (5 min) at most; heartbeats come every ~1 s
MIN_WORKER_TTL_S, MAX_WORKER_TTL_S = 5.0, 300.0

DEFAULT_OUTPUT = "data/shakespeare"

__all__ = ["DEFAULT_OUTPUT", "MAX_RECORD_S", "PipelineConfig", "cli_fields"]


@dataclass
class InputFlags:
    """What the run reads and how it cuts it into partitions."""

    inputs: Annotated[list[str], NOT_A_FLAG] = flag([], "files or globs", cli=False)
    inputs_from: Annotated[str | None, Parameter(metavar="FILE")] = flag(
        None, "also read the inputs listed in FILE (local or any fsspec URL), one per line: "
        "URL SIZE [VERSION] (spaces), CSV url,size[,version] or JSON Lines "
        '{"url", "size", "version"}; no listing, for millions of files. VERSION (ETag, mtime) '
        "tells a changed file apart on a rerun", manifest=False)
    text_field: str = flag("text", "JSONL/CSV/Parquet field holding the text")
    id_field: str | None = flag(None, "field holding a document id (default: file:line, "
                                "file@offset or file#row)")
    partition_bytes: int = flag(0, "split uncompressed JSONL/text files into byte ranges "
                                "(Parquet: row groups) of about this size, one task and one "
                                "shard each (compressed, CSV and WARC/WET files are never "
                                "split: one partition each, or packed when smaller, see "
                                "--files-per-partition); phase 1 streams it, so a worker holds "
                                "~250 MiB + the finished shard (~0.4 x this) with GPT-2. "
                                "0: input bytes / 64, within 1 MiB-1 GiB")
    files_per_partition: int = flag(PACK_MAX_FILES, "pack up to this many consecutive small "
                                    "files (each under the partition size) into one partition, "
                                    "task and shard, up to ~the partition size; 1: a partition "
                                    "never spans files", manifest=False)  # see for_manifest
    max_record_bytes: int = flag(DEFAULT_MAX_RECORD_BYTES, "records (lines, paragraphs, "
                                 "fields) larger than this are quarantined as "
                                 "record_too_large")
    strict: bool = flag(False, "stop at the first bad record, naming file and line, instead "
                        "of quarantining it", manifest=False)

    def check_inputs(self) -> None:
        if self.partition_bytes < 0 or self.max_record_bytes < 1:
            raise ValueError("partition_bytes must be >= 0 (0: automatic) and "
                             "max_record_bytes positive")
        if self.files_per_partition < 1:
            raise ValueError("files_per_partition must be at least 1 (1: no packing)")

    @property
    def read_options(self) -> ReadOptions:
        return ReadOptions(self.text_field, self.id_field, self.max_record_bytes)


@dataclass
class ExecutionFlags:
    """Where and how the Dask work runs (never changes the output bytes)."""

    workers: int = flag(0, "LocalCluster worker processes (0: cores / --tokenizer-threads)",
                        manifest=False)
    adapt: MinMax = flag(None, "adaptive LocalCluster scaling between MIN and MAX workers",
                         manifest=False)
    scheduler: str | None = flag(None, "address of a running Dask scheduler (tcp://host:8786) "
                                 "instead of starting a LocalCluster", manifest=False)
    dashboard_address: str = flag("127.0.0.1:8787", "where the LocalCluster serves its "
                                  "dashboard (':0' picks a free port)", manifest=False)
    retries: int = flag(2, "times Dask retries a failed task (a lost worker's tasks are "
                        "rescheduled anyway)", manifest=False)
    worker_ttl: Annotated[float, Parameter(metavar="SECONDS")] = flag(
        WORKER_TTL_S, "seconds the LocalCluster's scheduler waits for a silent (hung) "
        "worker's heartbeat before it drops the worker and reruns its tasks elsewhere; it "
        "checks every TTL, so a hung worker goes within twice this", manifest=False)

    def check_execution(self) -> None:
        positive_seconds("--worker-ttl", self.worker_ttl, MAX_WORKER_TTL_S)
        if self.worker_ttl < MIN_WORKER_TTL_S:  # heartbeats come every ~1 s; a busy loop lags
            raise ValueError(f"--worker-ttl must be at least {MIN_WORKER_TTL_S:g} seconds, "
                             f"not {self.worker_ttl:g}: a busy worker's heartbeat can lag that")
        if isinstance(self.adapt, str):  # given in Python as text: the flag's grammar
            try:
                self.adapt = min_max(self.adapt)
            except ValueError as exc:
                raise ValueError(f"adapt {exc}") from None

    @property
    def adapt_range(self) -> tuple[int, int] | None:
        """``(MIN, MAX)`` workers of ``--adapt`` (typed by the flag: :data:`MinMax`)."""
        return self.adapt


@dataclass
class OutputFlags:
    """Where the dataset goes: the output URL and its replicas, and the writer's lease."""

    output: Annotated[str, NOT_A_FLAG] = flag(
        DEFAULT_OUTPUT, "dataset URL", manifest=False, cli=False)
    storage_options: Annotated[dict[str, Any], NOT_A_FLAG] = flag(
        {}, "fsspec options", manifest=False, cli=False)
    replicas: Annotated[list[str], NOT_A_FLAG] = flag(
        [], "other replicas", manifest=False, cli=False)
    write_quorum: int | None = flag(None, "replicas each write must reach (default: all); a "
                                    "write that meets the quorum but misses a replica is "
                                    "recorded for `storage repair`", manifest=False)
    replica_options: Annotated[list[dict[str, Any] | None] | None, NOT_A_FLAG] = flag(
        None, "per-replica options", manifest=False, cli=False)
    wait: bool = flag(False, "when another run holds the output's writer lease, wait for it "
                      "(saying who holds it, again every 30 s) instead of failing at once",
                      manifest=False)
    lease_ttl: Annotated[float, Parameter(metavar="SECONDS")] = flag(
        90.0, "seconds the output's writer lease lasts unless renewed; the driver renews it "
        "every third of that, and a dead driver's lease is taken over once it expires",
        manifest=False)
    card: bool = flag(True, "write the dataset card (card/<version>/README.md and PNG "
                      "pictures: pipeline/output/card.py) before the commit; about 1-2 s on the "
                      "demo", manifest=False)

    def check_output(self) -> None:
        positive_seconds("--lease-ttl", self.lease_ttl)  # finite: NaN would never expire

    def output_store(self) -> ReplicaSet:
        """Where the dataset goes: ``output`` first, then each ``--replica``."""
        urls = [self.output, *self.replicas]
        options = self.replica_options or [None] * len(urls)
        return ReplicaSet.from_urls(urls, self.storage_options, options,
                                    write_quorum=self.write_quorum)


#: the parts, in the order their flags are listed (a dataclass lists its bases' fields from
#: the last base to the first: :class:`PipelineConfig` names them in reverse)
_PARTS = (InputFlags, RecordLimitFlags, CleaningFlags, LanguageFlags, RuleSetFlags,
          UrlBlocklistFlags, PiiFlags, DecontaminateFlags, RecipeFlags, DedupFlags,
          TokenizerFlags, ShardFlags, ExecutionFlags, OutputFlags, CarbonFlags)


@dataclass
class PipelineConfig(CarbonFlags, OutputFlags, ExecutionFlags, ShardFlags, TokenizerFlags,
                     DedupFlags, RecipeFlags, DecontaminateFlags, PiiFlags, UrlBlocklistFlags,
                     RuleSetFlags, LanguageFlags, CleaningFlags, RecordLimitFlags, InputFlags):
    """Every part's flags as one configuration; each part checks its own, then the recipe
    (which reads several parts) is checked."""

    def __post_init__(self) -> None:
        for part in _PARTS:
            for name, check in vars(part).items():
                if name.startswith("check_") and callable(check):
                    check(self)
        self.web_config  # noqa: B018 - validates --filters and --filter-options
        self.recipe  # noqa: B018 - validates --annotate, --steps and their mix with flags
        if self.cluster_by:  # a column the shards can have (exactly: once phase 1 has run)
            cluster.check_name(self.cluster_by, self.recipe.names(),
                               [*META_COLUMNS, *dedup_signals.names(True, True)])

    @property
    def n_workers(self) -> int:
        return self.workers or max(1, (os.cpu_count() or 1) // self.tokenizer_threads)

    def for_manifest(self) -> dict[str, Any]:
        """What the manifest records: the knobs that decide the output bytes.

        Not the output URL (a dataset may be copied elsewhere), not worker counts, scheduler or
        retries (they never change the result), and never storage options (credentials).
        """
        d = asdict(self)
        out = {f.name: d[f.name] for f in fields(self) if f.metadata.get("manifest", True)}
        out["inputs"] = [display_url(u) for u in self.inputs]
        if self.inputs_from:  # recorded only when used: other manifests keep their bytes
            out["inputs_from"] = display_url(self.inputs_from)
        if self.shard_compression != DEFAULT_CODEC:  # the same
            out["shard_compression"] = self.shard_compression
        if self.files_per_partition != PACK_MAX_FILES:  # the same: a rerun of files too big
            out["files_per_partition"] = self.files_per_partition  # to pack finds its work
        if self.cluster_by:  # the same: shards ordered by a column
            out["cluster_by"] = self.cluster_by
        if self.dedup_signals:  # the same: shards with dedup's columns
            out["dedup_signals"] = True
        out["steps"] = resolved(self.recipe)  # each step with its version: a changed step
        # changes the partition keys (its partitions are redone), an unchanged one does not
        limits = {k: d[k] for k, default in _RECORD_LIMITS.items() if d[k] != default}
        out.update(limits)  # the same: they decide which records are poison
        if self.web_config is not None:  # the same: recorded only when used
            out.update({k: _as_given(k, d[k]) for k in _WEB_FIELDS})
        return out

    @property
    def language_codes(self) -> tuple[str, ...]:
        """``--languages``, lower-cased, checked and sorted (() when not given)."""
        return check_languages(tuple(sorted({c.lower() for c in self.languages or ()})))

    @property
    def recipe(self) -> Recipe:
        """The steps this run applies: ``--steps`` (or the config file's ``[[steps]]``), else
        the recipe the step flags describe (:func:`pipeline.steps.shorthand.shorthand_recipe`)."""
        languages = self.language_codes
        if self.steps is not None:
            given = [f"--{name.replace('_', '-')}" for name, default in _STEP_FLAGS.items()
                     if getattr(self, name) != default]
            if given:
                raise ValueError(f"{', '.join(given)}: with a recipe (steps), give every "
                                 "step's options in the recipe, not as flags")
            return Recipe(pinned(parse_recipe_json(self.steps)), metadata=self.web_inputs)
        web = self.web_config
        recipe = shorthand_recipe(
            self.cleaning, web=web is not None, filters=parse_filters(self.filters),
            annotate=parse_rule_sets(self.annotate, "--annotate"),
            filter_options=parse_filter_options(self.filter_options), languages=languages,
            min_lang_score=self.min_lang_score, identify=web is not None and web.identify,
            url_blocklist=self.url_blocklist, pii=self.pii == "mask",
            metadata=web is not None and web.metadata,
            decontaminate=self.decontaminate_options(), decontaminate_mode=self.decontaminate_mode)
        return Recipe(pinned(recipe.steps), recipe.metadata)

    @property
    def web_config(self) -> WebConfig | None:
        """The web steps this run applies (None: none; the pipeline is as it always was)."""
        filters = parse_filters(self.filters)
        options = parse_filter_options(self.filter_options)
        languages = self.language_codes
        if not (self.web_inputs or languages or filters or self.url_blocklist
                or self.pii == "mask"):
            return None
        metadata = self.web_inputs or bool(languages)
        return WebConfig(filters=filters, filter_options=options, languages=languages,
                         min_lang_score=self.min_lang_score, identify=metadata,
                         url_blocklist=self.url_blocklist, pii=self.pii == "mask",
                         metadata=metadata)


#: the flags a recipe replaces, and their defaults (a recipe with one of them set is an error)
_STEP_FLAGS = {"fix_mojibake": True, "min_chars": 1, "max_chars": 0, "min_alpha_frac": 0.0,
               "max_repeated_line_frac": 1.0, "languages": None, "min_lang_score": 0.65,
               "filters": (), "filter_options": None, "url_blocklist": None, "pii": "none",
               "annotate": (), "decontaminate": None, "decontaminate_n": 13,
               "decontaminate_min_overlap": 0.0, "decontaminate_mode": "filter"}

#: record limits and their defaults (recorded in the manifest only when changed)
_RECORD_LIMITS = {"record_cpu_s": RECORD_CPU_S, "record_wall_s": RECORD_WALL_S}

_WEB_FIELDS = ("languages", "min_lang_score", "filters", "filter_options", "url_blocklist",
               "pii", "web_inputs")


def _as_given(name: str, value: Any) -> Any:
    """A typed web flag as the manifest has always recorded it: the text of the flag
    (``"gopher,c4"``, the options' JSON), so that a rerun's record, and the partition keys
    made from it, stay the same bytes."""
    if name in ("filters", "annotate") or (name == "languages" and value is not None):
        return ",".join(value)
    if name == "filter_options" and value is not None:
        return json.dumps(value)
    return value


def cli_fields() -> list[Any]:
    """The fields that are flags (and config-file keys), in declaration order."""
    return [f for f in fields(PipelineConfig) if f.metadata.get("cli", True)]
