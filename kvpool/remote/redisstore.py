"""RedisStore: entries in Redis or Valkey, through the ``redis`` client.

Each entry is a hash with two fields: ``h``, the header
(:mod:`kvpool.remote.header`), and ``d``, the object's bytes, under the
key ``prefix + key``.

How the bytes move:

* ``put`` sends ``MULTI; DEL k; HSET k h <header> d <bytes>; EXEC`` as one
  pipelined write.  The command is packed here (the ``redis`` client's own
  packer copies memoryviews into ``bytes`` when ``hiredis`` is installed)
  and handed to the client's ``send_packed_command`` as
  ``[command head + header, byte_array, tail]``: the object's memory goes
  to ``sendall`` as a memoryview, with no copy in Python.  The server
  applies ``DEL`` and ``HSET`` atomically, so a reader sees the old entry,
  the new one or none, never a header without its bytes; a connection
  lost mid-command leaves the server with an incomplete command, which it
  discards.
* ``get`` sends ``HMGET k h d`` and reads the reply itself
  (:class:`~kvpool.remote.resp.RespReader`) from the client's socket: the
  header goes into a small buffer and is checked first, then the object is
  allocated and the bytes are received with ``recv_into`` straight into
  its ``byte_array`` (only bytes that arrived together with the header
  line, at most 4 KiB, pass through the small buffer).  One copy, the
  kernel's.

The client's connection pool does the connecting, authentication, TLS,
database selection and reconnection; replies to kvpool's commands are
read by kvpool, so the client's parser never holds a partial reply.  Any
error in the middle of a command drops that connection (the next call
opens a new one), so a connection is never left out of step.

Errors: a timeout raises :class:`~kvpool.errors.StoreTimeoutError`, a
refused or lost connection :class:`~kvpool.errors.StoreConnectionError`,
an entry that is damaged or was not written by kvpool
:class:`~kvpool.errors.CorruptEntryError`, any other server refusal
:class:`~kvpool.errors.RemoteStoreError`.  Nothing is retried.
"""

from __future__ import annotations

import inspect
import zlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from kvpool.errors import (
    CorruptEntryError,
    FeatureUnavailableError,
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
    allocate,
    check_format,
    check_pairs,
    check_stored,
    describe,
    discard,
    hold,
    key_bytes,
    release,
    requested_layout,
)
from kvpool.remote.header import EntryInfo, Layout, decode_header, encode_header, layout_for
from kvpool.remote.resp import RespReader, ServerClosed, bulk_length

__all__ = ["RedisStore"]

_T = TypeVar("_T")
_EXEC = b"\r\n*1\r\n$4\r\nEXEC\r\n"
_DEL_CHUNK = 1024


def _import_redis() -> Any:
    try:
        import redis
        import redis.backoff
        import redis.retry
    except ImportError as exc:
        raise FeatureUnavailableError(
            "RedisStore needs the redis client, which is not installed: pip install 'kvpool[redis]'"
        ) from exc
    return redis


def _pack(*args: bytes) -> bytes:
    """A command in RESP (small arguments only)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        parts.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(parts)


def _reply(r: RespReader) -> Any:
    """Read one whole reply; an error reply is returned as a RemoteStoreError."""
    line = r.line()
    kind = line[:1]
    try:
        if kind == b"+":
            return line[1:]
        if kind == b":":
            return int(line[1:])
        if kind == b"$":
            n = int(line[1:])
            if n < 0:
                return None
            data = r.read_bytes(n)
            r.crlf()
            return data
        if kind == b"*":
            n = int(line[1:])
            return None if n < 0 else [_reply(r) for _ in range(n)]
    except ValueError:
        raise RemoteStoreError(f"malformed reply line {line[:80]!r}") from None
    if kind == b"-":
        return RemoteStoreError(f"the server answered: {line[1:200].decode(errors='replace')}")
    if kind == b"_":
        return None
    if kind == b"#":
        return line[1:] == b"t"
    raise RemoteStoreError(f"unexpected reply line {line[:80]!r}")


def _as_byte_view(view: memoryview) -> memoryview:
    return view if view.format == "B" else view.cast("B")


class RedisStore(RemoteStore):
    """A store of entries in a Redis or Valkey server.

    Args:
        url: ``redis://[user:password@]host[:port][/db]``, ``rediss://``
            (TLS) or ``unix:///path?db=N``, as the ``redis`` client reads it.
        prefix: prepended to every key (namespaces kvpool's entries).
        checksum: record a CRC-32 of every payload on ``put`` (checked on
            ``get`` whenever an entry has one).
        timeout: seconds to wait on any read or write of a connection.
        connect_timeout: seconds to wait for a connection (default: ``timeout``).
        max_connections: connections the pool may open (None: no limit).
        ping: send ``PING`` now, so an unreachable server fails here.

    Raises:
        FeatureUnavailableError: the ``redis`` client is not installed
            (``pip install 'kvpool[redis]'``).
        InvalidArgumentError: a malformed URL or a bad argument.
        StoreConnectionError / StoreTimeoutError: ``ping`` failed.

    Thread safety: every call takes a connection of its own from the pool.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: Key = "kvpool:",
        checksum: bool = False,
        timeout: float = 5.0,
        connect_timeout: float | None = None,
        max_connections: int | None = None,
        ping: bool = True,
    ) -> None:
        super().__init__(1)
        redis = _import_redis()
        self._redis = redis
        if not isinstance(url, str):
            raise InvalidArgumentError(f"url must be a str, got {type(url).__name__}")
        for name, value in (("timeout", timeout), ("connect_timeout", connect_timeout)):
            if value is not None and (isinstance(value, bool) or not value > 0):
                raise InvalidArgumentError(f"{name} must be a number of seconds > 0, got {value!r}")
        self._prefix = key_bytes(prefix)
        self._checksum = bool(checksum)
        self.timeout = float(timeout)
        try:
            self._pool = redis.ConnectionPool.from_url(
                url,
                socket_timeout=self.timeout,
                socket_connect_timeout=connect_timeout or self.timeout,
                max_connections=max_connections,
                retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
            )
        except (ValueError, TypeError) as exc:
            raise InvalidArgumentError(f"bad Redis URL {url!r}: {exc}") from None
        kw = self._pool.connection_kwargs
        if "path" in kw:
            self.server = f"unix:{kw['path']}/{kw.get('db', 0)}"
        else:
            self.server = f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
        param = inspect.signature(self._pool.get_connection).parameters.get("command_name")
        self._needs_command_name = param is not None and param.default is inspect.Parameter.empty
        if ping:
            self.ping()

    # -- plumbing ----------------------------------------------------

    def _where(self, action: str, kb: bytes | None) -> str:
        return (
            f"{action} {kb!r} on {self.server}" if kb is not None else f"{action} on {self.server}"
        )

    def _map_error(self, exc: BaseException, action: str, kb: bytes | None) -> BaseException:
        """The kvpool error for a client or socket error (``exc`` itself if none)."""
        if isinstance(exc, KVPoolError):
            return exc
        r = self._redis.exceptions
        where = self._where(action, kb)
        if isinstance(exc, (TimeoutError, r.TimeoutError)):
            return StoreTimeoutError(f"{where}: no answer within {self.timeout} s ({exc})")
        if isinstance(exc, (ServerClosed, ConnectionError, r.ConnectionError)):
            return StoreConnectionError(f"{where}: connection failed or lost ({exc})")
        if isinstance(exc, OSError):
            return StoreConnectionError(f"{where}: socket error ({exc})")
        if isinstance(exc, r.RedisError):
            return RemoteStoreError(f"{where}: {type(exc).__name__}: {exc}")
        return exc

    def _run(self, action: str, kb: bytes | None, op: Callable[[Any], _T]) -> _T:
        """Run ``op(connection)``; drop the connection unless it ends cleanly."""
        try:
            if self._needs_command_name:  # redis-py < 5.3
                conn = self._pool.get_connection(action.upper())
            else:
                conn = self._pool.get_connection()
        except BaseException as exc:
            mapped = self._map_error(exc, action, kb)
            if mapped is exc:
                raise
            raise mapped from exc
        clean = False
        try:
            result = op(conn)
            clean = True
            return result
        except BaseException as exc:
            mapped = self._map_error(exc, action, kb)
            if mapped is exc:
                raise
            raise mapped from exc
        finally:
            if not clean:
                conn.disconnect()
            self._pool.release(conn)

    @staticmethod
    def _send(conn: Any, items: list[Any]) -> RespReader:
        conn.send_packed_command(items, check_health=False)
        sock = getattr(conn, "_sock", None)
        if sock is None:
            raise FeatureUnavailableError(
                "this version of the redis client keeps no socket on its connections; "
                "RedisStore needs redis>=5"
            )
        return RespReader(sock)

    @staticmethod
    def _done(r: RespReader) -> None:
        if r.pending():
            raise RemoteStoreError(f"{r.pending()} unexpected bytes after the reply")

    def _command(self, action: str, kb: bytes | None, *args: bytes) -> Any:
        """Send one small command and return its reply (raising an error reply)."""

        def op(conn: Any) -> Any:
            r = self._send(conn, [_pack(*args)])
            out = _reply(r)
            self._done(r)
            if isinstance(out, RemoteStoreError):
                raise out
            return out

        return self._run(action, kb, op)

    def ping(self) -> None:
        """Check that the server answers.

        Raises:
            StoreConnectionError / StoreTimeoutError: it does not.
        """
        self._check_open()
        self._command("ping", None, b"PING")

    # -- put ---------------------------------------------------------

    def _put_items(self, kb: bytes, obj: MemoryObj) -> tuple[bytes, memoryview]:
        layout, fmt, view = describe(obj)
        crc = zlib.crc32(view) if self._checksum else None
        header = encode_header(layout, fmt, view.nbytes, crc)
        k = self._prefix + kb
        head = (
            b"*1\r\n$5\r\nMULTI\r\n*2\r\n$3\r\nDEL\r\n$%d\r\n%b\r\n"
            b"*6\r\n$4\r\nHSET\r\n$%d\r\n%b\r\n$1\r\nh\r\n$%d\r\n%b\r\n$1\r\nd\r\n$%d\r\n"
            % (len(k), k, len(k), k, len(header), header, view.nbytes)
        )
        return head, view

    @staticmethod
    def _read_put_replies(r: RespReader, count: int) -> None:
        error: RemoteStoreError | None = None
        for _ in range(count):
            replies = [_reply(r) for _ in range(4)]  # OK, QUEUED, QUEUED, [DEL, HSET]
            exec_reply = replies[3]
            bad = [x for x in replies if isinstance(x, RemoteStoreError)]
            if isinstance(exec_reply, list):
                bad += [x for x in exec_reply if isinstance(x, RemoteStoreError)]
            elif not bad:
                bad.append(RemoteStoreError(f"unexpected EXEC reply {exec_reply!r}"))
            if bad and error is None:
                error = bad[0]
        RedisStore._done(r)
        if error is not None:
            raise error

    def put(self, key: Key, memory_obj: MemoryObj) -> None:
        """Store ``memory_obj`` under ``key`` (see :meth:`RemoteStore.put`).

        Raises:
            InvalidArgumentError: bad key or object.
            InvalidHandleError: the object was freed.
            PoolClosedError: the store was closed.
            StoreTimeoutError / StoreConnectionError: the server did not
                answer or the connection failed (the entry is then either
                written whole or not at all).
            RemoteStoreError: the server refused (e.g. out of memory).
        """
        kb = key_bytes(key)
        self._check_open()
        hold(memory_obj, "put")
        try:
            head, view = self._put_items(kb, memory_obj)

            def op(conn: Any) -> None:
                self._read_put_replies(self._send(conn, [head, view, _EXEC]), 1)

            self._run("put", kb, op)
        finally:
            release(memory_obj)

    def batched_put(self, keys: Sequence[Key], memory_objs: Sequence[MemoryObj]) -> None:
        """Store each object under its key, pipelined on one connection.

        Each entry is written atomically; after an error, which entries of
        the batch were written is unspecified (each is whole or absent).

        Raises:
            As :meth:`put`; the lists differing in length is an
            ``InvalidArgumentError`` (nothing is stored).
        """
        check_pairs(keys, memory_objs)
        kbs = [key_bytes(k) for k in keys]
        self._check_open()
        if not kbs:
            return
        held: list[MemoryObj] = []
        try:
            for obj in memory_objs:
                hold(obj, "batched_put")
                held.append(obj)
            items: list[Any] = []
            tail = b""
            for kb, obj in zip(kbs, memory_objs, strict=True):
                head, view = self._put_items(kb, obj)
                items.append(tail + head)
                items.append(view)
                tail = _EXEC
            items.append(tail)

            def op(conn: Any) -> None:
                self._read_put_replies(self._send(conn, items), len(kbs))

            self._run(f"batched_put of {len(kbs)} keys, first", kbs[0], op)
        finally:
            for obj in held:
                release(obj)

    # -- get ---------------------------------------------------------

    def _read_entry(
        self,
        r: RespReader,
        allocator: MemoryAllocatorInterface,
        layout: Layout | None,
        fmt: MemoryFormat | None,
        kb: bytes,
    ) -> MemoryObj | None:
        """Read one ``HMGET k h d`` reply into a new object (None: no entry)."""
        where = self._where("get", kb)
        line = r.line()
        if line[:1] == b"-":
            text = line[1:200].decode(errors="replace")
            if text.startswith("WRONGTYPE"):
                raise CorruptEntryError(f"{where}: the key holds a value kvpool did not write")
            raise RemoteStoreError(f"{where}: the server answered: {text}")
        if line != b"*2":
            raise RemoteStoreError(f"{where}: unexpected reply {line[:80]!r} to HMGET")
        header_len = bulk_length(r.line())
        if header_len is None:
            size = bulk_length(r.line())
            if size is None:
                return None
            raise CorruptEntryError(f"{where}: the entry has bytes but no header")
        header = r.read_bytes(header_len)
        r.crlf()
        size = bulk_length(r.line())
        if size is None:
            raise CorruptEntryError(f"{where}: the entry has a header but no bytes")
        info = decode_header(header, where)
        check_stored(info, layout, fmt, where)
        if size != info.size:
            raise CorruptEntryError(
                f"{where}: {size} payload bytes stored, the header announces {info.size}"
            )
        if header_len != info.header_size:
            raise CorruptEntryError(f"{where}: trailing bytes after the header")
        obj = allocate(
            allocator, layout or layout_for(info.shapes, info.dtypes), fmt or info.fmt, where
        )
        try:
            view = _as_byte_view(obj.byte_array)[:size]
            r.read_into(view)
            r.crlf()
            if info.payload_crc is not None and zlib.crc32(view) != info.payload_crc:
                raise CorruptEntryError(f"{where}: payload CRC mismatch")
            if info.size != info.layout_size:
                obj.set_used_size(info.size)
        except BaseException:
            discard(obj)
            raise
        return obj

    def get(
        self,
        key: Key,
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> MemoryObj | None:
        """Read ``key`` into a new object (see :meth:`RemoteStore.get`).

        The header is checked before anything is allocated; the bytes are
        then received straight into the new object.

        Raises:
            InvalidArgumentError: bad key or arguments; the stored layout
                or format differs from the requested one.
            CorruptEntryError: damaged header, missing field, wrong
                length, payload CRC mismatch, or a key kvpool did not write.
            OutOfMemoryError: the allocator is full.
            PoolClosedError: the allocator or the store was closed.
            StoreTimeoutError / StoreConnectionError: as for :meth:`put`.
        """
        kb = key_bytes(key)
        self._check_open()
        layout = requested_layout(shapes, dtypes)
        fmt = check_format(fmt)
        command = _pack(b"HMGET", self._prefix + kb, b"h", b"d")

        def op(conn: Any) -> MemoryObj | None:
            r = self._send(conn, [command])
            obj = self._read_entry(r, allocator, layout, fmt, kb)
            if r.pending():
                discard(obj)
                self._done(r)
            return obj

        return self._run("get", kb, op)

    def batched_get(
        self,
        keys: Sequence[Key],
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> list[MemoryObj | None]:
        """``get`` for each key, pipelined on one connection.

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
        command = b"".join(_pack(b"HMGET", self._prefix + kb, b"h", b"d") for kb in kbs)

        def op(conn: Any) -> list[MemoryObj | None]:
            r = self._send(conn, [command])
            out: list[MemoryObj | None] = []
            try:
                for kb in kbs:
                    out.append(self._read_entry(r, allocator, layout, fmt, kb))
                self._done(r)
            except BaseException:
                for obj in out:
                    discard(obj)
                raise
            return out

        return self._run(f"batched_get of {len(kbs)} keys, first", kbs[0], op)

    # -- the rest ----------------------------------------------------

    def exists(self, key: Key) -> bool:
        """True when ``key`` exists in the server (see :meth:`RemoteStore.exists`)."""
        kb = key_bytes(key)
        self._check_open()
        return bool(self._command("exists", kb, b"EXISTS", self._prefix + kb))

    def batched_exists(self, keys: Sequence[Key]) -> list[bool]:
        """``exists`` for each key, pipelined on one connection."""
        kbs = [key_bytes(k) for k in keys]
        self._check_open()
        if not kbs:
            return []
        command = b"".join(_pack(b"EXISTS", self._prefix + kb) for kb in kbs)

        def op(conn: Any) -> list[bool]:
            r = self._send(conn, [command])
            replies = [_reply(r) for _ in kbs]
            self._done(r)
            for x in replies:
                if isinstance(x, RemoteStoreError):
                    raise x
            return [bool(x) for x in replies]

        return self._run(f"batched_exists of {len(kbs)} keys, first", kbs[0], op)

    def delete(self, key: Key) -> bool:
        """Remove ``key`` from the server (see :meth:`RemoteStore.delete`)."""
        kb = key_bytes(key)
        self._check_open()
        return bool(self._command("delete", kb, b"DEL", self._prefix + kb))

    def batched_delete(self, keys: Sequence[Key]) -> int:
        """Remove every key (one ``DEL`` per 1024 keys); returns how many existed."""
        kbs = [key_bytes(k) for k in keys]
        self._check_open()
        removed = 0
        for i in range(0, len(kbs), _DEL_CHUNK):
            chunk = [self._prefix + kb for kb in kbs[i : i + _DEL_CHUNK]]
            removed += int(self._command("batched_delete", kbs[i], b"DEL", *chunk))
        return removed

    def head(self, key: Key) -> EntryInfo | None:
        """The stored header of ``key`` (see :meth:`RemoteStore.head`).

        Also checks that the stored bytes have the length the header says.

        Raises:
            CorruptEntryError: damaged header, wrong length, or a key
                kvpool did not write.
        """
        kb = key_bytes(key)
        self._check_open()
        k = self._prefix + kb
        where = self._where("head", kb)

        def op(conn: Any) -> tuple[Any, Any]:
            r = self._send(conn, [_pack(b"HGET", k, b"h") + _pack(b"HSTRLEN", k, b"d")])
            out = (_reply(r), _reply(r))
            self._done(r)
            return out

        header, size = self._run("head", kb, op)
        for x in (header, size):
            if isinstance(x, RemoteStoreError):
                if "WRONGTYPE" in str(x):
                    raise CorruptEntryError(f"{where}: the key holds a value kvpool did not write")
                raise x
        if header is None:
            if size:
                raise CorruptEntryError(f"{where}: the entry has bytes but no header")
            return None
        info = decode_header(header, where)
        if size != info.size:
            raise CorruptEntryError(
                f"{where}: {size} payload bytes stored, the header announces {info.size}"
            )
        return info

    def _close(self) -> None:
        self._pool.disconnect()

    def __repr__(self) -> str:
        return f"<RedisStore {self.server}{' closed' if self._closed else ''}>"
