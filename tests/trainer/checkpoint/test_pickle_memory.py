"""What checking a hostile ``.metadata`` costs in memory (issue 43): at most
``MEMORY_PER_BYTE`` times the file (plus ``MEMORY_SLACK``), the walk's own records included.

The guard used to charge only the objects the unpickler would make, while the walk held a memo
``dict`` and a record per object of its own: a 48 MB file of ``MEMOIZE`` (1 byte each) took
2.9 GB before it was refused, and 256 MiB files are admitted. Here: every shape of hostile
pickle the guard's other checks admit is walked and unpickled under ``tracemalloc``, and
neither may hold more than the walk charged; two 16 MB bombs (the reported one, and the shape
that costs the walk most per byte) are refused in a process of their own within the bound, in
RSS; a real sharded checkpoint's metadata is charged well under the limit; and a file whose
size is over the cap is refused unread.
"""

from __future__ import annotations

import io
import os
import pickle
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from tests._forked_python import ForkedPython
from trainer.checkpoint import pickle_guard, safe_metadata
from trainer.checkpoint.safe_metadata import (
    MAX_METADATA_BYTES,
    MetadataUnpickler,
    UnsafeCheckpointError,
    load_metadata,
    read_capped,
)

ROOT = Path(__file__).resolve().parents[3]
P4 = pickle.PROTO + b"\x04"
DCP = "torch.distributed.checkpoint.metadata"


def _s(text: str) -> bytes:
    raw = text.encode()
    return pickle.SHORT_BINUNICODE + bytes([len(raw)]) + raw


def _g(module: str, name: str) -> bytes:
    return _s(module) + _s(name) + pickle.STACK_GLOBAL


def _in_list(body: bytes) -> bytes:
    return P4 + pickle.EMPTY_LIST + pickle.MARK + body + pickle.APPENDS + pickle.STOP


def _keys(n: int) -> list[bytes]:
    """``n`` distinct 3-character strings (dict keys, set members, path names)."""
    return [_s(format(i, "x").rjust(3, "0")) for i in range(n)]


def _memoized(glob: bytes, body: bytes) -> bytes:
    """``glob`` stored as memo 0, then ``body`` (which fetches it with ``BINGET 0``)."""
    return glob + pickle.MEMOIZE + pickle.POP + body


#: Hostile shapes, ``n`` repetitions of each (all admitted by every check but memory): one
#: per opcode family that makes objects, memo entries or stack entries.
SHAPES: dict[str, Callable[[int], bytes]] = {
    "memoize": lambda n: P4 + pickle.EMPTY_LIST + pickle.MEMOIZE * n + pickle.STOP,
    "empty_list": lambda n: _in_list(pickle.EMPTY_LIST * n),
    "empty_dict": lambda n: _in_list(pickle.EMPTY_DICT * n),
    "empty_set": lambda n: _in_list(pickle.EMPTY_SET * n),
    "empty_dict_memo": lambda n: _in_list((pickle.EMPTY_DICT + pickle.MEMOIZE) * n),
    "texts": lambda n: _in_list(b"".join(_keys(n))),
    "texts_memo": lambda n: _in_list(b"".join(k + pickle.MEMOIZE for k in _keys(n))),
    "non_ascii_text": lambda n: _in_list(pickle.BINUNICODE + (4 + 4 * n).to_bytes(4, "little")
                                         + "\U0001f600".encode() + b"a" * 4 * n),
    "tuple1": lambda n: _in_list((pickle.NONE + pickle.TUPLE1) * n),
    "tuple1_memo": lambda n: _in_list((pickle.NONE + pickle.TUPLE1 + pickle.MEMOIZE) * n),
    "one_big_tuple": lambda n: _in_list(pickle.MARK + pickle.NONE * n + pickle.TUPLE),
    "ints": lambda n: _in_list((pickle.BININT + (1 << 20).to_bytes(4, "little")) * n),
    "short_ints": lambda n: _in_list((pickle.BININT2 + (1000).to_bytes(2, "little")) * n),
    "floats": lambda n: _in_list((pickle.BINFLOAT + b"\x3f\xf0" + b"\0" * 6) * n),
    "long_ints": lambda n: _in_list((pickle.LONG1 + b"\xff" + b"\x01" * 255) * (n // 256)),
    "dup": lambda n: P4 + pickle.EMPTY_LIST + pickle.MARK + pickle.EMPTY_LIST
    + pickle.DUP * n + pickle.POP_MARK + pickle.STOP,
    "memo_get": lambda n: P4 + pickle.EMPTY_LIST + pickle.MEMOIZE + pickle.MARK
    + (pickle.BINGET + b"\0") * n + pickle.POP_MARK + pickle.STOP,
    "dict": lambda n: P4 + pickle.EMPTY_DICT + pickle.MARK
    + b"".join(k + pickle.NONE for k in _keys(n)) + pickle.SETITEMS + pickle.STOP,
    "set": lambda n: P4 + pickle.EMPTY_SET + pickle.MARK + b"".join(_keys(n))
    + pickle.ADDITEMS + pickle.STOP,
    "frozenset": lambda n: P4 + pickle.MARK + b"".join(_keys(n)) + pickle.FROZENSET
    + pickle.STOP,
    "ordered_dict": lambda n: P4 + _g("collections", "OrderedDict") + pickle.EMPTY_TUPLE
    + pickle.REDUCE + pickle.MARK + b"".join(k + pickle.NONE for k in _keys(n))
    + pickle.SETITEMS + pickle.STOP,
    "sizes": lambda n: _in_list(_memoized(_g("torch", "Size"), (
        pickle.BINGET + b"\0" + pickle.BININT1 + b"\3" + pickle.TUPLE1 + pickle.TUPLE1
        + pickle.REDUCE) * n)),
    "instances": lambda n: _in_list(_memoized(_g(DCP, "ChunkStorageMetadata"), (
        pickle.BINGET + b"\0" + pickle.EMPTY_TUPLE + pickle.NEWOBJ) * n)),
    "instances_built": lambda n: _in_list(_memoized(_g(DCP, "ChunkStorageMetadata"), (
        pickle.EMPTY_DICT + pickle.MARK + b"".join(k + pickle.NONE for k in _keys(24))
        + pickle.SETITEMS + pickle.MEMOIZE + pickle.POP + (
            pickle.BINGET + b"\0" + pickle.EMPTY_TUPLE + pickle.NEWOBJ + pickle.BINGET + b"\1"
            + pickle.BUILD) * n))),
    "index_keys": lambda n: P4 + _memoized(_g(DCP, "MetadataIndex"), pickle.EMPTY_DICT
                                           + pickle.MARK + b"".join(
        pickle.BINGET + b"\0" + k + pickle.TUPLE1 + pickle.REDUCE + pickle.NONE
        for k in _keys(n)) + pickle.SETITEMS) + pickle.STOP,
    "paths": lambda n: _in_list(_memoized(_g("pathlib", "PosixPath"), b"".join(
        pickle.BINGET + b"\0" + k + pickle.TUPLE1 + pickle.REDUCE for k in _keys(n)))),
    "long_paths": lambda n: _in_list(_memoized(_g("pathlib", "PosixPath"), b"".join(
        pickle.BINGET + b"\0" + pickle.BINUNICODE + (3 * 1300).to_bytes(4, "little")
        + (format(i, "02x")[-2:] + "/").encode() * 1300 + pickle.TUPLE1 + pickle.REDUCE
        for i in range(max(1, n // 1300))))),
}

#: What tracemalloc sees besides the objects: the unpickler's frame buffer (64 KB), the walk's
#: generator and its current opcode.
FIXED_BYTES = 256 << 10


def _walk(data: bytes) -> pickle_guard.Cost:
    return pickle_guard.check_pickle(
        data, safe_metadata.BUILDABLE, "x", key_classes=safe_metadata.KEY_CLASSES,
        on_global=lambda module, name: safe_metadata._admit(module, name, "x"))


def _peak(action: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_neither_the_walk_nor_the_unpickler_holds_more_than_charged(
        shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Walked to the end (no memory limit), each shape's walk holds at most ``records`` and
    its unpickling at most ``memory`` (what the limit is checked against)."""
    monkeypatch.setattr(pickle_guard, "MEMORY_SLACK", 1 << 50)
    data = SHAPES[shape](30_000)
    cost = _walk(data)  # once outside the measure: imports, caches
    walked = _peak(lambda: _walk(data))
    unpickled = _peak(lambda: MetadataUnpickler(io.BytesIO(data), "x").load())
    assert walked <= cost.records + FIXED_BYTES, (shape, walked / len(data),
                                                  cost.records / len(data))
    assert unpickled <= cost.memory + FIXED_BYTES, (shape, unpickled / len(data),
                                                    cost.memory / len(data))


_LOAD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a regression fails, not OOMs
from trainer.checkpoint.safe_metadata import UnsafeCheckpointError, load_metadata
def status(field):
    return int(next(ln for ln in open("/proc/self/status") if ln.startswith(field)).split()[1])
data = open(sys.argv[1], "rb").read()
before = status("VmRSS:")
try:
    load_metadata(data, "ckpt/.metadata")
    print("LOADED")
except UnsafeCheckpointError as exc:
    print("REFUSED", exc)
print("GROWTH_KB", status("VmHWM:") - before)
"""


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkedPython]:
    server = ForkedPython(["torch", "trainer.checkpoint.safe_metadata"],
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    yield server
    server.close()


@pytest.mark.parametrize("shape", ["memoize", "empty_list"])
def test_a_16_mb_bomb_is_refused_within_the_bound(shape: str, forked: ForkedPython,
                                                  tmp_path: Path) -> None:
    """The reported bomb (``MEMOIZE``: 84 MB a MB before, ~2.5 now) and the shape whose walk
    costs most per byte (a record per ``EMPTY_LIST`` kept on the stack): refused, the peak
    growth of the process's RSS within MEMORY_PER_BYTE x the file + MEMORY_SLACK."""
    size = 16 << 20
    path = tmp_path / ".metadata"
    path.write_bytes(SHAPES[shape](size))
    out = forked.run(["-c", _LOAD, str(path)], cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "REFUSED ckpt/.metadata: " in out.stdout, out.stdout
    growth = int(out.stdout.split("GROWTH_KB")[1]) << 10
    bound = pickle_guard.MEMORY_PER_BYTE * len(path.read_bytes()) + pickle_guard.MEMORY_SLACK
    assert growth <= bound, f"{shape}: peak growth {growth >> 20} MB, bound {bound >> 20} MB"


def _sharded(ranks: int) -> bytes:
    """The ``.metadata`` DCP writes for a model and its AdamW state sharded over ``ranks``
    (FSDP: a row chunk per rank of every tensor, a storage entry each, keyed by its own copy of
    the name as gathered from the ranks), built from a real save's entries with short names
    (what makes objects outweigh text, the most charged per byte of real files)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorStorageMetadata,
    )
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = nn.Sequential(*(nn.Linear(64, 64) for _ in range(8)))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    opt.step()
    with tempfile.TemporaryDirectory() as d:
        dcp.save(dict(zip(("model", "optim"), get_state_dict(model, opt), strict=True)),
                 storage_writer=dcp.FileSystemWriter(d), no_dist=True)
        real = pickle.loads((Path(d) / ".metadata").read_bytes())
    tensors, storage = {}, {}
    for i, value in enumerate(real.state_dict_metadata.values()):
        if not isinstance(value, TensorStorageMetadata):
            continue
        name, chunks = f"w{i}", []
        for rank in range(ranks):
            offset = torch.Size([rank] + [0] * (len(value.size) - 1))
            chunks.append(ChunkStorageMetadata(offset, torch.Size([1, *value.size[1:]])))
            storage[MetadataIndex(name.encode().decode(), offset)] = _StorageInfo(
                f"__{rank}_0.distcp", rank * 4096, 4096)
        tensors[name] = TensorStorageMetadata(value.properties,
                                              torch.Size([ranks, *value.size[1:]]), chunks)
    return pickle.dumps(Metadata(state_dict_metadata=tensors, storage_data=storage))


def test_real_sharded_metadata_is_charged_well_under_the_limit() -> None:
    data = _sharded(64)
    assert len(data) > 500_000
    cost = _walk(data)
    per_byte = max(cost) / len(data)
    assert per_byte < 0.85 * pickle_guard.MEMORY_PER_BYTE, per_byte
    assert load_metadata(data).storage_data == pickle.loads(data).storage_data


def test_a_path_longer_than_any_file_system_takes_is_refused() -> None:
    """``PosixPath`` splits its argument into parts (~22 bytes a character): refused past
    PATH_MAX, before it is called."""
    for name in ("PosixPath", "PurePosixPath"):
        data = P4 + _g("pathlib", name) + pickle.BINUNICODE + (15_000).to_bytes(4, "little") \
            + b"ab/" * 5000 + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP
        with pytest.raises(UnsafeCheckpointError, match="a path of 15,000 characters"):
            load_metadata(data, "ckpt/.metadata")


def test_a_file_stating_a_size_over_the_cap_is_refused_unread(tmp_path: Path) -> None:
    """A 20 GB ``.metadata`` (sparse) is refused before a byte is read, naming the file, its
    size and the limit."""
    big = tmp_path / ".metadata"
    with big.open("wb") as f:
        f.truncate(20 << 30)
    with big.open("rb") as f:
        with pytest.raises(UnsafeCheckpointError) as info:
            read_capped(f, str(big))
        assert f.tell() == 0
    message = str(info.value)
    assert str(big) in message and "21,474,836,480 bytes" in message
    assert f"{MAX_METADATA_BYTES:,} bytes = 256 MiB" in message and "MAX_METADATA_BYTES" in message
