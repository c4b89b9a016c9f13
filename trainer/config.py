"""The training configuration: flags, defaults, and their resolution.

Flags whose good value depends on the device (model shape, sequence length, batch size) default
to ``None`` and are filled in by :func:`resolve` from :data:`PRESETS` once the device is known,
so ``python -m trainer --data URL`` does something sensible on a laptop CPU and on a GPU. The
resolved config (no ``None`` left) is what gets saved to ``config.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from storage.admin.cli import STORAGE_OPTIONS_HELP, json_object, storage_options_default

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


@dataclass(frozen=True)
class TrainConfig:
    data: str
    storage_options: dict[str, Any] | None = None
    steps: int = 200
    batch_size: int | None = None
    seq_len: int | None = None
    layers: int | None = None
    width: int | None = None
    heads: int | None = None
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int | None = None
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    num_workers: int = 0
    cache_dir: str | None = None
    cache_bytes: int | None = None
    log_every: int = 10
    run_dir: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    global_batch_size: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_storage_options: dict[str, Any] | None = None
    checkpoint_every: int = 100
    keep: int = 3
    resume: str = "auto"
    async_checkpoint: bool = False
    deterministic: bool = False
    strategy: str = "ddp"
    preset: str | None = None
    grad_accum: int = 1
    compile: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(text: str) -> int:
    """Bytes, with an optional binary unit: ``500M``, ``16G``, ``1T`` (or plain bytes)."""
    number, unit = text.strip(), ""
    if number and number[-1].upper() in _SIZE_UNITS:
        number, unit = number[:-1], number[-1].upper()
    try:
        value = int(float(number) * _SIZE_UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 16G, 500M)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value



class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show "(default: X)" only where X says something (not None, not already in the help)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or "default" in text:
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    cpu, cuda = PRESETS["cpu"], PRESETS["cuda"]

    def preset(key: str) -> str:
        return f"default: {cpu[key]} on CPU, {cuda[key]} on CUDA"

    p = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Train a small GPT on a Shardflow dataset. Run under "
                    "`torchrun --nproc-per-node N` for DDP, or plainly for one process.",
        epilog="Subcommand: `python -m trainer plot RUN_DIR` draws RUN_DIR/metrics.png "
               "from RUN_DIR/metrics.jsonl.",
        formatter_class=_HelpFormatter,
    )
    p.add_argument("--config", metavar="FILE",
                   help="TOML or JSON file of flag values (keys: the flags' names, e.g. "
                        "steps = 200, checkpoint-dir = \"runs/ckpt\"); flags given on the "
                        "command line win")
    d = p.add_argument_group("data")
    d.add_argument("--data", required=True, metavar="URL",
                   help="dataset root (any fsspec URL: a path, file://, s3://...)")
    d.add_argument("--storage-options", type=json_object, default=storage_options_default(),
                   metavar="JSON|@FILE", help=STORAGE_OPTIONS_HELP)
    d.add_argument("--num-workers", type=_non_negative_int, default=0,
                   help="DataLoader worker processes per rank (0: batches are built in this "
                        "process by a background thread, row groups read ahead: the fastest)")
    d.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="keep the verified shard pieces read from the store in this local "
                        "directory (shared by the ranks and jobs of a host), so later epochs "
                        "read local disk; unset = no cache")
    d.add_argument("--cache-bytes", type=_size, default=None, metavar="SIZE",
                   help="size limit of --cache-dir, least recently used pieces evicted "
                        "(e.g. 200G; default: 16G)")
    d.add_argument("--seq-len", type=_positive_int, default=None, help=preset("seq_len"))
    d.add_argument("--batch-size", type=_positive_int, default=None,
                   help="sequences per micro-batch per rank; " + preset("batch_size"))
    d.add_argument("--global-batch-size", type=_positive_int, default=None,
                   help="sequences per optimizer step over all ranks; the per-rank batch is "
                        "this / world size (an error if it does not divide). Fix it to resume "
                        "on another number of processes with the same training dynamics; "
                        "overrides --batch-size")

    m = p.add_argument_group("model")
    m.add_argument("--preset", choices=sorted(MODEL_PRESETS), default=None,
                   help="model shape: tiny (2x64), gpt2-small (12x768, 124M), 1b (18x2048, "
                        "~1.0B); --layers/--width/--heads override it")
    m.add_argument("--layers", type=_positive_int, default=None, help=preset("layers"))
    m.add_argument("--width", type=_positive_int, default=None,
                   help="d_model; " + preset("width"))
    m.add_argument("--heads", type=_positive_int, default=None, help=preset("heads"))

    o = p.add_argument_group("optimisation")
    o.add_argument("--steps", type=_positive_int, default=200, help="optimizer steps")
    o.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW)")
    o.add_argument("--min-lr-ratio", type=float, default=0.1,
                   help="the cosine decays to lr * this")
    o.add_argument("--warmup-steps", type=_non_negative_int, default=None,
                   help="linear warmup steps (default: 10%% of --steps)")
    o.add_argument("--weight-decay", type=float, default=0.1,
                   help="AdamW decoupled weight decay on matrices")
    o.add_argument("--grad-clip", type=float, default=1.0,
                   help="clip the global gradient norm to this (0 = off)")
    o.add_argument("--seed", type=int, default=0, help="model init and data order")
    o.add_argument("--grad-accum", type=_positive_int, default=1, metavar="N",
                   help="micro-batches per optimizer step (gradients summed locally, synced "
                        "once); --global-batch-size counts all of them")

    r = p.add_argument_group("runtime")
    r.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto = CUDA when available")
    r.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="bfloat16 = autocast, CUDA only; auto = bfloat16 on CUDA when "
                        "supported, else float32")
    r.add_argument("--log-every", type=_positive_int, default=10, metavar="K",
                   help="log a metrics line every K steps (and at the last step)")
    r.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp",
                   help="ddp: full replicas; fsdp: FSDP2 fully_shard per block (HSDP over a "
                        "2-D mesh when torchrun runs more than one node)")
    r.add_argument("--compile", action="store_true", help="torch.compile the model")
    r.add_argument("--deterministic", action="store_true",
                   help="torch.use_deterministic_algorithms(True) (and a fixed cuBLAS "
                        "workspace on CUDA): bitwise-reproducible runs and resumes, a little "
                        "slower")
    r.add_argument("--run-dir", default=None, metavar="DIR",
                   help="where config.json, metrics.jsonl and the per-rank sample digests "
                        "go (default: runs/<timestamp>)")

    c = p.add_argument_group("checkpoints")
    c.add_argument("--checkpoint-dir", default=None, metavar="URL",
                   help="where checkpoints go: a directory or any fsspec URL (s3://...); "
                        "unset = no checkpoints")
    c.add_argument("--checkpoint-storage-options", type=json_object, default=None,
                   metavar="JSON|@FILE", help="fsspec options for --checkpoint-dir, as a JSON "
                                              "object or @FILE (default: --storage-options)")
    c.add_argument("--checkpoint-every", type=_positive_int, default=100, metavar="N",
                   help="save every N steps (and at the last step)")
    c.add_argument("--keep", type=_positive_int, default=3, metavar="K",
                   help="keep the newest K complete checkpoints")
    c.add_argument("--resume", default="auto", metavar="auto|PATH|none",
                   help="auto: the newest complete checkpoint in --checkpoint-dir, if any "
                        "(what a torchrun restart needs); PATH: that checkpoint; none: start "
                        "afresh")
    c.add_argument("--async-checkpoint", action="store_true",
                   help="save with dcp.async_save: training continues while the shards are "
                        "written; the checkpoint is marked complete at the next save or at "
                        "the end")
    return p


def load_config_file(path: str, known: set[str]) -> dict[str, Any]:
    """Flag values from a TOML or JSON file: the same keys as the flags (``-`` or ``_``)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    try:
        with open(path, "rb") as fh:
            data = json.load(fh) if path.endswith(".json") else tomllib.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--config {path}: {exc}") from None
    values = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"--config {path}: unknown keys {unknown} (keys are the flags' names)")
    return values


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Flags over ``--config FILE`` values over defaults."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known_args, _ = pre.parse_known_args(argv)
    parser = build_parser()
    names = {f.name for f in fields(TrainConfig)}
    if known_args.config:
        values = load_config_file(known_args.config, names)
        parser.set_defaults(**values)
        for action in parser._actions:  # a required flag may come from the file
            if action.dest in values:
                action.required = False
    ns = parser.parse_args(argv)
    return TrainConfig(**{k: v for k, v in vars(ns).items() if k in names})


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
