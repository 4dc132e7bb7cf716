"""RedisStore: entries in one Redis or Valkey server.

The entry format and the commands are those of :mod:`kvpool.remote.redis.wire`
(one string key per entry: ``SET`` of header + bytes, ``GET`` read straight
into the destination); the connections are kvpool's own
(:mod:`kvpool.remote.redis.connection`), opened by
:mod:`kvpool.remote.redis.opener` within the call's deadline (socket, TLS,
``AUTH``/``CLIENT SETNAME``/``SELECT``) from the options the ``redis``
client reads in a URL or a client, so they mean what they mean there.

How the bytes move:

* ``put`` sends ``SET key <header><bytes>`` with one ``sendmsg``: the
  object's memory goes to the kernel as a memoryview, never copied in
  Python.  Zero copies.
* ``get`` sends ``GET key``, checks the header as soon as it arrives, then
  allocates the object and receives the bytes with ``recv_into`` straight
  into it (only bytes that arrived together with the header, at most
  8 KiB, pass through a small buffer).  One copy, the kernel's.
* The batched forms keep a bounded *window* of commands in flight on one
  connection: about :data:`~kvpool.remote.redis.common.WINDOW_BYTES` of
  values (one 512 KiB entry, 64 entries of 8 KiB; or ``window`` commands
  when given) and :data:`SMALL_WINDOW` ``EXISTS``/``DEL`` commands, chosen
  by measurement (``kvpool bench --only remote_put_get``): deeper
  pipelines of large values run slower than a loop of single calls.

Hostile servers: every call has a deadline (``timeout`` bounds the whole
call, connecting included, however slowly the bytes arrive); every length
is checked before anything is allocated; replies are parsed without
recursion; a reply that is not what the command asked for (including
another key's entry, detected by its key tag, or a duplicated frame,
detected by an end-of-call marker) fails the call; and a connection is
reused only when its call ended cleanly and nothing unread waits on it.

Errors: a timeout raises :class:`~kvpool.errors.StoreTimeoutError`, a
refused or lost connection :class:`~kvpool.errors.StoreConnectionError`,
an entry that is damaged, foreign, of the old hash format or another
key's :class:`~kvpool.errors.CorruptEntryError`, a reply that breaks the
protocol or a server refusal :class:`~kvpool.errors.RemoteStoreError`.
Nothing is retried; the next call opens a new connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from kvpool.checks import check_bool
from kvpool.errors import StoreTimeoutError
from kvpool.formats import MemoryFormat
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.base import (
    Key,
    RemoteStore,
    check_pairs,
    get_request,
    key_bytes,
    key_list,
    prefix_bytes,
)
from kvpool.remote.header import EntryInfo
from kvpool.remote.objects import discard, hold, release
from kvpool.remote.redis.common import (
    DEFAULT_WINDOW,
    DEL_KEYS,
    MAX_WINDOW,
    SMALL_WINDOW,
    WINDOW_BYTES,
    Plan,
    RedisCommon,
    check_seconds,
    check_window,
)
from kvpool.remote.redis.connection import NodePool, now
from kvpool.remote.redis.prefix import delete_prefix_plan
from kvpool.remote.redis.resp import DEFAULT_LIMITS, Limits

__all__ = [
    "DEFAULT_WINDOW",
    "DEL_KEYS",
    "MAX_WINDOW",
    "SMALL_WINDOW",
    "WINDOW_BYTES",
    "RedisStore",
    "check_seconds",
    "check_window",
]

_T = TypeVar("_T")


class RedisStore(RemoteStore, RedisCommon):
    """A store of entries in one Redis or Valkey server.

    Args:
        url: where the server is: a URL (``redis://[user:password@]host[:port][/db]``,
            ``rediss://`` for TLS, ``unix:///path?db=N``, with the query
            options the ``redis`` client reads), an existing ``redis.Redis``
            client or a ``redis.ConnectionPool`` (their connection options are
            used; kvpool opens connections of its own with them).
        prefix: prepended to every key (namespaces kvpool's entries).
        checksum: record a CRC-32 of every payload on ``put`` (checked on
            ``get`` whenever an entry has one).
        timeout: seconds one call may take in all (a batched call
            included), connecting included.
        connect_timeout: longest wait for one connection (default: ``timeout``).
        max_connections: connections open at once (None: no limit); a call
            waits for a free one until its deadline.
        ttl: seconds every entry lives after its ``put`` (None: forever);
            ``put(..., ttl=)`` overrides it per call.
        window: ``SET``/``GET`` commands in flight at once in the batched
            forms (None: about 512 KiB of values, see ``WINDOW_BYTES``).
        limits: bounds on replies (see :class:`~kvpool.remote.redis.resp.Limits`).
        ping: send ``PING`` now, so an unreachable server fails here.

    Raises:
        FeatureUnavailableError: the ``redis`` client is not installed
            (``pip install 'kvpool[redis]'``).
        InvalidArgumentError: a malformed URL (shown without its secrets),
            a cluster or asyncio client, or a bad argument.
        StoreConnectionError / StoreTimeoutError: ``ping`` failed.

    Thread safety: every call takes a connection of its own from the pool.
    """

    def __init__(
        self,
        url: Any = "redis://127.0.0.1:6379/0",
        *,
        prefix: Key = "kvpool:",
        checksum: bool = False,
        timeout: float = 5.0,
        connect_timeout: float | None = None,
        max_connections: int | None = None,
        ttl: float | None = None,
        window: int | None = DEFAULT_WINDOW,
        limits: Limits = DEFAULT_LIMITS,
        ping: bool = True,
    ) -> None:
        super().__init__(1)
        connect = self._configure(
            url,
            prefix=prefix,
            checksum=checksum,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_connections=max_connections,
            ttl=ttl,
            window=window,
            limits=limits,
        )
        self._pool = NodePool(connect, self.server, max_connections)
        if check_bool("ping", ping):
            self.ping()

    def _call(self, action: str, kb: bytes | None, plan: Plan) -> Any:
        """Serve ``plan`` on a pooled connection within the timeout.

        The connection goes back to the pool only when the plan ended
        cleanly; on any error it is closed and the error mapped.
        """
        deadline = now() + self.timeout
        try:
            conn = self._pool.acquire(deadline)
        except BaseException as exc:
            mapped = self._map_error(exc, self._where(action, kb))
            if mapped is exc:
                raise
            raise mapped from None
        try:
            result = conn.run(plan(conn.reader), deadline)
        except BaseException as exc:
            self._pool.discard(conn)
            mapped = self._map_error(exc, self._where(action, kb))
            if mapped is exc:
                raise
            raise mapped from None
        self._pool.release(conn)
        return result

    def ping(self) -> None:
        """Check that the server answers.

        Raises:
            StoreConnectionError / StoreTimeoutError: it does not.
            RemoteStoreError: it answered something else.
        """
        self._check_open()
        self._call("ping", None, self._ping_plan())

    # -- put ---------------------------------------------------------

    def put(self, key: Key, memory_obj: MemoryObj, *, ttl: float | None = None) -> None:
        """Store ``memory_obj`` under ``key`` with one ``SET`` (see :meth:`RemoteStore.put`).

        Args:
            key: ``str`` or ``bytes``.
            memory_obj: a live host memory object.
            ttl: seconds the entry lives (None: the store's ``ttl``).

        Raises:
            InvalidArgumentError: bad key, object or ttl.
            InvalidHandleError: the object was freed.
            FeatureUnavailableError: a device or GDS object.
            PoolClosedError: the store was closed.
            StoreTimeoutError / StoreConnectionError: the server did not
                answer in time or the connection failed (the entry is then
                either written whole or not at all).
            RemoteStoreError: the server refused (e.g. out of memory).
        """
        kb = key_bytes(key)
        self._check_open()
        px = self._px_for(ttl)
        hold(memory_obj, "put")
        try:
            replies = self._call("put", kb, self._put_plan((kb,), (memory_obj,), px))
        finally:
            release(memory_obj)
        self._raise_refusals("put", (kb,), replies)

    def batched_put(
        self, keys: Sequence[Key], memory_objs: Sequence[MemoryObj], *, ttl: float | None = None
    ) -> None:
        """Store each object under its key, pipelined in windows on one connection.

        Each entry is written atomically; after an error, which entries of
        the batch were written is unspecified (each is whole or absent).

        It raises what :meth:`put` raises; the lists differing in length is an
        ``InvalidArgumentError`` (nothing is stored).
        """
        check_pairs(keys, memory_objs)
        kbs = key_list(keys)
        self._check_open()
        px = self._px_for(ttl)
        if not kbs:
            return
        held: list[MemoryObj] = []
        try:
            for obj in memory_objs:
                hold(obj, "batched_put")
                held.append(obj)
            plan = self._put_plan(kbs, memory_objs, px)
            replies = self._call(f"batched_put of {len(kbs)} keys, first", kbs[0], plan)
        finally:
            for obj in held:
                release(obj)
        self._raise_refusals("batched_put", kbs, replies)

    # -- get ---------------------------------------------------------

    def get(
        self,
        key: Key,
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> MemoryObj | None:
        """Read ``key`` into a new object with one ``GET`` (see :meth:`RemoteStore.get`).

        The header is checked before anything is allocated; the bytes are
        then received straight into the new object.

        Raises:
            InvalidArgumentError: bad key or arguments; the stored layout
                or format differs from the requested one.
            CorruptEntryError: damaged or foreign value, wrong length,
                payload CRC mismatch, another key's entry, an entry of the
                old hash format.
            OutOfMemoryError: the allocator is full.
            FeatureUnavailableError: the allocator gives device or GDS objects.
            PoolClosedError: the allocator or the store was closed.
            StoreTimeoutError / StoreConnectionError: as for :meth:`put`.
        """
        kb = key_bytes(key)
        self._check_open()
        layout, fmt = get_request(allocator, shapes, dtypes, fmt)
        return self._call("get", kb, self._get_plan(kb, allocator, layout, fmt))  # type: ignore[no-any-return]

    def batched_get(
        self,
        keys: Sequence[Key],
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> list[MemoryObj | None]:
        """``get`` for each key, pipelined in windows on one connection.

        Returns:
            One object (or None for a missing key) per key, in order.

        It raises what :meth:`get` raises; every object this call allocated is freed first.
        """
        kbs = key_list(keys)
        self._check_open()
        layout, fmt = get_request(allocator, shapes, dtypes, fmt)
        if not kbs:
            return []
        out: list[MemoryObj | None] = []
        plan = self._batched_get_plan(kbs, allocator, layout, fmt, out)
        try:
            return self._call(f"batched_get of {len(kbs)} keys, first", kbs[0], plan)  # type: ignore[no-any-return]
        except BaseException:
            for obj in out:
                discard(obj)
            raise

    # -- the rest ----------------------------------------------------

    def _count(self, action: str, kbs: list[bytes], commands: list[bytes], what: str) -> list[int]:
        plan = self._count_plan(action, commands, what, kbs[0])
        label = action if len(kbs) == 1 else f"{action} of {len(kbs)} keys, first"
        return self._counts(action, kbs[0], self._call(label, kbs[0], plan))

    def exists(self, key: Key) -> bool:
        """True when ``key`` exists in the server (see :meth:`RemoteStore.exists`)."""
        kb = key_bytes(key)
        self._check_open()
        return bool(self._count("exists", [kb], self._exists_commands([kb]), "EXISTS")[0])

    def batched_exists(self, keys: Sequence[Key]) -> list[bool]:
        """``exists`` for each key, pipelined in windows on one connection."""
        kbs = key_list(keys)
        self._check_open()
        if not kbs:
            return []
        counts = self._count("batched_exists", kbs, self._exists_commands(kbs), "EXISTS")
        return [bool(n) for n in counts]

    def delete(self, key: Key) -> bool:
        """Remove ``key`` from the server (see :meth:`RemoteStore.delete`)."""
        kb = key_bytes(key)
        self._check_open()
        return bool(self._count("delete", [kb], self._delete_commands([kb]), "DEL")[0])

    def batched_delete(self, keys: Sequence[Key]) -> int:
        """Remove every key (one ``DEL`` per 256 keys, pipelined); returns how many existed."""
        kbs = key_list(keys)
        self._check_open()
        if not kbs:
            return 0
        return sum(self._count("batched_delete", kbs, self._delete_commands(kbs), "DEL"))

    def delete_prefix(self, prefix: Key) -> int:
        """Remove every entry whose key starts with ``prefix``; how many were removed.

        As :meth:`RemoteStore.delete_prefix`: ``SCAN MATCH`` over the
        server's keys under the store's ``prefix`` plus ``prefix``, each
        step's keys removed with ``UNLINK`` (:mod:`kvpool.remote.redis.prefix`);
        the whole walk is bounded by ``timeout``, past which it raises
        ``StoreTimeoutError`` saying how many it removed (call again for the
        rest).  O(keys on the server).
        """
        pb = prefix_bytes(prefix)
        self._check_open()
        removed = [0]
        plan = delete_prefix_plan(self._prefix + pb, self._where("delete_prefix", pb), removed)
        try:
            return self._call("delete_prefix", pb, plan)  # type: ignore[no-any-return]
        except StoreTimeoutError as exc:
            raise self._cut_off(exc, removed[0]) from None

    def head(self, key: Key) -> EntryInfo | None:
        """The stored header of ``key`` (see :meth:`RemoteStore.head`).

        Also checks that the stored value has the length the header says.

        Raises:
            CorruptEntryError: damaged header, wrong length, another key's
                entry, an entry of the old hash format or a value kvpool
                did not write.
        """
        kb = key_bytes(key)
        self._check_open()
        return self._call("head", kb, self._head_plan(kb))  # type: ignore[no-any-return]

    def _close(self) -> None:
        self._pool.close()

    def __repr__(self) -> str:
        return f"<RedisStore {self.server}{' closed' if self._closed else ''}>"
