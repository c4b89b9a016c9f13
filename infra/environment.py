"""The environment variables read outside the config dataclasses: each one registered here
with its meaning and default, read through :func:`value`, and listed in the README's
"Configuration" section (``tests/infra/test_environment.py`` checks all three).

Every other setting is a field of a component's config dataclass, whose environment override
``SHARDFLOW_<COMPONENT>_<FIELD>`` comes with it (:mod:`infra.config`). A variable stays a
variable only where no configuration reaches the code that reads it: a Dask worker encoding a
batch, a DataLoader worker opening a dataset, any process that opens an S3 file; or where its
value is a secret that must never be a flag (a flag is visible in ``/proc/PID/cmdline``).

This module imports nothing but the standard library: it is read in those workers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, its default (what an unset or empty value
    means), what it does, and the module that reads it."""

    name: str
    default: str
    meaning: str
    read_by: str


def _registry(*variables: Variable) -> dict[str, Variable]:
    return {v.name: v for v in variables}


#: every ``SHARDFLOW_*`` variable read outside the config dataclasses
VARIABLES: dict[str, Variable] = _registry(
    Variable("SHARDFLOW_STORAGE_OPTIONS", "",
             "the default of every --storage-options flag: fsspec options as a JSON object or "
             "@FILE (may hold credentials: never printed)", "infra/config.py"),
    Variable("SHARDFLOW_S3_CLIENT", "auto",
             "the S3 read client: auto (obstore where the options allow it), s3fs or obstore; "
             "read wherever an S3 file is opened (loader workers, Dask workers)",
             "storage/io/clients.py"),
    Variable("SHARDFLOW_TOKENIZER_ENGINE", "auto",
             "hf: HF tokenizers encodes everything, never the checked fast BPE path; read by "
             "each Dask worker as it encodes", "pipeline/tasks/fast_bpe.py"),
    Variable("SHARDFLOW_CARD_PLOTS", "1",
             "0: the dataset card has no pictures (text only, and it says so)",
             "pipeline/output/card_plots.py"),
    Variable("SHARDFLOW_CARBON_SIGNAL_HEADER", "",
             "an HTTP header 'Name: value' sent with an https --carbon-signal request (an API "
             "key: a secret, so never a flag, never printed)", "infra/energy/signal.py"),
    Variable("SHARDFLOW_INDEX_DIR", "",
             "where loaders share a large dataset's row-group index as a memory-mapped file "
             "when no cache_dir is given (default: the temporary directory); read in every "
             "process that builds a loader's plan", "loaders/shared_index.py"),
    Variable("SHARDFLOW_S3_BACKEND", "auto",
             "the test suite's loopback S3 servers (its s3_* fixtures): auto (MinIO when on "
             "PATH, else SeaweedFS), minio or seaweedfs", "loopback_s3/pytest_plugin.py"),
)


def value(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The variable's value, or its registered default when unset or empty; a name that is
    not registered is a programming error (``KeyError``): register it first."""
    variable = VARIABLES[name]
    env = os.environ if environ is None else environ
    return env.get(name) or variable.default
