"""Hostile DCP ``.metadata`` pickles: every bypass family is refused, nothing runs.

The payloads are hand-assembled pickles (what an attacker writes), not objects pickled by
Python, so each family is exercised exactly: dotted names resolved from an allowed module,
``builtins``, REDUCE on admitted classes with hostile arguments, a pickle of another type,
storage entries that point outside the checkpoint, and random mutations of a real file.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.distributed.checkpoint.metadata import Metadata

from tests._forked_python import ForkedPython
from trainer.checkpoint.checkpointer import Checkpointer, CheckpointError, load_checkpoint
from trainer.checkpoint.safe_metadata import UnsafeCheckpointError, load_metadata

ROOT = Path(__file__).resolve().parents[3]

REPO = Path(__file__).resolve().parents[3]


def _str(s: str) -> bytes:
    raw = s.encode()
    return pickle.SHORT_BINUNICODE + bytes([len(raw)]) + raw


def _call(module: str, name: str, *args: str) -> bytes:
    """A protocol-4 pickle of ``module.name(*args)`` (STACK_GLOBAL, TUPLE, REDUCE)."""
    body = _str(module) + _str(name) + pickle.STACK_GLOBAL + pickle.MARK
    body += b"".join(_str(a) for a in args) + pickle.TUPLE + pickle.REDUCE
    return pickle.PROTO + b"\x04" + body + pickle.STOP


def _real_metadata() -> bytes:
    """A ``.metadata`` written by DCP itself (bf16 and fp32 tensors, AdamW state)."""
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4)).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3, dtype=torch.bfloat16)).sum().backward()
    opt.step()
    with tempfile.TemporaryDirectory() as d:
        dcp.save({"model": model.state_dict(), "x": {"lr": 0.1}},
                 storage_writer=dcp.FileSystemWriter(d, single_file_per_rank=True))
        return (Path(d) / ".metadata").read_bytes()


@pytest.fixture(scope="module")
def real_metadata() -> bytes:
    return _real_metadata()


def test_dcp_metadata_of_our_own_saves_loads(real_metadata: bytes) -> None:
    md = load_metadata(real_metadata)
    assert isinstance(md, Metadata) and md.state_dict_metadata
    # keyed by DCP's own class again (made with a secret hash while unpickled), and equal to
    # what plain unpickling gives
    from torch.distributed.checkpoint.metadata import MetadataIndex
    assert md.storage_data and {type(k) for k in md.storage_data} == {MetadataIndex}
    assert md.storage_data == pickle.loads(real_metadata).storage_data


def test_the_walk_runs_once_per_passing_bytes(real_metadata: bytes,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The same bytes pass once per process; other bytes, and a refused file every time, are
    walked again."""
    import trainer.checkpoint.safe_metadata as safe_metadata

    walks = [0]
    walk = safe_metadata.check_pickle

    def counting(*args: object, **kwargs: object) -> None:
        walks[0] += 1
        walk(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(safe_metadata, "check_pickle", counting)
    monkeypatch.setattr(safe_metadata, "_PASSED", type(safe_metadata._PASSED)())
    first, again = load_metadata(real_metadata), load_metadata(bytes(real_metadata))
    assert walks[0] == 1 and first.storage_data == again.storage_data
    assert first is not again  # unpickled each time: nothing shared between callers
    other = pickle.dumps(first, protocol=2)
    load_metadata(other)
    assert walks[0] == 2
    bomb = _call("os", "system", "true")
    for expected in (3, 4):
        with pytest.raises(UnsafeCheckpointError):
            load_metadata(bomb)
        assert walks[0] == expected


@pytest.mark.parametrize(("module", "name"), [
    # dotted names, resolved attribute by attribute from an admitted module (protocol >= 4)
    ("torch.distributed.checkpoint.metadata", "os.system"),
    ("torch.distributed.checkpoint.metadata", "Metadata.__init__.__globals__"),
    ("torch", "Size.__class__"),
    ("torch.serialization", "_get_layout.__globals__"),
    ("torch.distributed.checkpoint.filesystem", "pickle.loads"),
    # builtins and plain dangerous modules
    ("builtins", "eval"), ("builtins", "exec"), ("builtins", "getattr"),
    ("builtins", "__import__"), ("os", "system"), ("posix", "system"),
    ("subprocess", "check_call"), ("torch", "load"), ("numpy", "load"),
    # an admitted module's other names, a module sharing the prefix
    ("torch.distributed.checkpoint.metadata", "pickle"),
    ("torch.distributed.checkpoint.filesystem", "FileSystemReader"),
    ("torch.distributed.checkpoint.metadata_evil", "Metadata"),
    ("pathlib", "Path"), ("torch", "compile"),
])
def test_any_name_off_the_exact_list_is_refused(module: str, name: str, tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    with pytest.raises(UnsafeCheckpointError, match="refusing to load") as info:
        load_metadata(_call(module, name, f"touch {canary}"), "ck/.metadata")
    assert "ck/.metadata" in str(info.value) and f"{module!r}.{name!r}" in str(info.value)
    assert not canary.exists()


def test_old_style_global_opcode_is_checked_too(tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    payload = (b"cos\nsystem\n" + pickle.MARK + _str(f"touch {canary}") + pickle.TUPLE
               + pickle.REDUCE + pickle.STOP)
    with pytest.raises(UnsafeCheckpointError, match="'os'.'system'"):
        load_metadata(payload)
    assert not canary.exists()


@pytest.mark.parametrize(("module", "name", "args"), [
    ("torch", "Size", ("not", "ints")),
    ("torch.serialization", "_get_layout", ("load",)),  # only layouts are in its table
    ("torch.serialization", "_get_layout", ("__globals__",)),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING", ("bogus",)),
    ("pathlib", "PosixPath", ("/etc/passwd",)),  # harmless to build, but not Metadata
])
def test_reduce_on_admitted_names_with_hostile_arguments(module: str, name: str,
                                                         args: tuple[str, ...]) -> None:
    with pytest.raises(UnsafeCheckpointError):
        load_metadata(_call(module, name, *args))


def test_a_pickle_of_another_type_is_refused() -> None:
    for obj in ({"a": 1}, [1, 2], "text", 3, torch.Size([2, 3])):
        with pytest.raises(UnsafeCheckpointError, match="not DCP checkpoint metadata"):
            load_metadata(pickle.dumps(obj))


def test_persistent_ids_are_refused() -> None:
    payload = pickle.PROTO + b"\x04" + _str("x") + pickle.BINPERSID + pickle.STOP
    with pytest.raises(UnsafeCheckpointError, match="persistent"):
        load_metadata(payload)


@pytest.mark.parametrize("relative", ["../../etc/passwd", "/etc/passwd", "..", "a/b.distcp", ""])
def test_storage_entries_outside_the_checkpoint_are_refused(real_metadata: bytes,
                                                            relative: str) -> None:
    md = pickle.loads(real_metadata)
    for info in md.storage_data.values():
        info.relative_path = relative
    with pytest.raises(UnsafeCheckpointError, match="not a file inside the checkpoint"):
        load_metadata(pickle.dumps(md))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_pickles_have_no_side_effect(real_metadata: bytes, data: st.DataObject) -> None:
    """Random byte flips, splices of dangerous globals and truncations of a real file: each
    either loads as DCP metadata or fails with the one clean error, and the canary payload
    (``os.system('touch ...')`` spliced in) never runs."""
    canary = Path(tempfile.gettempdir()) / f"shardflow-canary-{os.getpid()}"
    canary.unlink(missing_ok=True)
    buf = bytearray(real_metadata)
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    evil = _call("torch.distributed.checkpoint.metadata", "os.system", f"touch {canary}")[2:-1]
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "splice", "truncate", "insert"]))
        pos = rng.randrange(2, max(3, len(buf)))
        if kind == "flip":
            if pos < len(buf):  # earlier truncations may have left only the 2-byte header
                buf[pos] ^= 1 << rng.randrange(8)
        elif kind == "splice":
            buf[pos:pos] = evil
        elif kind == "truncate":
            del buf[pos:]
        else:
            buf[pos:pos] = bytes([rng.randrange(256)])
    with contextlib.suppress(UnsafeCheckpointError):
        assert isinstance(load_metadata(bytes(buf)), Metadata)
    assert not canary.exists()


def test_load_checkpoint_refuses_the_reported_exploit(tmp_path: Path) -> None:
    """The reported reproduction: a dotted ``os.system`` from DCP's metadata module."""
    model = nn.Linear(3, 3)
    opt = torch.optim.AdamW(model.parameters())
    path = Path(Checkpointer(str(tmp_path / "ck")).save(5, model, opt, {}))
    canary = tmp_path / "pwned"
    (path / ".metadata").write_bytes(
        _call("torch.distributed.checkpoint.metadata", "os.system", f"touch {canary}"))
    with pytest.raises(CheckpointError, match=r"\.metadata: refers to .*os\.system"):
        load_checkpoint(str(path), model, opt)
    assert not canary.exists()


@pytest.mark.slow
def test_torchrun_resume_auto_on_a_hostile_checkpoint_runs_no_code(
        tiny_vocab_dataset: str, tmp_path: Path) -> None:
    """End to end as reported: ``--resume auto`` over a directory an attacker wrote to."""
    ck = tmp_path / "ck"
    step = ck / "step-00000005"
    (step / "rng").mkdir(parents=True)
    canary = tmp_path / "pwned"
    (step / ".metadata").write_bytes(
        _call("torch.distributed.checkpoint.metadata", "os.system", f"touch {canary}"))
    (step / "trainer.json").write_text('{"format": 1, "step": 5}')
    (step / "COMPLETE").write_text('{"format": 1}')
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "-m", "trainer",
         "--data", tiny_vocab_dataset, "--steps", "10", "--checkpoint-dir", str(ck),
         "--resume", "auto", "--device", "cpu", "--layers", "1", "--width", "16",
         "--heads", "2", "--seq-len", "16", "--batch-size", "2",
         "--run-dir", str(tmp_path / "run")],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=180)
    assert proc.returncode != 0
    assert "refusing to load" in proc.stdout + proc.stderr
    assert not canary.exists()


def test_unpickling_plainly_would_have_run_it(tmp_path: Path) -> None:
    """The payload is live: plain pickle runs it (so the tests above can fail)."""
    canary = tmp_path / "pwned"
    pickle.Unpickler(io.BytesIO(_call("torch.distributed.checkpoint.metadata", "os.system",
                                      f"touch {canary}"))).load()
    assert canary.exists()


_MEMO_BOMB = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a regression fails, not OOMs
from trainer.checkpoint.safe_metadata import UnsafeCheckpointError, load_metadata
try:
    load_metadata(bytes.fromhex(sys.argv[1]), "ckpt/.metadata")
except UnsafeCheckpointError as exc:
    print(exc)
"""


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkedPython]:
    """Each bomb in a process of its own, forked from one that imported the trainer once."""
    server = ForkedPython(["trainer.checkpoint.safe_metadata"],
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    yield server
    server.close()


@pytest.mark.parametrize("index", [300_000_000, 1_500_000_000, 2**32 - 1])
def test_a_memo_index_bomb_is_refused_before_any_allocation(index: int,
                                                            forked: ForkedPython) -> None:
    """14 bytes that make CPython's unpickler zero-fill a memo table of 2 x index pointers
    (~24 GB at 1.5 G): found by the fuzz test below, whose process the OOM killer took."""
    bomb = b"\x80\x04N" + b"r" + index.to_bytes(4, "little") + b"."
    # First in a process whose address space is capped: should the check regress, this fails
    # with a MemoryError there instead of the OOM killer taking the test run.
    out = forked.run(["-c", _MEMO_BOMB, bomb.hex()], cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"ckpt/.metadata: memo index {index} out of sequence" in out.stdout, out.stdout
    with pytest.raises(UnsafeCheckpointError, match=f"memo index {index} out of sequence"):
        load_metadata(bomb)


def test_fetching_a_memo_entry_never_stored_is_refused(real_metadata: bytes) -> None:
    with pytest.raises(UnsafeCheckpointError, match="fetches memo index 7, never stored"):
        load_metadata(b"\x80\x04N" + b"h\x07" + b".")
    # A real file's memo is in sequence: it still loads.
    assert isinstance(load_metadata(real_metadata), Metadata)
