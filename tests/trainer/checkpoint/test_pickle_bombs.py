"""Small ``.metadata`` files that hang, crash or poison every rank although every global they
name is admitted: memo DAGs, deep nesting, BUILD on admitted classes and functions, memory
bombs, and random damage to a real file. Each load runs in a child process with a timeout (and
a capped address space), so that a regression is an ordinary failure, not a hung or
SIGSEGV-killed test run.
"""

from __future__ import annotations

import os
import pickle
import pickletools
import re
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

from tests._forked_python import ForkedPython
from trainer.checkpoint.safe_metadata import (
    MAX_METADATA_BYTES,
    UnsafeCheckpointError,
    load_metadata,
)

ROOT = Path(__file__).resolve().parents[3]

_LOAD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a regression fails, not OOMs
from pathlib import Path, PosixPath, PurePath
import torch.serialization
from trainer.checkpoint.safe_metadata import UnsafeCheckpointError, load_metadata
truediv, cache = PosixPath.__truediv__, torch.serialization._get_layout.cache
layouts = dict(cache)
try:
    load_metadata(Path(sys.argv[1]).read_bytes(), "ckpt/.metadata")
    print("LOADED")
except UnsafeCheckpointError as exc:
    print("REFUSED", exc)
intact = (PosixPath.__truediv__ is truediv and "__truediv__" not in vars(PosixPath)
          and torch.serialization._get_layout.cache is cache
          and dict(torch.serialization._get_layout.cache) == layouts
          and str(Path("a") / "b") == "a/b")
print("INTACT" if intact else "POISONED")
# this process's own peak (VmHWM): ru_maxrss survives exec, so it would report the forking
# test runner's size
hwm = [ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")]
print("RSS_KB", int(hwm[0].split()[1]) if hwm else
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkedPython]:
    """Each load in a process of its own, forked from one that imported torch once."""
    server = ForkedPython(["torch", "trainer.checkpoint.safe_metadata"],
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    yield server
    server.close()


def load_in_child(forked: ForkedPython, data: bytes, tmp_path: Path,
                  timeout: float = 90) -> str:
    """``load_metadata`` in a fresh process; its stdout. A hang is a failure after
    ``timeout``; a crash (SIGSEGV) a failure with its return code."""
    path = tmp_path / "metadata.bin"
    path.write_bytes(data)
    try:
        out = forked.run(["-c", _LOAD, str(path)], cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {len(data):,} bytes of .metadata did not finish in {timeout} s")
    assert out.returncode == 0, f"child died with rc {out.returncode}: {out.stderr[-2000:]}"
    return out.stdout


def _str(s: str) -> bytes:
    raw = s.encode()
    return pickle.SHORT_BINUNICODE + bytes([len(raw)]) + raw


def _global(module: str, name: str) -> bytes:
    return _str(module) + _str(name) + pickle.STACK_GLOBAL


P4 = pickle.PROTO + b"\x04"


def tuple_dag(levels: int, as_key: bool = True) -> bytes:
    """``{t[levels]: None}`` with ``t[0] = 1`` and ``t[i+1] = (t[i], t[i])``: each level is
    two memo fetches of the one before, so hashing the key visits ``2**levels`` leaves.
    ``as_key=False``: ``{"k": t[levels]}`` (the same shape, never hashed)."""
    body = pickle.BININT1 + b"\x01" + pickle.MEMOIZE + pickle.POP
    for i in range(levels):
        body += (pickle.BINGET + bytes([i])) * 2 + pickle.TUPLE2 + pickle.MEMOIZE + pickle.POP
    item = (pickle.BINGET + bytes([levels]) + pickle.NONE if as_key
            else _str("k") + pickle.BINGET + bytes([levels]))
    body += pickle.EMPTY_DICT + item + pickle.SETITEM
    return P4 + body + pickle.STOP


def test_a_tuple_dag_as_a_dict_key_is_refused_before_hashing(forked: ForkedPython,
                                                            tmp_path: Path) -> None:
    bomb = tuple_dag(64)
    assert len(bomb) < 1000
    out = load_in_child(forked, bomb, tmp_path, timeout=60)  # today's unpickler: 2**64 hash steps
    assert "REFUSED ckpt/.metadata: objects are reused so often" in out, out
    # The same shape, small enough to hash, is not refused for its shape: as a key, for the
    # key's type (a tuple's hash takes no secret); as a value, for the pickle's type.
    with pytest.raises(UnsafeCheckpointError, match="a tuple as a dict key"):
        load_metadata(tuple_dag(8))
    with pytest.raises(UnsafeCheckpointError, match="not DCP checkpoint metadata"):
        load_metadata(tuple_dag(8, as_key=False))


def test_a_million_deep_tuple_is_refused_before_the_c_stack_overflows(
        forked: ForkedPython, tmp_path: Path) -> None:
    """A 1 MB dict key nested 1,000,000 deep: ``hash`` recurses in C and SIGSEGVs."""
    bomb = (P4 + pickle.EMPTY_DICT + pickle.BININT1 + b"\x01" + pickle.TUPLE1 * 1_000_000
            + pickle.NONE + pickle.SETITEM + pickle.STOP)
    out = load_in_child(forked, bomb, tmp_path, timeout=90)
    assert "REFUSED ckpt/.metadata: objects nested deeper than 100 levels" in out, out


def _build(target: bytes, state: bytes) -> bytes:
    return P4 + target + state + pickle.BUILD + pickle.STOP


@pytest.mark.parametrize(("name", "payload"), [
    # (None, {"__truediv__": torch.float32}): slot state, setattr on the class itself
    ("PosixPath class", _build(_global("pathlib", "PosixPath"),
                               pickle.NONE + pickle.EMPTY_DICT + _str("__truediv__")
                               + _global("torch", "float32") + pickle.SETITEM
                               + pickle.TUPLE2)),
    # {"cache": {"torch.strided": torch.float32}}: the function's __dict__, i.e. its cache
    ("_get_layout function", _build(_global("torch.serialization", "_get_layout"),
                                    pickle.EMPTY_DICT + _str("cache") + pickle.EMPTY_DICT
                                    + _str("torch.strided") + _global("torch", "float32")
                                    + pickle.SETITEM + pickle.SETITEM)),
    # a class CPython protects (immutable type): refused by the walk all the same
    ("torch.Size class", _build(_global("torch", "Size"),
                                pickle.NONE + pickle.EMPTY_DICT + _str("__len__")
                                + _global("torch", "float32") + pickle.SETITEM
                                + pickle.TUPLE2)),
    # instances of admitted classes that are not DCP's metadata dataclasses
    ("PosixPath instance", _build(_global("pathlib", "PosixPath") + _str("x") + pickle.TUPLE1
                                  + pickle.REDUCE,
                                  pickle.NONE + pickle.EMPTY_DICT + _str("_raw_paths")
                                  + pickle.NONE + pickle.SETITEM + pickle.TUPLE2)),
    ("OrderedDict instance", _build(_global("collections", "OrderedDict") + pickle.EMPTY_TUPLE
                                    + pickle.REDUCE,
                                    pickle.EMPTY_DICT + _str("x") + pickle.NONE
                                    + pickle.SETITEM)),
])
def test_build_on_anything_but_dcp_metadata_is_refused_before_it_changes_anything(
        name: str, payload: bytes, forked: ForkedPython, tmp_path: Path) -> None:
    out = load_in_child(forked, payload, tmp_path)
    assert "REFUSED ckpt/.metadata: BUILD (setstate) on a" in out, (name, out)
    assert "INTACT" in out, (name, out)


def test_the_build_payloads_are_live() -> None:
    """Plain unpickling of the PosixPath payload does rewrite the class (so the test above can
    fail); undone at once."""
    from pathlib import PosixPath

    before = PosixPath.__truediv__
    try:
        pickle.loads(_build(_global("pathlib", "PosixPath"),
                            pickle.NONE + pickle.EMPTY_DICT + _str("__truediv__")
                            + _global("torch", "float32") + pickle.SETITEM + pickle.TUPLE2))
        assert PosixPath.__truediv__ is torch.float32
    finally:
        PosixPath.__truediv__ = before  # type: ignore[method-assign]


@pytest.mark.parametrize("opcode", [pickle.EMPTY_SET, pickle.EMPTY_DICT])
def test_a_20_mb_memory_bomb_is_refused_with_little_memory(opcode: bytes, forked: ForkedPython,
                                                           tmp_path: Path) -> None:
    """20 MB of empty containers in a list: ~1.5-4.5 GB once unpickled."""
    n = 20_000_000
    bomb = P4 + pickle.EMPTY_LIST + pickle.MARK + opcode * n + pickle.APPENDS + pickle.STOP
    out = load_in_child(forked, bomb, tmp_path)
    # refused for what unpickling would hold, or for what the walk holds first (a record per
    # container on its stack, more than an empty dict itself)
    assert re.search(r"REFUSED ckpt/\.metadata: (unpickling|checking it) would take more than",
                     out), out
    rss_mb = int(out.split("RSS_KB")[1]) / 1024
    assert rss_mb < 1500, f"peak RSS {rss_mb:.0f} MB"


# -- hash flooding -----------------------------------------------------------------------------

_MASK = (1 << 64) - 1
#: CPython's tuple hash (Objects/tupleobject.c since 3.8, xxHash's round): per item
#: ``acc = rotl(acc + hash(item) * P2, 31) * P1`` from ``acc = P5``; every step is invertible
_P1, _P2, _P5 = 11400714785074694791, 14029467366897019727, 2870177450012600261


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK


def colliding_offsets(n: int, target: int = 12345) -> list[tuple[int, int]]:
    """``n`` distinct 2-d offsets whose tuple (and ``torch.Size``) hashes are all equal: for
    each first item the second one's hash is solved for (an int's hash is the int), kept where
    it pickles in 8 bytes (``2**55 <= b < 2**61 - 1``)."""
    inv1, inv2 = pow(_P1, -1, 1 << 64), pow(_P2, -1, 1 << 64)
    goal = _rotl(target * inv1 & _MASK, 64 - 31)  # what acc + hash(b) * P2 must be
    out: list[tuple[int, int]] = []
    a = 1 << 60
    while len(out) < n:
        a += 1
        acc = _rotl((_P5 + a * _P2) & _MASK, 31) * _P1 & _MASK
        b = (goal - acc) * inv2 & _MASK
        if 1 << 55 <= b < (1 << 61) - 1:
            out.append((a, b))
    return out


def flooding_metadata(offsets: list[tuple[int, int]]) -> bytes:
    """A DCP ``Metadata`` with one ``storage_data`` entry per offset, pickled without building a
    dict of the colliding keys (quadratic here too): pickled with placeholder second items,
    then each placeholder's 8 bytes (``LONG1``) swapped for the colliding one's."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        Metadata,
        MetadataIndex,
    )

    storage = {MetadataIndex("w", torch.Size([a, (1 << 56) + i])):
               _StorageInfo("__0_0.distcp", 0, 1) for i, (a, _b) in enumerate(offsets)}
    data = pickle.dumps(Metadata(state_dict_metadata={"w": BytesStorageMetadata()},
                                 storage_data=storage), protocol=4)
    swap = {((1 << 56) + i).to_bytes(8, "little"): b.to_bytes(8, "little")
            for i, (_a, b) in enumerate(offsets)}
    swapped = re.sub(rb"\x8a\x08(.{8})",
                     lambda m: b"\x8a\x08" + swap.get(m.group(1), m.group(1)), data,
                     flags=re.DOTALL)
    assert all(b.to_bytes(8, "little") in swapped for _a, b in offsets)
    return swapped


def _counting_eq(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count ``MetadataIndex.__eq__`` calls: what a dict does per key that shares a hash."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    calls = [0]
    eq = MetadataIndex.__eq__

    def counting(self: object, other: object) -> bool:
        calls[0] += 1
        return eq(self, other)

    monkeypatch.setattr(MetadataIndex, "__eq__", counting)
    return calls


def test_colliding_storage_keys_really_cost_quadratic_comparisons(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The payload below is live: its keys share one hash, and a dict of them compares each
    new key with every earlier one."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    offsets = colliding_offsets(400)
    assert len(set(offsets)) == 400
    assert len({hash(torch.Size(o)) for o in offsets}) == 1
    assert len({hash(MetadataIndex("w", o)) for o in offsets}) == 1
    calls = _counting_eq(monkeypatch)
    assert len({MetadataIndex("w", o): 0 for o in offsets}) == 400
    assert calls[0] >= 400 * 399 // 2


def test_storage_keys_made_to_share_a_hash_are_refused_in_linear_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """3,000 colliding entries (~210 KB): 4.5 M comparisons (~2 s) if loaded plainly, hours
    at 40 MB; refused here after ~0 comparisons (the keys are made with a secret hash, their
    real hashes counted)."""
    n = 3000
    data = flooding_metadata(colliding_offsets(n))
    calls = _counting_eq(monkeypatch)
    with pytest.raises(UnsafeCheckpointError, match=f"{n:,} storage entries share one hash"):
        load_metadata(data, "ckpt/.metadata")
    assert calls[0] < 10 * n, calls[0]


def test_a_few_colliding_keys_still_load_with_dcp_keys() -> None:
    """Below the limit the entries load, keyed by DCP's own class (its lookups hash them)."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    offsets = colliding_offsets(4)
    md = load_metadata(flooding_metadata(offsets))
    assert {type(k) for k in md.storage_data} == {MetadataIndex}
    for a, b in offsets:
        assert md.storage_data[MetadataIndex("w", torch.Size([a, b]))].relative_path


def _planner_data(value: object) -> bytes:
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata

    return pickle.dumps(Metadata(state_dict_metadata={"w": BytesStorageMetadata()},
                                 planner_data=value), protocol=4)


@pytest.mark.parametrize(("what", "value"), [
    ("number", {7: "x"}), ("number", {2**61 - 1: "x", 2 * (2**61 - 1): "y"}),
    ("number", {1.5: "x"}), ("number", {None: "x"}), ("tuple", {(1, 2): "x"}),
    ("torch.Size", {torch.Size([1, 2]): "x"}), ("number", {"k": {1, 2}}),
    ("number", {"k": frozenset({1, 2})}),
])
def test_keys_whose_hash_takes_no_secret_are_refused_by_the_walk(what: str,
                                                                  value: object) -> None:
    with pytest.raises(UnsafeCheckpointError,
                       match=f"a {re.escape(what)}( or constant)? as a dict key or set "
                             r"member \(.*hash flooding"):
        load_metadata(_planner_data(value))


class _CalledWith:
    """Pickles as ``factory(items)`` (REDUCE with arguments), as a crafted file can."""

    def __init__(self, factory: object, items: object) -> None:
        self.factory, self.items = factory, items

    def __reduce__(self) -> tuple[object, tuple[object]]:
        return (self.factory, (self.items,))


def test_an_ordered_dict_built_from_colliding_pairs_is_refused() -> None:
    """``OrderedDict(pairs)`` inserts its argument's keys itself: no SETITEMS for the walk to
    check. Refused however few; ``pickle`` itself writes an empty call and SETITEMS."""
    import collections

    pairs = [(torch.Size(o), 0) for o in colliding_offsets(50)]
    assert len({hash(k) for k, _ in pairs}) == 1  # the payload is live
    for value in (_CalledWith(collections.OrderedDict, pairs),
                  {"k": _CalledWith(collections.OrderedDict, [("a", 1)])}):
        with pytest.raises(UnsafeCheckpointError,
                           match=r"collections\.OrderedDict called with arguments \(REDUCE\)"):
            load_metadata(_planner_data(value))
    od = collections.OrderedDict(a=1)
    assert load_metadata(_planner_data({"k": od})).planner_data == {"k": od}


def test_a_storage_key_with_an_unhashable_field_is_one_clean_error() -> None:
    """A ``MetadataIndex`` whose fqn is a list: refused by name, not a TypeError."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        Metadata,
        MetadataIndex,
    )

    data = pickle.dumps(Metadata(state_dict_metadata={"w": BytesStorageMetadata()},
                                 storage_data={MetadataIndex("XX"): _StorageInfo("f", 0, 1)}),
                        protocol=2)
    fqn = pickle.BINUNICODE + (2).to_bytes(4, "little") + b"XX"
    assert data.count(fqn) == 1
    with pytest.raises(UnsafeCheckpointError, match="storage entry's key does not hold "
                                                     r"\(TypeError: unhashable"):
        load_metadata(data.replace(fqn, pickle.EMPTY_LIST))


def test_string_keys_are_admitted() -> None:
    md = load_metadata(_planner_data({"model.w": ("model", "w"), b"raw": 1}))
    assert md.planner_data == {"model.w": ("model", "w"), b"raw": 1}


def test_metadata_above_the_cap_is_refused_unread(tmp_path: Path) -> None:
    """A file one byte over MAX_METADATA_BYTES (sparse: costs no disk) is refused having read
    one byte past the cap, whatever its size."""
    from trainer.checkpoint.safe_metadata import read_capped

    big = tmp_path / ".metadata"
    with big.open("wb") as f:
        f.truncate(MAX_METADATA_BYTES + 1)
    with big.open("rb") as f, pytest.raises(UnsafeCheckpointError,
                                            match="more than DCP metadata may take"):
        read_capped(f, str(big))
    with pytest.raises(UnsafeCheckpointError, match="MAX_METADATA_BYTES"):
        load_metadata(bytes(MAX_METADATA_BYTES + 1))


# -- random damage to a real file: only the clean error, and quickly ----------------------

_FUZZ = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from trainer.checkpoint.safe_metadata import UnsafeCheckpointError, load_metadata
for line in sys.stdin:
    try:
        load_metadata(bytes.fromhex(line.strip()), "ckpt/.metadata")
        print("ok", flush=True)
    except UnsafeCheckpointError:
        print("refused", flush=True)
"""

#: Seconds one damaged file may take (a hash runs in C: no signal interrupts it, so the
#: parent waits on the child's answer instead, and kills it).
EXAMPLE_TIMEOUT = 10


class FuzzChild:
    """One long-lived process loading one hex-encoded file per line (torch imported once);
    restarted after a failure."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def ask(self, data: bytes) -> str:
        import select

        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-c", _FUZZ], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                         env={**os.environ, "PYTHONPATH": str(ROOT)})
            first = True
        else:
            first = False
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(data.hex() + "\n")
        self.proc.stdin.flush()
        timeout = EXAMPLE_TIMEOUT + (60 if first else 0)  # the first answer imports torch
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            return f"no answer in {timeout} s"
        answer = self.proc.stdout.readline().strip()
        if not answer:
            rc = self.proc.wait()
            self.proc = None
            return f"died with rc {rc}"
        return answer

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def _real_metadata() -> bytes:
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4)).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3, dtype=torch.bfloat16)).sum().backward()
    opt.step()
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    with tempfile.TemporaryDirectory() as d:
        dcp.save({"model": msd, "optim": osd},
                 storage_writer=dcp.FileSystemWriter(d, single_file_per_rank=True))
        return (Path(d) / ".metadata").read_bytes()


@pytest.fixture(scope="module")
def fuzz_child() -> Iterator[FuzzChild]:
    child = FuzzChild()
    yield child
    child.close()


@pytest.fixture(scope="module")
def real_file() -> tuple[bytes, list[int]]:
    """A real DCP file and the offsets of its opcodes (where an inserted fragment is read as
    opcodes, not as part of an argument)."""
    data = _real_metadata()
    return data, [pos for _, _, pos in pickletools.genops(data)][1:]


_OPS = [pickle.MEMOIZE, pickle.BINGET + b"\x00", pickle.TUPLE2, pickle.TUPLE1, pickle.BUILD,
        pickle.EMPTY_DICT, pickle.SETITEM, pickle.MARK, pickle.DUP, pickle.POP, pickle.APPEND,
        pickle.REDUCE, pickle.NEWOBJ, pickle.STACK_GLOBAL, pickle.EMPTY_LIST, pickle.SETITEMS]


def dup_dag(levels: int) -> bytes:
    """A stack-neutral fragment ``{t: None}`` (then POP) with ``t`` a tuple DAG built by DUP:
    hashing it takes ``2**levels`` steps."""
    return (pickle.EMPTY_DICT + pickle.BININT1 + b"\x01" + (pickle.DUP + pickle.TUPLE2) * levels
            + pickle.NONE + pickle.SETITEM + pickle.POP)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(data=st.data())
def test_damaged_real_metadata_loads_or_is_refused_cleanly(
        real_file: tuple[bytes, list[int]], fuzz_child: FuzzChild, data: st.DataObject) -> None:
    """Flips, truncations and inserted opcodes (memo fetches, BUILDs, tuple builders, DAG
    fragments: the material of the bombs above) in a real DCP file: the child answers ``ok``
    or ``refused`` within EXAMPLE_TIMEOUT, never a traceback, a hang or a crash."""
    original, boundaries = real_file
    buf = bytearray(original)
    for _ in range(data.draw(st.integers(1, 6))):
        kind = data.draw(st.sampled_from(["flip", "truncate", "insert", "repeat", "dag"]))
        pos = data.draw(st.integers(2, max(2, len(buf) - 1)))
        if kind == "flip" and pos < len(buf):
            buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "truncate":
            del buf[pos:]
        elif kind == "insert":
            buf[pos:pos] = data.draw(st.sampled_from(_OPS))
        elif kind == "repeat":  # a run of one opcode: deep tuples, memo fan-out
            buf[pos:pos] = data.draw(st.sampled_from(_OPS)) * data.draw(st.integers(2, 300))
        elif len(buf) == len(original):  # at an opcode boundary of the intact file
            at = data.draw(st.sampled_from(boundaries))
            buf[at:at] = dup_dag(data.draw(st.integers(1, 80)))
    answer = fuzz_child.ask(bytes(buf))
    assert answer in ("ok", "refused"), f"{len(buf)} bytes: {answer}"
