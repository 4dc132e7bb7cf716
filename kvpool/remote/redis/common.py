"""What the blocking and the asyncio Redis stores share: options, plans, errors.

:class:`RedisCommon` validates the stores' options, resolves where they
connect, names calls in messages, maps low-level errors to kvpool's and
builds every call as a *plan*: a generator that yields the commands to
send and the bytes it needs (:mod:`kvpool.remote.redis.resp`).  A plan is the
whole call - commands, replies, checks - without any I/O, so
:class:`~kvpool.remote.redis.store.RedisStore` serves it with a blocking
connection and :class:`~kvpool.remote.redis.aio.AsyncRedisStore` with an
event loop, and both behave the same byte for byte.

Each ``*_plan`` method returns ``reader -> plan`` (the plan needs the
connection's reader); the stores run it with their ``_call``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import kvpool.checks as checks
import kvpool.remote.redis.wire as wire
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
from kvpool.remote.base import Key, key_bytes
from kvpool.remote.header import Layout, key_tag
from kvpool.remote.objects import allocator_for, discard, encode_entry
from kvpool.remote.redis.config import Target, import_redis, resolve_target, scrub
from kvpool.remote.redis.connection import pipelined
from kvpool.remote.redis.opener import HandshakeRefused, connector
from kvpool.remote.redis.resp import (
    ErrorReply,
    Limits,
    ProtocolError,
    Reader,
    Send,
    ServerClosed,
    Steps,
)

__all__ = [
    "DEFAULT_WINDOW",
    "DEL_KEYS",
    "MAX_WINDOW",
    "WINDOW_BYTES",
    "SMALL_WINDOW",
    "Plan",
    "RedisCommon",
    "check_seconds",
    "check_window",
]

#: The batched forms keep about this many bytes of values in flight: the
#: window of ``SET``/``GET`` commands is ``WINDOW_BYTES // entry size``
#: (1 for 512 KiB entries, 64 for 8 KiB ones, at most :data:`MAX_WINDOW`).
#: Measured on loopback (``kvpool bench --only remote_put_get``): deeper
#: pipelines of large values run slower than a loop of single calls (the
#: values in flight no longer fit in the caches), small values gain from
#: deep ones.
WINDOW_BYTES = 512 << 10
#: Most ``SET``/``GET`` commands in flight at once.
MAX_WINDOW = 256
#: The ``window`` argument that picks the window from :data:`WINDOW_BYTES`.
DEFAULT_WINDOW = None
#: Small commands (``EXISTS``, ``DEL`` of up to :data:`DEL_KEYS` keys) in flight at once.
SMALL_WINDOW = 64
#: Keys per ``DEL`` command of ``batched_delete``.
DEL_KEYS = 256

#: ``reader -> plan``: a call, ready to be served on a connection.
Plan = Callable[[Reader], Steps]


def check_seconds(name: str, value: object, none_ok: bool = False) -> float | None:
    """Validate a duration in seconds (> 0).

    Raises:
        InvalidArgumentError: not a positive number (or None when allowed).
    """
    seconds = checks.check_seconds(name, value, allow_none=none_ok)
    if seconds is not None and seconds >= 1e9:
        raise InvalidArgumentError(f"{name} must be under 1e9 seconds, got {value!r}")
    return seconds


def check_window(value: object) -> int | None:
    """Validate a pipeline window (an int from 1 to 4096, or None: by bytes in flight).

    Raises:
        InvalidArgumentError: anything else.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise InvalidArgumentError(
            f"window must be an int from 1 to 4096 or None (by size), got {value!r}"
        )
    return value


class RedisCommon:
    """Options, plans and error mapping of a Redis-protocol store (a mixin).

    Attributes:
        server: the server as messages name it (``host:port/db``; no secret).
        timeout: seconds one call may take in all.
        ttl: seconds an entry lives after its ``put`` (None: forever).
    """

    server: str
    timeout: float
    ttl: float | None

    def _configure(
        self,
        url: Any,
        *,
        prefix: Key,
        checksum: bool,
        timeout: float,
        connect_timeout: float | None,
        max_connections: int | None,
        ttl: float | None,
        window: int | None,
        limits: Limits,
        allow_asyncio: bool = False,
    ) -> Callable[[float], Any]:
        """Validate the options; return the ``deadline -> RedisConnection`` connector.

        Raises:
            FeatureUnavailableError: the ``redis`` client is missing.
            InvalidArgumentError: a bad option or URL.
        """
        self._redis = import_redis()
        if isinstance(url, (bytes, int, float)) or url is None:
            raise InvalidArgumentError(
                f"url must be a str, a redis.Redis client or a ConnectionPool, got "
                f"{type(url).__name__}"
            )
        self.timeout = check_seconds("timeout", timeout)  # type: ignore[assignment]
        connect = check_seconds("connect_timeout", connect_timeout, none_ok=True)
        if max_connections is not None and (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise InvalidArgumentError(
                f"max_connections must be an int >= 1 or None, got {max_connections!r}"
            )
        self._max_connections = max_connections
        self._px = wire.ttl_ms(ttl)
        self.ttl = ttl
        self._window = check_window(window)
        if not isinstance(limits, Limits):
            raise InvalidArgumentError(f"limits must be a resp.Limits, got {limits!r}")
        self._prefix = key_bytes(prefix)
        self._checksum = checks.check_bool("checksum", checksum)
        self._target: Target = resolve_target(url, allow_asyncio=allow_asyncio)
        self.server = self._target.label
        return connector(
            self._target.connection_class,
            self._target.options,
            self.server,
            connect or self.timeout,
            limits,
        )

    # -- messages and errors ------------------------------------------

    def _where(self, action: str, kb: bytes | None) -> str:
        if kb is None:
            return f"{action} on {self.server}"
        return f"{action} {kb!r} on {self.server}"

    def _map_error(self, exc: BaseException, where: str) -> BaseException:
        """The kvpool error for a socket, protocol or client error (``exc`` itself if none)."""
        if isinstance(exc, ProtocolError) and not str(exc).startswith(where):
            # The parser does not know the call or the server: say which.
            return ProtocolError(f"{where}: {exc}")
        if isinstance(exc, KVPoolError):
            return exc
        errors = self._redis.exceptions
        text = scrub(str(exc), self._target.secrets)
        if isinstance(exc, (TimeoutError, errors.TimeoutError)):
            return StoreTimeoutError(f"{where}: no answer within {self.timeout} s ({text})")
        if isinstance(exc, HandshakeRefused):
            return StoreConnectionError(f"{where}: {text}")
        if isinstance(exc, (ServerClosed, ConnectionError, errors.ConnectionError)):
            return StoreConnectionError(f"{where}: connection failed or lost ({text})")
        if isinstance(exc, OSError):
            return StoreConnectionError(f"{where}: socket error ({text})")
        if isinstance(exc, errors.RedisError):
            return RemoteStoreError(f"{where}: {type(exc).__name__}: {text}")
        return exc

    @staticmethod
    def _cut_off(exc: BaseException, removed: int) -> BaseException:
        """A ``delete_prefix`` error, saying how many entries it removed before its deadline."""
        if isinstance(exc, StoreTimeoutError):
            return StoreTimeoutError(
                f"{exc}; {removed} entries were removed by then: call delete_prefix again to "
                "remove the rest (or give the store a longer timeout)"
            )
        return exc

    def _refused(self, reply: ErrorReply, action: str, kb: bytes | None) -> RemoteStoreError:
        return wire.refusal(reply, self._where(action, kb))

    def _px_for(self, ttl: float | None) -> int | None:
        return self._px if ttl is None else wire.ttl_ms(ttl)

    def _window_for(self, entry_bytes: int) -> int:
        """Values in flight for entries of ``entry_bytes`` (the store's ``window`` if set)."""
        if self._window is not None:
            return self._window
        return max(1, min(MAX_WINDOW, WINDOW_BYTES // max(1, entry_bytes)))

    # -- plans --------------------------------------------------------

    def _ping_plan(self) -> Plan:
        nonce = wire.new_nonce()
        where = self._where("ping", None)

        def plan(reader: Reader) -> Steps:
            yield Send((wire.sentinel_command(nonce),))
            yield from wire.read_sentinel(reader, nonce, where)

        return plan

    def _set_parts(self, kb: bytes, obj: MemoryObj, px: int | None) -> list[Any]:
        """``SET`` of ``obj`` under ``kb`` (the caller holds a reference on ``obj``)."""
        rkey = self._prefix + kb
        header, view = encode_entry(obj, self._checksum, key_tag(rkey))
        return wire.set_parts(rkey, header, view, px)

    def _put_plan(self, kbs: Sequence[bytes], objs: Sequence[MemoryObj], px: int | None) -> Plan:
        """``SET`` of each object (windowed), then the end-of-call marker (``wire``).

        The plan returns the server's refusals, one per key (None: stored).
        """
        commands = [self._set_parts(kb, obj, px) for kb, obj in zip(kbs, objs, strict=True)]
        nonce = wire.new_nonce()
        commands[-1].append(wire.sentinel_command(nonce))
        if len(commands) == 1:
            command = commands[0]
            where = self._where("put", kbs[0])

            def single(reader: Reader) -> Steps:
                yield Send(command)
                refused = yield from wire.read_ok(reader)
                yield from wire.read_sentinel(reader, nonce, where)
                return [refused]

            return single
        where = self._where("batched_put", kbs[0])
        window = self._window_for(sum(c[1].nbytes for c in commands) // len(commands))

        def plan(reader: Reader) -> Steps:
            replies: list[Any] = []
            yield from pipelined(
                len(commands), commands.__getitem__, lambda i: wire.read_ok(reader), window, replies
            )
            yield from wire.read_sentinel(reader, nonce, where)
            return replies

        return plan

    def _raise_refusals(self, action: str, kbs: Sequence[bytes], replies: list[Any]) -> None:
        for kb, refused in zip(kbs, replies, strict=True):
            if refused is not None:
                raise self._refused(refused, action, kb)

    def _get_plan(
        self,
        kb: bytes,
        allocator: MemoryAllocatorInterface,
        layout: Layout | None,
        fmt: MemoryFormat | None,
    ) -> Plan:
        """``GET``, read straight into a new object; the plan returns it (or None)."""
        rkey = self._prefix + kb
        nonce = wire.new_nonce()
        cmd = (wire.get_command(rkey), wire.sentinel_command(nonce))
        tag = key_tag(rkey)
        where = self._where("get", kb)
        keyed = allocator_for(allocator, kb)

        def plan(reader: Reader) -> Steps:
            yield Send(cmd)
            obj = yield from wire.read_entry(reader, where, tag, keyed, layout, fmt)
            try:
                yield from wire.read_sentinel(reader, nonce, where)
            except BaseException:
                discard(obj)
                raise
            return obj

        return plan

    def _batched_get_plan(
        self,
        kbs: Sequence[bytes],
        allocator: MemoryAllocatorInterface,
        layout: Layout | None,
        fmt: MemoryFormat | None,
        out: list[MemoryObj | None],
    ) -> Plan:
        """``GET`` of each key (windowed), then the end-of-call marker, into ``out``.

        The caller frees ``out`` on error.  The marker matters for misses:
        a late copy of an earlier ``$-1`` carries no key tag.
        """
        rkeys = [self._prefix + kb for kb in kbs]
        commands = [(wire.get_command(rkey),) for rkey in rkeys]
        nonce = wire.new_nonce()
        commands[-1] = (commands[-1][0], wire.sentinel_command(nonce))
        server = self.server
        where = self._where("batched_get", kbs[0])
        count = len(commands)
        window_for = self._window_for

        def plan(reader: Reader) -> Steps:
            def steps(i: int) -> Steps:
                where = f"batched_get {kbs[i]!r} on {server}"
                return wire.read_entry(
                    reader, where, key_tag(rkeys[i]), allocator_for(allocator, kbs[i]), layout, fmt
                )

            done = 0
            if layout is not None:
                window = window_for(layout.nbytes)
            else:  # the stored size decides: read entries alone until one exists
                window = 0
                while not window and done < count:
                    yield Send(commands[done])
                    obj = yield from steps(done)
                    out.append(obj)
                    done += 1
                    if obj is not None:
                        window = window_for(obj.get_size())
            if done < count:
                yield from pipelined(
                    count - done,
                    lambda i: commands[done + i],
                    lambda i: steps(done + i),
                    window or 1,
                    out,
                )
            yield from wire.read_sentinel(reader, nonce, where)
            return out

        return plan

    def _count_plan(self, action: str, commands: list[bytes], what: str, first: bytes) -> Plan:
        """Commands answered by counts (windowed), then the end-of-call marker.

        The plan returns the counts (or refusals), one per command.
        """
        nonce = wire.new_nonce()
        where = self._where(action, first)
        if len(commands) == 1:
            command = (commands[0], wire.sentinel_command(nonce))

            def single(reader: Reader) -> Steps:
                yield Send(command)
                count = yield from wire.read_count(reader, what)
                yield from wire.read_sentinel(reader, nonce, where)
                return [count]

            return single
        parts: list[tuple[bytes, ...]] = [(c,) for c in commands]
        parts[-1] = (commands[-1], wire.sentinel_command(nonce))

        def plan(reader: Reader) -> Steps:
            replies: list[Any] = []
            yield from pipelined(
                len(parts),
                parts.__getitem__,
                lambda i: wire.read_count(reader, what),
                SMALL_WINDOW,
                replies,
            )
            yield from wire.read_sentinel(reader, nonce, where)
            return replies

        return plan

    def _counts(self, action: str, first: bytes, replies: list[Any]) -> list[int]:
        for reply in replies:
            if isinstance(reply, ErrorReply):
                raise self._refused(reply, action, first)
        return replies

    def _exists_commands(self, kbs: Sequence[bytes]) -> list[bytes]:
        return [wire.exists_command(self._prefix + kb) for kb in kbs]

    def _delete_commands(self, kbs: Sequence[bytes]) -> list[bytes]:
        prefix = self._prefix
        return [
            wire.del_command(*(prefix + kb for kb in kbs[i : i + DEL_KEYS]))
            for i in range(0, len(kbs), DEL_KEYS)
        ]

    def _head_plan(self, kb: bytes) -> Plan:
        """``EXISTS``/``STRLEN``/``GETRANGE``; the plan returns the header (or None)."""
        rkey = self._prefix + kb
        tag = key_tag(rkey)
        where = self._where("head", kb)

        def plan(reader: Reader) -> Steps:
            length = wire.HEAD_READ
            for _ in range(2):
                nonce = wire.new_nonce()
                yield Send((wire.head_commands(rkey, length), wire.sentinel_command(nonce)))
                info = yield from wire.read_head(reader, where, tag)
                yield from wire.read_sentinel(reader, nonce, where)
                if not isinstance(info, int):
                    return info
                length = info  # a header longer than the first read
            raise ProtocolError(f"{where}: the header kept growing between two reads")

        return plan
