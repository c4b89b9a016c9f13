"""What a replica set raises, and the one-line form of an error that reports and health
states show."""

from __future__ import annotations


class ReplicaError(IOError):
    """Every replica failed for one object; the message names each replica and its error."""


class QuorumError(IOError):
    """A write reached fewer replicas than the write quorum."""


class ChecksumMismatchError(IOError):
    """A replica returned bytes whose checksum is not the one in the manifest."""


class ReplicaStalledError(TimeoutError):
    """A replica did not answer a read before another replica, asked later, did (a hedge won)."""


class InvalidObjectError(Exception):
    """Raised by a ``fetch`` when the replica answered but its copy of the object is unusable
    (an invalid manifest): like a missing object, the object's problem and not the replica's,
    so the read moves on without marking the replica unhealthy. ``error`` is re-raised when
    no replica has a usable copy."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error




def short_error(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]

