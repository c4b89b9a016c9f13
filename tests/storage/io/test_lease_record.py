"""A lease file is untrusted input (storage.io.lease_record): every field checked for type and
range, the file read with a bound and opened as what it must be (a regular file), and anything
else a clean "invalid lease" with a short reason. The property tests over any bytes and any
JSON are in test_lease_crafted.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from storage import resolve
from storage.format.layout import LEASE
from storage.io.lease import Holder, Lease
from storage.io.lease_record import (
    FORMAT,
    MAX_LEASE_BYTES,
    MAX_TTL_S,
    InvalidLeaseError,
    positive_seconds,
    read_lease,
)


def _fields(**changes: Any) -> dict[str, Any]:
    """A valid lease of a live writer on another host, with ``changes``."""
    now = time.time()
    d = {"host": "other-host", "pid": 4242, "run_id": "liverun", "started": now - 10,
         "expires": now + 60, "ttl_s": 60.0, "pidns": 1, "format": FORMAT}
    d.update(changes)
    return d


def _bytes(d: Any) -> bytes:
    return json.dumps(d, allow_nan=True).encode()


def test_a_valid_lease_parses_and_round_trips() -> None:
    holder = Holder.from_bytes(_bytes(_fields()))
    assert holder.host == "other-host" and holder.pid == 4242 and holder.run_id == "liverun"
    assert Holder.from_bytes(holder.to_bytes()) == holder
    assert not holder.implausible(time.time())


@pytest.mark.parametrize("changes, reason", [
    ({"expires": 1e18}, "its expiry 1e+18 is out of range"),
    ({"expires": float("nan")}, "it holds NaN"),
    ({"started": float("-inf")}, "it holds -Infinity"),
    ({"expires": "soon"}, "its expiry is 'soon', not a time"),
    ({"expires": True}, "its expiry is True, not a time"),
    ({"pid": 2**70}, "its pid is an integer of 71 bits, not a valid pid"),
    ({"pid": 0}, "its pid is 0, not a valid pid"),
    ({"pid": 12.5}, "its pid is 12.5, not a valid pid"),
    ({"pidns": -1}, "its pidns is -1, not a valid pidns"),
    ({"ttl_s": 0}, "its ttl_s 0 is no TTL"),
    ({"ttl_s": 1e9}, "its ttl_s 1000000000.0 is no TTL"),
    ({"host": ""}, "its host '' is no host name"),
    ({"host": "a\x1b[2Jb"}, "its host 'a\\x1b[2Jb' is no host name"),
    ({"host": "h" * 300}, "is no host name"),
    ({"run_id": "../../etc/x"}, "its run_id '../../etc/x' is no run id"),
    ({"run_id": 7}, "its run_id is 7, not a string"),
    ({"format": "shardflow.lease/9"}, "its format is 'shardflow.lease/9', not shardflow.lease/1"),
    ({"started": 2e9, "expires": 1e9}, "it expires before it started"),
    ({"extra": {"nested": 1}}, "it nests deeper than a lease's one JSON object"),
])
def test_each_bad_field_is_an_invalid_lease_naming_it(changes: dict[str, Any],
                                                       reason: str) -> None:
    with pytest.raises(InvalidLeaseError) as err:
        Holder.from_bytes(_bytes(_fields(**changes)))
    assert reason in str(err.value)
    assert str(err.value).isascii() and str(err.value).isprintable()


@pytest.mark.parametrize("data, reason", [
    (b"[" * 100_000 + b"]" * 100_000, f"it is larger than {MAX_LEASE_BYTES} bytes"),
    (b'{"a":' * 2000 + b"1" + b"}" * 2000, "it nests deeper than a lease's one JSON object"),
    (b"\xff\xfe{}", "it is not UTF-8 text"),
    (b"garbage", "it is not JSON"),
    (b"[1, 2]", "it is not a JSON object"),
    (b'{"host": "a", "host": "b"}', "it names 'host' twice"),
    (b'{"pid": ' + b"9" * 5000 + b"}", "it is not JSON"),
])
def test_bytes_that_are_no_lease_are_an_invalid_lease(data: bytes, reason: str) -> None:
    with pytest.raises(InvalidLeaseError, match=None) as err:
        Holder.from_bytes(data)
    assert reason in str(err.value)


def test_an_expiry_far_beyond_the_ttl_is_implausible() -> None:
    now = time.time()
    holder = Holder.from_bytes(_bytes(_fields(expires=now + 3600, ttl_s=60.0)))
    assert "more than its TTL of 60 s ahead" in holder.implausible(now)
    assert not Holder.from_bytes(_bytes(_fields(expires=now + 60))).implausible(now)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, 0, MAX_TTL_S * 2, "90",
                                   True])
def test_lease_numbers_must_be_finite_and_positive(value: Any) -> None:
    with pytest.raises(ValueError, match="--lease-ttl must be"):
        positive_seconds("--lease-ttl", value)
    assert positive_seconds("--lease-ttl", 90) == 90.0


def test_a_lease_with_a_nan_ttl_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    loc = resolve(str(tmp_path / "ds"))
    for ttl in (float("nan"), float("inf"), -5.0):
        with pytest.raises(ValueError, match="the lease TTL must be a finite number"):
            Lease(loc, ttl_s=ttl)
    assert not (tmp_path / "ds").exists()


def test_a_lease_file_is_read_with_a_bound(tmp_path: Path) -> None:
    """1 GiB (sparse) in the lease's place: read up to the bound, not whole."""
    ds = tmp_path / "ds"
    ds.mkdir()
    with open(ds / LEASE, "wb") as fh:
        fh.truncate(1 << 30)
    found = read_lease(resolve(str(ds)), LEASE)
    assert found.invalid == f"it is larger than {MAX_LEASE_BYTES} bytes"
    assert found.identity is not None and len(found.identity) == MAX_LEASE_BYTES + 1


@pytest.mark.parametrize("kind", ["folder", "fifo", "symlink to /dev/zero"])
def test_what_is_no_regular_file_is_an_invalid_lease_and_never_blocks(
        tmp_path: Path, kind: str) -> None:
    ds = tmp_path / "ds"
    ds.mkdir()
    path = ds / LEASE
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    t0 = time.monotonic()
    found = read_lease(resolve(str(ds)), LEASE)
    assert time.monotonic() - t0 < 5  # a pipe with no writer must not hang the reader
    assert found.invalid.endswith("not a lease file") and found.valid is None
    assert found.folder == (kind == "folder")
