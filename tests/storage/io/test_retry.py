"""Error classification: what it costs a process that never talks to an object store."""

from __future__ import annotations

import subprocess
import sys


def test_classifying_a_local_error_imports_no_object_store_client() -> None:
    """botocore and aiohttp cost ~0.17 s to import; an error from them implies they are loaded."""
    code = ("import sys; from storage.io.retry import classify; "
            "print(classify(FileNotFoundError('x')), classify(ConnectionResetError()), "
            "classify(TimeoutError()), 'botocore' in sys.modules, 'aiohttp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["permanent", "transient", "timeout", "False", "False"]


def test_object_store_errors_are_still_classified_once_their_client_is_loaded() -> None:
    import aiohttp
    import botocore.exceptions as boto

    from storage.io.retry import PERMANENT, THROTTLE, TIMEOUT, TRANSIENT, classify

    slow = boto.ClientError({"Error": {"Code": "SlowDown"},
                             "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetObject")
    missing = boto.ClientError({"Error": {"Code": "NoSuchKey"},
                                "ResponseMetadata": {"HTTPStatusCode": 404}}, "GetObject")
    assert classify(slow) == THROTTLE and classify(missing) == PERMANENT
    assert classify(boto.ReadTimeoutError(endpoint_url="http://s3")) == TIMEOUT
    assert classify(boto.ConnectionClosedError(endpoint_url="http://s3")) == TRANSIENT
    assert classify(aiohttp.ClientPayloadError("cut short")) == TRANSIENT
    wrapped = OSError("read failed")
    wrapped.__cause__ = boto.ConnectTimeoutError(endpoint_url="http://s3")
    assert classify(wrapped) == TIMEOUT
