"""Remote put/get of memory objects: files and Redis/Valkey.

::

    from kvpool.remote import open_store

    with open_store("/dev/shm/kvcache") as store:     # or "redis://host:6379/0"
        store.put("chunk-0", obj)                     # no copy of obj's bytes
        back = store.get("chunk-0", pool, shapes, dtypes, fmt)   # one copy
        ...
        back.ref_count_down()

* :class:`RemoteStore` - the interface: ``put``, ``get``, ``exists``,
  ``delete``, ``head``, their batched forms, ``close`` and ``with``.
* :class:`FileStore` - one file per entry, written atomically (embedded
  default; on ``/dev/shm`` it lives in memory).
* :class:`RedisStore` - Redis or Valkey through the ``redis`` client
  (``pip install 'kvpool[redis]'``).
* :class:`AsyncRedisStore`, :class:`AsyncFileStore` - the same stores for
  asyncio code (:class:`AsyncRemoteStore`): coroutines, the same bytes
  path, cancellation that frees what a call allocated.
* :func:`open_store` / :func:`open_async_store` - a store from a string,
  for command lines.
* :class:`EntryInfo` - what an entry's header records.

Errors: :class:`~kvpool.errors.CorruptEntryError`,
:class:`~kvpool.errors.StoreConnectionError`,
:class:`~kvpool.errors.StoreTimeoutError` (all
:class:`~kvpool.errors.RemoteStoreError`), plus the usual
``InvalidArgumentError``, ``InvalidHandleError``, ``PoolClosedError``.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit

from kvpool.errors import (
    CorruptEntryError,
    InvalidArgumentError,
    RemoteStoreError,
    StoreConnectionError,
    StoreTimeoutError,
)
from kvpool.remote.aiobase import AsyncRemoteStore
from kvpool.remote.aiofile import AsyncFileStore
from kvpool.remote.aioredis import AsyncRedisStore
from kvpool.remote.base import MAX_KEY_BYTES, Key, RemoteStore
from kvpool.remote.filestore import FileStore
from kvpool.remote.header import EntryInfo
from kvpool.remote.redisconfig import redact_url
from kvpool.remote.redisstore import RedisStore

__all__ = [
    "MAX_KEY_BYTES",
    "AsyncFileStore",
    "AsyncRedisStore",
    "AsyncRemoteStore",
    "CorruptEntryError",
    "EntryInfo",
    "FileStore",
    "Key",
    "RedisStore",
    "RemoteStore",
    "RemoteStoreError",
    "StoreConnectionError",
    "StoreTimeoutError",
    "open_async_store",
    "open_store",
]


def _parse(spec: object) -> tuple[str, str]:
    """``("file", path)`` or ``("redis", url)`` for a store spec.

    Raises:
        InvalidArgumentError: see :func:`open_store`.
    """
    try:
        text = os.fspath(spec)  # type: ignore[call-overload]
    except TypeError:
        raise InvalidArgumentError(f"a store spec must be a str, got {spec!r}") from None
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgumentError(f"a store spec must be a non-empty str, got {spec!r}")
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if scheme == "":
        return "file", text
    if scheme == "file":
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise InvalidArgumentError(
                f"file URL {text!r} names host {parts.netloc!r}; use file:///absolute/path"
            )
        path = unquote(parts.path)
        if not path:
            raise InvalidArgumentError(f"file URL {text!r} has no path")
        return "file", path
    if scheme in ("redis", "rediss", "unix", "valkey", "valkeys"):
        url = text
        if scheme.startswith("valkey"):
            url = "redis" + text[len("valkey") :]
        return "redis", url
    raise InvalidArgumentError(
        f"unknown store spec {redact_url(text)!r}: use a directory, file:///path, "
        "redis://host:port/db, rediss://..., or unix:///socket"
    )


def open_store(spec: str | os.PathLike[str], **options: Any) -> RemoteStore:
    """Open a store described by a string (the form a command line takes).

    Args:
        spec: one of

            * a directory path (``/dev/shm/kv``, ``./cache``) or
              ``file:///abs/path`` -> :class:`FileStore`;
            * ``redis://[user:password@]host[:port][/db]``, ``rediss://...``
              (TLS) or ``unix:///path/to/socket`` -> :class:`RedisStore`;
              ``valkey://`` and ``valkeys://`` are accepted as synonyms.
        **options: keyword arguments for the store's constructor (e.g.
            ``checksum=True``, ``io_threads=2``, ``timeout=1.0``).

    Returns:
        The open store (close it, or use it in a ``with`` block).

    Raises:
        InvalidArgumentError: an empty spec, an unknown scheme, or a
            ``file:`` URL with a host.
        FeatureUnavailableError: a Redis spec without the ``redis`` client.
        StoreConnectionError: the Redis server cannot be reached.
    """
    kind, where = _parse(spec)
    if kind == "file":
        return FileStore(where, **options)
    return RedisStore(where, **options)


def open_async_store(spec: str | os.PathLike[str], **options: Any) -> AsyncRemoteStore:
    """:func:`open_store` for asyncio code: an :class:`AsyncFileStore` or :class:`AsyncRedisStore`.

    Nothing is connected until the first call (``await store.ping()``
    checks a Redis server).

    Raises:
        As :func:`open_store` (without the connection errors).
    """
    kind, where = _parse(spec)
    if kind == "file":
        return AsyncFileStore(where, **options)
    return AsyncRedisStore(where, **options)
