"""The training loop and the run around it.

:func:`run` does the wiring (process group, config resolution, run directory, manifest,
loader); :func:`train` is the loop itself and takes any :class:`~trainer.data.EpochLoader`,
so it can be exercised on a synthetic loader without the data stack.

A checkpoint (:mod:`trainer.checkpoint.checkpointer`) holds what a resume needs: model and optimizer
(sharded, DCP), the step, the epoch stream with the loader's ``state_dict()``, the scheduler's
step count and each rank's RNG states.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from loaders.state import LoaderStateError
from trainer.checkpoint.checkpointer import Checkpointer, CheckpointError, load_checkpoint
from trainer.config import ConfigError, TrainConfig, resolve, resolve_batch
from trainer.data import (
    EpochLoader,
    EpochStream,
    build_loader,
    dataset_vocab_size,
    mixture_vocab_size,
)
from trainer.distributed import (
    DistInfo,
    all_reduce,
    barrier,
    broadcast_object,
    destroy_distributed,
    init_distributed,
)
from trainer.heartbeat import beat
from trainer.imbalance import format_report as format_imbalance
from trainer.imbalance import record as imbalance_record
from trainer.imbalance_probe import ImbalanceProbe
from trainer.metrics import (
    LOADER_KEYS,
    IntervalMeter,
    IntervalStats,
    JsonlWriter,
    RunTotals,
    StepEnergy,
    energy_fields,
    format_record,
    format_summary,
    mfu,
    nvml_index,
    peak_flops,
    truncate_jsonl,
)
from trainer.mixture import MixtureFile, MixtureMeter, read_mixture_file
from trainer.model import GPT, GPTConfig
from trainer.optim import build_optimizer
from trainer.parallelize import mesh_shape, parallelize, set_gradient_sync
from trainer.samples import SampleLog, truncate_departed
from trainer.samples import path_for as samples_path
from trainer.schedule import build_scheduler

Clock = Callable[[], float]


def log(info: DistInfo, message: str) -> None:
    """Print on rank 0 only: N ranks repeating every line helps nobody."""
    if info.is_main:
        print(message, flush=True)


def default_run_dir(now: datetime | None = None, base: str = "runs") -> Path:
    """``runs/<timestamp>``, with a numeric suffix if that directory already exists."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    path = Path(base) / stamp
    n = 1
    while path.exists():
        path = Path(base) / f"{stamp}-{n}"
        n += 1
    return path


def prepare_run_dir(requested: str | None, info: DistInfo) -> Path:
    """Rank 0 picks the directory and every rank uses that one (timestamps taken on each
    rank could differ by a second)."""
    chosen = str(default_run_dir()) if requested is None and info.is_main else requested
    chosen = broadcast_object(chosen)
    assert isinstance(chosen, str)
    path = Path(chosen)
    path.mkdir(parents=True, exist_ok=True)
    return path


def model_config(cfg: TrainConfig, vocab_size: int) -> GPTConfig:
    assert None not in (cfg.seq_len, cfg.layers, cfg.width, cfg.heads), "resolve() first"
    return GPTConfig(vocab_size=vocab_size, max_seq_len=cfg.seq_len, n_layers=cfg.layers,
                     d_model=cfg.width, n_heads=cfg.heads)


def write_config(path: Path, cfg: TrainConfig, info: DistInfo, model: GPT,
                 mixture: MixtureFile | None = None) -> None:
    """config.json: everything needed to understand (and later reproduce) the run, a
    ``--mixture`` file's content included (the file may change after the run). Storage
    options are redacted: they can hold S3 secrets."""
    from storage import redact

    train = cfg.to_dict()
    train["storage_options"] = redact(cfg.storage_options) or None
    train["checkpoint_storage_options"] = redact(cfg.checkpoint_storage_options) or None
    record = {
        "train": train,
        "model": asdict(model.cfg),
        "num_parameters": model.num_parameters(),
        "flops_per_token": model.flops_per_token(),
        "world_size": info.world_size,
        "backend": info.backend,
        "strategy": cfg.strategy,
        "mesh": list(mesh_shape(info)) if cfg.strategy == "fsdp" else None,
        "device": info.device.type,
        "global_batch_tokens": cfg.batch_size * cfg.grad_accum * cfg.seq_len * info.world_size,
        "global_batch_size": cfg.batch_size * cfg.grad_accum * info.world_size,
        "torch_version": torch.__version__,
    }
    if mixture is not None:
        record["mixture"] = mixture.record()
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def autocast_context(cfg: TrainConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast for DDP and single-process runs; FSDP2 casts through its
    ``MixedPrecisionPolicy`` instead."""
    if cfg.dtype == "bfloat16" and cfg.strategy != "fsdp":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(
    cfg: TrainConfig,
    info: DistInfo,
    loader: EpochLoader,
    vocab_size: int,
    run_dir: Path,
    *,
    clock: Clock = time.perf_counter,
    mixture: MixtureMeter | None = None,
    mixture_file: MixtureFile | None = None,
) -> dict[str, Any]:
    """Run optimizer steps up to ``cfg.steps`` (from a checkpoint's step when resuming);
    returns the run summary (printed on rank 0). ``mixture``: count each step's samples per
    component, and log their shares with every metrics record."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.deterministic:
        set_deterministic(info.device)
    torch.manual_seed(cfg.seed)  # identical init everywhere (DDP also broadcasts rank 0's)
    model = GPT(model_config(cfg, vocab_size)).to(info.device)
    train_model = parallelize(model, info, cfg.strategy, bf16=cfg.dtype == "bfloat16")
    if cfg.compile:
        train_model = torch.compile(train_model)
    optimizer = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay)
    assert cfg.warmup_steps is not None
    scheduler = build_scheduler(optimizer, warmup_steps=cfg.warmup_steps,
                                total_steps=cfg.steps, min_lr_ratio=cfg.min_lr_ratio)
    stream = EpochStream(loader)

    checkpointer = None
    if cfg.checkpoint_dir is not None:
        checkpointer = Checkpointer(cfg.checkpoint_dir, keep=cfg.keep,
                                    storage_options=cfg.checkpoint_storage_options,
                                    async_save=cfg.async_checkpoint,
                                    full_every=cfg.full_every,
                                    delta_moments=cfg.delta_moments)
    resume_from = resume_target(cfg, checkpointer)
    start_step = 1
    if resume_from is not None:
        beat("load")
        loaded = load_checkpoint(resume_from, model, optimizer, cfg.checkpoint_storage_options,
                                 max_step=cfg.steps)
        restore_trainer_state(loaded.trainer_state, cfg, info, stream, scheduler)
        start_step = loaded.step + 1
        log(info, f"trainer: resumed from {loaded.path} at step {loaded.step} (epoch "
                  f"{stream.epoch}, RNG {'restored' if loaded.rng_restored else 'seeded'})")

    if info.is_main:
        write_config(run_dir / "config.json", cfg, info, model, mixture_file)
    log(info, f"trainer: world size {info.world_size} ({info.backend or 'no process group'}), "
              f"device {info.device}, dtype {cfg.dtype}, {model.num_parameters():,} params, "
              f"vocab {vocab_size}, {len(loader)} batches/epoch/rank, run dir {run_dir}")

    # A resumed run appends to its logs, after dropping what a killed run wrote for the steps
    # it is about to repeat.
    mode = "w"
    if resume_from is not None:
        mode = "a"
        truncate_jsonl(samples_path(run_dir, info.rank), start_step - 1)
        if info.is_main:
            truncate_jsonl(run_dir / "metrics.jsonl", start_step - 1)
            truncate_departed(run_dir, info.world_size, start_step - 1)
    metrics = JsonlWriter(run_dir / "metrics.jsonl", mode) if info.is_main else None
    samples = SampleLog(run_dir, info.rank, mode)
    meter, totals = IntervalMeter(), RunTotals()
    energy = StepEnergy(info.local_rank, nvml_index(info.device.index or 0)
                        if info.device.type == "cuda" else None)
    flops_per_token = model.flops_per_token(cfg.seq_len)
    peak = peak_flops(torch.cuda.get_device_name(info.device)) \
        if info.device.type == "cuda" else None
    loss_sum = torch.zeros((), device=info.device)  # on device: no host sync per step
    grad_norm = torch.zeros((), device=info.device)
    lr = 0.0
    train_model.train()

    imbalance = ImbalanceProbe(train_model, optimizer, info.world_size, info.device,
                               cfg.imbalance_every, clock)
    step_end = clock()
    try:
        for step in range(start_step, cfg.steps + 1):
            beat("first-step" if step == start_step else "data", step)
            micro = []
            for _ in range(cfg.grad_accum):
                t0 = clock()
                batch = stream.next()
                waited = clock() - t0
                meter.add_wait(waited)
                imbalance.add_data(waited)
                micro.append(batch)
            input_ids = torch.cat([b["input_ids"] for b in micro])
            sample_ids = torch.cat([b["sample_id"] for b in micro]) \
                if "sample_id" in micro[0] else None
            samples.record(step, stream.epoch, input_ids, sample_ids)
            if mixture is not None and sample_ids is not None:
                mixture.add(sample_ids)
            if step == start_step:
                check_batch(input_ids, torch.cat([b["labels"] for b in micro]), vocab_size,
                            cfg.seq_len)
            pairs = [(b["input_ids"].to(info.device, non_blocking=True),
                      b["labels"].to(info.device, non_blocking=True)) for b in micro]

            if step != start_step:
                beat("step", step)
            lr = scheduler.get_last_lr()[0]
            t_step = clock()
            loss, grad_norm = train_step(train_model, model, optimizer, scheduler, pairs, cfg,
                                         info.device)
            imbalance.add_train_step(clock() - t_step)
            loss_sum += loss

            now = clock()
            meter.add_step(now - step_end, input_ids.numel() * info.world_size)
            imbalance.add_step(now - step_end)
            step_end = now

            if step % cfg.log_every == 0 or step == cfg.steps:
                stats, record = reduce_interval(meter, loss_sum, info, loader_metrics(loader))
                record.update(step=step, total_steps=cfg.steps, lr=lr, epoch=stream.epoch,
                              grad_norm=float(grad_norm),
                              mfu=mfu(record["tokens_per_s"], flops_per_token,
                                      info.world_size, peak))
                if mixture is not None:  # global batches step - interval .. step - 1
                    record.update(mixture.interval(step - stats.steps, step, info.device))
                joules = energy.interval()  # counters read once per interval, not per step
                all_j = all_reduce(torch.tensor([joules.joules], dtype=torch.float64,
                                                device=info.device))
                record.update(energy_fields(float(all_j[0]), joules.source, stats.steps,
                                            stats.tokens, cfg.grid_intensity))
                totals.add(stats, record["loss"], record["data_wait_frac"])
                totals.add_energy(record)
                loss_sum.zero_()
                if metrics is not None:
                    metrics.write(record)
                log(info, format_record(record))
            report = imbalance.report(step)  # collective, every --imbalance-every steps
            if report is not None:
                if metrics is not None:
                    metrics.write(imbalance_record(report))
                log(info, format_imbalance(report))

            if checkpointer is not None and (step % cfg.checkpoint_every == 0
                                             or step == cfg.steps):
                beat("save", step)
                checkpointer.save(step, model, optimizer,
                                  trainer_state(cfg, info, stream, scheduler))
                step_end = clock()  # a save is not a training step: keep it out of step time
        beat("save")
        if checkpointer is not None:
            checkpointer.wait()
    finally:
        samples.close()
        if metrics is not None:
            metrics.close()

    write_final_weights(model, optimizer, run_dir, info)
    summary = totals.summary()
    if info.is_main:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True)
                                              + "\n", encoding="utf-8")
    log(info, format_summary(summary))
    return summary


def set_deterministic(device: torch.device) -> None:
    """Deterministic kernels, so that a resumed run is bitwise the run it replaces. cuBLAS needs
    its workspace fixed before its first use for that."""
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def resume_target(cfg: TrainConfig, checkpointer: Checkpointer | None) -> str | None:
    """The checkpoint to start from: ``--resume PATH`` works without ``--checkpoint-dir``;
    ``auto`` needs one (and finds nothing on a first start, which is not an error)."""
    if cfg.resume in ("auto", "none"):
        return checkpointer.resolve_resume(cfg.resume) if checkpointer is not None else None
    return cfg.resume


def trainer_state(cfg: TrainConfig, info: DistInfo, stream: EpochStream,
                  scheduler: torch.optim.lr_scheduler.LRScheduler) -> dict[str, Any]:
    """Everything of a resume that is not a tensor: JSON, saved once (rank 0's)."""
    sched = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    return {
        "stream": stream.state_dict(),
        "scheduler": sched,
        "world_size": info.world_size,
        "global_batch_size": cfg.global_batch_size,
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "seed": cfg.seed,
    }


def restore_trainer_state(state: dict[str, Any], cfg: TrainConfig, info: DistInfo,
                          stream: EpochStream,
                          scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """Put the loop's non-tensor state back; refuse a resume that would silently change what
    the run means (another sequence length, seed or global batch)."""
    for key in ("seq_len", "seed", "global_batch_size"):
        saved, now = state.get(key), getattr(cfg, key)
        if saved is not None and saved != now:
            raise ConfigError(f"the checkpoint was written with {key}={saved}, this run has "
                              f"{now}; resume with the same value (the per-rank batch may "
                              f"change with the world size, the global batch may not)")
    try:
        stream.load_state_dict(state["stream"])
    except LoaderStateError as exc:  # a saved loader state of another plan, or malformed
        raise CheckpointError(f"trainer.json: field 'stream.loader': {exc}") from None
    sched = dict(state["scheduler"])
    sched["lr_lambdas"] = [None] * len(scheduler.optimizer.param_groups)
    scheduler.load_state_dict(sched)


def write_final_weights(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        run_dir: Path, info: DistInfo) -> None:
    """``model_final.pt``: the full (unsharded) model state dict on CPU, rank 0; loadable with
    ``torch.load(..., weights_only=True)``. Collective under FSDP (the gather)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                              cpu_offload=True))
    if info.is_main:
        torch.save(sd, run_dir / "model_final.pt")


def train_step(
    train_model: torch.nn.Module,
    model: GPT,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
    cfg: TrainConfig,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over ``micro_batches`` (``--grad-accum`` of them); returns the
    (detached, on-device) mean loss and the pre-clip gradient norm.

    ``train_model`` is the parallel wrapper (forward/backward go through it so gradients are
    synchronised); ``model`` is the bare module whose parameters are clipped. Gradients are
    synchronised once per step, on the last micro-batch (DDP ``no_sync``, FSDP2
    ``set_requires_gradient_sync``). The norm is computed even without clipping
    (max_norm=inf) because it is worth logging.
    """
    n = len(micro_batches)
    total = torch.zeros((), device=device)
    for i, (input_ids, labels) in enumerate(micro_batches):
        last = i == n - 1
        set_gradient_sync(train_model, last)
        sync = contextlib.nullcontext() if last or not hasattr(train_model, "no_sync") \
            else train_model.no_sync()
        with sync:
            with autocast_context(cfg, device):
                _, loss = train_model(input_ids, labels)
            assert loss is not None
            (loss / n).backward()
        total += loss.detach() / n
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if isinstance(grad_norm, DTensor):  # FSDP2: the norm of sharded gradients
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return total, grad_norm.detach()


def loader_metrics(loader: EpochLoader) -> dict[str, float]:
    """The loader's own read counters (``loader.metrics()``: cumulative for this process
    since it started, so since the last restart), where the loader has them."""
    get = getattr(loader, "metrics", None)
    if get is None:
        return {}
    values = get()
    return {k: float(values.get(k, 0.0)) for k in LOADER_KEYS}


def reduce_interval(meter: IntervalMeter, loss_sum: torch.Tensor, info: DistInfo,
                    loader: dict[str, float] | None = None
                    ) -> tuple[IntervalStats, dict[str, Any]]:
    """Close a logging interval: loss averaged over its steps and over ranks, data wait as
    the mean and the max over ranks (one slow rank stalls all of them at the next gradient
    all-reduce, so the max is the number to watch), the loader's counters summed over ranks
    (the wait: the max). Collective: every rank must call it, with the same keys."""
    stats = meter.flush()
    device = loss_sum.device
    loader = loader or {}
    sum_keys = [k for k in LOADER_KEYS if k in loader and LOADER_KEYS[k] == "sum"]
    max_keys = [k for k in LOADER_KEYS if k in loader and LOADER_KEYS[k] == "max"]
    sums = torch.tensor([float(loss_sum), stats.data_wait_frac,
                         *(loader[k] for k in sum_keys)], dtype=torch.float64, device=device)
    all_reduce(sums, "sum")
    maxes = torch.tensor([stats.data_wait_frac, *(loader[k] for k in max_keys)],
                         dtype=torch.float64, device=device)
    all_reduce(maxes, "max")
    wait_max = maxes[:1]
    ws = info.world_size
    extra = {f"loader_{k}": float(v) for k, v in zip(sum_keys, sums[2:].tolist(),
                                                      strict=True)}
    extra.update({f"loader_{k}": float(v) for k, v in zip(max_keys, maxes[1:].tolist(),
                                                          strict=True)})
    return stats, {
        "loss": float(sums[0]) / (stats.steps * ws),
        "tokens_per_s": stats.tokens_per_s,
        "step_time_s": stats.step_time,
        "data_wait_frac": float(sums[1]) / ws,
        "data_wait_frac_max": float(wait_max[0]),
        "interval_steps": stats.steps,
        "interval_s": stats.seconds,
        "interval_wait_s": stats.wait_seconds,
        "tokens": stats.tokens,
        **extra,
    }


def check_batch(input_ids: torch.Tensor, labels: torch.Tensor, vocab_size: int,
                seq_len: int | None) -> None:
    """Fail early and readably on a batch the model cannot take (a CUDA embedding lookup out
    of range is an opaque device-side assert)."""
    if input_ids.dim() != 2 or input_ids.shape != labels.shape:
        raise ValueError(f"expected input_ids and labels of one shape [B, T], got "
                         f"{tuple(input_ids.shape)} and {tuple(labels.shape)}")
    if seq_len is not None and input_ids.shape[1] != seq_len:
        raise ValueError(f"loader gave sequences of {input_ids.shape[1]} tokens, not {seq_len}")
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"token ids in [{lo}, {hi}] but the manifest's vocab_size is "
                         f"{vocab_size}")


def mixture_meter(mixture: MixtureFile, loader: EpochLoader, cfg: TrainConfig
                  ) -> MixtureMeter:
    """The meter of a ``--mixture`` run: the mixture source says which component a sample id
    is from, the schedule what each run of steps was meant to hold."""
    from loaders.mixture_schedule import scheduled_shares

    source_of = loader.source.source_of  # type: ignore[attr-defined]
    return MixtureMeter(mixture.names, source_of,
                        lambda first, end: scheduled_shares(mixture.schedule, first, end))


def run(cfg: TrainConfig) -> dict[str, Any]:
    """The ``python -m trainer`` entry: set up, train, tear down."""
    info = init_distributed(cfg.device, hang_timeout=cfg.hang_timeout,
                            hang_timeout_io=cfg.hang_timeout_io)
    try:
        bf16 = info.device.type == "cuda" and torch.cuda.is_bf16_supported()
        cfg = resolve_batch(resolve(cfg, info.device.type, bf16), info.world_size)
        # The manifest first: a wrong URL (or mixture file) should fail before a run
        # directory is made.
        mixture = read_mixture_file(cfg.mixture) if cfg.mixture is not None else None
        if mixture is not None:
            vocab_size = mixture_vocab_size(mixture, cfg.storage_options)
        else:
            assert cfg.data is not None
            vocab_size = dataset_vocab_size(cfg.data, cfg.storage_options)
        run_dir = prepare_run_dir(cfg.run_dir, info)
        cfg = replace(cfg, run_dir=os.fspath(run_dir))
        assert cfg.batch_size is not None and cfg.seq_len is not None
        loader = build_loader(
            cfg.data, batch_size=cfg.batch_size, seq_len=cfg.seq_len,
            num_workers=cfg.num_workers, seed=cfg.seed, rank=info.rank,
            world_size=info.world_size, storage_options=cfg.storage_options,
            cache_dir=cfg.cache_dir, cache_bytes=cfg.cache_bytes,
            readahead_bytes=cfg.readahead_bytes, global_batch_size=cfg.global_batch_size,
            run_blocks=cfg.run_blocks, mixture=mixture,
        )
        meter = None
        if mixture is not None:
            meter = mixture_meter(mixture, loader, cfg)
        summary = train(cfg, info, loader, vocab_size, run_dir, mixture=meter,
                        mixture_file=mixture)
        beat("finish")
        barrier()
        return summary
    finally:
        destroy_distributed()
