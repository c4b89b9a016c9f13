"""The training configuration: flags, defaults, and their resolution.

:class:`TrainConfig` is the one statement of every flag: type, default, help. The shared
mechanism of :mod:`infra.config` (cyclopts) makes it ``python -m trainer``'s flags, the keys
of ``--config FILE`` (TOML, YAML or JSON) and ``SHARDFLOW_TRAINER_<FLAG>`` environment
overrides; precedence: flags, file, environment, defaults.

Flags whose good value depends on the device (model shape, sequence length, batch size) default
to ``None`` and are filled in by :func:`resolve` from :data:`PRESETS` once the device is known,
so ``python -m trainer --data URL`` does something sensible on a laptop CPU and on a GPU. The
resolved config (no ``None`` left) is what gets saved to ``config.json``.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field, replace
from typing import Annotated, Any, Literal

from cyclopts import Group, Parameter
from cyclopts.validators import Number

from infra.config import ByteSize, ConfigFlag, OptionsFlag, StorageOptions, make_app, parse

#: Defaults by device type: small enough for 2 CPU cores, GPT-2-small-like on CUDA.
PRESETS: dict[str, dict[str, int]] = {
    "cpu": {"seq_len": 128, "batch_size": 8, "layers": 4, "width": 128, "heads": 4},
    "cuda": {"seq_len": 1024, "batch_size": 16, "layers": 12, "width": 768, "heads": 12},
}


#: Model shapes by name (``--preset``); explicit --layers/--width/--heads win over them.
MODEL_PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"layers": 2, "width": 64, "heads": 2},          # CPU tests: ~20k params + vocab
    "gpt2-small": {"layers": 12, "width": 768, "heads": 12},  # 124M with GPT-2's vocab
    "1b": {"layers": 18, "width": 2048, "heads": 16},          # ~1.0B with GPT-2's vocab
}


class ConfigError(ValueError):
    """A combination of flags that cannot run (reported without a traceback)."""


_CPU, _CUDA = PRESETS["cpu"], PRESETS["cuda"]


def _preset(key: str) -> str:
    return f"default: {_CPU[key]} on CPU, {_CUDA[key]} on CUDA"


def _h(default: Any, help: str) -> Any:
    """A field with its one default and its help (cyclopts reads ``metadata["help"]``)."""
    return field(default=default, metadata={"help": help})


_DATA = Parameter(group=Group("Data", sort_key=1))
_MODEL = Parameter(group=Group("Model", sort_key=2))
_OPTIMISATION = Parameter(group=Group("Optimisation", sort_key=3))
_RUNTIME = Parameter(group=Group("Runtime", sort_key=4))
_CHECKPOINTS = Parameter(group=Group("Checkpoints", sort_key=5))
_Positive = Parameter(validator=Number(gt=0))
_NonNegative = Parameter(validator=Number(gte=0))
_NoNegative = Parameter(negative="", show_default=False)


@Parameter(name="*")
@dataclass(frozen=True)
class TrainConfig:
    """Every flag of ``python -m trainer``: its type, its one default and its help. ``None``
    means "filled in by :func:`resolve`" (from :data:`PRESETS` once the device is known)."""

    # fields in the order of config.json (a run directory's record); help groups them
    data: Annotated[str | None, Parameter(metavar="URL"), _DATA] = _h(
        None, "dataset root (any fsspec URL: a path, file://, s3://...); or --mixture")
    mixture: Annotated[str | None, Parameter(metavar="FILE"), _DATA] = _h(
        None, "train on several datasets instead of --data: a TOML file of [components] "
              "(name = \"URL\") and [[schedule]] points (step, weights = { name = w }), "
              "ramp = \"linear\" or \"step\" between them (README: Mixtures)")
    storage_options: Annotated[StorageOptions, _DATA] = None
    steps: Annotated[int, _Positive, _OPTIMISATION] = _h(200, "optimizer steps")
    batch_size: Annotated[int | None, _Positive, _DATA] = _h(
        None, "sequences per micro-batch per rank; " + _preset("batch_size"))
    seq_len: Annotated[int | None, _Positive, _DATA] = _h(None, _preset("seq_len"))
    layers: Annotated[int | None, _Positive, _MODEL] = _h(None, _preset("layers"))
    width: Annotated[int | None, _Positive, _MODEL] = _h(None, "d_model; " + _preset("width"))
    heads: Annotated[int | None, _Positive, _MODEL] = _h(None, _preset("heads"))
    lr: Annotated[float, _OPTIMISATION] = _h(1e-3, "peak learning rate (AdamW)")
    min_lr_ratio: Annotated[float, _OPTIMISATION] = _h(0.1, "the cosine decays to lr * this")
    warmup_steps: Annotated[int | None, _NonNegative, _OPTIMISATION] = _h(
        None, "linear warmup steps (default: 10% of --steps)")
    weight_decay: Annotated[float, _OPTIMISATION] = _h(
        0.1, "AdamW decoupled weight decay on matrices")
    grad_clip: Annotated[float, _OPTIMISATION] = _h(
        1.0, "clip the global gradient norm to this (0 = off)")
    seed: Annotated[int, _OPTIMISATION] = _h(0, "model init and data order")
    num_workers: Annotated[int, _NonNegative, _DATA] = _h(
        0, "DataLoader worker processes per rank (0: batches are built in this process by a "
           "background thread, row groups read ahead: the fastest)")
    cache_dir: Annotated[str | None, Parameter(metavar="DIR"), _DATA] = _h(
        None, "keep the verified shard pieces read from the store in this local directory "
              "(shared by the ranks and jobs of a host), so later epochs read local disk; "
              "unset = no cache")
    cache_bytes: Annotated[ByteSize, _DATA] = _h(
        None, "size limit of --cache-dir, least recently used pieces evicted (e.g. 200G; "
              "default: 16G)")
    readahead_bytes: Annotated[ByteSize, _DATA] = _h(
        None, "decoded row groups a rank may hold ahead of use when reading from an object "
              "store, which bounds its requests' size: a request takes a whole run when "
              "this holds lanes per rank x --run-blocks row groups (default: 320M, runs of "
              "64 for 8 lanes)")
    run_blocks: Annotated[int | None, _Positive, Parameter(metavar="K"), _DATA] = _h(
        None, "row groups the loader's shuffle moves as one run: from an object store a "
              "rank reads a run with one request at any dataset size (1: one request per "
              "row group at scale, ~60x litdata's requests per token at 1 T tokens). Part of "
              "the data order. Unset: up to 64, as long as 2 runs per lane (and 64) remain (1 "
              "on a small dataset); a resume takes the checkpoint's")
    log_every: Annotated[int, _Positive, Parameter(metavar="K"), _RUNTIME] = _h(
        10, "log a metrics line every K steps (and at the last step)")
    run_dir: Annotated[str | None, Parameter(metavar="DIR"), _RUNTIME] = _h(
        None, "where config.json, metrics.jsonl and the per-rank sample digests go (default: "
              "runs/<timestamp>)")
    device: Annotated[Literal["auto", "cpu", "cuda"], _RUNTIME] = _h(
        "auto", "auto = CUDA when available")
    dtype: Annotated[Literal["auto", "float32", "bfloat16"], _RUNTIME] = _h(
        "auto", "bfloat16 = autocast, CUDA only; auto = bfloat16 on CUDA when supported, else "
                "float32")
    global_batch_size: Annotated[int | None, _Positive, _DATA] = _h(
        None, "sequences per optimizer step over all ranks; the per-rank batch is this / world "
              "size (an error if it does not divide). Fix it to resume on another number of "
              "processes with the same training dynamics; overrides --batch-size")
    checkpoint_dir: Annotated[str | None, Parameter(metavar="URL"), _CHECKPOINTS] = _h(
        None, "where checkpoints go: a directory or any fsspec URL (s3://...); unset = no "
              "checkpoints")
    checkpoint_storage_options: Annotated[OptionsFlag, _CHECKPOINTS] = _h(
        None, "fsspec options for --checkpoint-dir, as a JSON object or @FILE (default: "
              "--storage-options)")
    checkpoint_every: Annotated[int, _Positive, Parameter(metavar="N"), _CHECKPOINTS] = _h(
        100, "save every N steps (and at the last step)")
    keep: Annotated[int, _Positive, Parameter(metavar="K"), _CHECKPOINTS] = _h(
        3, "keep the newest K complete checkpoints")
    resume: Annotated[str, Parameter(metavar="auto|PATH|none"), _CHECKPOINTS] = _h(
        "auto", "auto: the newest complete checkpoint in --checkpoint-dir, if any (what a "
                "torchrun restart needs); PATH: that checkpoint; none: start afresh")
    async_checkpoint: Annotated[bool, _NoNegative, _CHECKPOINTS] = _h(
        False, "save with dcp.async_save: training continues while the shards are written; "
               "the checkpoint is marked complete at the next save or at the end")
    full_every: Annotated[int, _Positive, Parameter(metavar="K"), _CHECKPOINTS] = _h(
        1, "every K-th save is a full checkpoint; the saves between are deltas holding only "
           "what changed since it (lossless: integer difference against it, byte planes, "
           "zstd; unchanged tensors such as frozen parameters take no space); 1 = every save "
           "full")
    delta_moments: Annotated[Literal["exact", "bf16"], _CHECKPOINTS] = _h(
        "exact", "how deltas store AdamW's moments (exp_avg, exp_avg_sq): exact (lossless, "
                 "bitwise restores) or bf16 (LOSSY, opt-in: rounded to bfloat16, relative "
                 "error <= 2^-8; a dense delta 1.55x smaller; weights and the full checkpoints "
                 "stay exact)")
    imbalance_every: Annotated[int, _NonNegative, Parameter(metavar="N"), _RUNTIME] = _h(
        50, "every N steps, compare the ranks' time in data wait, compute, optimizer and "
            "collective wait (one small all_gather) and log the slowest rank and the spread; "
            "0 = off")

    deterministic: Annotated[bool, _NoNegative, _RUNTIME] = _h(
        False, "torch.use_deterministic_algorithms(True) (and a fixed cuBLAS workspace on "
               "CUDA): bitwise-reproducible runs and resumes, a little slower")
    strategy: Annotated[Literal["ddp", "fsdp"], _RUNTIME] = _h(
        "ddp", "ddp: full replicas; fsdp: FSDP2 fully_shard per block (HSDP over a 2-D mesh "
               "when torchrun runs more than one node)")
    preset: Annotated[Literal["1b", "gpt2-small", "tiny"] | None, _MODEL] = _h(
        None, "model shape: tiny (2x64), gpt2-small (12x768, 124M), 1b (18x2048, ~1.0B); "
              "--layers/--width/--heads override it")
    grad_accum: Annotated[int, _Positive, Parameter(metavar="N"), _OPTIMISATION] = _h(
        1, "micro-batches per optimizer step (gradients summed locally, synced once); "
           "--global-batch-size counts all of them")
    compile: Annotated[bool, _NoNegative, _RUNTIME] = _h(False, "torch.compile the model")
    hang_timeout: Annotated[float, _NonNegative, Parameter(metavar="SECONDS"), _RUNTIME] = _h(
        60.0, "a rank without progress for this long (after its first step) is a hang: it is "
              "named in the log, its stack dumped, and the job exits 75 so that torchrun "
              "--max-restarts restarts it from the last checkpoint (0 = off)")
    hang_timeout_io: Annotated[float, _Positive, Parameter(metavar="SECONDS"), _RUNTIME] = _h(
        600.0, "the same limit while starting, loading or saving a checkpoint, in the first "
               "step (compilation) and at the end")
    grid_intensity: Annotated[float | None, _NonNegative, Parameter(metavar="G"), _RUNTIME] = _h(
        None, "grid carbon intensity in gCO2e/kWh: metrics.jsonl and the summary then give "
              "gCO2e beside the joules")

    def __post_init__(self) -> None:
        # What to train on: exactly one of the two (a parse error, one line, exit 2).
        if self.data is None and self.mixture is None:
            raise ValueError("give --data URL (a dataset) or --mixture FILE (several)")
        if self.data is not None and self.mixture is not None:
            raise ValueError("give --data or --mixture, not both (a mixture file names its "
                             "datasets)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


app = make_app(
    "python -m trainer", component="trainer",
    help="Train a small GPT on a Shardflow dataset (--data URL), or on several mixed by "
         "weights that may change by step (--mixture FILE). Run under "
         "`torchrun --nproc-per-node N` for DDP, or plainly for one process. Subcommand: "
         "`python -m trainer plot RUN_DIR` draws RUN_DIR/metrics.png from RUN_DIR/metrics.jsonl.")


@app.default
def _train(*, cfg: TrainConfig | None = None,
           config: Annotated[ConfigFlag, Parameter(help=(
               "TOML, YAML or JSON file of flag values (keys: the flags' names, e.g. steps = "
               "200, checkpoint-dir = \"runs/ckpt\"); flags given on the command line win "
               "over it, it wins over SHARDFLOW_TRAINER_<FLAG> environment variables"))] = None
           ) -> TrainConfig | None:
    return cfg


def help_text() -> str:
    """``python -m trainer --help`` as printed (for tests and docs)."""
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=100)
    app.help_print([], console=console)
    return console.file.getvalue()  # type: ignore[attr-defined]


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Flags over ``--config FILE`` values over ``SHARDFLOW_TRAINER_*`` over defaults; a bad
    flag or file prints one ``error:`` line and exits 2."""
    command, bound = parse(app, sys.argv[1:] if argv is None else argv)
    if command is not _train:  # --help
        command(*bound.args, **bound.kwargs)
        raise SystemExit(0)
    cfg = bound.arguments.get("cfg")
    if cfg is None:  # no flag of the config at all: not even what to train on
        print("error: give --data URL (a dataset) or --mixture FILE (several)", file=sys.stderr)
        raise SystemExit(2)
    return cfg


def resolve(cfg: TrainConfig, device_type: str, bf16_supported: bool) -> TrainConfig:
    """Fill device-dependent defaults and check the combination; pure so it is testable."""
    preset = dict(PRESETS["cuda" if device_type == "cuda" else "cpu"])
    if cfg.preset is not None:
        preset.update(MODEL_PRESETS[cfg.preset])
    filled = {k: preset[k] for k in preset if getattr(cfg, k) is None}
    cfg = replace(cfg, **filled)
    if cfg.warmup_steps is None:
        cfg = replace(cfg, warmup_steps=cfg.steps // 10)
    dtype = cfg.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device_type == "cuda" and bf16_supported else "float32"
    elif dtype == "bfloat16" and device_type != "cuda":
        raise ConfigError("--dtype bfloat16 uses CUDA autocast; on CPU use float32")
    cfg = replace(cfg, dtype=dtype)
    assert cfg.width is not None and cfg.heads is not None
    if cfg.width % cfg.heads:
        raise ConfigError(f"--width ({cfg.width}) must be divisible by --heads ({cfg.heads})")
    if not 0.0 <= cfg.min_lr_ratio <= 1.0:
        raise ConfigError(f"--min-lr-ratio must be in [0, 1], got {cfg.min_lr_ratio}")
    if cfg.checkpoint_storage_options is None and cfg.storage_options is not None:
        cfg = replace(cfg, checkpoint_storage_options=cfg.storage_options)
    return cfg


def resolve_batch(cfg: TrainConfig, world_size: int) -> TrainConfig:
    """Per-rank batch from ``--global-batch-size`` (once the world size is known), or the
    global batch from the per-rank one. The global batch is what a resume on another world
    size keeps: the loader then re-deals the rest of the epoch at the new per-rank size."""
    per_step = world_size * cfg.grad_accum
    if cfg.global_batch_size is None:
        assert cfg.batch_size is not None, "resolve() first"
        return replace(cfg, global_batch_size=cfg.batch_size * per_step)
    if cfg.global_batch_size % per_step:
        raise ConfigError(f"--global-batch-size {cfg.global_batch_size} is not divisible by "
                          f"world size x --grad-accum = {world_size} x {cfg.grad_accum}")
    return replace(cfg, batch_size=cfg.global_batch_size // per_step)
