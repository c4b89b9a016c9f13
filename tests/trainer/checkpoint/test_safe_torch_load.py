"""Checkpoint bytes through ``torch.load(weights_only=True)``: what ``torch.save`` writes loads
as before; pickles that would hang every rank (a memo tuple DAG as a dict key, keys made to
share a hash) are refused before torch's unpickler sees them, also through ``dcp.load``."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from trainer.checkpoint.checkpointer import SafeFileSystemReader, SafeLoadPlanner
from trainer.checkpoint.safe_metadata import UnsafeCheckpointError
from trainer.checkpoint.safe_torch_load import load_torch_bytes

ROOT = Path(__file__).resolve().parents[3]


def saved(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def with_pickle(archive: bytes, pickled: bytes) -> bytes:
    """``archive`` (a ``torch.save`` zip) with its ``data.pkl`` replaced."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            zout.writestr(info, pickled if info.filename.endswith("/data.pkl") else data)
    return out.getvalue()


def dag_key(levels: int) -> bytes:
    """``{t[levels]: None}``, ``t[0] = 1``, ``t[i+1] = (t[i], t[i])``, in the opcodes torch's
    weights-only unpickler takes (protocol 2: BINPUT, no POP): hashing the key visits
    ``2**levels`` leaves."""
    body = pickle.PROTO + b"\x02" + pickle.EMPTY_DICT + pickle.BININT1 + b"\x01"
    for i in range(levels):
        body += pickle.BINPUT + bytes([i]) + pickle.BINGET + bytes([i]) + pickle.TUPLE2
    return body + pickle.NONE + pickle.SETITEM + pickle.STOP


@pytest.mark.parametrize("value", [
    torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), 0.1, (0.9, 0.999), None, True,
    [1, None, "x"], {"lr": torch.tensor(0.1), "betas": (0.9, 0.95)},
    torch.nn.Parameter(torch.ones(2)), "adamw",
])
def test_what_torch_save_writes_loads_as_before(value: object) -> None:
    blob = saved(value)
    got = load_torch_bytes(blob, "v")
    want = torch.load(io.BytesIO(blob), weights_only=True)
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert torch.equal(got, want) and got.dtype == want.dtype
    elif isinstance(want, dict):
        assert got.keys() == want.keys() and torch.equal(got["lr"], want["lr"])
        assert got["betas"] == want["betas"]
    else:
        assert got == want


def test_the_dag_payload_is_live_under_weights_only() -> None:
    """torch's weights-only unpickler takes the DAG and hashes it (18 levels: 2**18 leaves,
    ~0.05 s; 64 would never finish), so the refusal below is the walk's doing."""
    got = torch.load(io.BytesIO(with_pickle(saved({"lr": 0.1}), dag_key(18))),
                     weights_only=True)
    assert isinstance(got, dict) and len(got) == 1


_CHILD = """
import sys
from pathlib import Path
from trainer.checkpoint.safe_metadata import UnsafeCheckpointError
from trainer.checkpoint.safe_torch_load import load_torch_bytes
try:
    load_torch_bytes(Path(sys.argv[1]).read_bytes(), "ckpt/__0_0.distcp[x]")
    print("LOADED")
except UnsafeCheckpointError as exc:
    print("REFUSED", exc)
"""


def test_a_64_level_dag_key_is_refused_before_it_hangs(tmp_path: Path) -> None:
    """In a child with a timeout: a regression is a failure, not a hung test run."""
    path = tmp_path / "value.pt"
    path.write_bytes(with_pickle(saved({"lr": 0.1}), dag_key(64)))
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                             text=True, cwd=ROOT, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        pytest.fail("loading a 64-level DAG did not finish in 120 s")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "REFUSED ckpt/__0_0.distcp[x]: objects are reused so often" in out.stdout, out.stdout


def test_keys_made_to_share_a_hash_are_refused() -> None:
    flood = {k * (2**61 - 1): 0 for k in range(3)}  # one hash: hash(k * (2**61 - 1)) == 0
    assert len({hash(k) for k in flood}) == 1
    with pytest.raises(UnsafeCheckpointError, match="number or constant as a dict key.*hash "
                                                      "flooding"):
        load_torch_bytes(saved(flood), "v")


@pytest.mark.parametrize("value", [{"s": {1, 2}}, frozenset({"a"}), Counter("aab")])
def test_containers_built_from_arguments_are_refused(value: object) -> None:
    """``torch.save`` (pickle protocol 2) writes a set as ``set([...])``: the call hashes the
    items itself, where the walk cannot check them."""
    with pytest.raises(UnsafeCheckpointError, match="called with arguments .*hash flooding"):
        load_torch_bytes(saved(value), "v")


@pytest.mark.parametrize(("blob", "why"), [
    (pickle.dumps(0.1), "not a torch.save zip archive"),
    (b"PK\x03\x04" + b"\x00" * 64, "unreadable torch.save archive"),
])
def test_anything_but_a_torch_save_archive_is_refused(blob: bytes, why: str) -> None:
    with pytest.raises(UnsafeCheckpointError, match=why):
        load_torch_bytes(blob, "v")


def test_dcp_load_of_a_hostile_value_names_it(tmp_path: Path) -> None:
    """Through DCP's own load with the trainer's planner: the value's bytes are walked."""
    flood = {k * (2**61 - 1): 0 for k in range(2000)}
    dcp.save({"x": (flood,), "w": torch.ones(2)},
             storage_writer=dcp.FileSystemWriter(str(tmp_path)))
    state = {"x": None, "w": torch.zeros(2)}
    with pytest.raises(CheckpointException) as info:  # DCP wraps each rank's error
        dcp.load(state, storage_reader=SafeFileSystemReader(str(tmp_path)),
                 planner=SafeLoadPlanner())
    (error, _trace), = info.value.failures.values()
    assert isinstance(error, UnsafeCheckpointError)
    assert "checkpoint value 'x': a number or constant as a dict key" in str(error)
    assert "hash flooding" in str(error)
    # the same file with a harmless value loads
    dcp.save({"x": (0.5, "s"), "w": torch.ones(2)},
             storage_writer=dcp.FileSystemWriter(str(tmp_path / "ok")))
    dcp.load(state, storage_reader=SafeFileSystemReader(str(tmp_path / "ok")),
             planner=SafeLoadPlanner())
    assert state["x"] == (0.5, "s") and torch.equal(state["w"], torch.ones(2))
