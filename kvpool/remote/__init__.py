"""Remote put/get of memory objects: files, Redis/Valkey (one node or a cluster), Mooncake.

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
* :class:`RedisClusterStore` - a Redis or Valkey Cluster, keys routed by slot.
* :class:`MooncakeStore` - a Mooncake Store (``pip install 'kvpool[mooncake]'``).
* :class:`AsyncRedisStore`, :class:`AsyncRedisClusterStore`,
  :class:`AsyncMooncakeStore`, :class:`AsyncFileStore` - the same stores
  for asyncio code (:class:`AsyncRemoteStore`): coroutines, the same bytes
  path, cancellation that frees what a call allocated.
* :func:`open_store` / :func:`open_async_store` - a store from a string,
  for command lines.
* :class:`EntryInfo` - what an entry's header records.

Layout: the contract every store keeps is here (``base``: the blocking
:class:`RemoteStore` and its checks; ``aiobase``: the asyncio one;
``header``: the bytes an entry starts with; ``counters``: per-call
metrics); each engine is a folder below (``file/``, ``redis/``,
``cluster/`` on top of ``redis/``, ``mooncake/``).  A new store is a new
folder that subclasses :class:`RemoteStore` and is named in
:func:`open_store`.

Errors: :class:`~kvpool.errors.CorruptEntryError`,
:class:`~kvpool.errors.StoreConnectionError`,
:class:`~kvpool.errors.StoreTimeoutError`,
:class:`~kvpool.errors.ProtocolError` (all
:class:`~kvpool.errors.RemoteStoreError`), plus the usual
``InvalidArgumentError``, ``InvalidHandleError``, ``PoolClosedError``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from kvpool.checks import check_keywords, keywords_of, refuse_unknown_keywords_in
from kvpool.errors import (
    CorruptEntryError,
    ProtocolError,
    RemoteStoreError,
    StoreConnectionError,
    StoreTimeoutError,
)
from kvpool.remote.aiobase import AsyncRemoteStore
from kvpool.remote.base import MAX_KEY_BYTES, Key, RemoteStore
from kvpool.remote.cluster.aio import AsyncRedisClusterStore
from kvpool.remote.cluster.store import RedisClusterStore
from kvpool.remote.file.aio import AsyncFileStore
from kvpool.remote.file.store import FileStore
from kvpool.remote.header import EntryInfo
from kvpool.remote.mooncake.aio import AsyncMooncakeStore
from kvpool.remote.mooncake.store import MooncakeStore
from kvpool.remote.redis.aio import AsyncRedisStore
from kvpool.remote.redis.store import RedisStore
from kvpool.remote.urls import parse_spec

__all__ = [
    "MAX_KEY_BYTES",
    "AsyncFileStore",
    "AsyncMooncakeStore",
    "AsyncRedisClusterStore",
    "AsyncRedisStore",
    "AsyncRemoteStore",
    "CorruptEntryError",
    "EntryInfo",
    "FileStore",
    "Key",
    "MooncakeStore",
    "RedisClusterStore",
    "RedisStore",
    "RemoteStore",
    "RemoteStoreError",
    "StoreConnectionError",
    "StoreTimeoutError",
    "ProtocolError",
    "open_async_store",
    "open_store",
    "store_kind",
    "store_options",
]


def _parse(spec: object) -> tuple[str, str]:
    """``(kind, where)`` of a store spec, read by :func:`kvpool.remote.urls.parse_spec`.

    Raises:
        InvalidArgumentError: see :func:`open_store`.
    """
    parsed = parse_spec(spec)
    return parsed.kind, parsed.where


def _open(
    opener: Callable[..., Any],
    name: str,
    where: str,
    options: dict[str, Any],
    by: str = "open_store",
) -> Any:
    """``opener(where, **options)``, refusing options the store does not take.

    A Redis option given to a directory spec (``timeout=``) would otherwise
    escape as a bare ``TypeError``.
    """
    known = keywords_of(opener, skip=1)  # the first parameter is the spec itself
    if known is not None:
        check_keywords(f"{name} (opened by {by})", options, known)
    return opener(where, **options)


def open_store(spec: str | os.PathLike[str], **options: Any) -> RemoteStore:
    """Open a store described by a string (the form a command line takes).

    Args:
        spec: one of

            * a directory path (``/dev/shm/kv``, ``./cache``) or
              ``file:///abs/path`` -> :class:`FileStore`;
            * ``redis://[user:password@]host[:port][/db]``, ``rediss://...``
              (TLS) or ``unix:///path/to/socket`` -> :class:`RedisStore`;
              ``valkey://`` and ``valkeys://`` are accepted as synonyms;
            * ``redis-cluster://[user:password@]h1:p1,h2:p2,...[?options]``
              (``rediss-cluster://`` for TLS; ``valkey-cluster://``) ->
              :class:`RedisClusterStore`;
            * ``mooncake://MASTER:PORT?metadata=URL&protocol=tcp`` ->
              :class:`MooncakeStore` (see :meth:`MooncakeStore.from_url`).
        **options: keyword arguments for the store's constructor (e.g.
            ``checksum=True``, ``io_threads=2``, ``timeout=1.0``).

    Returns:
        The open store (close it, or use it in a ``with`` block).

    A spec is read exactly (:mod:`kvpool.remote.urls`): an unknown scheme, a URL
    written without ``://`` (``redis//h:p``, ``redis:h``) or a bare ``host:port``
    is refused naming the spec meant, never taken as a directory; a Redis
    database must be a number.  A directory store creates its directory when
    the parent exists (``make_parents=True`` creates missing parents too).

    Raises:
        InvalidArgumentError: an empty spec, an unknown scheme, a URL or
            address without ``://``, a ``file:`` URL with a host, a Redis
            database that is not a number, or a directory whose parent is
            missing (without ``make_parents=True``).
        ArgumentTypeError: an option the chosen store does not take.
        FeatureUnavailableError: a Redis spec without the ``redis`` client,
            a Mooncake spec without Mooncake's client.
        StoreConnectionError: the server, cluster or master cannot be reached.
    """
    kind, where = _parse(spec)
    if kind == "file":
        return _open(FileStore, "FileStore", where, options)  # type: ignore[no-any-return]
    if kind == "redis-cluster":
        return _open(RedisClusterStore, "RedisClusterStore", where, options)  # type: ignore[no-any-return]
    if kind == "mooncake":
        return _open(MooncakeStore.from_url, "MooncakeStore", where, options)  # type: ignore[no-any-return]
    return _open(RedisStore, "RedisStore", where, options)  # type: ignore[no-any-return]


def open_async_store(spec: str | os.PathLike[str], **options: Any) -> AsyncRemoteStore:
    """:func:`open_store` for asyncio code: the asyncio store of the same spec.

    Args:
        spec: as for :func:`open_store`:

            * a directory or ``file:///abs/path`` -> :class:`AsyncFileStore`
              (``threads=`` besides FileStore's options);
            * ``redis://...``, ``rediss://...``, ``unix:///...``,
              ``valkey://...`` -> :class:`AsyncRedisStore`;
            * ``redis-cluster://[user:password@]h1:p1,h2:p2[?options]``
              (``rediss-cluster://``, ``valkey-cluster://``) ->
              :class:`AsyncRedisClusterStore`;
            * ``mooncake://MASTER:PORT?metadata=URL&protocol=tcp&...`` ->
              :class:`AsyncMooncakeStore` (the query takes MooncakeStore's
              options, e.g. ``headerless=1``; ``threads=`` besides).
        **options: keyword arguments for the store's constructor, as the
            blocking store of that spec takes them.

    Nothing is connected until the first call for the file and Redis
    stores (``await store.ping()`` checks a server or cluster); a Mooncake
    store sets up its client here (the master must answer), as
    :class:`MooncakeStore` does.

    Raises:
        InvalidArgumentError: as :func:`open_store`.
        ArgumentTypeError: an option the chosen store does not take.
        FeatureUnavailableError: the client of the chosen store is missing.
        StoreConnectionError: (``mooncake://`` only) the master cannot be reached.
    """
    kind, where = _parse(spec)
    by = "open_async_store"
    if kind == "file":
        return _open(AsyncFileStore, "AsyncFileStore", where, options, by)  # type: ignore[no-any-return]
    if kind == "redis-cluster":
        return _open(AsyncRedisClusterStore, "AsyncRedisClusterStore", where, options, by)  # type: ignore[no-any-return]
    if kind == "mooncake":
        return _open(AsyncMooncakeStore.from_url, "AsyncMooncakeStore", where, options, by)  # type: ignore[no-any-return]
    return _open(AsyncRedisStore, "AsyncRedisStore", where, options, by)  # type: ignore[no-any-return]


def store_kind(spec: str | os.PathLike[str]) -> str:
    """Which store :func:`open_store` opens for ``spec``.

    Returns:
        ``"file"``, ``"redis"``, ``"redis-cluster"`` or ``"mooncake"``.

    Raises:
        InvalidArgumentError: as :func:`open_store` for a bad spec.
    """
    return _parse(spec)[0]


def store_options(spec: str | os.PathLike[str], asyncio: bool = True) -> frozenset[str]:
    """The option names the store of ``spec`` takes (what :func:`open_async_store` accepts).

    For settings read from an engine's configuration, to tell a store
    option from a misspelt one before anything is opened.

    Args:
        spec: a store spec, as :func:`open_store` takes.
        asyncio: the options of the asyncio store (True) or the blocking one.

    Returns:
        The keyword names (empty when the store's signature cannot be read).

    Raises:
        InvalidArgumentError: as :func:`open_store` for a bad spec.
    """
    kind, _ = _parse(spec)
    openers: dict[str, Callable[..., Any]] = {
        "file": AsyncFileStore if asyncio else FileStore,
        "redis": AsyncRedisStore if asyncio else RedisStore,
        "redis-cluster": AsyncRedisClusterStore if asyncio else RedisClusterStore,
        "mooncake": AsyncMooncakeStore.from_url if asyncio else MooncakeStore.from_url,
    }
    return keywords_of(openers[kind], skip=1) or frozenset()


# Every public call refuses a misspelt keyword naming the closest known one
# (kvpool.checks.refuse_unknown_keywords; the stores get it as subclasses).
refuse_unknown_keywords_in(globals(), __all__)
