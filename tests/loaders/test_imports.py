"""``import loaders`` loads what a data loop needs and nothing else: no DCP (its Stateful is a
protocol the loader matches by shape), no S3 client until a URL needs one, no Dask, no fsspec
(``storage.io.local.files.LocalFiles`` reads a local dataset; obstore an S3 one) and none of
storage's admin tools (``storage/__init__.py`` loads its names on first use)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from storage import resolve

REPO = Path(__file__).resolve().parents[2]
NOT_AT_IMPORT = ("torch.distributed.checkpoint", "s3fs", "obstore", "botocore", "aiobotocore",
                 "dask", "distributed", "pipeline", "cyclopts", "fsspec", "storage.admin",
                 "infra.config")
#: not even after a whole epoch, local or from S3 through obstore
NOT_IN_A_DATA_LOOP = ("torch.distributed.checkpoint", "s3fs", "botocore", "aiobotocore",
                      "dask", "pipeline", "fsspec", "storage.admin", "numpy.ma")


def _run(code: str, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _loaded(names: tuple[str, ...]) -> str:
    """Code that fails naming any of ``names`` (or a submodule of one) that is loaded."""
    return (f"names = {names!r}\n"
            "bad = sorted(m for m in sys.modules\n"
            "             if m in names or m.startswith(tuple(n + '.' for n in names)))\n"
            "assert not bad, bad\n")


def test_import_loaders_loads_no_checkpointing_no_s3_client() -> None:
    _run("import sys, loaders\n"
         "from loaders import build_dataloader, TokenDataset\n" + _loaded(NOT_AT_IMPORT))


def _epoch_code(url: str) -> str:
    return ("import json, os, sys\n"
            "from loaders import build_dataloader\n"
            "opts = json.loads(os.environ['SF_TEST_OPTIONS'] or 'null')\n"
            f"loader = build_dataloader({url!r}, 2, 64, storage_options=opts, seed=3)\n"
            "n = sum(len(b['input_ids']) for b in loader)\n"
            "assert n == len(loader) * 2 > 0, n\n" + _loaded(NOT_IN_A_DATA_LOOP))


def test_an_epoch_of_a_local_dataset_loads_no_fsspec(tiny_dataset: str) -> None:
    _run(_epoch_code(tiny_dataset), {"SF_TEST_OPTIONS": ""})


def test_an_epoch_from_s3_through_obstore_loads_no_fsspec(
        tiny_dataset: str, s3_bucket) -> None:  # type: ignore[no-untyped-def]
    url = f"{s3_bucket.url}/imports"
    loc = resolve(url, s3_bucket.storage_options)
    files = sorted(p for p in Path(tiny_dataset).rglob("*") if p.is_file())
    for path in sorted(files, key=lambda p: p.name == "manifest.json"):  # manifest last
        loc.fs.pipe_file(loc.path(path.relative_to(tiny_dataset).as_posix()), path.read_bytes())
    # the options (credentials) travel in the environment, not on a command line
    _run(_epoch_code(url), {"SF_TEST_OPTIONS": json.dumps(s3_bucket.storage_options),
                            "SHARDFLOW_S3_CLIENT": "obstore"})


def test_the_loader_is_still_a_dcp_stateful() -> None:
    from torch.distributed.checkpoint.stateful import Stateful

    from loaders.dataloader import ShardflowLoader

    assert issubclass(ShardflowLoader, Stateful)
