"""The pipeline's configuration: one dataclass that is the flags, the config-file keys, the
environment overrides and the manifest record.

Each field states its default once and carries its help text; ``python -m pipeline run``
(:mod:`pipeline.cli`) gets ``--flag-name`` for every field from it through the shared mechanism
of :mod:`storage.config`, ``--config pipeline.toml|.yaml|.json`` accepts the same names
(``text-field`` or ``text_field``) and ``SHARDFLOW_PIPELINE_TEXT_FIELD`` overrides the default.
Fields marked ``Parameter(parse=False)`` are set by the CLI from its own flags (``INPUT``,
``--output``, the replica flags). What a run resolved — defaults, environment, file and flags
merged — is recorded in the manifest, minus the knobs that cannot change the bytes (workers,
scheduler, retries) and minus anything secret.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from typing import Annotated, Any

from cyclopts import Parameter

from pipeline.cleaning import CleaningConfig
from pipeline.driver.carbon import parse_deadline
from pipeline.output.shards import DEFAULT_CODEC, check_codec
from pipeline.planning.plan import PACK_MAX_FILES
from pipeline.readers import DEFAULT_MAX_RECORD_BYTES, ReadOptions
from pipeline.steps.checks import resolved
from pipeline.steps.recipe import Recipe, parse_recipe_json
from pipeline.steps.shorthand import parse_rule_sets, shorthand_recipe
from pipeline.tasks.record_steps import RECORD_CPU_S, RECORD_WALL_S
from pipeline.web import WebConfig, parse_filter_options, parse_filters
from pipeline.web.langid import check_languages
from storage import ReplicaSet, display_url
from storage.energy import WATTS_PER_CORE
from storage.io.lease_record import positive_seconds

DEFAULT_OUTPUT = "data/shakespeare"


#: a field the CLI sets from flags of its own (positional INPUTs, --output, replica flags)
_NOT_A_FLAG = Parameter(parse=False)


def _f(default: Any, help: str, *, manifest: bool = True, cli: bool = True) -> Any:
    """A field with its one default and its help (which cyclopts reads from ``metadata``);
    ``manifest=False``: not recorded in the manifest (it cannot change the output bytes)."""
    meta = {"help": help, "manifest": manifest, "cli": cli}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class PipelineConfig:
    # -- inputs ------------------------------------------------------------------------------
    inputs: Annotated[list[str], _NOT_A_FLAG] = _f([], "files or globs", cli=False)
    inputs_from: Annotated[str | None, Parameter(metavar="FILE")] = _f(
        None, "also read the inputs listed in FILE (local or any fsspec URL), one per line: "
        "URL SIZE [VERSION] (spaces), CSV url,size[,version] or JSON Lines "
        '{"url", "size", "version"}; no listing, for millions of files. VERSION (ETag, mtime) '
        "tells a changed file apart on a rerun", manifest=False)
    text_field: str = _f("text", "JSONL/CSV/Parquet field holding the text")
    id_field: str | None = _f(None, "field holding a document id (default: file:line, "
                              "file@offset or file#row)")
    partition_bytes: int = _f(0, "split uncompressed JSONL/text files into byte ranges "
                              "(Parquet: row groups) of about this size, one task and one shard "
                              "each (compressed, CSV and WARC/WET files are never split: one "
                              "partition each, or packed when smaller, see "
                              "--files-per-partition); phase 1 streams it, so a worker holds "
                              "~250 MiB + the finished shard (~0.4 x this) with GPT-2. "
                              "0: input bytes / 64, within 1 MiB-1 GiB")
    files_per_partition: int = _f(PACK_MAX_FILES, "pack up to this many consecutive small "
                                  "files (each under the partition size) into one partition, "
                                  "task and shard, up to ~the partition size; 1: a partition "
                                  "never spans files", manifest=False)  # see for_manifest
    max_record_bytes: int = _f(DEFAULT_MAX_RECORD_BYTES, "records (lines, paragraphs, fields) "
                               "larger than this are quarantined as record_too_large")
    record_cpu_s: Annotated[float, Parameter(metavar="SECONDS")] = _f(
        RECORD_CPU_S, "CPU seconds one record's cleaning and web steps may take (~10,000x a "
        "typical page); a record past it ends its worker and, retried in isolation, is "
        "quarantined as record_cpu_limit", manifest=False)  # see for_manifest
    record_wall_s: Annotated[float, Parameter(metavar="SECONDS")] = _f(
        RECORD_WALL_S, "wall seconds one record may take when its partition is retried record "
        "by record in isolation (record_time_limit)", manifest=False)  # see for_manifest
    strict: bool = _f(False, "stop at the first bad record, naming file and line, instead of "
                      "quarantining it", manifest=False)
    # -- cleaning ----------------------------------------------------------------------------
    fix_mojibake: bool = _f(True, "repair mojibake (UTF-8 read as Latin-1/cp1252) with ftfy")
    min_chars: int = _f(1, "drop documents shorter than this after cleaning (too_short)")
    max_chars: int = _f(0, "drop documents longer than this after cleaning (0: no limit)")
    min_alpha_frac: float = _f(0.0, "drop documents whose share of letters among visible "
                               "characters is below this (low_alpha; 0: off)")
    max_repeated_line_frac: float = _f(1.0, "drop documents whose share of repeated lines "
                                       "exceeds this (repeated_lines; 1: off)")
    # -- web data (pipeline.web; recorded in the manifest only when used) --------------------
    languages: Annotated[str | None, Parameter(metavar="CODES")] = _f(
        None, "keep only documents in these languages (ISO 639-1, comma-separated, e.g. "
        "'en,de'), identified with py3langid's bundled model; default: keep all",
        manifest=False)
    min_lang_score: float = _f(0.65, "with --languages: drop documents whose language "
                               "probability is below this (lang_score)", manifest=False)
    filters: str = _f("", "heuristic rule sets to apply, comma-separated: gopher "
                      "(gopher_repetition + gopher_quality), c4, fineweb; drops are counted as "
                      "<rule set>.<reason>", manifest=False)
    filter_options: Annotated[str | None, Parameter(metavar="JSON")] = _f(
        None, "thresholds of the rule sets, a JSON object, e.g. "
        '\'{"gopher_quality.min_doc_words": 100, "c4.filter_no_terminal_punct": false}\'',
        manifest=False)
    url_blocklist: Annotated[str | None, Parameter(metavar="FILE")] = _f(
        None, "drop documents whose URL's domain (or a parent domain) or whole URL is listed "
        "in FILE (local or any fsspec URL), one per line (url_blocked)", manifest=False)
    pii: str = _f("none", "'mask': replace e-mail addresses and public IP addresses with "
                  "stand-ins (counted); 'none'", manifest=False)
    annotate: str = _f("", "rule sets to measure without dropping anything, comma-separated "
                       "(gopher, c4, fineweb, as --filters): every signal their rules look at "
                       "becomes a column <rule set>.<signal> beside input_ids", manifest=False)
    steps: Annotated[str | None, Parameter(metavar="JSON")] = _f(
        None, "the recipe: the steps between reading and tokenizing, a JSON list of "
        "{use, name, mode, options...}; usually [[steps]] tables in the --config file (README, "
        "'Recipes'; `python -m pipeline steps` lists them). Replaces the step flags "
        "(--filters, --annotate, --languages, --url-blocklist, --pii, the cleaning flags)",
        manifest=False)
    web_inputs: Annotated[bool, _NOT_A_FLAG] = _f(
        False, "set by the job when any input is WARC/WET", manifest=False, cli=False)
    # -- dedup -------------------------------------------------------------------------------
    dedup: str = _f("exact", "'exact': drop documents whose cleaned text repeats an earlier one "
                    "(the first by partition and position survives); 'none'")
    near_dup: bool = _f(False, "also drop near-duplicates found by MinHash LSH")
    near_dup_threshold: float = _f(0.7, "near-dup: estimated Jaccard similarity (of word "
                                   "shingles) at which two documents are near-duplicates; LSH "
                                   "candidates below it are not (0: keep every candidate)")
    minhash_perms: int = _f(256, "MinHash permutations (near-dup): all verify a candidate "
                            "pair, bands x rows of them make the LSH bands")
    minhash_bands: int = _f(21, "LSH bands (near-dup)")
    minhash_rows: int = _f(5, "MinHash values per LSH band (near-dup; 0: perms/bands)")
    shingle_words: int = _f(5, "words per shingle (near-dup)")
    dedup_signals: bool = _f(False, "dedup's own columns on every kept document: "
                             "dedup.exact_count (with --dedup exact: documents with its exact "
                             "text, itself included), dedup.cluster_id and dedup.cluster_size "
                             "(with --near-dup: its near-duplicate cluster, id = its survivor's "
                             "partition << 32 | row, size = its documents); every shard is then "
                             "re-encoded in phase 2", manifest=False)  # see for_manifest
    dedup_buckets: int = _f(0, "hash buckets for the dedup shuffle (0: one per 512 Ki keys, "
                            "~50 MiB of worker memory, at most 4096); never changes the result",
                            manifest=False)
    # -- tokenizer ---------------------------------------------------------------------------
    tokenizer: str = _f("gpt2", "'gpt2', a tokenizer.json path, or train:VOCAB to train a "
                        "byte-level BPE on a deterministic sample of the input")
    eos_token: str | None = _f(None, "end-of-document token (default: by tokenizer kind, e.g. "
                               "<|endoftext|>, </s>, [SEP])")
    tokenizer_sample_bytes: int = _f(8 << 20, "train:VOCAB: bytes of cleaned text sampled, "
                                     "spread evenly over the partitions")
    tokenizer_threads: int = _f(1, "threads each worker's tokenizer uses; LocalCluster workers "
                                "default to cores / this, so cores are never oversubscribed",
                                manifest=False)
    encode_batch_docs: int = _f(1024, "documents per encode_batch_fast call")
    row_group_tokens: int = _f(256 * 1024, "tokens per Parquet row group (the loader's unit "
                               "of reading)")
    # recorded in the manifest when not zstd (for_manifest): other manifests keep their bytes
    shard_compression: Annotated[str, Parameter(metavar="CODEC")] = _f(
        DEFAULT_CODEC, "the shards' Parquet codec: 'zstd' (smallest), 'lz4' or 'none' (larger "
        "shards, less of the loader's CPU per token)", manifest=False)
    # -- execution ---------------------------------------------------------------------------
    workers: int = _f(0, "LocalCluster worker processes (0: cores / --tokenizer-threads)",
                      manifest=False)
    adapt: Annotated[str | None, Parameter(metavar="MIN:MAX")] = _f(
        None, "adaptive LocalCluster scaling between MIN and MAX workers",
                           manifest=False)
    scheduler: str | None = _f(None, "address of a running Dask scheduler (tcp://host:8786) "
                               "instead of starting a LocalCluster", manifest=False)
    dashboard_address: str = _f("127.0.0.1:8787", "where the LocalCluster serves its dashboard "
                                "(':0' picks a free port)", manifest=False)
    retries: int = _f(2, "times Dask retries a failed task (a lost worker's tasks are "
                      "rescheduled anyway)", manifest=False)
    # -- output ------------------------------------------------------------------------------
    output: Annotated[str, _NOT_A_FLAG] = _f(
        DEFAULT_OUTPUT, "dataset URL", manifest=False, cli=False)
    storage_options: Annotated[dict[str, Any], _NOT_A_FLAG] = _f(
        {}, "fsspec options", manifest=False, cli=False)
    replicas: Annotated[list[str], _NOT_A_FLAG] = _f(
        [], "other replicas", manifest=False, cli=False)
    write_quorum: int | None = _f(None, "replicas each write must reach (default: all); a write "
                                  "that meets the quorum but misses a replica is recorded for "
                                  "`storage repair`", manifest=False)
    replica_options: Annotated[list[dict[str, Any] | None] | None, _NOT_A_FLAG] = _f(
        None, "per-replica options",
                                                            manifest=False, cli=False)
    wait: bool = _f(False, "when another run holds the output's writer lease, wait for it "
                    "(saying who holds it, again every 30 s) instead of failing at once",
                    manifest=False)
    lease_ttl: Annotated[float, Parameter(metavar="SECONDS")] = _f(
        90.0, "seconds the output's writer lease lasts unless renewed; the "
                          "driver renews it every third of that, and a dead driver's lease is "
                          "taken over once it expires", manifest=False)

    # -- energy and carbon (pipeline/driver/carbon.py; never change the output bytes) --------------
    carbon_signal: Annotated[str | None, Parameter(metavar="SRC")] = _f(
        None, "carbon-intensity forecast (gCO2e/kWh) to read and re-read while the run goes: "
        "a file or URL in the Carbon Aware SDK's or Electricity Maps' JSON (README, "
        "'Energy and carbon'); with --deadline or --max-intensity it decides when new tasks "
        "start", manifest=False)
    deadline: Annotated[str | None, Parameter(metavar="WHEN")] = _f(
        None, "with --carbon-signal: start new tasks only in the cleanest windows that still "
        "finish by then: 24h, 90m, 2d (from now) or an ISO 8601 time", manifest=False)
    max_intensity: Annotated[float | None, Parameter(metavar="G")] = _f(
        None, "with --carbon-signal: start new tasks only while the intensity is at most G "
        "g/kWh (bounded by --deadline when given)", manifest=False)
    grid_intensity: Annotated[float | None, Parameter(metavar="G")] = _f(
        None, "grid intensity in gCO2e/kWh for the run's carbon figure where no signal covers "
        "the time", manifest=False)
    watts_per_core: float = _f(WATTS_PER_CORE, "the energy estimate's watts per busy core, "
                               "used where RAPL cannot be read", manifest=False)
    record_energy: bool = _f(False, "record the run's energy in the manifest's stats.energy "
                             "(a measurement: a rerun's manifest is then no longer "
                             "byte-identical)", manifest=False)

    def __post_init__(self) -> None:
        if self.dedup not in ("exact", "none"):
            raise ValueError(f"dedup must be 'exact' or 'none', not {self.dedup!r}")
        if self.partition_bytes < 0 or self.max_record_bytes < 1:
            raise ValueError("partition_bytes must be >= 0 (0: automatic) and "
                             "max_record_bytes positive")
        if self.files_per_partition < 1:
            raise ValueError("files_per_partition must be at least 1 (1: no packing)")
        positive_seconds("--lease-ttl", self.lease_ttl)  # finite: NaN would never expire
        if self.dedup_signals and self.dedup == "none" and not self.near_dup:
            raise ValueError("--dedup-signals needs --dedup exact or --near-dup: with no dedup "
                             "there is nothing to count")
        positive_seconds("--record-cpu-s", self.record_cpu_s, MAX_RECORD_S)
        positive_seconds("--record-wall-s", self.record_wall_s, MAX_RECORD_S)
        if self.tokenizer_threads < 1:
            raise ValueError("tokenizer_threads must be at least 1")
        rows = self.minhash_rows or self.minhash_perms // max(1, self.minhash_bands)
        if self.minhash_bands < 1 or rows < 1 or self.minhash_bands * rows > self.minhash_perms:
            raise ValueError(f"minhash: {self.minhash_bands} bands x {rows} rows need at least "
                             f"that many permutations, not {self.minhash_perms}")
        if not 0 <= self.near_dup_threshold <= 1:
            raise ValueError("near_dup_threshold must be in [0, 1]")
        if self.adapt is not None:
            self.adapt_range  # noqa: B018 - validates
        check_codec(self.shard_compression)
        if self.pii not in ("none", "mask"):
            raise ValueError(f"pii must be 'mask' or 'none', not {self.pii!r}")
        self.web_config  # noqa: B018 - validates --filters and --filter-options
        self.recipe  # noqa: B018 - validates --annotate, --steps and their mix with flags
        if (self.deadline or self.max_intensity is not None) and not self.carbon_signal:
            raise ValueError("--deadline and --max-intensity need --carbon-signal")
        if self.deadline:
            parse_deadline(self.deadline, 0.0)  # validates
        if self.watts_per_core <= 0 or any(
                g is not None and g < 0 for g in (self.max_intensity, self.grid_intensity)):
            raise ValueError("watts_per_core must be positive and intensities >= 0")

    @property
    def adapt_range(self) -> tuple[int, int] | None:
        if self.adapt is None:
            return None
        try:
            lo, hi = (int(x) for x in self.adapt.split(":"))
        except ValueError:
            lo, hi = -1, -1
        if not 0 <= lo <= hi or hi < 1:
            raise ValueError(f"adapt {self.adapt!r}: expected MIN:MAX with 0 <= MIN <= MAX")
        return lo, hi

    def output_store(self) -> ReplicaSet:
        """Where the dataset goes: ``output`` first, then each ``--replica``."""
        urls = [self.output, *self.replicas]
        options = self.replica_options or [None] * len(urls)
        return ReplicaSet.from_urls(urls, self.storage_options, options,
                                    write_quorum=self.write_quorum)

    @property
    def n_workers(self) -> int:
        return self.workers or max(1, (os.cpu_count() or 1) // self.tokenizer_threads)

    @property
    def read_options(self) -> ReadOptions:
        return ReadOptions(self.text_field, self.id_field, self.max_record_bytes)

    @property
    def cleaning(self) -> CleaningConfig:
        return CleaningConfig(self.fix_mojibake, self.min_chars, self.max_chars,
                              self.min_alpha_frac, self.max_repeated_line_frac)

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
        if self.dedup_signals:  # the same: shards with dedup's columns
            out["dedup_signals"] = True
        out["steps"] = resolved(self.recipe)  # each step with its version: a changed step
        # changes the partition keys (its partitions are redone), an unchanged one does not
        limits = {k: d[k] for k, default in _RECORD_LIMITS.items() if d[k] != default}
        out.update(limits)  # the same: they decide which records are poison
        if self.web_config is not None:  # the same: recorded only when used
            out.update({k: d[k] for k in _WEB_FIELDS})
        return out

    @property
    def recipe(self) -> Recipe:
        """The steps this run applies: ``--steps`` (or the config file's ``[[steps]]``), else
        the recipe the step flags describe (:func:`pipeline.steps.shorthand_recipe`)."""
        languages = check_languages(tuple(sorted(
            {c.strip().lower() for c in (self.languages or "").split(",") if c.strip()})))
        if self.steps is not None:
            given = [f"--{name.replace('_', '-')}" for name, default in _STEP_FLAGS.items()
                     if getattr(self, name) != default]
            if given:
                raise ValueError(f"{', '.join(given)}: with a recipe (steps), give every "
                                 "step's options in the recipe, not as flags")
            return Recipe(parse_recipe_json(self.steps), metadata=self.web_inputs)
        web = self.web_config
        return shorthand_recipe(
            self.cleaning, web=web is not None, filters=parse_filters(self.filters),
            annotate=parse_rule_sets(self.annotate, "--annotate"),
            filter_options=parse_filter_options(self.filter_options), languages=languages,
            min_lang_score=self.min_lang_score, identify=web is not None and web.identify,
            url_blocklist=self.url_blocklist, pii=self.pii == "mask",
            metadata=web is not None and web.metadata)

    @property
    def web_config(self) -> WebConfig | None:
        """The web steps this run applies (None: none; the pipeline is as it always was)."""
        filters = parse_filters(self.filters)
        options = parse_filter_options(self.filter_options)
        languages = check_languages(tuple(sorted(
            {c.strip().lower() for c in (self.languages or "").split(",") if c.strip()})))
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
               "filters": "", "filter_options": None, "url_blocklist": None, "pii": "none",
               "annotate": ""}

#: record limits and their defaults (recorded in the manifest only when changed)
_RECORD_LIMITS = {"record_cpu_s": RECORD_CPU_S, "record_wall_s": RECORD_WALL_S}
#: the longest record limit accepted (a day)
MAX_RECORD_S = 86_400.0

_WEB_FIELDS = ("languages", "min_lang_score", "filters", "filter_options", "url_blocklist",
               "pii", "web_inputs")


def cli_fields() -> list[Any]:
    """The fields that are flags (and config-file keys), in declaration order."""
    return [f for f in fields(PipelineConfig) if f.metadata.get("cli", True)]
