"""AsyncRedisClusterStore: RedisClusterStore for asyncio code, on the same ops, routing and bytes.

Every call is the op :class:`~kvpool.remote.cluster.common.ClusterCommon`
builds for :class:`~kvpool.remote.cluster.store.RedisClusterStore`, routed
by the same decisions (keys grouped by the master of their slot; one
second chance after ``MOVED``/``ASK`` or an unreachable master, with the
slot map read again), so both stores route, redirect and fail alike and
write the same entries.  Only the I/O differs:

* each node's group runs as its own task on the event loop, pipelined on
  one connection of that node (an
  :class:`~kvpool.remote.redis.aio.AsyncConnection` from the node's
  :class:`~kvpool.remote.redis.aio.AsyncNodePool`): the masters of a batch
  work side by side, no thread per call;
* ``put`` sends each entry with ``sendmsg`` straight from the object's
  memory, ``get`` receives each value with ``recv_into`` straight into the
  new object, as :class:`~kvpool.remote.redis.aio.AsyncRedisStore` does;
* the slot map (``CLUSTER SLOTS``) is read on the loop too, once for all
  the calls that need it at the same moment.

Deadlines: ``timeout`` bounds each call in all - waiting for a
connection, opening one, reading the map again, redirects, every byte.

Cancellation: a cancelled call cancels its node tasks, each of which
closes its plan first (so a ``get`` frees the destination it was
receiving into) and then its connection; the objects a ``get`` had
already read are freed before the cancellation propagates.

Closing: :meth:`~AsyncRedisClusterStore.close` refuses new calls and
closes the idle connections at once; calls in flight end by their
deadlines and their connections are closed as they finish.
:meth:`~AsyncRedisClusterStore.aclose` also waits for them (at most
``timeout`` seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import torch

import kvpool.remote.redis.wire as wire
from kvpool.errors import RemoteStoreError, StoreConnectionError, StoreTimeoutError
from kvpool.formats import MemoryFormat
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.aiobase import AsyncRemoteStore
from kvpool.remote.base import Key, check_pairs, get_request, key_bytes, key_list, prefix_bytes
from kvpool.remote.cluster.common import (
    ClusterCommon,
    Groups,
    Op,
    free_object,
    lane_failed,
    lane_window,
)
from kvpool.remote.cluster.nodes import ClusterNodes, resolve_cluster, slot_map_from, slots_plan
from kvpool.remote.cluster.slots import Address
from kvpool.remote.header import EntryInfo
from kvpool.remote.objects import hold, release
from kvpool.remote.redis.aio import AsyncNodePool
from kvpool.remote.redis.common import DEFAULT_WINDOW, Plan, check_seconds
from kvpool.remote.redis.connection import now
from kvpool.remote.redis.prefix import delete_prefix_plan
from kvpool.remote.redis.resp import DEFAULT_LIMITS, Limits

__all__ = ["AsyncRedisClusterStore"]


def _observe(task: asyncio.Future[Any]) -> None:
    # A map read whose every waiter was cancelled: its error is nobody's, not a log line.
    if not task.cancelled():
        task.exception()


class AsyncRedisClusterStore(AsyncRemoteStore, ClusterCommon):
    """:class:`~kvpool.remote.cluster.store.RedisClusterStore` for asyncio: same options, awaited.

    Args:
        nodes: the seed nodes: ``"redis-cluster://[user:password@]h1:p1,h2:p2[?options]"``
            (``rediss-cluster://`` for TLS), a list of ``"host:port"`` or
            ``(host, port)``, or a ``redis.cluster.RedisCluster`` (its nodes
            and connection options are used).
        timeout: seconds one call may take in all (waiting for and opening
            connections, a map refresh and redirects included).
        connect_timeout: longest wait for one connection (default: ``timeout``).
        max_connections: connections open at once per node (None: no
            limit); a call waits for a free one until its deadline.

    ``prefix``, ``checksum``, ``ttl``, ``window`` and ``limits`` are as for
    ``RedisClusterStore``.

    Nothing is sent until the first call (``await store.ping()`` reads the
    slot map, so an unreachable cluster fails there).  Calls may run
    concurrently from many tasks of one event loop; each node task of a
    call takes a connection of its own.

    Raises:
        FeatureUnavailableError: the ``redis`` client is not installed.
        InvalidArgumentError: malformed seeds (shown without secrets) or a
            bad argument.
    """

    def __init__(
        self,
        nodes: Any = "redis-cluster://127.0.0.1:7000",
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
        seeds, first = resolve_cluster(nodes)
        self._configure(
            first,
            prefix=prefix,
            checksum=checksum,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_connections=max_connections,
            ttl=ttl,
            window=window,
            limits=limits,
        )
        connect = check_seconds("connect_timeout", connect_timeout, none_ok=True)
        self._nodes = ClusterNodes(
            seeds,
            self._target,
            connect or self.timeout,
            max_connections,
            limits,
            self._map_error,
            pool_class=AsyncNodePool,
        )
        self.server = self._nodes.label
        self._reading: asyncio.Task[None] | None = None
        self._busy = 0
        self._drained: list[asyncio.Future[None]] = []

    # -- the map -----------------------------------------------------

    async def ping(self) -> None:
        """Read the slot map now: checks that the cluster answers.

        Raises:
            StoreConnectionError / StoreTimeoutError: no node answered.
            RemoteStoreError: a node is not part of a cluster.
        """
        await self.refresh()

    async def refresh(self) -> None:
        """Read the slot map again now (normally done when the cluster says it changed).

        It raises what :meth:`ping` raises.
        """
        self._check_open()
        await self._refresh(now() + self.timeout)

    @property
    def masters(self) -> list[Address]:
        """The masters of the last slot map read (``(host, port)``)."""
        return list(self._nodes.slot_map().masters) if self._nodes.has_map() else []

    async def _refresh(self, deadline: float) -> None:
        """Read the map, sharing a read already under way on this loop."""
        loop = asyncio.get_running_loop()
        task = self._reading
        if task is None or task.done() or task.get_loop() is not loop:
            task = self._reading = loop.create_task(self._read_map(deadline))
            task.add_done_callback(_observe)
        # Shielded: one waiter's cancellation does not cancel the others' read.
        await asyncio.shield(task)

    async def _read_map(self, deadline: float) -> None:
        nodes = self._nodes
        last: BaseException | None = None
        for address in nodes.candidates():
            pool = nodes.pool(address)
            where = f"CLUSTER SLOTS on {pool.label}"
            try:
                reply = await self._serve(pool, slots_plan, deadline)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                mapped = self._map_error(exc, where)
                if not isinstance(mapped, (StoreConnectionError, StoreTimeoutError)):
                    raise mapped from None
                last = mapped
                continue
            if nodes.accept(slot_map_from(reply, address, where)):
                return
        raise nodes.no_map(last)

    @staticmethod
    async def _serve(pool: AsyncNodePool, plan: Plan, deadline: float) -> Any:
        """Run ``plan`` on a connection of ``pool`` (kept only after a clean end)."""
        conn = await pool.acquire(deadline)
        try:
            result = await conn.run(plan(conn.reader), deadline)
        except BaseException:
            pool.discard(conn)
            raise
        pool.release(conn)
        return result

    # -- the router --------------------------------------------------

    async def _route(self, action: str, op: Op) -> list[Any]:
        """Run ``op`` on every item; returns per item its value or a (kvpool) exception.

        On any error (a cancellation included) the objects read so far are
        freed before it propagates.
        """
        deadline = now() + self.timeout
        routing = self._routing(action, op)
        results: list[Any] = []
        self._busy += 1
        try:
            request = next(routing)
            while True:
                if isinstance(request, Groups):
                    results = request.results
                    await self._run_groups(action, op, request.groups, results, deadline)
                elif request.required:
                    await self._refresh(deadline)
                else:
                    with contextlib.suppress(RemoteStoreError):  # none answered: errors stand
                        await self._refresh(deadline)
                request = routing.send(None)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        except BaseException:
            for value in results:
                free_object(value)
            raise
        finally:
            self._left()

    def _left(self) -> None:
        """A call ended: wake the closes waiting for the last one."""
        self._busy -= 1
        if not self._busy:
            while self._drained:
                waiter = self._drained.pop()
                if not waiter.done():
                    waiter.set_result(None)

    async def _run_groups(
        self,
        action: str,
        op: Op,
        groups: dict[tuple[Address, bool], list[int]],
        results: list[Any],
        deadline: float,
    ) -> None:
        """Run each node's group, side by side as tasks (one group: in this task)."""
        items = list(groups.items())
        window = lane_window(op.window, len(items))
        if len(items) == 1:
            (address, asking), idx = items[0]
            await self._run_lane(action, op, address, asking, idx, results, deadline, window)
            return
        # Every lane finishes (or frees what it read) before this returns or
        # raises: gather waits for cancelled children, and lanes return their
        # errors in ``results`` rather than raising them.
        done = await asyncio.gather(
            *(
                self._run_lane(action, op, address, asking, idx, results, deadline, window)
                for (address, asking), idx in items
            ),
            return_exceptions=True,
        )
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _run_lane(
        self,
        action: str,
        op: Op,
        address: Address,
        asking: bool,
        idx: list[int],
        results: list[Any],
        deadline: float,
        window: int,
    ) -> None:
        """One node's group pipelined on one of its connections; results (or errors) per item."""
        pool = self._nodes.pool(address)
        where = f"{action} on {pool.label}"
        try:
            conn = await pool.acquire(deadline)
        except Exception as exc:
            error = self._map_error(exc, where)
            for i in idx:
                results[i] = error
            return
        out: list[Any] = []
        try:
            await conn.run(op.lane_plan(idx, asking, window, out)(conn.reader), deadline)
        except BaseException as exc:
            pool.discard(conn)
            if not isinstance(exc, Exception):  # cancelled: nobody will receive these
                for value in out:
                    free_object(value)
                raise
            lane_failed(out, idx, self._map_error(exc, where), results)
            return
        pool.release(conn)
        for i, value in zip(idx, out, strict=True):
            results[i] = value

    # -- the calls ---------------------------------------------------

    async def put(self, key: Key, memory_obj: MemoryObj, *, ttl: float | None = None) -> None:
        """Store ``memory_obj`` under ``key`` on its slot's master (as RedisClusterStore.put)."""
        await self.batched_put([key], [memory_obj], ttl=ttl)

    async def batched_put(
        self, keys: Sequence[Key], memory_objs: Sequence[MemoryObj], *, ttl: float | None = None
    ) -> None:
        """Store each object: grouped per master, the masters' groups pipelined side by side.

        It raises what :meth:`RedisClusterStore.batched_put` raises.
        """
        check_pairs(keys, memory_objs)
        kbs = key_list(keys)
        self._check_open()
        px = self._px_for(ttl)
        if not kbs:
            return
        action = "put" if len(kbs) == 1 else "batched_put"
        held: list[MemoryObj] = []
        try:
            for obj in memory_objs:
                hold(obj, action)
                held.append(obj)
            results = await self._route(action, self._put_op(kbs, held, px))
        finally:
            for obj in held:
                release(obj)
        self._put_result(action, kbs, results)

    async def get(
        self,
        key: Key,
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> MemoryObj | None:
        """Read ``key`` from its slot's master into a new object (as ``RedisClusterStore.get``)."""
        return (await self.batched_get([key], allocator, shapes, dtypes, fmt))[0]

    async def batched_get(
        self,
        keys: Sequence[Key],
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> list[MemoryObj | None]:
        """``get`` of each key: grouped per master, the masters' groups pipelined side by side.

        It raises what :meth:`RedisClusterStore.batched_get` raises; every object this call
        allocated is freed first (also when it is cancelled).
        """
        kbs = key_list(keys)
        self._check_open()
        layout, fmt = get_request(allocator, shapes, dtypes, fmt)
        if not kbs:
            return []
        action = "get" if len(kbs) == 1 else "batched_get"
        results = await self._route(action, self._get_op(action, kbs, allocator, layout, fmt))
        return self._get_result(results)

    async def exists(self, key: Key) -> bool:
        """True when ``key`` exists (see :meth:`RedisClusterStore.exists`)."""
        return (await self.batched_exists([key]))[0]

    async def batched_exists(self, keys: Sequence[Key]) -> list[bool]:
        """``exists`` for each key, grouped per master and pipelined."""
        kbs = key_list(keys)
        self._check_open()
        if not kbs:
            return []
        action = "exists" if len(kbs) == 1 else "batched_exists"
        counts = self._count_result(action, await self._route(action, self._exists_op(kbs)))
        return [bool(n) for n in counts]

    async def delete(self, key: Key) -> bool:
        """Remove ``key`` (see :meth:`RedisClusterStore.delete`)."""
        return (await self.batched_delete([key])) == 1

    async def batched_delete(self, keys: Sequence[Key]) -> int:
        """Remove every key (a ``DEL`` per slot, of at most 256 keys); how many existed."""
        kbs = key_list(keys)
        self._check_open()
        if not kbs:
            return 0
        action = "delete" if len(kbs) == 1 else "batched_delete"
        return sum(self._count_result(action, await self._route(action, self._delete_op(kbs))))

    async def delete_prefix(self, prefix: Key) -> int:
        """Remove every entry under ``prefix`` (see :meth:`RedisClusterStore.delete_prefix`)."""
        pb = prefix_bytes(prefix)
        self._check_open()
        deadline = now() + self.timeout
        removed = [0]
        failed: BaseException | None = None
        self._busy += 1
        try:
            if not self._nodes.has_map():
                await self._refresh(deadline)
            for address in self.masters:
                pool = self._nodes.pool(address)
                where = f"delete_prefix {pb!r} on {pool.label}"
                plan = delete_prefix_plan(self._prefix + pb, where, removed, one_key_each=True)
                try:
                    await self._serve(pool, plan, deadline)
                except Exception as exc:
                    failed = failed or self._map_error(exc, where)
        except StoreTimeoutError as exc:
            failed = exc
        finally:
            self._left()
        if failed is not None:
            raise self._cut_off(failed, removed[0]) from None
        return removed[0]

    async def head(self, key: Key) -> EntryInfo | None:
        """The stored header of ``key`` (see :meth:`RedisClusterStore.head`)."""
        kb = key_bytes(key)
        self._check_open()
        length = wire.HEAD_READ
        for _ in range(2):
            info = self._head_result(await self._route("head", self._head_op(kb, length)))
            if not isinstance(info, int):
                return info
            length = info  # a header longer than the first read
        raise self._head_grew(kb)

    # -- closing -----------------------------------------------------

    def _close(self) -> None:
        self._nodes.close()

    async def aclose(self) -> None:
        """:meth:`close`, then wait for the calls in flight to end (at most ``timeout`` s).

        Their connections are closed as they end; each ends by its own
        deadline, so this returns within ``timeout`` seconds.
        """
        self.close()
        if not self._busy:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drained.append(waiter)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter, self.timeout)

    def __repr__(self) -> str:
        return f"<AsyncRedisClusterStore {self.server}{' closed' if self._closed else ''}>"
