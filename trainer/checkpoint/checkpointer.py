"""Sharded, atomic checkpoints with ``torch.distributed.checkpoint`` (DCP).

Who owns what: this module owns the checkpoint directory and its layout; the loop hands it the
model, the optimizer and a small JSON-able *trainer state* (step, epoch stream and loader state,
scheduler) and gets them back. One checkpoint is a directory::

    <checkpoint-dir>/step-00000120/
        .metadata, __<rank>_0.distcp   DCP: model and optimizer tensors, sharded by rank
        rng/rank00000.json ...         each rank's RNG states (torch CPU/CUDA, numpy, python)
        trainer.json                   step, epoch, loader state, scheduler, world and batch
        COMPLETE                       written last, by rank 0, after every rank has finished

With ``full_every=K`` > 1, every K-th save is full and those in between are *deltas* against
the last full one (:mod:`trainer.checkpoint.delta`, :mod:`trainer.checkpoint.delta_dcp`): their
tensors are
``__<rank>_0.sfdelta`` records (the integer difference against the base's chunk, byte planes,
zstd; unchanged chunks such as frozen parameters, and unchanged hyper-parameters, take no
payload) and ``delta.json`` names the base. ``delta_moments="bf16"`` (opt-in, lossy) stores
AdamW's moments in deltas rounded to bfloat16 (``delta.json`` then says so). Loading
a delta reads the base's chunks under it and gives bitwise what a full save would have;
pruning keeps a full checkpoint while a kept delta needs it.

A checkpoint exists only once ``COMPLETE`` does: a job killed half-way through a save leaves a
directory without it, which :func:`latest_checkpoint` ignores and the next save prunes. The
marker (rather than writing ``step-N.tmp`` and renaming) works the same on object stores, where
a rename is a copy.

Loading never unpickles arbitrary objects: DCP's ``.metadata`` (a pickle) is read with an
unpickler that admits an exact list of DCP's own metadata classes and a few torch value types
(:mod:`trainer.checkpoint.safe_metadata`), non-tensor
values in the DCP payload go through ``torch.load(weights_only=True)`` after the same opcode
walk (:mod:`trainer.checkpoint.safe_torch_load`), and everything else is JSON.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import random
import re
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from infra.user_files import UserFileError, read_file_of, special_files
from loaders.dataset import dist_rank_world
from storage import Location, resolve
from storage.io.urls import s3_options
from trainer.checkpoint.delta import DeltaError, Entry, next_base, to_remove
from trainer.checkpoint.delta_dcp import MOMENT_CODECS, delta_reader, delta_writer
from trainer.checkpoint.files import (
    MAX_JSON_BYTES,
    CheckpointFileError,
    check_rng_state,
    check_trainer_state,
    read_json,
)
from trainer.checkpoint.safe_metadata import UnsafeCheckpointError, load_metadata, read_capped
from trainer.checkpoint.safe_torch_load import load_torch_bytes

FORMAT_VERSION = 1
COMPLETE = "COMPLETE"
TRAINER_STATE = "trainer.json"
DELTA_MANIFEST = "delta.json"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or does not fit this run."""


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


# -- safe loading --------------------------------------------------------------------------

class _SafeMetadataMixin:
    """``read_metadata`` of DCP's file-system readers through :func:`load_metadata`."""

    fs: Any
    load_id: Any

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        path = self._get_metadata_path(kwargs.get("rank"))  # type: ignore[attr-defined]
        with self.fs.create_stream(path, "rb") as f:
            metadata = load_metadata(read_capped(f, str(path)), str(path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeFileSystemReader(_SafeMetadataMixin, dcp.FileSystemReader):
    pass


class SafeLoadPlanner(DefaultLoadPlanner):
    """Non-tensor values (optimizer hyper-parameters) through ``weights_only=True``, after
    the opcode walk (:mod:`trainer.checkpoint.safe_torch_load`)."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        obj = load_torch_bytes(value.getvalue(), f"checkpoint value {read_item.dest_index.fqn!r}")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def _fsspec_options(url: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """The options ``storage.resolve`` would use (S3 defaults, endpoint from the environment,
    then explicit options), for DCP's fsspec writer, which builds its own filesystem."""
    options = dict(storage_options or {})
    return s3_options(options) if url.startswith(("s3://", "s3a://")) else options


# The writers and readers below carry their path and fsspec options; dcp.save/load are called
# without ``checkpoint_id``, which would make them re-resolve the path *without* the options
# (on S3: no endpoint, no credentials).


def _storage_writer(loc: Location, url: str, storage_options: dict[str, Any] | None) -> Any:
    if loc.is_local:
        return dcp.FileSystemWriter(url, single_file_per_rank=True)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(url, single_file_per_rank=True,
                        **_fsspec_options(url, storage_options))


def _storage_reader(loc: Location, url: str, storage_options: dict[str, Any] | None,
                    base: Location | None = None) -> Any:
    """A safe DCP reader; of delta records against ``base`` when given."""
    if loc.is_local:
        if base is not None:
            return delta_reader(SafeFileSystemReader, url, base)
        return SafeFileSystemReader(url)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    class SafeFsspecReader(_SafeMetadataMixin, FsspecReader):
        pass

    options = _fsspec_options(url, storage_options)
    if base is not None:
        return delta_reader(SafeFsspecReader, url, base, **options)
    return SafeFsspecReader(url, **options)


# -- RNG states as JSON --------------------------------------------------------------------


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def rng_state() -> dict[str, Any]:
    """This process's RNG states, JSON-able (no pickle on the way back)."""
    np_state = np.random.get_state(legacy=False)
    assert isinstance(np_state, dict)
    py_version, py_internal, py_gauss = random.getstate()
    return {
        "torch": _b64(torch.get_rng_state()),
        "cuda": [_b64(s) for s in torch.cuda.get_rng_state_all()]
        if torch.cuda.is_available() else [],
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": np_state["state"]["key"].tolist(), "pos": int(np_state["state"]["pos"]),
                  "has_gauss": int(np_state["has_gauss"]), "gauss": float(np_state["gauss"])},
        "python": [py_version, list(py_internal), py_gauss],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(_unb64(state["torch"]))
    if state.get("cuda") and torch.cuda.is_available():
        states = [_unb64(s) for s in state["cuda"]]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
    n = state["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": np.array(n["key"], dtype=np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


# -- the checkpointer ----------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedCheckpoint:
    path: str
    step: int
    trainer_state: dict[str, Any]
    rng_restored: bool


def _barrier(group: Any = None) -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=group)


def _broadcast(obj: Any) -> Any:
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def list_checkpoints(url: str, storage_options: dict[str, Any] | None = None
                     ) -> list[tuple[int, str, bool]]:
    """``(step, url, complete)`` of every ``step-XXXXXXXX`` under ``url``, oldest first."""
    loc = resolve(url, storage_options)
    if not loc.fs.exists(loc.root):
        return []
    out = []
    for entry in loc.fs.ls(loc.root, detail=False, refresh=True):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        m = _STEP_DIR.match(name)
        if m:
            complete = loc.fs.exists(loc.path(f"{name}/{COMPLETE}"))
            out.append((int(m.group(1)), loc.child_url(name), complete))
    return sorted(out)


def delta_base(loc: Location, name: str | None = None) -> tuple[int, int] | None:
    """``(base step, delta index)`` of a delta checkpoint's ``delta.json`` (None: a full one).
    ``loc``: the checkpoint directory, or its parent with ``name``. The file is untrusted:
    it must name an earlier ``step-XXXXXXXX`` beside it (no other path)."""
    relative = f"{name}/{DELTA_MANIFEST}" if name else DELTA_MANIFEST
    try:
        manifest = _read_json_file(loc, relative)
    except FileNotFoundError:
        return None
    source = loc.child_url(relative)
    base, index = manifest.get("base"), manifest.get("index")
    m = _STEP_DIR.match(base) if isinstance(base, str) else None
    own = _STEP_DIR.match((name or loc.url.rstrip("/")).rsplit("/", 1)[-1])
    if manifest.get("format") != FORMAT_VERSION or m is None or not isinstance(index, int) \
            or isinstance(index, bool) or not 1 <= index < 1 << 31:
        raise CheckpointFileError(f"{source}: field 'base' must name a step-XXXXXXXX "
                                  f"checkpoint beside it and 'index' a delta number "
                                  f"(format {FORMAT_VERSION}), got {str(base)[:80]!r}")
    if own is not None and int(m.group(1)) >= int(own.group(1)):
        raise CheckpointFileError(f"{source}: base {base} is not older than the checkpoint")
    return int(m.group(1)), index


def checkpoint_entries(url: str, storage_options: dict[str, Any] | None = None
                       ) -> list[Entry]:
    """Every checkpoint under ``url`` as the retention rules see it (a delta's base read
    from its ``delta.json``; an unreadable one counts as incomplete)."""
    loc = resolve(url, storage_options)
    out = []
    for step, _, complete in list_checkpoints(url, storage_options):
        found = None
        if complete:
            try:
                found = delta_base(loc, step_dir_name(step))
            except CheckpointFileError:
                complete = False
        out.append(Entry(step, complete, *(found or (None, 0))))
    return out


def latest_checkpoint(url: str, storage_options: dict[str, Any] | None = None) -> str | None:
    """The newest *complete* checkpoint under ``url`` (what ``--resume auto`` takes)."""
    done = [u for _, u, complete in list_checkpoints(url, storage_options) if complete]
    return done[-1] if done else None


class Checkpointer:
    """Saves and loads checkpoints under one directory or URL; every rank makes the same calls
    (saves and loads are collective)."""

    def __init__(self, url: str, *, keep: int = 3,
                 storage_options: dict[str, Any] | None = None,
                 async_save: bool = False, full_every: int = 1,
                 delta_moments: str = "exact") -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if full_every < 1:
            raise ValueError(f"full_every must be >= 1, got {full_every}")
        if delta_moments not in MOMENT_CODECS:
            raise ValueError(f"delta_moments must be one of {MOMENT_CODECS}, "
                             f"got {delta_moments!r}")
        self.full_every = full_every
        self.delta_moments = delta_moments
        self.loc = resolve(url, storage_options)
        self.url = self.loc.url
        self.storage_options = storage_options
        self.keep = keep
        self.async_save = async_save
        self._pending: tuple[Future, str, int] | None = None
        self._group: Any = None
        if async_save and dist.is_available() and dist.is_initialized():
            # DCP's background thread runs collectives; a group of its own keeps them from
            # interleaving with the training loop's all-reduces on the default group.
            self._group = dist.new_group(backend="gloo")

    # -- save ------------------------------------------------------------------------------

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
             trainer_state: dict[str, Any]) -> str:
        """Write checkpoint ``step``; returns its URL. With async saving, returns once the
        tensors are staged in memory; the marker is written by :meth:`wait` (called by the
        next save and at the end of training)."""
        self.wait()
        rank, _ = dist_rank_world()
        name = step_dir_name(step)
        url = self.loc.child_url(name)
        path = self.loc.path(name)
        if rank == 0 and self.loc.fs.exists(path):
            self._remove(name)  # a leftover of a save that never finished
        base = None
        if self.full_every > 1:  # rank 0 decides, everyone follows
            base = _broadcast(next_base(checkpoint_entries(self.url, self.storage_options),
                                        self.full_every) if rank == 0 else None)
        _barrier()
        self.loc.fs.makedirs(self.loc.path(f"{name}/rng"), exist_ok=True)
        self._write_json(f"{name}/rng/rank{rank:05d}.json", rng_state())
        if rank == 0:
            state = {"format": FORMAT_VERSION, "step": step, **trainer_state}
            self._write_json(f"{name}/{TRAINER_STATE}", state)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state_dict = {"model": model_sd, "optim": optim_sd}
        if base is not None:
            if rank == 0:
                manifest = {"format": FORMAT_VERSION, "base": step_dir_name(base[0]),
                            "index": base[1]}
                if self.delta_moments != "exact":  # lossy: said where a reader can see it
                    manifest["moments"] = self.delta_moments
                self._write_json(f"{name}/{DELTA_MANIFEST}", manifest)
            writer = delta_writer(self.loc, url, resolve(self.loc.child_url(
                step_dir_name(base[0])), self.storage_options),
                _fsspec_options(url, self.storage_options), moments=self.delta_moments)
        else:
            writer = _storage_writer(self.loc, url, self.storage_options)
        if self.async_save:
            result = dcp.async_save(state_dict, storage_writer=writer,
                                    process_group=self._group)
            fut = getattr(result, "upload_completion", result)
            self._pending = (fut, name, step)
        else:
            dcp.save(state_dict, storage_writer=writer)
            self._finish(name)
        return url

    def wait(self) -> None:
        """Finish a pending asynchronous save (marker and pruning)."""
        if self._pending is None:
            return
        fut, name, _ = self._pending
        self._pending = None
        fut.result()
        self._finish(name)

    def _finish(self, name: str) -> None:
        _barrier()  # every rank's shards and RNG file are written
        if dist_rank_world()[0] == 0:
            self._write_json(f"{name}/{COMPLETE}", {"format": FORMAT_VERSION})
            self.prune()
        _barrier()

    def prune(self) -> None:
        """Keep the newest ``keep`` complete checkpoints and the full ones their deltas need;
        drop older ones and incomplete ones older than the newest complete one (leftovers of
        killed saves). See :func:`trainer.checkpoint.delta.to_remove`."""
        for step in to_remove(checkpoint_entries(self.url, self.storage_options), self.keep):
            self._remove(step_dir_name(step))

    def _remove(self, name: str) -> None:
        """Delete one checkpoint directory. On object stores that keep folder entries
        (SeaweedFS), deleting every object leaves empty ``name/`` and ``name/rng/`` entries
        that would still list as a (broken) checkpoint: delete those keys too."""
        fs, path = self.loc.fs, self.loc.path(name)
        fs.rm(path, recursive=True)
        if not self.loc.is_local:
            for folder in (f"{path}/rng/", f"{path}/"):
                with contextlib.suppress(FileNotFoundError, OSError):
                    fs.rm_file(folder)
            fs.invalidate_cache()

    def _write_json(self, relative: str, obj: Any) -> None:
        data = json.dumps(obj, sort_keys=True).encode("utf-8")
        with self.loc.fs.open(self.loc.path(relative), "wb") as f:
            f.write(data)

    # -- load ------------------------------------------------------------------------------

    def resolve_resume(self, resume: str) -> str | None:
        """``none`` → None; ``auto`` → newest complete checkpoint here (or None); anything
        else is a checkpoint URL that must be complete. Rank 0 decides, everyone follows, so
        that a save finishing during the lookup cannot split the ranks."""
        if resume == "none":
            return None
        if resume == "auto":
            found = latest_checkpoint(self.url, self.storage_options) \
                if dist_rank_world()[0] == 0 else None
            return _broadcast(found)
        return resume


def _read_json_file(loc: Location, relative: str) -> dict[str, Any]:
    source = loc.child_url(relative)
    try:
        data = read_file_of(loc.fs, loc.path(relative), "checkpoint file", MAX_JSON_BYTES,
                            local=loc.is_local)
    except UserFileError as exc:  # longer than the bound, a FIFO, unreadable
        raise CheckpointFileError(str(exc)) from None
    return read_json(data, source)


def _refuse_special_files(loc: Location, url: str) -> None:
    """A local checkpoint whose folder holds a FIFO, socket or device (a planted
    ``__0_0.distcp`` FIFO blocks DCP's read forever) is refused before any file is opened."""
    if not loc.is_local:
        return
    special = special_files(loc.root)
    if special:
        path, kind = special[0]
        raise CheckpointError(f"{url}: {path} is {kind}, not a regular file; refusing to load "
                              "this checkpoint")


def load_checkpoint(url: str, model: nn.Module, optimizer: torch.optim.Optimizer,
                    storage_options: dict[str, Any] | None = None, *,
                    max_step: int | None = None) -> LoadedCheckpoint:
    """Load model and optimizer (resharded to this world size by DCP), restore this rank's RNG
    states when the checkpoint has them, and return the trainer state.

    Every file is validated before anything is loaded or changed (``trainer.json`` and this
    rank's RNG file field by field, ``.metadata`` by :mod:`trainer.checkpoint.safe_metadata`); any
    fault
    is a :class:`CheckpointError` naming the file. ``max_step``: this run's ``--steps``.
    """
    loc = resolve(url, storage_options)
    if not loc.fs.exists(loc.path(COMPLETE)):
        raise CheckpointError(f"{url} is not a complete checkpoint (no {COMPLETE} marker)")
    _refuse_special_files(loc, url)
    name = loc.url.rstrip("/").rsplit("/", 1)[-1]
    named = _STEP_DIR.match(name)
    rank, _ = dist_rank_world()
    rng_relative = f"rng/rank{rank:05d}.json"
    rng_path = loc.path(rng_relative)
    rng: dict[str, Any] | None = None
    try:
        trainer_state = _read_json_file(loc, TRAINER_STATE)
        step = check_trainer_state(trainer_state, loc.child_url(TRAINER_STATE),
                                   format_version=FORMAT_VERSION,
                                   dir_step=int(named.group(1)) if named else None,
                                   max_step=max_step)
        if loc.fs.exists(rng_path):  # a rank that did not exist before keeps its seeded state
            rng = _read_json_file(loc, rng_relative)
            check_rng_state(rng, loc.child_url(rng_relative))
    except CheckpointFileError as exc:
        raise CheckpointError(str(exc)) from None
    except FileNotFoundError:
        raise CheckpointError(f"{url}: no {TRAINER_STATE}") from None
    base_loc = None
    try:
        found = delta_base(loc)
        if found is not None:  # a delta: its base must be a complete full checkpoint
            parent = loc.url.rstrip("/").rsplit("/", 1)[0]
            base_loc = resolve(f"{parent}/{step_dir_name(found[0])}", storage_options)
            if not base_loc.fs.exists(base_loc.path(COMPLETE)):
                raise CheckpointError(f"{url} is a delta of {base_loc.url}, which is not a "
                                      f"complete checkpoint (pruned or never finished)")
            if delta_base(base_loc) is not None:
                raise CheckpointError(f"{url}: its base {base_loc.url} is itself a delta")
            _refuse_special_files(base_loc, base_loc.url)
    except CheckpointFileError as exc:
        raise CheckpointError(str(exc)) from None
    try:  # DCP reads it again (safely too), but would bury this error in a collective's
        for where in (loc, base_loc) if base_loc is not None else (loc,):
            source = where.child_url(".metadata")
            with where.fs.open(where.path(".metadata"), "rb") as f:  # regular, checked above
                load_metadata(read_capped(f, source), source)
    except UnsafeCheckpointError as exc:
        raise CheckpointError(str(exc)) from None
    except FileNotFoundError:
        raise CheckpointError(f"{url}: no DCP .metadata file (or its base has none)") from None
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state_dict = {"model": model_sd, "optim": optim_sd}
    try:
        dcp.load(state_dict,
                 storage_reader=_storage_reader(loc, loc.url, storage_options, base_loc),
                 planner=SafeLoadPlanner())
    except DeltaError as exc:
        raise CheckpointError(str(exc)) from None
    except CheckpointException as exc:  # DCP wraps each rank's error: name the file
        faults = [pair[0] for pair in exc.failures.values()
                  if isinstance(pair[0], DeltaError | UnsafeCheckpointError)]
        if faults:
            raise CheckpointError(str(faults[0])) from None
        raise
    set_state_dict(model, optimizer, model_state_dict=state_dict["model"],
                   optim_state_dict=state_dict["optim"])
    if rng is not None:
        set_rng_state(rng)
    return LoadedCheckpoint(loc.url, step, trainer_state, rng is not None)
