"""kvpool's exception hierarchy.

Every exception kvpool raises on purpose derives from :class:`KVPoolError`
*and* from the builtin that an ordinary ``except`` clause would expect
(``ValueError`` for bad input, ``MemoryError`` when memory runs out,
``OSError`` when the operating system or a driver refuses), so callers
that never heard of kvpool still catch them.  Messages name the offending
value, the limit it broke and, where there is one, the fix.
"""

from __future__ import annotations

__all__ = [
    "AddressSpaceExhaustedError",
    "ArgumentTypeError",
    "InheritedAcrossForkError",
    "MemlockLimitError",
    "MemoryLimitError",
    "ViewsOutliveHandleError",
    "BatchSizeError",
    "CorruptEntryError",
    "DeviceNotFoundError",
    "FeatureUnavailableError",
    "GroupIndexError",
    "HugePagesExhaustedError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "LeakedHandleError",
    "LeakedHandleWarning",
    "KVPoolError",
    "NativeError",
    "NumaNodeError",
    "OutOfMemoryError",
    "PoolClosedError",
    "RefCountError",
    "ProtocolError",
    "RemoteStoreError",
    "RequestTooLargeError",
    "SharedMemoryExistsError",
    "SharedMemoryNotFoundError",
    "StoreConnectionError",
    "StoreTimeoutError",
]


class KVPoolError(Exception):
    """Base class of every error kvpool raises deliberately."""


class InvalidArgumentError(KVPoolError, ValueError):
    """An argument is out of range, of the wrong type or inconsistent."""


class ArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument has the wrong type, or a keyword is unknown (also a ``TypeError``)."""


class GroupIndexError(InvalidArgumentError, IndexError):
    """A group index names no group of a memory object (also an ``IndexError``)."""


class BatchSizeError(InvalidArgumentError, RuntimeError):
    """A batch size that is not an int >= 0.

    Also a ``RuntimeError``, which is what LMCache's address manager raises
    for a negative batch size (its callers catch that).
    """


class InvalidHandleError(KVPoolError, ValueError):
    """A handle (memory object, pointer, region) is freed, stale or unknown.

    Raised for double frees, frees of ranges that are not allocated, and
    any use of a memory object after its memory went back to the pool.
    """


class PoolClosedError(InvalidHandleError):
    """The pool or region was closed; its objects are no longer usable."""


class InheritedAcrossForkError(PoolClosedError):
    """A pool or object was inherited by a forked child, which may not use it.

    The parent's memory is not the child's (pinned mappings are not even
    inherited); a child attaches a shared-memory pool by name instead.
    """


class ViewsOutliveHandleError(InvalidHandleError):
    """A handle was freed while views of its bytes were alive (strict mode only).

    The bytes are not reused until the last view is gone; outside strict
    mode such a free is safe: it is counted (``PoolStats.freed_under_views``)
    and logged at DEBUG only.
    """


class LeakedHandleWarning(UserWarning):
    """A live memory object was garbage-collected; the pool reclaimed its memory."""


class RefCountError(KVPoolError, RuntimeError, ValueError):
    """A ref or pin count went below zero (raised only in strict mode).

    Outside strict mode the same event is logged as a warning and ignored;
    in neither mode is any memory freed twice.
    """


class LeakedHandleError(RefCountError):
    """Strict mode: objects were garbage-collected without ``ref_count_down``.

    Raised by the pool's next ``stats()``, ``memcheck()`` or ``close()``,
    naming the objects (a finalizer cannot raise).
    """


class OutOfMemoryError(KVPoolError, MemoryError):
    """The system could not provide the memory asked for."""


class MemoryLimitError(OutOfMemoryError):
    """The memory would exceed an effective limit (cgroup, RAM or memlock).

    Raised before populating, so that the kernel's OOM killer never acts
    first; the message names the limit, where it comes from and the fix.
    """


class RequestTooLargeError(InvalidArgumentError, MemoryError):
    """A request is larger than the whole pool, so it can never be served.

    Raised in strict mode only: otherwise the pool returns None as when it
    is full (the reference's behaviour) and says so once, as a warning.
    Also a ``MemoryError``, because that is what a caller of a full pool
    expects.
    """


class AddressSpaceExhaustedError(KVPoolError, RuntimeError, MemoryError):
    """An AddressManager has no free range large enough.

    A ``RuntimeError`` as in the reference API, and a ``MemoryError``
    because that is what it means.
    """


class HugePagesExhaustedError(OutOfMemoryError):
    """The 2 MiB hugepage pool has fewer free pages than a mapping needs."""


class NumaNodeError(InvalidArgumentError):
    """A NUMA node that does not exist on this machine was named."""


class SharedMemoryExistsError(KVPoolError, FileExistsError):
    """A POSIX shared-memory segment of that name already exists."""


class SharedMemoryNotFoundError(KVPoolError, FileNotFoundError):
    """No POSIX shared-memory segment of that name exists."""


class DeviceNotFoundError(KVPoolError, FileNotFoundError):
    """A device or file named by its path (a Device-DAX device...) does not exist."""


class FeatureUnavailableError(KVPoolError, OSError):
    """A feature this machine lacks (CUDA, hugepages, NUMA...) was required."""


class MemlockLimitError(MemoryLimitError, FeatureUnavailableError):
    """Locking (pin="mlock") would exceed RLIMIT_MEMLOCK.

    Also a :class:`FeatureUnavailableError` (an ``OSError``), what a refused
    mlock raised before the limit was checked in advance.
    """


class NativeError(KVPoolError, OSError):
    """The operating system or a driver refused a request."""


# -- remote stores (kvpool.remote) -------------------------------------


class RemoteStoreError(KVPoolError, OSError):
    """A remote or file store failed or refused a request.

    The base of the store errors below; also raised as is for a refusal
    that has no more specific class (e.g. the server's out-of-memory reply).
    """


class CorruptEntryError(RemoteStoreError):
    """A stored entry is truncated, corrupted or was not written by kvpool.

    Raised by ``get`` after the destination object was freed: a damaged
    entry is never returned, not even in part.
    """


class StoreConnectionError(RemoteStoreError, ConnectionError):
    """The connection to a store server could not be made or was lost."""


class StoreTimeoutError(RemoteStoreError, TimeoutError):
    """A store server did not answer within the configured timeout."""


class ProtocolError(RemoteStoreError):
    """A server's answer broke the store's protocol; the connection was dropped.

    Raised when what answers on a Redis URL's host and port is not a Redis
    server (the message quotes its first line: an HTTP server answers
    ``HTTP/1.1 400 Bad Request``), and when a Redis server's reply is
    malformed, over a limit, or not the one the command was due.
    """
