"""AsyncRedisStore: RedisStore for asyncio code, on the same plans and the same bytes path.

Every call is the plan :class:`~kvpool.remote.redis.common.RedisCommon`
builds for :class:`~kvpool.remote.redis.store.RedisStore`; here the event
loop serves it (:class:`AsyncConnection`): the socket is non-blocking, a
send is one ``sendmsg`` of the command with the object's memory as a
memoryview (no copy), a value is received with ``recv_into`` straight
into the destination (one copy), and when the socket is not ready the
call awaits its readiness (``loop.add_reader``/``add_writer``) until the
call's deadline.  No thread per call.

Many tasks may call one store at once: each call takes a connection of
its own (:class:`AsyncNodePool`, at most ``max_connections``), so many
concurrent ``get`` calls run in parallel on as many connections.
Connections are opened by :mod:`kvpool.remote.redis.opener` in a worker
thread (connecting is rare), within the call's deadline - which the loop
also stops waiting at - then driven by the loop.

A batched put of large values (each filling the pipeline window,
:data:`~kvpool.remote.redis.common.WINDOW_BYTES`, so one ``SET`` is in
flight at a time) runs in :data:`PUT_LANES` contiguous parts at once, each
on a connection of its own: while the server reads one part's value the
client's kernel copies the other's, where one connection leaves either
side idle in turn (see ``docs/measurements.md``).

Cancellation: a cancelled call closes its plan first - so a ``get``
frees its destination even with half its bytes received - and then
closes its connection (its position in the reply stream is unknown);
the next call opens a new one.  A connection opened for a call that was
cancelled meanwhile is closed when it arrives.
"""

from __future__ import annotations

import asyncio
import collections
import os
import ssl
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from kvpool.errors import StoreTimeoutError
from kvpool.formats import MemoryFormat
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.aiobase import AsyncRemoteStore, offload
from kvpool.remote.base import Key, check_pairs, get_request, key_bytes, key_list, prefix_bytes
from kvpool.remote.header import EntryInfo
from kvpool.remote.objects import discard, hold, let_go, release
from kvpool.remote.redis.common import DEFAULT_WINDOW, Plan, RedisCommon
from kvpool.remote.redis.connection import RedisConnection
from kvpool.remote.redis.prefix import delete_prefix_plan
from kvpool.remote.redis.resp import DEFAULT_LIMITS, Limits, Send, ServerClosed, Steps

__all__ = ["PUT_LANES", "AsyncConnection", "AsyncNodePool", "AsyncRedisStore"]

#: Connections a batched put of large values runs on at once (fewer when
#: ``max_connections`` is lower or the batch has fewer entries).
PUT_LANES = 2

_IOV_MAX = 512
_WOULD_BLOCK_READ = (BlockingIOError, InterruptedError, ssl.SSLWantReadError)
_WOULD_BLOCK_WRITE = (BlockingIOError, InterruptedError, ssl.SSLWantWriteError)
now = time.monotonic


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError("the call's deadline passed"))


class AsyncConnection:
    """A :class:`~kvpool.remote.redis.connection.RedisConnection` served by the running event loop.

    Not safe for two tasks at once (the pool gives each call its own).

    Args:
        conn: the connection (its socket is made non-blocking here).
    """

    __slots__ = ("_fd", "_ssl", "conn", "reader", "sock")

    def __init__(self, conn: RedisConnection) -> None:
        conn.sock.setblocking(False)  # the loop waits for readiness, never the kernel
        self.conn = conn
        self.sock = conn.sock
        self.reader = conn.reader
        self._fd = conn.sock.fileno()
        self._ssl = isinstance(conn.sock, ssl.SSLSocket)

    async def _ready(self, loop: asyncio.AbstractEventLoop, write: bool, deadline: float) -> None:
        """Await the socket's readiness; TimeoutError past the deadline."""
        remaining = deadline - now()
        if remaining <= 0:
            raise TimeoutError("the call's deadline passed")
        fut: asyncio.Future[None] = loop.create_future()
        fd = self._fd
        if write:
            loop.add_writer(fd, _wake, fut)
        else:
            loop.add_reader(fd, _wake, fut)
        timer = loop.call_later(remaining, _expire, fut)
        try:
            await fut
        finally:
            timer.cancel()
            if write:
                loop.remove_writer(fd)
            else:
                loop.remove_reader(fd)

    async def send(
        self, loop: asyncio.AbstractEventLoop, parts: Sequence[bytes | memoryview], deadline: float
    ) -> None:
        """Write every part in order (memoryviews are not copied)."""
        todo: list[bytes | memoryview] | None = [p for p in parts if len(p)]
        try:
            await self._send_all(loop, todo, deadline)  # type: ignore[arg-type]
        except BaseException:
            todo.clear()  # type: ignore[union-attr]  # views not kept by the traceback
            todo = parts = None  # type: ignore[assignment]
            raise

    async def _send_all(
        self, loop: asyncio.AbstractEventLoop, todo: list[bytes | memoryview], deadline: float
    ) -> None:
        if self._ssl:
            for part in todo:
                view = memoryview(part)
                while view.nbytes:
                    try:
                        view = view[self.sock.send(view) :]
                    except _WOULD_BLOCK_WRITE:
                        await self._ready(loop, True, deadline)
                    except ssl.SSLWantReadError:
                        await self._ready(loop, False, deadline)
            return
        sendmsg = self.sock.sendmsg
        i, count = 0, len(todo)
        while i < count:
            try:
                sent = sendmsg(todo[i : i + _IOV_MAX] if i or count > _IOV_MAX else todo)
            except _WOULD_BLOCK_WRITE:
                await self._ready(loop, True, deadline)
                continue
            while sent:
                size = len(todo[i])
                if sent >= size:
                    sent -= size
                    i += 1
                else:
                    todo[i] = memoryview(todo[i])[sent:]
                    sent = 0

    async def _fill(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        reader = self.reader
        view = reader.space()
        while True:
            try:
                n = self.sock.recv_into(view)
            except _WOULD_BLOCK_READ:
                await self._ready(loop, False, deadline)
                continue
            except ssl.SSLWantWriteError:
                await self._ready(loop, True, deadline)
                continue
            if n == 0:
                raise reader.closed()
            reader.commit(n)
            return

    async def _recv_exact(
        self, loop: asyncio.AbstractEventLoop, view: memoryview | None, deadline: float
    ) -> None:
        recv_into = self.sock.recv_into
        want, got = view.nbytes, 0  # type: ignore[union-attr]
        try:
            while got < want:
                try:
                    n = recv_into(view[got:] if got else view)  # type: ignore[index]
                except _WOULD_BLOCK_READ:
                    await self._ready(loop, False, deadline)
                    continue
                except ssl.SSLWantWriteError:
                    await self._ready(loop, True, deadline)
                    continue
                if n == 0:
                    raise ServerClosed("the server closed the connection in the middle of a value")
                got += n
        except BaseException:
            view = None  # not kept alive by the traceback (see run)
            raise

    async def run(self, steps: Steps, deadline: float) -> Any:
        """Serve a plan until it returns (see :meth:`RedisConnection.run`).

        On any error - a cancellation included - the plan is closed first
        (freeing what it allocated); the caller must drop the connection.
        """
        loop = asyncio.get_running_loop()
        try:
            want = steps.send(None)
            while True:
                if want is None:
                    await self._fill(loop, deadline)
                elif want.__class__ is Send:
                    await self.send(loop, want.parts, deadline)  # type: ignore[union-attr]
                else:
                    await self._recv_exact(loop, want, deadline)  # type: ignore[arg-type]
                want = steps.send(None)
        except StopIteration as stop:
            return stop.value
        except BaseException:
            # The traceback keeps this frame: drop the view it holds, so a
            # freed destination's memory is not held by a kept exception.
            want = None
            steps.close()
            raise

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


class AsyncNodePool:
    """The asyncio store's connections to one server (as :class:`~.connection.NodePool`).

    Connections are checked for unread bytes before reuse and kept only
    after a clean call.  Not thread-safe: use it from one event loop at a
    time.

    Args:
        connect: ``deadline -> RedisConnection`` (blocking; run in a thread).
        label: the server as messages name it.
        max_connections: most connections open at once (None: no limit).
    """

    def __init__(
        self,
        connect: Callable[[float], RedisConnection],
        label: str,
        max_connections: int | None = None,
    ) -> None:
        self._connect = connect
        self.label = label
        self._max = max_connections
        self._idle: list[AsyncConnection] = []
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._pid = os.getpid()
        self._closed = False
        self._opener = ThreadPoolExecutor(2, thread_name_prefix="kvpool-connect")

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def acquire(self, deadline: float) -> AsyncConnection:
        """A connection ready for a command (opened in a thread when none is idle).

        Raises:
            TimeoutError: none became free or could be opened before the deadline.
            ConnectionError / OSError / the ``redis`` client's errors.
        """
        while True:
            if self._pid != os.getpid():  # forked: the parent's sockets are not ours
                self._idle, self._open, self._pid = [], 0, os.getpid()
            if self._closed:
                raise ConnectionError(f"the connections to {self.label} were closed")
            if self._idle:
                conn = self._idle.pop()
                if conn.conn.idle():
                    return conn
                self.discard(conn)
                continue
            if self._max is not None and self._open >= self._max:
                await self._wait_for_one(deadline)
                continue
            self._open += 1
            try:
                return AsyncConnection(await self._open_one(deadline))
            except BaseException:
                self._open -= 1
                self._wake_one()
                raise

    async def _wait_for_one(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        remaining = deadline - now()
        timer = loop.call_later(max(remaining, 0), _expire, waiter)
        try:
            await waiter
        except TimeoutError:
            raise TimeoutError(f"all {self._max} connections to {self.label} stayed busy") from None
        finally:
            timer.cancel()

    async def _open_one(self, deadline: float) -> RedisConnection:
        # The connector keeps the deadline at each of its steps; waiting for
        # it no longer than the deadline covers what it cannot bound (name
        # resolution, a credential provider): a late connection is closed.
        opening = offload(
            self._opener, self._connect, deadline, on_orphan=lambda conn: conn.close()
        )
        try:
            return await asyncio.wait_for(opening, max(deadline - now(), 0.0))
        except asyncio.TimeoutError as exc:  # wait_for's (a bare one), or the connector's
            if exc.args:
                raise
            raise TimeoutError("the deadline passed while a connection was opened") from None

    def release(self, conn: AsyncConnection) -> None:
        """Give back a connection whose call ended cleanly (dropped if anything is unread)."""
        if conn.reader.pending() or self._closed or self._pid != os.getpid():
            self.discard(conn)
            return
        self._idle.append(conn)
        self._wake_one()

    def discard(self, conn: AsyncConnection) -> None:
        """Close a connection that must not be reused."""
        conn.close()
        if self._pid == os.getpid() and self._open > 0:
            self._open -= 1
        self._wake_one()

    def close(self) -> None:
        """Close the idle connections (those in use close when released)."""
        self._closed = True
        idle, self._idle = self._idle, []
        if self._pid == os.getpid():
            for conn in idle:
                conn.close()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        self._opener.shutdown(wait=False)


class AsyncRedisStore(AsyncRemoteStore, RedisCommon):
    """:class:`~kvpool.remote.redis.store.RedisStore` for asyncio: same options and calls, awaited.

    Args:
        url: a URL, a ``redis.Redis`` or ``redis.asyncio.Redis`` client, or
            either kind of ``ConnectionPool`` (their options are used).

    ``prefix``, ``checksum``, ``timeout``, ``connect_timeout``,
    ``max_connections``, ``ttl``, ``window`` and ``limits`` are as for
    ``RedisStore``.

    Nothing is sent until the first call (``await store.ping()`` checks
    the server).

    Raises:
        FeatureUnavailableError: the ``redis`` client is not installed.
        InvalidArgumentError: a malformed URL (shown without its secrets)
            or a bad argument.
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
    ) -> None:
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
            allow_asyncio=True,
        )
        self._pool = AsyncNodePool(connect, self.server, max_connections)

    async def _call(self, action: str, kb: bytes | None, plan: Plan) -> Any:
        deadline = now() + self.timeout
        try:
            conn = await self._pool.acquire(deadline)
        except BaseException as exc:
            mapped = self._map_error(exc, self._where(action, kb))
            if mapped is exc:
                raise
            raise mapped from None
        try:
            result = await conn.run(plan(conn.reader), deadline)
        except BaseException as exc:
            self._pool.discard(conn)
            mapped = self._map_error(exc, self._where(action, kb))
            if mapped is exc:
                raise
            raise mapped from None
        self._pool.release(conn)
        return result

    async def ping(self) -> None:
        """Check that the server answers (see :meth:`RedisStore.ping`)."""
        self._check_open()
        await self._call("ping", None, self._ping_plan())

    async def put(self, key: Key, memory_obj: MemoryObj, *, ttl: float | None = None) -> None:
        """Store ``memory_obj`` under ``key`` with one ``SET`` (see :meth:`RedisStore.put`)."""
        kb = key_bytes(key)
        self._check_open()
        px = self._px_for(ttl)
        hold(memory_obj, "put")
        try:
            replies = await self._call("put", kb, self._put_plan((kb,), (memory_obj,), px))
        finally:
            release(memory_obj)
        self._raise_refusals("put", (kb,), replies)

    async def batched_put(
        self, keys: Sequence[Key], memory_objs: Sequence[MemoryObj], *, ttl: float | None = None
    ) -> None:
        """Store each object, pipelined in windows (see :meth:`RedisStore.batched_put`)."""
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
            lanes = self._lanes(kbs, held)
            if lanes > 1:
                replies = await self._put_in_lanes(kbs, held, px, lanes)
            else:
                plan = self._put_plan(kbs, memory_objs, px)
                replies = await self._call(f"batched_put of {len(kbs)} keys, first", kbs[0], plan)
        finally:
            for obj in held:
                release(obj)
        self._raise_refusals("batched_put", kbs, replies)

    def _lanes(self, kbs: list[bytes], objs: list[MemoryObj]) -> int:
        """Connections a batched put of ``objs`` under ``kbs`` runs on (see the module notes).

        One when a key repeats: on one connection the last of its values
        wins, as in a put without lanes; across two either could.
        """
        count = len(kbs)
        most = min(PUT_LANES, count, self._max_connections or PUT_LANES)
        if most < 2 or self._window_for(sum(o.get_size() for o in objs) // count) > 1:
            return 1
        if len(set(kbs)) != count:
            return 1
        return most

    async def _put_in_lanes(
        self, kbs: list[bytes], objs: list[MemoryObj], px: int | None, lanes: int
    ) -> list[Any]:
        """The replies of a batched put run in ``lanes`` contiguous parts at once.

        Every part is sent even when another fails; then the first failure
        (in the batch's order) is raised.
        """
        bounds = [(i * len(kbs) // lanes, (i + 1) * len(kbs) // lanes) for i in range(lanes)]
        outcomes = await asyncio.gather(
            *(
                self._call(
                    f"batched_put of {len(kbs)} keys, part of {b - a} from",
                    kbs[a],
                    self._put_plan(kbs[a:b], objs[a:b], px),
                )
                for a, b in bounds
            ),
            return_exceptions=True,
        )
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        for other in failed[1:]:
            let_go(other)  # dropped: its frames hold no views of the objects
        if failed:
            raise failed[0]
        return [reply for part in outcomes for reply in part]

    async def get(
        self,
        key: Key,
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> MemoryObj | None:
        """Read ``key`` into a new object with one ``GET`` (see :meth:`RedisStore.get`)."""
        kb = key_bytes(key)
        self._check_open()
        layout, fmt = get_request(allocator, shapes, dtypes, fmt)
        return await self._call("get", kb, self._get_plan(kb, allocator, layout, fmt))  # type: ignore[no-any-return]

    async def batched_get(
        self,
        keys: Sequence[Key],
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> list[MemoryObj | None]:
        """``get`` for each key, pipelined in windows (see :meth:`RedisStore.batched_get`)."""
        kbs = key_list(keys)
        self._check_open()
        layout, fmt = get_request(allocator, shapes, dtypes, fmt)
        if not kbs:
            return []
        out: list[MemoryObj | None] = []
        plan = self._batched_get_plan(kbs, allocator, layout, fmt, out)
        try:
            return await self._call(f"batched_get of {len(kbs)} keys, first", kbs[0], plan)  # type: ignore[no-any-return]
        except BaseException:
            for obj in out:
                discard(obj)
            raise

    async def _count(
        self, action: str, kbs: list[bytes], commands: list[bytes], what: str
    ) -> list[int]:
        plan = self._count_plan(action, commands, what, kbs[0])
        label = action if len(kbs) == 1 else f"{action} of {len(kbs)} keys, first"
        return self._counts(action, kbs[0], await self._call(label, kbs[0], plan))

    async def exists(self, key: Key) -> bool:
        """True when ``key`` exists (see :meth:`RedisStore.exists`)."""
        kb = key_bytes(key)
        self._check_open()
        return bool((await self._count("exists", [kb], self._exists_commands([kb]), "EXISTS"))[0])

    async def batched_exists(self, keys: Sequence[Key]) -> list[bool]:
        """``exists`` for each key, pipelined."""
        kbs = key_list(keys)
        self._check_open()
        if not kbs:
            return []
        counts = await self._count("batched_exists", kbs, self._exists_commands(kbs), "EXISTS")
        return [bool(n) for n in counts]

    async def delete(self, key: Key) -> bool:
        """Remove ``key`` (see :meth:`RedisStore.delete`)."""
        kb = key_bytes(key)
        self._check_open()
        return bool((await self._count("delete", [kb], self._delete_commands([kb]), "DEL"))[0])

    async def batched_delete(self, keys: Sequence[Key]) -> int:
        """Remove every key (one ``DEL`` per 256 keys, pipelined); how many existed."""
        kbs = key_list(keys)
        self._check_open()
        if not kbs:
            return 0
        return sum(await self._count("batched_delete", kbs, self._delete_commands(kbs), "DEL"))

    async def delete_prefix(self, prefix: Key) -> int:
        """Remove every entry under ``prefix``; how many (see :meth:`RedisStore.delete_prefix`)."""
        pb = prefix_bytes(prefix)
        self._check_open()
        removed = [0]
        plan = delete_prefix_plan(self._prefix + pb, self._where("delete_prefix", pb), removed)
        try:
            return await self._call("delete_prefix", pb, plan)  # type: ignore[no-any-return]
        except StoreTimeoutError as exc:
            raise self._cut_off(exc, removed[0]) from None

    async def head(self, key: Key) -> EntryInfo | None:
        """The stored header of ``key`` (see :meth:`RedisStore.head`)."""
        kb = key_bytes(key)
        self._check_open()
        return await self._call("head", kb, self._head_plan(kb))  # type: ignore[no-any-return]

    def _close(self) -> None:
        self._pool.close()

    def __repr__(self) -> str:
        return f"<AsyncRedisStore {self.server}{' closed' if self._closed else ''}>"
