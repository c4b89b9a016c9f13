"""Per-replica settings from a config file (TOML or JSON).

Each replica usually lives on another server or zone with its own endpoint and credentials,
so options are given per replica. Secrets should stay out of the file: name an AWS profile
(``profile = "zone-b"``, resolved by botocore from ``~/.aws``) or use environment variables.

    write_quorum = 1
    [[replica]]
    url = "s3://train-a/datasets/shakespeare"
    profile = "zone-a"
    [[replica]]
    url = "s3://train-b/datasets/shakespeare"
    storage_options = { client_kwargs = { endpoint_url = "http://10.0.0.2:9000" } }
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from infra.user_files import OPTIONS_LIMIT, read_text


@dataclass(frozen=True)
class ReplicaConfig:
    urls: list[str]
    options: list[dict[str, Any] | None]
    write_quorum: int | None = None


def load_replica_config(path: str) -> ReplicaConfig:
    """The replicas a ``--replica-config`` file names: a regular file of at most
    :data:`infra.user_files.OPTIONS_LIMIT` bytes (a FIFO or device is refused unopened);
    every error is a ``ValueError`` naming the file."""
    text = read_text(path, "--replica-config", OPTIONS_LIMIT)
    try:
        data = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: cannot parse replica config: {exc}") from None
    except RecursionError:
        raise ValueError(f"{path}: cannot parse replica config: nested too deeply") from None
    entries = data.get("replica") or data.get("replicas") if isinstance(data, dict) else None
    if not entries:
        raise ValueError(f"{path}: no [[replica]] entries")
    if not isinstance(entries, list):
        raise ValueError(f"{path}: replica: expected a list of tables ([[replica]])")
    urls, options = [], []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "url" not in entry:
            raise ValueError(f"{path}: replica {i} has no url")
        if not isinstance(entry.get("storage_options", {}), dict):
            raise ValueError(f"{path}: replica {i}: storage_options must be a table")
        opts = dict(entry.get("storage_options", {}))
        if "profile" in entry:
            opts["profile"] = entry["profile"]
        if "endpoint_url" in entry:
            opts.setdefault("client_kwargs", {})["endpoint_url"] = entry["endpoint_url"]
        urls.append(str(entry["url"]))
        options.append(opts or None)
    quorum = data.get("write_quorum")
    if quorum is not None and (isinstance(quorum, bool) or not isinstance(quorum, int)
                               or not 1 <= quorum <= 2**31):
        raise ValueError(f"{path}: write_quorum must be a whole number of replicas (at least "
                         f"1), not {quorum!r}")
    return ReplicaConfig(urls, options, quorum)
