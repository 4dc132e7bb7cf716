"""Mooncake Store's status codes: their names and the kvpool error for each.

The Python client of Mooncake (``mooncake.store.MooncakeDistributedStore``)
answers with ``int`` codes: ``>= 0`` is success (a byte count for the
reads), a negative value is one of the ``ErrorCode`` enumerators of
Mooncake's ``types.h``.  This module names the ones kvpool meets and turns
them into kvpool's errors; what a code means for one operation (a missing
key is ``None`` for ``get``, ``False`` for ``exists``) is decided by the
store, not here.
"""

from __future__ import annotations

import time

from kvpool.errors import RemoteStoreError, StoreConnectionError, StoreTimeoutError

__all__ = [
    "ALREADY_EXISTS",
    "BUFFER_TOO_SMALL",
    "Backoff",
    "Busy",
    "HAS_LEASE",
    "LEASE_EXPIRED",
    "NOT_FOUND",
    "NOT_READY",
    "TRANSFER_FAIL",
    "RETRYABLE",
    "code_name",
    "error_for",
]

#: ``INVALID_PARAMS``: among others, a destination smaller than the object.
BUFFER_TOO_SMALL = -600
#: ``REPLICA_IS_NOT_READY``: the entry is being written (e.g. an upsert runs).
NOT_READY = -703
#: ``OBJECT_NOT_FOUND``.
NOT_FOUND = -704
#: ``OBJECT_ALREADY_EXISTS``: the key exists (a put of an existing key answers 0 here).
ALREADY_EXISTS = -705
#: ``OBJECT_HAS_LEASE``: a reader's lease blocks a remove (the master's
#: ``--default_kv_lease_ttl``, 10 s by default, after every read).
HAS_LEASE = -706
#: ``LEASE_EXPIRED``: the lease a read took ran out before its transfer
#: ended, so the bytes may have changed under it; a new read takes a new lease.
LEASE_EXPIRED = -707
#: ``TRANSFER_FAIL``: the bytes could not be moved (also: the sizes given
#: to a multi-buffer read do not add up to the object's size).
TRANSFER_FAIL = -800
#: ``RPC_FAIL``: the master did not answer.
RPC_FAIL = -900

#: Codes that go away by themselves: retried until the store's timeout.
RETRYABLE = frozenset({NOT_READY, HAS_LEASE, LEASE_EXPIRED})

_NAMES = {
    -1: "INTERNAL_ERROR",
    -10: "BUFFER_OVERFLOW",
    -100: "SHARD_INDEX_OUT_OF_RANGE",
    -101: "SEGMENT_NOT_FOUND",
    -102: "SEGMENT_ALREADY_EXISTS",
    -103: "CLIENT_NOT_FOUND",
    -200: "NO_AVAILABLE_HANDLE",
    -300: "INVALID_VERSION",
    -400: "INVALID_KEY",
    -500: "WRITE_FAIL",
    -600: "INVALID_PARAMS",
    -601: "ILLEGAL_CLIENT",
    -700: "INVALID_WRITE",
    -701: "INVALID_READ",
    -702: "INVALID_REPLICA",
    -703: "REPLICA_IS_NOT_READY",
    -704: "OBJECT_NOT_FOUND",
    -705: "OBJECT_ALREADY_EXISTS",
    -706: "OBJECT_HAS_LEASE",
    -707: "LEASE_EXPIRED",
    -800: "TRANSFER_FAIL",
    -900: "RPC_FAIL",
    -1010: "UNAVAILABLE_IN_CURRENT_STATUS",
}

# Codes that mean the master or a storage node cannot be reached.
_CONNECTION = frozenset({-101, -103, TRANSFER_FAIL, RPC_FAIL, -1010})

_HINTS = {
    -200: "the store has no free space in its segments; add segments (mooncake_client "
    "--global_segment_size) or delete entries",
    -600: "Mooncake refused the arguments",
    HAS_LEASE: "a reader holds a lease on it; the master's --default_kv_lease_ttl "
    "(milliseconds, 10000 by default) bounds how long",
    LEASE_EXPIRED: "the read's lease ran out before its transfer ended (a slow transfer, or "
    "a short --default_kv_lease_ttl on the master); each retry takes a new lease",
    NOT_READY: "it is being written by another client",
    RPC_FAIL: "the master does not answer",
    TRANSFER_FAIL: "the storage node holding it could not be reached",
}


def code_name(code: int) -> str:
    """The enumerator name of a Mooncake status code (``"code -N"`` if unknown)."""
    return _NAMES.get(code, f"code {code}")


def error_for(code: int, where: str) -> RemoteStoreError:
    """The kvpool error for a failed Mooncake call.

    Args:
        code: the negative status the client returned.
        where: names the operation and the key, e.g. ``"put b'k' on m:50051"``.

    Returns:
        :class:`StoreTimeoutError` for a code still standing after the
        retries (lease held or expired, not ready), :class:`StoreConnectionError` for an
        unreachable master or storage node, else :class:`RemoteStoreError`;
        the message carries the code, its name and a hint.  The code is
        also the error's ``mooncake_code`` attribute.
    """
    hint = _HINTS.get(code)
    text = f"{where}: Mooncake answered {code} ({code_name(code)})" + (f": {hint}" if hint else "")
    if code in RETRYABLE:
        exc: RemoteStoreError = StoreTimeoutError(text + "; it did not clear within the timeout")
    elif code in _CONNECTION:
        exc = StoreConnectionError(text)
    else:
        exc = RemoteStoreError(text)
    exc.mooncake_code = code  # type: ignore[attr-defined]
    return exc


class Busy(Exception):
    """A retryable code (lease, not ready) met inside a multi-step read; the caller retries."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Backoff:
    """Waits between retries of a code that clears by itself, until a deadline.

    ``wait()`` sleeps 1 ms, then twice as long each time (at most 50 ms),
    and returns False instead once the next sleep would end past
    ``timeout`` seconds after the Backoff was made.
    """

    __slots__ = ("deadline", "delay")

    def __init__(self, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.delay = 0.001

    def wait(self) -> bool:
        """Sleep before the next try; False (without sleeping) when time is up."""
        if time.monotonic() + self.delay > self.deadline:
            return False
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, 0.05)
        return True
