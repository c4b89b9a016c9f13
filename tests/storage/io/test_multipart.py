"""Unfinished multipart uploads on a real S3 server: listed under the dataset (only there),
aborted, and aborted right after a write that its deadline cancelled."""

from __future__ import annotations

import time
from typing import Any

from storage import ReplicaSet
from storage.io import multipart
from storage.io.urls import Location


def _begin(loc: Location, relative: str, part: bytes = b"p" * 1024) -> str:
    """An upload of ``relative`` with one part sent, never completed (what a cancelled or
    killed writer leaves); its id."""
    fs = multipart.s3_filesystem(loc)
    bucket, key, _ = fs.split_path(loc.path(relative))
    upload = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"]
    fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=part)
    return upload


def test_open_uploads_are_those_under_the_dataset(s3_bucket: Any) -> None:
    opts = s3_bucket.storage_options
    loc = ReplicaSet.from_urls([f"{s3_bucket.url}/data/ds"], opts).primary
    beside = ReplicaSet.from_urls([f"{s3_bucket.url}/data/ds2"], opts).primary
    before = time.time()
    mine = {_begin(loc, "_index/idx-1.sfidx"), _begin(loc, "shards/a.parquet")}
    other = _begin(beside, "_index/idx-2.sfidx")  # "ds2" starts with "ds": not ours
    listed = multipart.open_uploads(loc)
    assert {u.upload_id for u in listed} == mine
    assert {u.relative for u in listed} == {"_index/idx-1.sfidx", "shards/a.parquet"}
    assert all(before - 60 < u.initiated < time.time() + 60 for u in listed)
    for upload in listed:
        multipart.abort(loc, upload)
    multipart.abort(loc, listed[0])  # already gone: no error
    assert multipart.open_uploads(loc) == []
    assert [u.upload_id for u in multipart.open_uploads(beside)] == [other]


def test_a_cancelled_writes_upload_is_aborted_by_key(s3_bucket: Any) -> None:
    loc = ReplicaSet.from_urls([f"{s3_bucket.url}/ds"], s3_bucket.storage_options).primary
    fs = multipart.s3_filesystem(loc)
    _begin(loc, "_index/a.sfidx")
    _begin(loc, "_index/a.sfidx")  # a retried put's second upload of the same key
    kept = _begin(loc, "_index/a.sfidx.more")
    assert multipart.abort_uploads_of(fs, loc.path("_index/a.sfidx"), 5.0) == 2
    assert [u.upload_id for u in multipart.open_uploads(loc)] == [kept]


def test_a_local_store_has_no_uploads(tmp_path) -> None:
    loc = ReplicaSet.from_urls([str(tmp_path / "ds")]).primary
    assert multipart.s3_filesystem(loc) is None and multipart.open_uploads(loc) == []


def test_a_put_cancelled_by_its_deadline_leaves_no_upload(s3_bucket: Any, tmp_path) -> None:
    """A 200 MB file in 5 MB parts cannot reach a loopback server in 1 s here: the write
    deadline cancels it mid-upload (s3fs's own abort skipped) and the writer aborts it."""
    from storage.io.replicas.writes import _WriteDeadline

    loc = ReplicaSet.from_urls([f"{s3_bucket.url}/ds"], s3_bucket.storage_options).primary
    fs = multipart.s3_filesystem(loc)
    big = tmp_path / "index.sfidx"
    with open(big, "wb") as fh:
        fh.truncate(200 << 20)
    t0 = time.monotonic()
    try:
        _WriteDeadline(fs, 1.0).put_file(str(big), loc.path("_index/big.sfidx"),
                                         chunksize=5 << 20, max_concurrency=1)
    except TimeoutError as exc:
        assert "not done in 1.0 s (cancelled)" in str(exc)
    else:
        raise AssertionError("the 200 MB put finished within its 1 s deadline")
    assert time.monotonic() - t0 < 1.0 + 2 * 1.0 + 1.0  # the deadline, the abort's requests
    assert multipart.open_uploads(loc) == []
