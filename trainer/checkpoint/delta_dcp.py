"""Delta checkpoints in DCP: a storage writer and reader whose data files hold
:mod:`trainer.checkpoint.delta` records encoded against a base (full) checkpoint.

A delta checkpoint is a DCP checkpoint like any other: its ``.metadata`` is DCP's, with the
same ``state_dict_metadata`` a full save would write; only its storage entries point into
``__<rank>_0.sfdelta`` files of records instead of ``.distcp`` files of ``torch.save``
blobs. So DCP's planners do the resharding exactly as for a full checkpoint (a rank reads the
chunks that overlap its shards, at any world size), and the reader turns each record back
into the chunk a full save would have held, bit for bit:

* writing: each rank encodes the chunks DCP's save plan gave it, each against the chunk of
  the same fully-qualified name, offset, shape and dtype in the base (read from the base's
  files, which are plain DCP: ``trainer.checkpoint.safe_torch_load`` of the chunk); a chunk the
  base lacks is stored whole (``raw``);
* reading: a record of kind ``same``/``sub``/``xor``/``bf16`` reads the same chunk from the
  base, a ``same-value`` record the same non-tensor value.

``moments="bf16"`` (opt-in, LOSSY) stores the changed chunks of AdamW's moments
(``...exp_avg``, ``...exp_avg_sq``, float32) rounded to bfloat16; weights and everything else
stay exact, and the base (a full checkpoint) is always exact.

The base's files are untrusted input like the delta's: its ``.metadata`` goes through
:func:`trainer.checkpoint.safe_metadata.load_metadata`, its chunks through
:mod:`trainer.checkpoint.safe_torch_load` and
must have the dtype and shape its metadata gives; a record must agree with the delta's
metadata (length, element size) and decompresses to no more than that.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from storage import Location
from trainer.checkpoint.delta import (
    BASED,
    SAME_VALUE,
    DeltaError,
    decode_bytes,
    decode_tensor,
    encode_bytes,
    encode_tensor,
    parse,
)
from trainer.checkpoint.safe_metadata import load_metadata, read_capped
from trainer.checkpoint.safe_torch_load import load_torch_bytes

SUFFIX = ".sfdelta"
#: Largest non-tensor value (optimizer hyper-parameters) a record may hold.
MAX_VALUE_BYTES = 16 << 20
#: Delta codecs for AdamW's moments: exact (lossless) or rounded to bfloat16 (lossy).
MOMENT_CODECS = ("exact", "bf16")
MOMENT_SUFFIXES = (".exp_avg", ".exp_avg_sq")
#: torch.save's zip wrapping around a chunk's bytes (headers, the pickle, alignment).
_ZIP_SLACK = 1 << 20


def tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """A tensor's elements as raw bytes (uint8, C order), for any dtype (bf16 included)."""
    t = t.detach().cpu().contiguous().reshape(-1)
    if t.numel() == 0:
        return np.zeros(0, dtype=np.uint8)
    return t.view(torch.uint8).numpy()


def tensor_from_bytes(raw: np.ndarray, dtype: torch.dtype, sizes: Any) -> torch.Tensor:
    if raw.size == 0:
        return torch.empty(tuple(sizes), dtype=dtype)
    return torch.frombuffer(bytearray(raw.tobytes()), dtype=torch.uint8).view(dtype) \
        .reshape(tuple(sizes))


def _chunk_shape(metadata: Metadata, index: MetadataIndex, source: str
                 ) -> tuple[torch.dtype, torch.Size] | None:
    """(dtype, chunk sizes) of the tensor chunk ``index`` in ``metadata``, or None."""
    md = metadata.state_dict_metadata.get(index.fqn)
    if not isinstance(md, TensorStorageMetadata):
        return None
    for chunk in md.chunks:
        if tuple(chunk.offsets) == tuple(index.offset or ()):
            return md.properties.dtype, chunk.sizes
    return None


class BaseCheckpoint:
    """The chunks of a full DCP checkpoint, read one at a time and checked."""

    def __init__(self, loc: Location) -> None:
        self.loc = loc
        source = loc.child_url(".metadata")
        try:
            with loc.fs.open(loc.path(".metadata"), "rb") as f:
                self.metadata = load_metadata(read_capped(f, source), source)
        except FileNotFoundError:
            raise DeltaError(f"{loc.url}: the base checkpoint has no DCP .metadata") from None
        self._files: dict[str, Any] = {}

    def chunk(self, index: MetadataIndex, dtype: torch.dtype, sizes: Any) -> np.ndarray | None:
        """The chunk's raw bytes when the base has exactly that chunk (same name, offsets,
        shape and dtype), else None."""
        found = _chunk_shape(self.metadata, index, self.loc.url)
        if found is None or found[0] != dtype or tuple(found[1]) != tuple(sizes):
            return None
        info = (self.metadata.storage_data or {}).get(index)
        if info is None or getattr(info, "transform_descriptors", None):
            return None
        source = self.loc.child_url(info.relative_path)
        expected = int(np.prod(sizes, dtype=np.int64)) * torch.empty((), dtype=dtype) \
            .element_size()
        if info.length > expected + _ZIP_SLACK:
            raise DeltaError(f"{source}: the base's chunk {index.fqn!r} is {info.length:,} "
                             f"bytes for {expected:,} bytes of data")
        blob = self._read(info)
        if len(blob) != info.length:
            raise DeltaError(f"{source}: truncated (chunk {index.fqn!r} wants {info.length} "
                             f"bytes at {info.offset})")
        try:
            t = load_torch_bytes(blob, source, map_location="cpu")
        except Exception as exc:  # noqa: BLE001 - any unreadable blob is one clear error
            raise DeltaError(f"{source}: chunk {index.fqn!r} unreadable "
                             f"({type(exc).__name__}: {exc})"[:300]) from None
        if not isinstance(t, torch.Tensor) or t.dtype != dtype \
                or tuple(t.shape) != tuple(sizes):
            raise DeltaError(f"{source}: chunk {index.fqn!r} is not the "
                             f"{dtype} {tuple(sizes)} its metadata says")
        return tensor_bytes(t)

    def value(self, index: MetadataIndex) -> bytes | None:
        """A non-tensor value's bytes as the base stored them (DCP's ``BYTE_IO``), or None."""
        md = self.metadata.state_dict_metadata.get(index.fqn)
        info = (self.metadata.storage_data or {}).get(index)
        if md is None or isinstance(md, TensorStorageMetadata) or info is None \
                or getattr(info, "transform_descriptors", None):
            return None
        if info.length > MAX_VALUE_BYTES:
            return None
        blob = self._read(info)
        return blob if len(blob) == info.length else None

    def _read(self, info: Any) -> bytes:
        """``info.length`` bytes at ``info.offset`` of the base's file (kept open), or fewer
        where the file ends."""
        f = self._files.get(info.relative_path)
        if f is None:
            f = self._files[info.relative_path] = self.loc.fs.open(
                self.loc.path(info.relative_path), "rb")
        f.seek(info.offset)
        return f.read(info.length)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


class _DeltaWriterMixin:
    """``write_data`` of DCP's file-system writers, writing records instead of blobs."""

    fs: Any
    path: Any
    base: BaseCheckpoint | None
    moments: str = "exact"

    def write_data(self, plan: Any, planner: Any) -> torch.futures.Future[list[WriteResult]]:
        name = f"{plan.storage_data.prefix}0{SUFFIX}"
        results: list[WriteResult] = []
        offset = 0
        try:
            with self.fs.create_stream(self.fs.concat_path(self.path, name), "wb") as stream:
                for item in plan.items:
                    data = planner.resolve_data(item)
                    if item.type == WriteItemType.BYTE_IO:
                        record = encode_bytes(data.getbuffer(), self.base.value(item.index)
                                              if self.base is not None else None)
                    else:
                        t = data.detach().cpu()
                        base = self.base.chunk(item.index, t.dtype, t.shape) \
                            if self.base is not None else None
                        lossy = self.moments == "bf16" and t.dtype == torch.float32 \
                            and item.index.fqn.endswith(MOMENT_SUFFIXES)
                        record = encode_tensor(tensor_bytes(t), base, t.element_size(),
                                               bf16=lossy)
                    stream.write(record)
                    results.append(WriteResult(
                        index=item.index, size_in_bytes=len(record),
                        storage_data=_StorageInfo(name, offset, len(record))))
                    offset += len(record)
                stream.flush()
        finally:
            if self.base is not None:
                self.base.close()
        fut: torch.futures.Future[list[WriteResult]] = torch.futures.Future()
        fut.set_result(results)
        return fut


class _DeltaReaderMixin:
    """``read_data`` of DCP's file-system readers, decoding records against the base."""

    fs: Any
    path: Any
    storage_data: Any
    base_loc: Location
    _metadata: Metadata

    def set_up_storage_reader(self, metadata: Metadata, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, *args, **kwargs)  # type: ignore[misc]
        self._metadata = metadata

    def read_data(self, plan: Any, planner: Any) -> torch.futures.Future[None]:
        per_file: dict[str, list[Any]] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path,
                                []).append(req)
        base: BaseCheckpoint | None = None
        try:
            for relative, reqs in per_file.items():
                source = f"{self.path}/{relative}"
                with self.fs.create_stream(self.fs.concat_path(self.path, relative),
                                           "rb") as stream:
                    for req in sorted(reqs, key=lambda r: self.storage_data[
                            r.storage_index].offset):
                        info = self.storage_data[req.storage_index]
                        stream.seek(info.offset)
                        record = stream.read(info.length)
                        if len(record) != info.length:
                            raise DeltaError(f"{source}: truncated (record of "
                                             f"{req.storage_index.fqn!r} wants "
                                             f"{info.length} bytes at {info.offset})")
                        where = f"{source} ({req.storage_index.fqn!r})"
                        if req.type == LoadItemType.BYTE_IO:
                            base_value = None
                            if parse(record, where).kind == SAME_VALUE:
                                if base is None:
                                    base = BaseCheckpoint(self.base_loc)
                                base_value = base.value(req.storage_index)
                            value = decode_bytes(record, where, MAX_VALUE_BYTES, base_value)
                            planner.load_bytes(req, io.BytesIO(value))
                            continue
                        shape = _chunk_shape(self._metadata, req.storage_index, where)
                        if shape is None:
                            raise DeltaError(f"{where}: no tensor chunk of that name and "
                                             "offset in the metadata")
                        dtype, sizes = shape
                        itemsize = torch.empty((), dtype=dtype).element_size()
                        expected = int(np.prod(sizes, dtype=np.int64)) * itemsize
                        base_raw = None
                        if parse(record, where).kind in BASED:
                            if base is None:
                                base = BaseCheckpoint(self.base_loc)
                            base_raw = base.chunk(req.storage_index, dtype, sizes)
                        raw = decode_tensor(record, base_raw, expected, itemsize, where)
                        tensor = narrow_tensor_by_index(
                            tensor_from_bytes(raw, dtype, sizes), req.storage_offsets,
                            req.lengths)
                        target = planner.resolve_tensor(req).detach()
                        if target.size() != tensor.size():
                            raise DeltaError(f"{where}: chunk of {tuple(tensor.size())}, the "
                                             f"model wants {tuple(target.size())}")
                        target.copy_(tensor)
                        planner.commit_tensor(req, target)
        finally:
            if base is not None:
                base.close()
        fut: torch.futures.Future[None] = torch.futures.Future()
        fut.set_result(None)
        return fut


def delta_writer(loc: Location, url: str, base: Location | None,
                 fsspec_options: dict[str, Any], moments: str = "exact") -> Any:
    """A DCP storage writer of delta records (``base=None``: every chunk ``raw``, the full
    state compressed with the delta's own codec). ``moments``: one of
    :data:`MOMENT_CODECS` ("bf16": AdamW's moments rounded to bfloat16, lossy)."""
    if moments not in MOMENT_CODECS:
        raise ValueError(f"moments must be one of {MOMENT_CODECS}, got {moments!r}")
    if loc.is_local:
        cls: type = type("DeltaFileSystemWriter", (_DeltaWriterMixin, dcp.FileSystemWriter), {})
        writer = cls(url, single_file_per_rank=True)
    else:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        cls = type("DeltaFsspecWriter", (_DeltaWriterMixin, FsspecWriter), {})
        writer = cls(url, single_file_per_rank=True, **fsspec_options)
    writer.base = BaseCheckpoint(base) if base is not None else None
    writer.moments = moments
    return writer


def delta_reader(reader_cls: type, url: str, base: Location, **kwargs: Any) -> Any:
    """A DCP storage reader of delta records, on top of ``reader_cls`` (one of the safe
    readers of :mod:`trainer.checkpoint.checkpointer`)."""
    cls = type(f"Delta{reader_cls.__name__}", (_DeltaReaderMixin, reader_cls), {})
    reader = cls(url, **kwargs)
    reader.base_loc = base
    return reader
