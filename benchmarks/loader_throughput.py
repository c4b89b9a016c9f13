"""Delivered tokens/s, CPU cost, start-up, resume and memory: Shardflow's loader vs its peers.

Everything runs in one invocation on the same tokens: the real Shakespeare GPT-2 token stream
repeated (``np.resize``) to ``--tokens`` tokens and cut into samples of 2049 tokens (a 2048
window plus the shifted label), the grid Shardflow's plan uses. Every loader therefore delivers
exactly the same samples, as the same batch: ``{"input_ids", "labels"}``, int64, 8 x 2048.

Loaders measured (``CONFIGS`` below; medians over ``--runs`` full epochs, warm page cache):

- ``shardflow_local`` / ``shardflow_s3``: ``build_dataloader(url, 8, 2048)`` with its DEFAULT
  settings (in-process, one batch thread, read-ahead thread pool), from local disk and from a
  real S3 server on loopback (MinIO or SeaweedFS, ``loopback_s3``).
- ``shardflow_local_lz4`` / ``shardflow_local_none`` (and ``shardflow_s3_lz4`` / ``_none``
  in ``--codecs``): the default loader over the same tokens
  written with the pipeline's ``--shard-compression lz4`` / ``none`` instead of zstd (larger
  shards, no zstd decompression: ~480 us of CPU per 512 KiB row group); the results give each
  local dataset's bytes (``dataset_bytes``, ``x_zstd_bytes``).
- ``shardflow_s3_cached``: from S3 with ``cache_dir`` set: the first epoch fills the local
  disk cache, the others read from it (so the median is the warm figure).
- ``shardflow_s3_run1`` / ``shardflow_s3_run16`` (``--s3``; ``_run1`` also in the default
  run): from S3 with ``run_blocks`` set to 1 (single row groups shuffled: the default before
  runs) or 16, where the default leaves it unset (``loaders.plan.auto_run_blocks``: 2 at 50 M
  tokens, 8 at 200 M, for 8 lanes): another order each, fewer and larger requests with runs.
- ``shardflow_local_bt`` / ``shardflow_local_rt4``: the local default with one setting changed,
  ``batch_thread=True`` (the trainer's: batches built ahead on a background thread, which a
  caller that only iterates pays for in hand-offs) or ``read_threads=4`` (the default is 2).
- ``shardflow_local_ixf``: the local default decoding under footers made from the index
  (``loaders.reader.LOCAL_FOOTER_GROUPS`` set to 0, as for a local dataset above it), where
  a dataset of this size keeps its shards' own footers: what the threshold saves.
- ``shardflow_local_w2`` / ``shardflow_local_w4``: the same with ``num_workers=2`` / ``4``:
  each worker owns a contiguous run of the rank's lanes and decodes only its row groups; the
  main process concatenates the workers' parts of each batch. ``--workers-sweep`` measures
  just ``shardflow_local`` and these two (local data only, no peers or S3 server needed) into
  ``loader_throughput_workers.json``.
- ``pyarrow_rowgroups``: a bare ``ParquetFile.read_row_group`` loop over the same local shards,
  one thread, no shuffle, no checksums, no read-ahead, cut into the same batches in source
  order: the ceiling of the format (aim: Shardflow >= 0.8x).
- ``mosaic_*``: MosaicML ``streaming`` over MDS shards written with its ``MDSWriter``
  (``ndarray:int32:2049`` column, no compression: its fastest local layout), shuffled (py1e).
- ``litdata_*``: litdata over chunks written with its ``optimize`` and read with its
  ``TokensLoader(block_size=2049)`` (its recommended layout for LLM pretraining), shuffled.
- For both peers: in-process (``_inproc``) and ``DataLoader(num_workers=2)`` with the default
  ``file_descriptor`` tensor sharing (``_w2``) and with ``file_system`` sharing (``_w2fs``),
  which is faster for worker hand-off; the peers' best of these is the reference.

Every loader's dataset object is built inside the clock, once per epoch (Shardflow's
``build_dataloader``, litdata's ``StreamingDataset``, MosaicML's ``StreamingDataset``): its
construction is part of what an epoch costs, and of its first batch.

Each configuration runs in its own fresh Python process so that its peak RSS
(``ru_maxrss``), and that of its DataLoader workers (``RUSAGE_CHILDREN``), are its own. The
process imports torch first, as a training job does, and times it (``torch_import_s``, numpy
included: torch imports it): its "first batch less torch" is the interpreter's start, this
harness, the loader's imports, its construction and first batch, and the full garbage
collection that the first allocations after torch's import set off (~0.1 s, wherever it lands).
Around each child the parent also reads ``/proc/stat``: ``other_cores`` (the machine's busy
CPU-seconds less the child's and the S3 server's, per second of the run) and ``steal_cores``
(taken by the VM's host) say how much of the machine was not there for it; printed per round.
Shardflow's local rate uses both cores of this machine and litdata's one, so a round with
half a core busy elsewhere moves their ratio and not litdata's rate.
CPU-seconds are ``getrusage`` user+sys of that process and its reaped children (workers) over
the epoch; the S3 server's own CPU is not counted (it is the store, not the loader).

For Shardflow also: time to first batch (``build_dataloader`` + first batch, i.e. manifest
read, plan and first row-group reads; aim < 1 s from S3) and resume at 90 % of an epoch
(a new loader + ``load_state_dict`` + first batch, checked equal to the batch the
uninterrupted run got there; aim < 1 s).

``--s3`` (``S3_CONFIGS``, results in ``loader_throughput_s3.json``): the same tokens also read
from the same S3 server by the peers: ``litdata_s3`` (``input_dir="s3://..."``; its obstore
download path, allowed plain http for the loopback server), ``litdata_s3_boto3`` (its boto3
path), ``litdata_s3_w2fs`` (2 workers), ``mosaic_s3`` (``remote="s3://..."``), each with a fresh
cache directory and the dataset built inside the clock, as Shardflow's is; plus
``shardflow_s3_s3fs`` (Shardflow through s3fs instead of obstore). Every run is a fresh process
with one epoch (``shardflow_s3_cached``: a filling epoch first, then the measured warm one), and
``--runs`` rounds go over the configurations interleaved; medians per configuration.

Peers are installed without their dependency trees (see ``_install_stand_ins``):

    pip install --no-deps mosaicml-streaming litdata lightning-utilities catalogue brotli zstd
    pip install boto3   # the botocore version s3fs's aiobotocore pins; peers read S3 with it

    python benchmarks/loader_throughput.py            # ~200 M tokens, 5 runs
    python benchmarks/loader_throughput.py --quick    # ~10 M tokens, 2 runs, under a minute
    python benchmarks/loader_throughput.py --s3 --runs 3   # the S3 comparison, ~6 minutes
    python benchmarks/loader_throughput.py --codecs   # zstd, lz4, none vs litdata, ~3 min
"""

from __future__ import annotations

import argparse
import atexit
import json
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_utils import RESULTS, median, write_results  # noqa: E402

BATCH, SEQ = 8, 2048
WIDTH = SEQ + 1
PEERS = ("mosaic", "litdata")
CONFIGS = ("shardflow_local", "shardflow_s3", "shardflow_s3_cached", "shardflow_s3_s3fs",
           "shardflow_local_bt", "shardflow_local_rt4", "shardflow_local_ixf",
           "shardflow_local_w2",
           "shardflow_local_w4", "pyarrow_rowgroups",
           "mosaic_inproc", "mosaic_w2", "mosaic_w2fs", "mosaic_s3",
           "litdata_inproc", "litdata_w2", "litdata_w2fs", "litdata_s3", "litdata_s3_boto3",
           "litdata_s3_w2fs")
#: the S3 comparison: Shardflow and both peers reading the same tokens from the same server,
#: cold (a fresh process and a fresh cache directory per run), beside the local figures
S3_CONFIGS = ("shardflow_local", "shardflow_s3", "shardflow_s3_cached", "shardflow_s3_s3fs",
              "shardflow_s3_run1", "shardflow_s3_run16", "pyarrow_rowgroups",
              "litdata_inproc", "litdata_s3",
              "litdata_s3_boto3", "litdata_s3_w2fs",
              "mosaic_inproc", "mosaic_s3")
#: the default run (~3 minutes): Shardflow and litdata, local and from S3, 5 interleaved
#: rounds, each a fresh process timed from its start (imports included). Five, not three:
#: on a shared 2-core machine one config's rounds spread 90-220 Mtok/s, and the median of
#: three moved a run's local ratio by +-0.15 (1.49x / 1.58x / 1.77x in one hour)
DEFAULT_CONFIGS = ("shardflow_local", "shardflow_local_lz4", "shardflow_local_none",
                   "litdata_inproc", "shardflow_s3", "shardflow_s3_run1", "litdata_s3",
                   "litdata_s3_boto3")
#: the shard codecs (pipeline --shard-compression) beside litdata, local and from S3 (--codecs)
CODEC_CONFIGS = ("shardflow_local", "shardflow_local_lz4", "shardflow_local_none",
                 "litdata_inproc", "shardflow_s3", "shardflow_s3_lz4", "shardflow_s3_none",
                 "litdata_s3_boto3")
#: a local Shardflow config's suffix -> the codec its dataset's shards are written with
CODECS = {"_lz4": "lz4", "_none": "none"}
QUICK_CONFIGS = ("shardflow_local", "shardflow_s3", "shardflow_s3_cached", "pyarrow_rowgroups",
                 "mosaic_inproc", "mosaic_s3", "litdata_inproc", "litdata_s3")


# -- the peers' imports ------------------------------------------------------------------------


def _stub(name: str, **attrs: Any) -> None:
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so that submodules can be stubbed below it
    module.__dict__.update(attrs)
    sys.modules[name] = module


def _missing(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def _install_stand_ins() -> None:
    """Empty modules for what the peers import at module level but this benchmark never runs.

    Installing the peers with their declared dependencies would pull a CUDA torch,
    torchvision, transformers and the Azure/GCS/OCI SDKs. Instead they are installed with
    ``--no-deps`` plus the few small packages their import chains really use (listed in the
    module docstring), and these stand-ins fill the rest:

    - ``streaming.vision``, ``streaming.text``, ``streaming.multimodal``: dataset-specific
      subpackages that ``import streaming`` loads eagerly; vision imports torchvision (whose
      wheel fails beside the CPU torch here), text imports transformers' tokenizers.
    - ``transformers.feature_extraction_utils.BatchFeature`` and
      ``transformers.tokenization_utils_base.BatchEncoding``: only type-checked by
      ``streaming.base.dataloader`` when a batch is one of them; ours never are.
    - ``snappy``: a compression codec ``streaming`` imports eagerly; MDS shards here are
      uncompressed.
    - ``boto3`` and ``requests`` (+ ``requests.adapters.HTTPAdapter``): litdata's S3 client;
      its chunks here are read from local disk. (A real ``boto3`` would have to match the
      ``botocore`` that s3fs's aiobotocore pins, so it is not installed.)

    A stand-in is only installed when the real module is absent.
    """

    class _Placeholder(dict):
        """A type nothing is ever an instance of (batches here are plain dicts)."""

    if _missing("transformers"):
        _stub("transformers")
        _stub("transformers.feature_extraction_utils", BatchFeature=_Placeholder)
        _stub("transformers.tokenization_utils_base", BatchEncoding=_Placeholder)
    for name in ("streaming.vision", "streaming.text", "streaming.multimodal"):
        _stub(name)
    for name in ("snappy", "boto3"):
        if _missing(name):
            _stub(name)
    if _missing("requests"):
        _stub("requests")
        _stub("requests.adapters", HTTPAdapter=object)


# -- writing the same tokens in every format ---------------------------------------------------


def base_tokens(workdir: Path) -> np.ndarray:
    """The Shakespeare GPT-2 tokens, tokenized once and cached (tokenizing takes ~10 s)."""
    cache = workdir / "shakespeare_gpt2.npy"
    if cache.exists():
        return np.load(cache)
    from benchmarks.bench_utils import shakespeare_tokens

    tokens = shakespeare_tokens()
    np.save(cache, tokens)
    return tokens


def write_mds(samples: np.ndarray, out: Path) -> None:
    from streaming import MDSWriter

    columns = {"tokens": f"ndarray:int32:{WIDTH}"}
    with MDSWriter(out=str(out), columns=columns, compression=None, size_limit=1 << 26,
                   progress_bar=False) as writer:
        for row in samples:
            writer.write({"tokens": row})


_LITDATA_SOURCE: np.ndarray | None = None
_LITDATA_ITEM = 256  # samples per item given to optimize: items never straddle 2049-token blocks


def _litdata_item(index: int) -> Any:
    import torch

    assert _LITDATA_SOURCE is not None
    rows = _LITDATA_SOURCE[index * _LITDATA_ITEM:(index + 1) * _LITDATA_ITEM]
    return torch.from_numpy(np.ascontiguousarray(rows).reshape(-1))


def write_litdata(samples: np.ndarray, out: Path) -> None:
    """``optimize`` with ``TokensLoader``: chunks hold whole 2049-token blocks only."""
    global _LITDATA_SOURCE
    from litdata import optimize
    from litdata.streaming.item_loader import TokensLoader

    _LITDATA_SOURCE = samples  # the (forked) optimize worker reads it from here
    n_items = -(-len(samples) // _LITDATA_ITEM)
    optimize(fn=_litdata_item, inputs=list(range(n_items)), output_dir=str(out),
             chunk_bytes="64MB", item_loader=TokensLoader(), num_workers=1,
             start_method="fork", verbose=False)
    _LITDATA_SOURCE = None


# -- one configuration, in its own process -----------------------------------------------------


def _to_batch(rows: Any) -> dict[str, Any]:
    """``[B, 2049]`` tokens -> the batch every loader here delivers (int64 inputs and labels)."""
    import torch

    t = rows if isinstance(rows, torch.Tensor) else torch.from_numpy(np.stack(rows))
    t = t.to(torch.int64)
    return {"input_ids": t[:, :-1], "labels": t[:, 1:]}


def _collate_mosaic(samples: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    return _to_batch([s["tokens"] for s in samples])


def _collate_litdata(samples: list[Any]) -> dict[str, Any]:
    import torch

    return _to_batch(torch.stack(samples))


def _grouped(items: Iterator[Any], n: int) -> Iterator[list[Any]]:
    group: list[Any] = []
    for item in items:
        group.append(item)
        if len(group) == n:
            yield group
            group = []
    if group:
        yield group


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _children_cpu_s() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


def _status_mb(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process, from ``/proc/self/status``.

    ``ru_maxrss`` of RUSAGE_SELF is not used: Linux carries it across ``exec``, so a child
    started by the (large) parent would report the parent's peak.
    """
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _fresh_cache(prefix: str) -> str:
    path = tempfile.mkdtemp(prefix=f"{prefix}-cache-")
    atexit.register(shutil.rmtree, path, True)
    return path


def _boto3_options(options: dict[str, Any]) -> dict[str, Any]:
    """The server's s3fs options as boto3 client keywords (litdata's ``storage_options``)."""
    ck = options.get("client_kwargs", {})
    return {"endpoint_url": ck["endpoint_url"], "region_name": ck.get("region_name", "us-east-1"),
            "aws_access_key_id": options["key"], "aws_secret_access_key": options["secret"]}


def _peer_s3_env(options: dict[str, Any]) -> None:
    """MosaicML streaming takes its S3 endpoint and credentials from the environment."""
    import os

    b = _boto3_options(options)
    os.environ.update(S3_ENDPOINT_URL=b["endpoint_url"], AWS_ACCESS_KEY_ID=b["aws_access_key_id"],
                      AWS_SECRET_ACCESS_KEY=b["aws_secret_access_key"],
                      AWS_DEFAULT_REGION=b["region_name"])


def _make_source(config: str, spec: dict[str, Any]) -> Callable[[], Iterator[Any]]:
    """A function that starts one epoch of ``config`` and yields its batches."""
    kind = config.split("_")[0]
    workers = 4 if "_w4" in config else 2 if "_w2" in config else 0
    if config.endswith("_w2fs"):
        import torch.multiprocessing

        torch.multiprocessing.set_sharing_strategy("file_system")
    if kind == "shardflow":
        from loaders import build_dataloader

        url, options = spec["s3_url"], spec["s3_options"]
        where = "s3_url"
        if config.startswith("shardflow_local"):
            url, options, where = spec["local_url"], None, "local_url"
        for suffix, codec in CODECS.items():
            if config.endswith(suffix):
                url = spec[f"{where}_{codec}"]
        extra: dict[str, Any] = {}
        if config.endswith("_cached"):  # epoch 1 fills the local disk cache, later ones hit it
            extra["cache_dir"] = tempfile.mkdtemp(prefix="shardflow-cache-")
            atexit.register(shutil.rmtree, extra["cache_dir"], True)
        if config.endswith("_bt"):
            extra["batch_thread"] = True
        runs = re.search(r"_run(\d+)$", config)
        if runs:  # run_blocks set: runs of that many row groups shuffled as one (1: single)
            extra["run_blocks"] = int(runs.group(1))
        if config.endswith("_rt4"):
            extra["read_threads"] = 4
        if config.endswith("_ixf"):  # footers made from the index, whatever the size
            from loaders import reader

            reader.LOCAL_FOOTER_GROUPS = 0
        if config.endswith("_s3fs"):  # the client before obstore, for the record
            import os

            os.environ["SHARDFLOW_S3_CLIENT"] = "s3fs"
        def shardflow() -> Iterator[Any]:
            _LAST["loader"] = loader = build_dataloader(url, BATCH, SEQ, num_workers=workers,
                                                        storage_options=options, **extra)
            return iter(loader)
        return shardflow
    if kind == "pyarrow":
        import pyarrow.parquet as pq
        import torch  # noqa: F401  (imported before the clock starts, as the loaders' is)

        files = sorted(Path(spec["local_url"], "shards").glob("*.parquet"))

        from storage import read_manifest, tokens

        encoding = read_manifest(spec["local_url"]).schema["input_ids"]

        def rows() -> Iterator[np.ndarray]:
            for path in files:
                pf = pq.ParquetFile(path)
                for i in range(pf.num_row_groups):
                    table = pf.read_row_group(i, columns=["input_ids"], use_threads=False)
                    flat = tokens.unpack(table.column(0), encoding)
                    yield from flat[:len(flat) // WIDTH * WIDTH].reshape(-1, WIDTH)

        return lambda: map(_to_batch, _grouped(rows(), BATCH))
    _install_stand_ins()
    from_s3 = "_s3" in config
    if from_s3:
        _peer_s3_env(spec["s3_options"])
    if kind == "mosaic" and from_s3:
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        def mds_s3() -> Iterator[Any]:  # built inside the clock, on a fresh cache directory
            clean_stale_shared_memory()
            mds = StreamingDataset(remote=spec["mds_s3"], local=_fresh_cache("mosaic"),
                                   batch_size=BATCH, shuffle=True)
            return map(_collate_mosaic, _grouped(iter(mds), BATCH))
        return mds_s3
    if kind == "litdata" and from_s3:
        from litdata import StreamingDataLoader as LitLoader
        from litdata import StreamingDataset as LitDataset
        from litdata.streaming import downloader
        from litdata.streaming.item_loader import TokensLoader

        # litdata downloads chunks through obstore when it is installed (its fastest path), but
        # gives obstore no way to reach a plain-http endpoint such as this loopback server;
        # allow it, as TLS would on a real store. ``_boto3``: its boto3 path instead.
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
        if config.endswith("_boto3"):
            downloader._OBSTORE_AVAILABLE = False

        def lit_s3() -> Iterator[Any]:
            ds = LitDataset(spec["litdata_s3"], cache_dir=_fresh_cache("litdata"),
                            item_loader=TokensLoader(block_size=WIDTH), shuffle=True,
                            storage_options=_boto3_options(spec["s3_options"]))
            if workers:
                return iter(LitLoader(ds, batch_size=BATCH, num_workers=workers,
                                      collate_fn=_collate_litdata))
            return map(_collate_litdata, _grouped(iter(ds), BATCH))
        return lit_s3
    if kind == "mosaic":
        from streaming import StreamingDataLoader, StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        def mds() -> Any:  # built inside the clock, as Shardflow's loader is
            clean_stale_shared_memory()
            return StreamingDataset(local=spec["mds_dir"], batch_size=BATCH, shuffle=True)
        if workers:
            return lambda: iter(StreamingDataLoader(
                mds(), batch_size=BATCH, num_workers=workers, collate_fn=_collate_mosaic,
                persistent_workers=False))
        return lambda: map(_collate_mosaic, _grouped(iter(mds()), BATCH))
    if kind == "litdata":
        from litdata import StreamingDataLoader as LitLoader
        from litdata import StreamingDataset as LitDataset
        from litdata.streaming.item_loader import TokensLoader

        def dataset() -> Any:  # built inside the clock, as Shardflow's loader is
            return LitDataset(spec["litdata_dir"], item_loader=TokensLoader(block_size=WIDTH),
                              shuffle=True)
        if workers:
            return lambda: iter(LitLoader(dataset(), batch_size=BATCH, num_workers=workers,
                                          collate_fn=_collate_litdata))
        return lambda: map(_collate_litdata, _grouped(iter(dataset()), BATCH))
    raise ValueError(config)


_LAST: dict[str, Any] = {}  # the Shardflow loader of the last epoch (its request counter)


def _count_tokens(item: Any) -> int:
    if isinstance(item, dict):
        return int(item["input_ids"].numel())
    return len(item)


def _shardflow_resume(config: str, spec: dict[str, Any], runs: int) -> dict[str, Any]:
    """Resume at 90 % of an epoch: new loader + ``load_state_dict`` + first batch."""
    import torch

    from loaders import build_dataloader

    url, options = spec["s3_url"], spec["s3_options"]
    if config.startswith("shardflow_local"):
        url, options = spec["local_url"], None
    loader = build_dataloader(url, BATCH, SEQ, storage_options=options)
    stop = int(0.9 * len(loader))
    it = iter(loader)
    for _ in range(stop):
        next(it)
    state = loader.state_dict()
    expected = next(it)["input_ids"]
    it.close()
    total, load_first = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        fresh = build_dataloader(url, BATCH, SEQ, storage_options=options)
        t1 = time.perf_counter()
        fresh.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint would carry it
        resumed = iter(fresh)
        batch = next(resumed)
        t2 = time.perf_counter()
        resumed.close()
        assert torch.equal(batch["input_ids"], expected), "resume did not continue exactly"
        total.append(t2 - t0)
        load_first.append(t2 - t1)
    return {"at_batch": stop, "of_batches": len(loader), "build_load_first_s": total,
            "load_first_s": load_first, "state_bytes": len(json.dumps(state))}


def run_child(config: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``spec["runs"]`` epochs of ``config`` here; report times, CPU and RSS.

    ``spawn_wall``: when the parent started this process (``time.time()``): the first epoch's
    first batch is also timed from then, as a user's job would see it (interpreter start,
    imports, construction, first batch); ``torch_import_s`` is the part torch's import took.
    """
    t_torch = time.perf_counter()
    import torch  # noqa: F401  (every loader here imports it; timed on its own)

    torch_import_s = TORCH_IMPORT_S if TORCH_IMPORT_S is not None else (
        time.perf_counter() - t_torch)
    source = _make_source(config, spec)
    if config.endswith("_cached"):  # one epoch fills the fresh cache; the measured ones hit it
        for _ in source():
            pass
    rss_ready = _status_mb("VmRSS")
    runs = []
    # the S3 server's CPU over the measured epochs only (not the resume check below, which
    # reads most of an epoch again, nor a cached config's filling epoch)
    server0 = _server_cpu_s(spec.get("server_pids", []))
    for _ in range(spec["runs"]):
        cpu0, t0 = _cpu_s(), time.perf_counter()
        tokens = batches = 0
        first = None
        first_wall = None
        for item in source():
            if first is None:
                first = time.perf_counter() - t0
                first_wall = time.time()
            tokens += _count_tokens(item)
            batches += 1
        seconds = time.perf_counter() - t0
        run = {"seconds": seconds, "tokens": tokens, "batches": batches,
               "cpu_s": _cpu_s() - cpu0, "first_batch_s": first,
               # the rate once streaming: the epoch less its first batch
               "after_first_mtok_per_s": (tokens - BATCH * SEQ) / (seconds - first) / 1e6}
        if not runs and spec.get("spawn_wall") and first_wall is not None:
            run["first_batch_from_start_s"] = first_wall - spec["spawn_wall"]
            # the same less torch's import (what the target counts: torch already imported)
            run["first_batch_less_torch_s"] = run["first_batch_from_start_s"] - torch_import_s
            run["epoch_from_start_s"] = time.time() - spec["spawn_wall"]
        loader = _LAST.pop("loader", None)
        if loader is not None:
            run["requests"] = loader.source.metrics().get("requests")
        runs.append(run)
    server_cpu = _server_cpu_s(spec.get("server_pids", [])) - server0
    out: dict[str, Any] = {
        "runs": runs, "rss_ready_mb": rss_ready, "torch_import_s": torch_import_s,
        "server_cpu_epochs_s": server_cpu,
        "peak_rss_mb": _status_mb("VmHWM"),
        # The largest reaped DataLoader worker; it counts the pages it shares with this
        # process (torch, the dataset object) as its own.
        "peak_worker_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}
    if config in ("shardflow_local", "shardflow_s3") and spec.get("resume", True):
        out["resume"] = _shardflow_resume(config, spec, spec["runs"])
    return out


def rotated(configs: tuple[str, ...], r: int) -> list[str]:
    """``configs`` with its local and its S3 configs each rotated by ``r`` in place (each
    group keeps the places it had)."""
    out = list(configs)
    for remote in (False, True):
        places = [i for i, c in enumerate(configs) if ("_s3" in c) == remote]
        group = [configs[i] for i in places]
        shift = r % len(group) if group else 0
        for i, c in zip(places, group[shift:] + group[:shift], strict=True):
            out[i] = c
    return out


def measure_rounds(configs: tuple[str, ...], spec: dict[str, Any],
                   rounds: int) -> dict[str, dict[str, Any]]:
    """``rounds`` interleaved rounds (config A, B, C, A, B, C, ...), each run a fresh process
    with one epoch (and, for the peers from S3, a fresh cache directory), merged into one
    result per config: medians over the rounds, the highest peak RSS.

    Round ``r`` rotates the local configs among themselves by ``r``, and the S3 ones: the
    first config to read from the S3 server after the local ones ran slower in every round
    (at a59d1c3, two Shardflow configs from S3 in six rounds: whichever came first was the
    slower, 62.8-100.9 vs 105.7-112.6 Mtok/s in one order, 89.8-94.0 vs 91.4-116.0 in the
    other), so no config holds that place in every round."""
    parts: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    one = {**spec, "runs": 1}
    for r in range(rounds):
        for config in rotated(configs, r):
            got = measure(config, one)
            if "error" in got:
                print(f"  round {r + 1}: {config} failed")
                continue
            parts[config].append(got)
            busy = (f"  elsewhere {got['other_cores']:.2f} cores busy, "
                    f"{got['steal_cores']:.2f} stolen" if "other_cores" in got else "")
            print(f"  round {r + 1}: {config:20} {got['mtok_per_s']:8.1f} Mtok/s  "
                  f"{got['cpu_s_per_gtok']:8.1f} CPU-s/Gtok  first batch "
                  f"{got['first_batch_s']:.2f} s{busy}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for config, got in parts.items():
        if not got:
            results[config] = {"error": "every round failed"}
            continue
        runs = [r for g in got for r in g["runs"]]
        out = {"runs": runs, "rounds": len(got), "tokens": runs[0]["tokens"],
               "median_s": median([r["seconds"] for r in runs]),
               "rss_ready_mb": median([g["rss_ready_mb"] for g in got]),
               "peak_rss_mb": max(g["peak_rss_mb"] for g in got),
               "peak_worker_rss_mb": max(g["peak_worker_rss_mb"] for g in got)}
        out["mtok_per_s"] = median([r["tokens"] / r["seconds"] / 1e6 for r in runs])
        out["cpu_s_per_gtok"] = median([r["cpu_s"] / r["tokens"] * 1e9 for r in runs])
        out["first_batch_s"] = median([r["first_batch_s"] for r in runs])
        out["after_first_mtok_per_s"] = median([g["after_first_mtok_per_s"] for g in got])
        for key in ("first_batch_from_start_s", "first_batch_less_torch_s",
                    "epoch_from_start_s", "server_cpu_s_per_gtok", "requests",
                    "torch_import_s", "other_cores", "steal_cores"):
            if all(g.get(key) is not None for g in got):
                out[key] = median([g[key] for g in got])
        if all("resume_s" in g for g in got):
            out["resume_s"] = median([g["resume_s"] for g in got])
            out["resume"] = [g["resume"] for g in got]
        results[config] = out
    return results


def measure(config: str, spec: dict[str, Any], attempts: int = 2) -> dict[str, Any]:
    """Run one configuration in a fresh interpreter and summarise it.

    A failed configuration is tried once more: on a loaded machine torch's shared-memory
    manager (``file_system`` sharing) can time out, which says nothing about the loader.
    """
    for attempt in range(1, attempts + 1):
        server0 = _server_cpu_s(spec.get("server_pids", []))
        # Started as a module (-c), not as a script: Python caches a module's bytecode, never
        # a script's, and recompiling this file would count in every first batch.
        cmd = [sys.executable, "-c", CHILD_MAIN, "--child", config,
               "--spec", json.dumps({**spec, "spawn_wall": time.time()})]
        machine0, kids0, wall0 = _machine_cpu_s(), _children_cpu_s(), time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=child_env())
        wall, machine1 = time.perf_counter() - wall0, _machine_cpu_s()
        server_cpu = _server_cpu_s(spec.get("server_pids", [])) - server0
        machine = machine_share(machine0, machine1,
                                _children_cpu_s() - kids0 + server_cpu, wall)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode == 0 and lines:
            break
        tail = (proc.stderr or proc.stdout)[-3000:]
        print(f"  {config}: FAILED (exit {proc.returncode}, attempt {attempt})\n{tail[-600:]}")
        if attempt == attempts:
            return {"error": tail}
    raw = json.loads(lines[-1][len("RESULT "):])
    runs = raw["runs"]
    sec = median([r["seconds"] for r in runs])
    tokens = runs[0]["tokens"]
    cpu = median([r["cpu_s"] for r in runs])
    out = {**raw, "median_s": sec, "tokens": tokens, "mtok_per_s": tokens / sec / 1e6,
           "cpu_s_per_gtok": cpu / tokens * 1e9,
           "first_batch_s": median([r["first_batch_s"] for r in runs]), **machine}
    if "resume" in raw:
        out["resume_s"] = median(raw["resume"]["build_load_first_s"])
    if "_s3" in config:  # the S3 server's own CPU over the measured epochs
        out["server_cpu_s_per_gtok"] = raw.get("server_cpu_epochs_s", server_cpu) / (
            tokens * len(runs)) * 1e9
    for key in ("first_batch_from_start_s", "first_batch_less_torch_s", "epoch_from_start_s"):
        if key in runs[0]:
            out[key] = runs[0][key]
    out["after_first_mtok_per_s"] = median([r["after_first_mtok_per_s"] for r in runs])
    if runs[0].get("requests") is not None:
        out["requests"] = median([r["requests"] for r in runs])
    elif config.startswith("litdata") and "_s3" in config:
        out["requests"] = spec.get("litdata_chunks")  # one whole-chunk GET per chunk
    return out


#: A child imports torch first, as a training job does, and times it: numpy comes with torch,
#: so it counts in ``torch_import_s``, not in the loader's "first batch less torch" (the
#: harness's own numpy import, first, had added ~0.07 s to every loader's figure there).
CHILD_MAIN = ("import time; _t = time.perf_counter(); import torch; _t = time.perf_counter() - _t; "
              "import sys; from benchmarks import loader_throughput as lt; "
              "lt.TORCH_IMPORT_S = _t; sys.exit(lt.main())")
#: torch's import in this process, when it came first (set by ``CHILD_MAIN``)
TORCH_IMPORT_S: float | None = None


def child_env() -> dict[str, str]:
    """The children's environment: bytecode cached (``__pycache__``, ignored by git) even where
    the caller disabled writing it (``PYTHONDONTWRITEBYTECODE``): without it every child would
    compile Shardflow's modules from source (~0.1 s of CPU) before its first batch, which an
    installed package (like the peers and torch, compiled at their install) never does. No
    ``PYTHONPYCACHEPREFIX``: it would hide the installed packages' bytecode too."""
    import os

    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}


def compile_bytecode() -> None:
    """Shardflow's packages compiled once, before anything is timed."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", "loaders", "storage",
                    "benchmarks"], cwd=ROOT, env=child_env(), check=True,
                   stdout=subprocess.DEVNULL)


def _server_cpu_s(pids: list[int]) -> float:
    """User + system CPU-seconds of the S3 server's processes so far (``/proc/PID/stat``)."""
    import os

    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime, stime, cutime, cstime: fields 14-17 of stat(5), 12-15 after the name
        total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def _machine_cpu_s() -> tuple[float, float] | None:
    """CPU-seconds the whole machine has spent busy, and lost to steal (a VM's vCPU run by
    the host for someone else), since boot (``/proc/stat``); None where there is none."""
    import os

    try:
        with open("/proc/stat") as fh:
            fields = [int(f) for f in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / tick, steal / tick


def machine_share(before: tuple[float, float] | None, after: tuple[float, float] | None,
                  own_cpu_s: float, wall_s: float) -> dict[str, float]:
    """What the rest of the machine did while a child ran, in cores: ``other_cores`` busy
    with anything but the child (and the S3 server, counted in ``own_cpu_s``) and
    ``steal_cores`` taken by the host. A 2-core figure means little when either is high:
    a loader using two cores loses the second one first, a one-core peer loses nothing."""
    if before is None or after is None or wall_s <= 0:
        return {}
    busy, steal = after[0] - before[0], after[1] - before[1]
    return {"other_cores": max(0.0, busy - own_cpu_s) / wall_s, "steal_cores": steal / wall_s}


# -- the parent: data, server, table, plot -----------------------------------------------------


def _upload(local: Path, store: Any, prefix: str) -> None:
    """The peers' files, as written locally, to the same S3 bucket (one PUT per file)."""
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        store.put(f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())


def prepare(workdir: Path, n_tokens: int, server: Any,
            configs: tuple[str, ...] = CONFIGS) -> dict[str, Any]:
    from benchmarks.bench_utils import write_token_dataset
    from storage import ReplicaSet

    _install_stand_ins()
    base = base_tokens(workdir)
    data = workdir / f"data-{n_tokens}"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    tokens = np.resize(base, n_tokens)
    samples = tokens[:len(tokens) // WIDTH * WIDTH].reshape(-1, WIDTH)
    shards = max(2, n_tokens // 4_000_000)
    bucket = server.make_bucket("loader-bench")
    spec = {"local_url": str(data / "shardflow"), "s3_url": f"{bucket.url}/ds",
            "s3_options": bucket.storage_options, "mds_dir": str(data / "mds"),
            "litdata_dir": str(data / "litdata"), "samples": len(samples), "shards": shards}
    spec["server_pids"] = list(server.pids) if server is not None else []
    kinds = {c.split("_")[0] for c in configs}
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("shardflow local", lambda: write_token_dataset(
            ReplicaSet.from_urls([spec["local_url"]]), tokens, shards)),
    ]
    if any("_s3" in c for c in configs):
        steps.append(("shardflow s3", lambda: write_token_dataset(
            ReplicaSet.from_urls([spec["s3_url"]], bucket.storage_options), tokens, shards)))
    for suffix, codec in CODECS.items():
        if f"shardflow_s3{suffix}" in configs:
            spec[f"s3_url_{codec}"] = url = f"{bucket.url}/ds_{codec}"
            steps.append((f"shardflow s3 {codec}", lambda url=url, codec=codec:
                          write_token_dataset(ReplicaSet.from_urls(
                              [url], bucket.storage_options), tokens, shards,
                              compression=codec)))
        if f"shardflow_local{suffix}" in configs:
            spec[f"local_url_{codec}"] = url = str(data / f"shardflow_{codec}")
            steps.append((f"shardflow local {codec}", lambda url=url, codec=codec:
                          write_token_dataset(ReplicaSet.from_urls([url]), tokens, shards,
                                              compression=codec)))
    if "mosaic" in kinds:
        steps.append(("mds", lambda: write_mds(samples, Path(spec["mds_dir"]))))
    if "litdata" in kinds:
        steps.append(("litdata", lambda: write_litdata(samples, Path(spec["litdata_dir"]))))
    if server is not None:
        spec["mds_s3"] = f"{bucket.url}/mds"
        spec["litdata_s3"] = f"{bucket.url}/litdata"
        upload = ReplicaSet.from_urls([bucket.url], bucket.storage_options)
        if "mosaic" in kinds:
            steps.append(("mds -> s3", lambda: _upload(Path(spec["mds_dir"]), upload, "mds")))
        if "litdata" in kinds:
            steps.append(("litdata -> s3",
                          lambda: _upload(Path(spec["litdata_dir"]), upload, "litdata")))
    spec["write_s"] = {}
    for name, step in steps:
        t0 = time.perf_counter()
        step()
        spec["write_s"][name] = time.perf_counter() - t0
        print(f"  wrote {name} in {spec['write_s'][name]:.1f} s")
    if "litdata" in kinds:
        spec["litdata_chunks"] = len(list(Path(spec["litdata_dir"]).glob("*.bin")))
    # bytes on disk of each local dataset (shards, index, manifest; litdata's chunks)
    spec["dataset_bytes"] = {
        name: sum(p.stat().st_size for p in Path(spec[key]).rglob("*") if p.is_file())
        for name, key in (("shardflow_local", "local_url"),
                          *((f"shardflow_local{s}", f"local_url_{c}") for s, c in CODECS.items()),
                          ("litdata_inproc", "litdata_dir"))
        if key in spec and Path(spec[key]).exists()}
    return spec


def summarise(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ok = {k: v for k, v in results.items() if "error" not in v}
    peers = {k: v for k, v in ok.items() if k.split("_")[0] in PEERS}
    best_rate = max(peers.values(), key=lambda v: v["mtok_per_s"], default=None)
    best_cpu = min(peers.values(), key=lambda v: v["cpu_s_per_gtok"], default=None)
    summary: dict[str, Any] = {}
    if best_rate:
        summary["peers_best_mtok_per_s"] = best_rate["mtok_per_s"]
        summary["peers_best_config"] = next(k for k, v in peers.items() if v is best_rate)
    if best_cpu:
        summary["peers_lowest_cpu_s_per_gtok"] = best_cpu["cpu_s_per_gtok"]
    for v in ok.values():
        if best_rate:
            v["x_peers_best_rate"] = v["mtok_per_s"] / best_rate["mtok_per_s"]
        if best_cpu:
            v["x_peers_lowest_cpu"] = v["cpu_s_per_gtok"] / best_cpu["cpu_s_per_gtok"]
    if "shardflow_local" in ok and "pyarrow_rowgroups" in ok:
        summary["shardflow_local_vs_pyarrow"] = (ok["shardflow_local"]["mtok_per_s"]
                                                 / ok["pyarrow_rowgroups"]["mtok_per_s"])
    for where in ("local", "s3"):
        r = ok.get(f"shardflow_{where}")
        if r:
            summary[f"first_batch_{where}_s"] = r["first_batch_s"]
            if "resume_s" in r:
                summary[f"resume_90pct_{where}_s"] = r["resume_s"]
    s3_peers = {k: v for k, v in peers.items() if "_s3" in k}
    sf = ok.get("shardflow_s3")
    if s3_peers and sf:
        best = max(s3_peers, key=lambda k: s3_peers[k]["mtok_per_s"])
        frugal = min(s3_peers, key=lambda k: s3_peers[k]["cpu_s_per_gtok"])
        summary["s3_peers_best_config"] = best
        summary["s3_peers_best_mtok_per_s"] = s3_peers[best]["mtok_per_s"]
        summary["s3_x_best_s3_peer"] = sf["mtok_per_s"] / s3_peers[best]["mtok_per_s"]
        summary["s3_cpu_x_lowest_s3_peer"] = (sf["cpu_s_per_gtok"]
                                              / s3_peers[frugal]["cpu_s_per_gtok"])
        summary["s3_peers_lowest_cpu_s_per_gtok"] = s3_peers[frugal]["cpu_s_per_gtok"]
        summary["s3_first_batch_best_s3_peer_s"] = min(v["first_batch_s"]
                                                       for v in s3_peers.values())
    if s3_peers and sf and "after_first_mtok_per_s" in sf:
        best = max(s3_peers, key=lambda k: s3_peers[k].get("after_first_mtok_per_s", 0))
        summary["s3_after_first_best_s3_peer"] = best
        summary["s3_after_first_x_best_s3_peer"] = (
            sf["after_first_mtok_per_s"] / s3_peers[best]["after_first_mtok_per_s"])
    # per billion tokens delivered (the stored widths differ: uint16 here, litdata's int32)
    for r in ok.values():
        if r.get("requests") is not None:
            r["requests_per_gtok"] = r["requests"] / r["tokens"] * 1e9
    for where, peer in (("local", "litdata_inproc"), ("s3", None)):
        r = ok.get(f"shardflow_{where}")
        others = ({peer: ok[peer]} if peer in ok else {}) if peer else s3_peers
        others = {k: v for k, v in others.items() if "first_batch_from_start_s" in v}
        if r and "first_batch_from_start_s" in r and others:
            fastest = min(others, key=lambda k: others[k]["first_batch_from_start_s"])
            summary[f"first_batch_from_start_{where}_s"] = r["first_batch_from_start_s"]
            summary[f"first_batch_from_start_{where}_peer"] = fastest
            summary[f"first_batch_from_start_{where}_peer_s"] = (
                others[fastest]["first_batch_from_start_s"])
            if "first_batch_less_torch_s" in r:
                summary[f"first_batch_less_torch_{where}_s"] = r["first_batch_less_torch_s"]
                summary[f"first_batch_less_torch_{where}_peer_s"] = (
                    others[fastest].get("first_batch_less_torch_s"))
    # the shard codecs, local, against litdata in-process (same rounds)
    lit = ok.get("litdata_inproc")
    for name in ("shardflow_local", *(f"shardflow_local{s}" for s in CODECS)):
        r = ok.get(name)
        if r and lit:
            key = name.removeprefix("shardflow_local").lstrip("_") or "zstd"
            summary[f"codec_{key}_x_litdata"] = r["mtok_per_s"] / lit["mtok_per_s"]
            summary[f"codec_{key}_after_first_x_litdata"] = (
                r["after_first_mtok_per_s"] / lit["after_first_mtok_per_s"])
            summary[f"codec_{key}_cpu_x_litdata"] = r["cpu_s_per_gtok"] / lit["cpu_s_per_gtok"]
            if r.get("x_zstd_bytes") is not None:
                summary[f"codec_{key}_x_zstd_bytes"] = r["x_zstd_bytes"]
    s3_peer = ok.get("litdata_s3_boto3")
    for name in ("shardflow_s3", *(f"shardflow_s3{s}" for s in CODECS)):
        r = ok.get(name)
        if r and s3_peer and any(f"shardflow_s3{s}" in ok for s in CODECS):
            key = name.removeprefix("shardflow_s3").lstrip("_") or "zstd"
            summary[f"s3_codec_{key}_x_litdata_boto3"] = r["mtok_per_s"] / s3_peer["mtok_per_s"]
            summary[f"s3_codec_{key}_after_first_x_litdata_boto3"] = (
                r["after_first_mtok_per_s"] / s3_peer["after_first_mtok_per_s"])
            summary[f"s3_codec_{key}_cpu_x_litdata_boto3"] = (
                r["cpu_s_per_gtok"] / s3_peer["cpu_s_per_gtok"])
            if r.get("server_cpu_s_per_gtok") is not None:
                summary[f"s3_codec_{key}_server_cpu_s_per_gtok"] = r["server_cpu_s_per_gtok"]
    cached, local = ok.get("shardflow_s3_cached"), ok.get("shardflow_local")
    if cached and local:
        summary["s3_cached_x_local"] = cached["mtok_per_s"] / local["mtok_per_s"]
    return summary


def print_table(results: dict[str, dict[str, Any]], summary: dict[str, Any]) -> None:
    head = (f"{'config':20} {'Mtok/s':>8} {'x best':>7} {'CPU s/Gtok':>11} {'x lowest':>8} "
            f"{'1st batch':>9} {'peak RSS':>9} {'worker RSS':>10}")
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        if "error" in r:
            print(f"{name:20} failed")
            continue
        worker = f"{r['peak_worker_rss_mb']:8.0f}MB" if "_w" in name else f"{'-':>10}"
        print(f"{name:20} {r['mtok_per_s']:8.1f} {r.get('x_peers_best_rate', 0):7.2f} "
              f"{r['cpu_s_per_gtok']:11.1f} {r.get('x_peers_lowest_cpu', 0):8.2f} "
              f"{r['first_batch_s']:8.2f}s {r['peak_rss_mb']:7.0f}MB {worker}")
    print()
    head = (f"{'config':20} {'after 1st':>9} {'1st from start':>14} {'torch import':>12} "
            f"{'rest':>6} {'requests':>8} {'req/Gtok':>8} {'server CPU s/Gtok':>17}")
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        if "error" in r:
            continue

        def f(key: str, fmt: str, r: dict[str, Any] = r) -> str:
            return format(r[key], fmt) if r.get(key) is not None else "-"
        print(f"{name:20} {f('after_first_mtok_per_s', '9.1f'):>9} "
              f"{f('first_batch_from_start_s', '13.2f'):>14} {f('torch_import_s', '11.2f'):>12} "
              f"{f('first_batch_less_torch_s', '6.2f'):>6} {f('requests', '8.0f'):>8} "
              f"{f('requests_per_gtok', '8.0f'):>8} "
              f"{f('server_cpu_s_per_gtok', '17.1f'):>17}")
    print()
    for key, value in summary.items():
        print(f"  {key}: {value:.3f}" if isinstance(value, float) else f"  {key}: {value}")


def plot(results: dict[str, dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = {k: v for k, v in results.items() if "error" not in v}
    names = list(ok)
    colors = ["tab:blue" if n.startswith("shardflow") else "tab:gray" if n.startswith("pyarrow")
              else "tab:orange" if n.startswith("mosaic") else "tab:green" for n in names]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    ax1.bar(names, [ok[n]["mtok_per_s"] for n in names], color=colors)
    ax1.set_ylabel("delivered Mtokens/s (batch 8 x 2048)")
    ax1.set_title("throughput, median of runs (higher is better)")
    ax2.bar(names, [ok[n]["cpu_s_per_gtok"] for n in names], color=colors)
    ax2.set_ylabel("CPU-seconds per billion tokens")
    ax2.set_title("CPU cost (lower is better)")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=50)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    best = summary.get("peers_best_mtok_per_s")
    if best:
        ax1.axhline(best, color="black", linestyle=":", linewidth=1, label="peers' best")
        ax1.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def workers_sweep(args: argparse.Namespace) -> int:
    """CPU per token of the default loader with 0, 2 and 4 DataLoader workers (local data)."""
    from benchmarks.bench_utils import write_token_dataset
    from storage import ReplicaSet

    n_tokens, runs = int(args.tokens), args.runs
    data = args.workdir / f"workers-{n_tokens}"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    tokens = np.resize(base_tokens(args.workdir), n_tokens)
    shards = max(2, n_tokens // 4_000_000)
    spec = {"local_url": str(data / "shardflow"), "s3_url": "", "s3_options": None,
            "runs": runs}
    write_token_dataset(ReplicaSet.from_urls([spec["local_url"]]), tokens, shards)
    results = {}
    try:
        for config in ("shardflow_local", "shardflow_local_w2", "shardflow_local_w4"):
            results[config] = r = measure(config, spec)
            if "error" not in r:
                print(f"  {config:20} {r['mtok_per_s']:8.1f} Mtok/s  "
                      f"{r['cpu_s_per_gtok']:8.1f} CPU-s/Gtok")
    finally:
        shutil.rmtree(data, ignore_errors=True)
    base = results["shardflow_local"]["cpu_s_per_gtok"]
    for r in results.values():
        if "error" not in r:
            r["x_in_process_cpu"] = r["cpu_s_per_gtok"] / base
    path = write_results("loader_throughput_workers", {
        "tokens": n_tokens, "shards": shards, "batch": BATCH, "seq_len": SEQ, "runs": runs,
        "configs": results})
    print(f"results: {path}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=None,
                        help="tokens in the dataset (default 50 M; --full, --s3: 200 M)")
    parser.add_argument("--runs", type=int, default=None,
                        help="rounds / epochs per configuration (default 5; --s3 3)")
    parser.add_argument("--full", action="store_true",
                        help="the full sweep (CONFIGS: every Shardflow setting and both peers "
                             "in-process and with workers, 200 M tokens, 5 runs; ~15+ min)")
    parser.add_argument("--quick", action="store_true",
                        help="~10 M tokens, 2 runs, fewer configurations (smoke test)")
    parser.add_argument("--configs", default=None, help="comma-separated subset of configs")
    parser.add_argument("--update", action="store_true",
                        help="merge the configs measured now into the existing results file "
                             "(same --tokens and --runs) instead of replacing it")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/shardflow-loader-bench"),
                        help="where the datasets are written (removed afterwards)")
    parser.add_argument("--s3", action="store_true",
                        help="the S3 comparison (S3_CONFIGS): Shardflow, litdata and MosaicML "
                             "streaming from the same S3 server, cold, beside the local runs; "
                             "--runs interleaved rounds, a fresh process per epoch; results in "
                             "loader_throughput_s3.json")
    parser.add_argument("--codecs", action="store_true",
                        help="only the shard codecs (CODEC_CONFIGS): the default loader over "
                             "zstd, lz4 and uncompressed shards beside litdata, local and from "
                             "S3 cold, 50 M tokens, 5 interleaved rounds; "
                             "loader_throughput_codecs.json")
    parser.add_argument("--workers-sweep", action="store_true",
                        help="only shardflow_local with 0, 2 and 4 DataLoader workers")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(run_child(args.child, json.loads(args.spec))), flush=True)
        return 0

    if args.workers_sweep:
        return workers_sweep(args)
    from loopback_s3 import start_servers

    # default: DEFAULT_CONFIGS, 50 M tokens, 5 interleaved rounds from process start (minutes)
    n_tokens, runs, configs, rounds = 50_000_000, 5, DEFAULT_CONFIGS, True
    if args.full or args.s3:
        n_tokens, runs, configs, rounds = 200_000_000, 5, CONFIGS, False
    if args.s3:
        runs, configs, rounds = 3, S3_CONFIGS, True
    if args.codecs:
        runs, configs = 5, CODEC_CONFIGS
    if args.quick:
        n_tokens, runs, configs = 10_000_000, 2, QUICK_CONFIGS
    n_tokens = int(args.tokens) if args.tokens else n_tokens
    runs = args.runs or runs
    if args.configs:
        configs = tuple(args.configs.split(","))
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"dataset: {n_tokens / 1e6:.0f} M tokens of Shakespeare (GPT-2 BPE), "
          f"samples of {WIDTH}, batch {BATCH} x {SEQ}, {runs} runs per config")
    t_start = time.perf_counter()
    compile_bytecode()
    (server,) = start_servers(1)
    try:
        spec = prepare(args.workdir, n_tokens, server, configs)
        spec["runs"] = runs
        spec["resume"] = args.full or args.s3 or args.quick
        results = {}
        if rounds:
            results = measure_rounds(configs, spec, runs)
        for config in () if rounds else configs:
            results[config] = measure(config, spec)
            r = results[config]
            if "error" not in r:
                print(f"  {config:20} {r['mtok_per_s']:8.1f} Mtok/s  "
                      f"{r['cpu_s_per_gtok']:8.1f} CPU-s/Gtok")
    finally:
        server.stop()
        shutil.rmtree(args.workdir / f"data-{n_tokens}", ignore_errors=True)
    name = ("loader_throughput_quick" if args.quick else "loader_throughput_s3" if args.s3
            else "loader_throughput_codecs" if args.codecs
            else "loader_throughput" if args.full else "loader_throughput_default")
    previous = RESULTS / f"{name}.json"
    if args.update and previous.exists():
        old = json.loads(previous.read_text())
        if (old["tokens"], old["runs"]) != (n_tokens, runs):
            raise SystemExit(f"{previous} has {old['tokens']} tokens x {old['runs']} runs")
        results = {**old["configs"], **results}
    zstd_bytes = spec["dataset_bytes"].get("shardflow_local")
    for config, size in spec["dataset_bytes"].items():
        if config in results and "error" not in results[config]:
            results[config]["dataset_bytes"] = size
            if zstd_bytes:
                results[config]["x_zstd_bytes"] = size / zstd_bytes
    summary = summarise(results)
    print()
    for config, size in spec["dataset_bytes"].items():
        print(f"  dataset {config:22} {size / 1e6:8.1f} MB")
    print_table(results, summary)
    out = {"tokens": n_tokens, "samples": spec["samples"], "shards": spec["shards"],
           "batch": BATCH, "seq_len": SEQ, "runs": runs, "backend": server.backend,
           "write_s": spec["write_s"], "dataset_bytes": spec["dataset_bytes"],
           "configs": results, "summary": summary,
           "wall_s": time.perf_counter() - t_start}
    path = write_results(name, out)
    plot(results, summary, RESULTS / f"{name}.png")
    print(f"results: {path} and {RESULTS / f'{name}.png'} ({out['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
