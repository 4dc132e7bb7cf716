"""RedisStore: entries in one Redis or Valkey server.

The entry format and the commands are those of :mod:`kvpool.remote.rediswire`
(one string key per entry: ``SET`` of header + bytes, ``GET`` read straight
into the destination); the connections are kvpool's own
(:mod:`kvpool.remote.connection`), opened with the ``redis`` client's
connection classes so that every URL option, ``AUTH``, ``SELECT`` and TLS
work as they do in ``redis-py``.

How the bytes move:

* ``put`` sends ``SET key <header><bytes>`` with one ``sendmsg``: the
  object's memory goes to the kernel as a memoryview, never copied in
  Python.  Zero copies.
* ``get`` sends ``GET key``, checks the header as soon as it arrives, then
  allocates the object and receives the bytes with ``recv_into`` straight
  into it (only bytes that arrived together with the header, at most
  8 KiB, pass through a small buffer).  One copy, the kernel's.
* The batched forms keep a bounded *window* of commands in flight on one
  connection (``window``, default :data:`DEFAULT_WINDOW` for values and
  :data:`SMALL_WINDOW` for ``EXISTS``/``DEL``), chosen by measurement
  (``kvpool bench --only remote_put_get``): deeper pipelines of 512 KiB
  values were slower, not faster.

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

import zlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

import kvpool.remote.rediswire as wire
from kvpool.errors import (
    InvalidArgumentError,
    KVPoolError,
    RemoteStoreError,
    StoreConnectionError,
    StoreTimeoutError,
)
from kvpool.formats import MemoryFormat
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.base import (
    Key,
    RemoteStore,
    check_format,
    check_pairs,
    describe,
    discard,
    hold,
    key_bytes,
    release,
    requested_layout,
)
from kvpool.remote.connection import NodePool, RedisConnection, now, pipeline, redis_py_connector
from kvpool.remote.header import EntryInfo, encode_header, key_tag
from kvpool.remote.redisconfig import Target, import_redis, resolve_target, scrub
from kvpool.remote.resp import DEFAULT_LIMITS, ErrorReply, Limits, ProtocolError, ServerClosed

__all__ = ["DEFAULT_WINDOW", "SMALL_WINDOW", "RedisStore"]

_T = TypeVar("_T")

#: Values (``SET``/``GET``) in flight at once in the batched forms.
DEFAULT_WINDOW = 4
#: Small commands (``EXISTS``, ``DEL`` of up to :data:`DEL_KEYS` keys) in flight at once.
SMALL_WINDOW = 64
#: Keys per ``DEL`` command of ``batched_delete``.
DEL_KEYS = 256


def check_seconds(name: str, value: object, none_ok: bool = False) -> float | None:
    """Validate a duration in seconds (> 0).

    Raises:
        InvalidArgumentError: not a positive number (or None when allowed).
    """
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        raise InvalidArgumentError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)


def check_window(value: object) -> int:
    """Validate a pipeline window (an int from 1 to 4096).

    Raises:
        InvalidArgumentError: anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise InvalidArgumentError(f"window must be an int from 1 to 4096, got {value!r}")
    return value


class RedisStore(RemoteStore):
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
        window: values in flight at once in the batched forms.
        limits: bounds on replies (see :class:`~kvpool.remote.resp.Limits`).
        ping: send ``PING`` now, so an unreachable server fails here.

    Raises:
        FeatureUnavailableError: the ``redis`` client is not installed
            (``pip install 'kvpool[redis]'``).
        InvalidArgumentError: a malformed URL (shown without its secrets),
            a cluster client, or a bad argument.
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
        window: int = DEFAULT_WINDOW,
        limits: Limits = DEFAULT_LIMITS,
        ping: bool = True,
    ) -> None:
        super().__init__(1)
        self._redis = import_redis()
        if isinstance(url, (bytes, int, float)) or url is None:
            raise InvalidArgumentError(
                f"url must be a str, a redis.Redis client or a ConnectionPool, got "
                f"{type(url).__name__}"
            )
        self.timeout = check_seconds("timeout", timeout)  # type: ignore[assignment]
        connect = check_seconds("connect_timeout", connect_timeout, none_ok=True)
        self._connect_timeout = connect or self.timeout
        if max_connections is not None and (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise InvalidArgumentError(
                f"max_connections must be an int >= 1 or None, got {max_connections!r}"
            )
        self._px = wire.ttl_ms(ttl)
        self.ttl = ttl
        self._window = check_window(window)
        if not isinstance(limits, Limits):
            raise InvalidArgumentError(f"limits must be a resp.Limits, got {limits!r}")
        self._prefix = key_bytes(prefix)
        self._checksum = bool(checksum)
        self._target: Target = self._resolve(url)
        self.server = self._target.label
        self._pool = NodePool(
            redis_py_connector(
                self._target.connection_class,
                self._target.options,
                self.server,
                self._connect_timeout,
                limits,
            ),
            self.server,
            max_connections,
        )
        if ping:
            self.ping()

    def _resolve(self, url: Any) -> Target:
        return resolve_target(url)

    # -- plumbing ----------------------------------------------------

    def _where(self, action: str, kb: bytes | None) -> str:
        if kb is None:
            return f"{action} on {self.server}"
        return f"{action} {kb!r} on {self.server}"

    def _map_error(self, exc: BaseException, where: str) -> BaseException:
        """The kvpool error for a socket, protocol or client error (``exc`` itself if none)."""
        if isinstance(exc, KVPoolError):
            return exc
        errors = self._redis.exceptions
        text = scrub(str(exc), self._target.secrets)
        if isinstance(exc, (TimeoutError, errors.TimeoutError)):
            return StoreTimeoutError(f"{where}: no answer within {self.timeout} s ({text})")
        if isinstance(exc, (ServerClosed, ConnectionError, errors.ConnectionError)):
            return StoreConnectionError(f"{where}: connection failed or lost ({text})")
        if isinstance(exc, OSError):
            return StoreConnectionError(f"{where}: socket error ({text})")
        if isinstance(exc, errors.RedisError):
            return RemoteStoreError(f"{where}: {type(exc).__name__}: {text}")
        return exc

    def _call(
        self, action: str, kb: bytes | None, op: Callable[[RedisConnection, float], _T]
    ) -> _T:
        """Run ``op(connection, deadline)`` within the timeout; drop the connection on any error."""
        deadline = now() + self.timeout
        try:
            conn = self._pool.acquire(deadline)
        except BaseException as exc:
            mapped = self._map_error(exc, self._where(action, kb))
            if mapped is exc:
                raise
            raise mapped from None
        try:
            result = op(conn, deadline)
        except BaseException as exc:
            self._pool.discard(conn)
            mapped = self._map_error(exc, self._where(action, kb))
            if mapped is exc:
                raise
            raise mapped from None
        self._pool.release(conn)
        return result

    def _simple(self, action: str, kb: bytes | None, cmd: bytes, what: str) -> int:
        """Send one command answered by a count, with the end-of-call marker; return the count."""
        nonce = wire.new_nonce()

        def op(conn: RedisConnection, deadline: float) -> int | ErrorReply:
            conn.send([cmd, wire.sentinel_command(nonce)], deadline)
            n = conn.run(wire.read_count(conn.reader, what), deadline)
            conn.run(wire.read_sentinel(conn.reader, nonce, self._where(action, kb)), deadline)
            return n  # type: ignore[no-any-return]

        n = self._call(action, kb, op)
        if isinstance(n, ErrorReply):
            raise RemoteStoreError(f"{self._where(action, kb)}: the server answered: {n.text}")
        return n

    def ping(self) -> None:
        """Check that the server answers.

        Raises:
            StoreConnectionError / StoreTimeoutError: it does not.
            RemoteStoreError: it answered something else than ``PONG``.
        """
        self._check_open()
        nonce = wire.new_nonce()

        def op(conn: RedisConnection, deadline: float) -> None:
            conn.send([wire.sentinel_command(nonce)], deadline)
            conn.run(wire.read_sentinel(conn.reader, nonce, self._where("ping", None)), deadline)

        self._call("ping", None, op)

    # -- put ---------------------------------------------------------

    def _set_parts(self, rkey: bytes, obj: MemoryObj, px: int | None) -> list[Any]:
        layout, fmt, view = describe(obj)
        crc = zlib.crc32(view) if self._checksum else None
        header = encode_header(layout, fmt, view.nbytes, crc, key_tag(rkey))
        return wire.set_parts(rkey, header, view, px)

    def _px_for(self, ttl: float | None) -> int | None:
        return self._px if ttl is None else wire.ttl_ms(ttl)

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
            parts = self._set_parts(self._prefix + kb, memory_obj, px)
            nonce = wire.new_nonce()
            parts.append(wire.sentinel_command(nonce))

            def op(conn: RedisConnection, deadline: float) -> ErrorReply | None:
                conn.send(parts, deadline)
                refused = conn.run(wire.read_ok(conn.reader), deadline)
                conn.run(wire.read_sentinel(conn.reader, nonce, self._where("put", kb)), deadline)
                return refused  # type: ignore[no-any-return]

            refused = self._call("put", kb, op)
        finally:
            release(memory_obj)
        if refused is not None:
            raise RemoteStoreError(f"{self._where('put', kb)}: the server answered: {refused.text}")

    def batched_put(
        self, keys: Sequence[Key], memory_objs: Sequence[MemoryObj], *, ttl: float | None = None
    ) -> None:
        """Store each object under its key, pipelined in windows on one connection.

        Each entry is written atomically; after an error, which entries of
        the batch were written is unspecified (each is whole or absent).

        Raises:
            As :meth:`put`; the lists differing in length is an
            ``InvalidArgumentError`` (nothing is stored).
        """
        check_pairs(keys, memory_objs)
        kbs = [key_bytes(k) for k in keys]
        self._check_open()
        px = self._px_for(ttl)
        if not kbs:
            return
        held: list[MemoryObj] = []
        try:
            for obj in memory_objs:
                hold(obj, "batched_put")
                held.append(obj)
            commands = [
                self._set_parts(self._prefix + kb, obj, px)
                for kb, obj in zip(kbs, memory_objs, strict=True)
            ]
            nonce = wire.new_nonce()
            commands[-1].append(wire.sentinel_command(nonce))
            replies: list[Any] = []

            def op(conn: RedisConnection, deadline: float) -> None:
                reader = conn.reader
                pipeline(
                    conn,
                    len(commands),
                    commands.__getitem__,
                    lambda i: wire.read_ok(reader),
                    self._window,
                    deadline,
                    replies,
                )
                conn.run(
                    wire.read_sentinel(reader, nonce, self._where("batched_put", kbs[0])), deadline
                )

            self._call(f"batched_put of {len(kbs)} keys, first", kbs[0], op)
        finally:
            for obj in held:
                release(obj)
        for kb, refused in zip(kbs, replies, strict=True):
            if refused is not None:
                raise RemoteStoreError(
                    f"{self._where('batched_put', kb)}: the server answered: {refused.text}"
                )

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
        layout = requested_layout(shapes, dtypes)
        fmt = check_format(fmt)
        rkey = self._prefix + kb
        cmd = wire.get_command(rkey)
        tag = key_tag(rkey)
        where = self._where("get", kb)

        def op(conn: RedisConnection, deadline: float) -> MemoryObj | None:
            conn.send((cmd,), deadline)
            return conn.run(  # type: ignore[no-any-return]
                wire.read_entry(conn.reader, where, tag, allocator, layout, fmt), deadline
            )

        return self._call("get", kb, op)

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

        Raises:
            As :meth:`get`; every object this call allocated is freed first.
        """
        kbs = [key_bytes(k) for k in keys]
        self._check_open()
        layout = requested_layout(shapes, dtypes)
        fmt = check_format(fmt)
        if not kbs:
            return []
        rkeys = [self._prefix + kb for kb in kbs]
        commands = [(wire.get_command(rkey),) for rkey in rkeys]
        server = self.server
        out: list[MemoryObj | None] = []

        def op(conn: RedisConnection, deadline: float) -> list[MemoryObj | None]:
            reader = conn.reader

            def steps(i: int) -> Any:
                where = f"batched_get {kbs[i]!r} on {server}"
                return wire.read_entry(reader, where, key_tag(rkeys[i]), allocator, layout, fmt)

            return pipeline(
                conn, len(kbs), commands.__getitem__, steps, self._window, deadline, out
            )

        try:
            return self._call(f"batched_get of {len(kbs)} keys, first", kbs[0], op)
        except BaseException:
            for obj in out:
                discard(obj)
            raise

    # -- the rest ----------------------------------------------------

    def exists(self, key: Key) -> bool:
        """True when ``key`` exists in the server (see :meth:`RemoteStore.exists`)."""
        kb = key_bytes(key)
        self._check_open()
        return bool(self._simple("exists", kb, wire.exists_command(self._prefix + kb), "EXISTS"))

    def _counts(self, action: str, commands: list[bytes], what: str, first: bytes) -> list[int]:
        """Pipeline ``commands`` (each answered by a count) and the end-of-call marker."""
        nonce = wire.new_nonce()
        parts = [(c,) for c in commands]
        parts[-1] = (commands[-1], wire.sentinel_command(nonce))
        replies: list[Any] = []

        def op(conn: RedisConnection, deadline: float) -> None:
            reader = conn.reader
            pipeline(
                conn,
                len(parts),
                parts.__getitem__,
                lambda i: wire.read_count(reader, what),
                SMALL_WINDOW,
                deadline,
                replies,
            )
            conn.run(wire.read_sentinel(reader, nonce, self._where(action, first)), deadline)

        self._call(f"{action} of {len(commands)} commands, first", first, op)
        for reply in replies:
            if isinstance(reply, ErrorReply):
                raise RemoteStoreError(
                    f"{self._where(action, first)}: the server answered: {reply.text}"
                )
        return replies

    def batched_exists(self, keys: Sequence[Key]) -> list[bool]:
        """``exists`` for each key, pipelined in windows on one connection."""
        kbs = [key_bytes(k) for k in keys]
        self._check_open()
        if not kbs:
            return []
        commands = [wire.exists_command(self._prefix + kb) for kb in kbs]
        counts = self._counts("batched_exists", commands, "EXISTS", kbs[0])
        return [bool(n) for n in counts]

    def delete(self, key: Key) -> bool:
        """Remove ``key`` from the server (see :meth:`RemoteStore.delete`)."""
        kb = key_bytes(key)
        self._check_open()
        return bool(self._simple("delete", kb, wire.del_command(self._prefix + kb), "DEL"))

    def batched_delete(self, keys: Sequence[Key]) -> int:
        """Remove every key (one ``DEL`` per 256 keys, pipelined); returns how many existed."""
        kbs = [key_bytes(k) for k in keys]
        self._check_open()
        if not kbs:
            return 0
        prefix = self._prefix
        commands = [
            wire.del_command(*(prefix + kb for kb in kbs[i : i + DEL_KEYS]))
            for i in range(0, len(kbs), DEL_KEYS)
        ]
        return sum(self._counts("batched_delete", commands, "DEL", kbs[0]))

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
        rkey = self._prefix + kb
        tag = key_tag(rkey)
        where = self._where("head", kb)

        def op(conn: RedisConnection, deadline: float) -> EntryInfo | None:
            length = wire.HEAD_READ
            for _ in range(2):
                conn.send((wire.head_commands(rkey, length),), deadline)
                info = conn.run(wire.read_head(conn.reader, where, tag), deadline)
                if not isinstance(info, int):
                    return info  # type: ignore[no-any-return]
                length = info  # a header longer than the first read
            raise ProtocolError(f"{where}: the header kept growing between two reads")

        return self._call("head", kb, op)

    def _close(self) -> None:
        self._pool.close()

    def __repr__(self) -> str:
        return f"<RedisStore {self.server}{' closed' if self._closed else ''}>"
