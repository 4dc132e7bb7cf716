"""RedisClusterStore: entries in a Redis (or Valkey) Cluster, routed by slot to the owning master.

Each key goes to the master that serves its slot (:mod:`kvpool.remote.cluster.slots`),
over kvpool's own connections to that node (:class:`~kvpool.remote.redis.connection.NodePool`),
with exactly the entry format, commands and copy-free paths of the
single-node :class:`~kvpool.remote.redis.store.RedisStore`
(:mod:`kvpool.remote.redis.wire`): ``SET`` of header + bytes sent from the
object's memory, ``GET`` received straight into the new object.  An entry
written by one store is read by the other, given the same key and prefix.

Routing
-------
* The slot map comes from ``CLUSTER SLOTS``, asked of a seed node when the
  store opens and again whenever the cluster says it changed.
* A batched call groups its keys by master; each group is pipelined on
  one connection of that master with a bounded window, and the groups run
  side by side from the caller's thread (every master has commands queued
  while the replies of the others are read; ``io_threads > 1`` gives each
  group a thread instead).
* ``-MOVED``: the slot moved; the key is retried once at the node named
  and the map is read again.  ``-ASK``: the slot is being migrated; the
  key is retried once at the node named, after ``ASKING``.  A key that
  is redirected again fails with :class:`~kvpool.errors.RemoteStoreError`.
* A master that cannot be reached (killed, restarting) fails its own keys
  with :class:`~kvpool.errors.StoreConnectionError` - within the timeout,
  since a refused or lost connection is seen at once - while the keys of
  the other masters go on.  The map is then read again, and a key whose
  slot has a new master (a replica promoted by failover) is retried there
  once; when the master comes back, the next call reaches it.

``batched_delete`` sends one ``DEL`` per slot (keys of one slot may share
a command; keys of different slots may not, ``CROSSSLOT``).

Errors are those of RedisStore; nothing is retried beyond the one
redirect or new master above.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

import kvpool.remote.redis.wire as wire
from kvpool.checks import check_bool
from kvpool.errors import RemoteStoreError, StoreTimeoutError
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
from kvpool.remote.cluster.common import (
    ClusterCommon,
    Groups,
    Op,
    lane_failed,
    lane_window,
)
from kvpool.remote.cluster.nodes import ClusterNodes, resolve_cluster
from kvpool.remote.cluster.route import Lane
from kvpool.remote.cluster.slots import Address
from kvpool.remote.header import EntryInfo
from kvpool.remote.objects import hold, release
from kvpool.remote.redis.common import DEFAULT_WINDOW, check_seconds
from kvpool.remote.redis.connection import now
from kvpool.remote.redis.prefix import delete_prefix_plan
from kvpool.remote.redis.resp import DEFAULT_LIMITS, Limits

__all__ = ["RedisClusterStore"]


class RedisClusterStore(RemoteStore, ClusterCommon):
    """A store of entries in a Redis or Valkey Cluster (see the module docstring).

    Args:
        nodes: the seed nodes: ``"redis-cluster://[user:password@]h1:p1,h2:p2[?options]"``
            (``rediss-cluster://`` for TLS; the query options of a
            ``redis://`` URL), a list of ``"host:port"`` or ``(host, port)``,
            or an existing ``redis.cluster.RedisCluster`` (its nodes and
            connection options are used; kvpool opens its own connections).
        prefix: prepended to every key (namespaces kvpool's entries).
        checksum: record a CRC-32 of every payload on ``put``.
        timeout: seconds one call may take in all (redirects, a map refresh
            and connecting included).
        connect_timeout: longest wait for one connection (default: ``timeout``).
        max_connections: connections open at once per node (None: no limit).
        ttl: seconds every entry lives after its ``put`` (None: forever).
        window: values in flight at once in a batched call, shared by the
            masters it reaches, each with at least one (None: about 512 KiB
            of values, as RedisStore).
        limits: bounds on replies (:class:`~kvpool.remote.redis.resp.Limits`).
        io_threads: run the per-node groups of a batched call on this many
            threads (1: one group after the other, in the caller's thread).
        ping: read the slot map now, so an unreachable cluster fails here.

    Raises:
        FeatureUnavailableError: the ``redis`` client is not installed.
        InvalidArgumentError: malformed seeds or a bad argument.
        StoreConnectionError / StoreTimeoutError: no seed node answered.

    Thread safety: every call takes connections of its own.
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
        io_threads: int = 1,
        ping: bool = True,
    ) -> None:
        super().__init__(io_threads)
        seeds, first = resolve_cluster(nodes)
        # The options every store of the Redis protocol takes, checked and
        # resolved for one node; each node's connections use them.
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
        )
        self.server = self._nodes.label
        if check_bool("ping", ping):
            self.refresh()

    # -- the map -----------------------------------------------------

    def refresh(self) -> None:
        """Read the slot map again now (normally done when the cluster says it changed).

        Raises:
            StoreConnectionError / StoreTimeoutError: no node answered.
        """
        self._check_open()
        self._nodes.refresh(now() + self.timeout)

    @property
    def masters(self) -> list[Address]:
        """The masters of the last slot map read (``(host, port)``)."""
        return list(self._nodes.slot_map().masters) if self._nodes.has_map() else []

    # -- the router --------------------------------------------------

    def _route(self, action: str, op: Op) -> list[Any]:
        """Run ``op`` on every item; returns per item its value or a (kvpool) exception."""
        deadline = now() + self.timeout
        routing = self._routing(action, op)
        try:
            request = next(routing)
            while True:
                if isinstance(request, Groups):
                    self._run_groups(action, op, request.groups, request.results, deadline)
                elif request.required:
                    self._nodes.refresh(deadline)
                else:
                    with contextlib.suppress(RemoteStoreError):  # none answered: errors stand
                        self._nodes.refresh(deadline)
                request = routing.send(None)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def _run_groups(
        self,
        action: str,
        op: Op,
        groups: dict[tuple[Address, bool], list[int]],
        results: list[Any],
        deadline: float,
    ) -> None:
        """Run each node's group: side by side in this thread, or on the I/O threads.

        The window is the call's, shared by its lanes (at least one command
        each in flight): a batch over *n* masters keeps about as many values
        in flight as RedisStore keeps on one server, not *n* times as many.
        """
        items = list(groups.items())
        window = lane_window(op.window, len(items))
        if len(items) > 1 and self._io_threads > 1:
            done = self._map(
                lambda g: self._run_lanes(action, op, [g], results, deadline, window), items
            )
            for outcome in done:
                if isinstance(outcome, BaseException):
                    raise outcome
        else:
            self._run_lanes(action, op, items, results, deadline, window)

    def _run_lanes(
        self,
        action: str,
        op: Op,
        items: list[tuple[tuple[Address, bool], list[int]]],
        results: list[Any],
        deadline: float,
        window: int,
    ) -> None:
        """Pipeline every group on a connection of its node, the lanes stepped in turn."""
        lanes: list[tuple[Lane, Any, list[int], str]] = []
        for (address, asking), idx in items:
            pool = self._nodes.pool(address)
            where = f"{action} on {pool.label}"
            try:
                conn = pool.acquire(deadline)
            except BaseException as exc:
                error = self._map_error(exc, where)
                for i in idx:
                    results[i] = error
                continue
            lane = self._lane(conn, op, idx, asking, deadline, window)
            try:
                lane.start()
            except BaseException as exc:
                self._lane_failed(lane, pool, idx, where, exc, results)
                continue
            lanes.append((lane, pool, idx, where))
        while lanes:
            for entry in list(lanes):
                lane, pool, idx, where = entry
                try:
                    done = lane.step()
                except BaseException as exc:
                    self._lane_failed(lane, pool, idx, where, exc, results)
                    lanes.remove(entry)
                    continue
                if done:
                    pool.release(lane.conn)
                    for i, value in zip(idx, lane.out, strict=True):
                        results[i] = value
                    lanes.remove(entry)

    @staticmethod
    def _lane(
        conn: Any, op: Op, idx: list[int], asking: bool, deadline: float, window: int
    ) -> Lane:
        nonce = wire.new_nonce()
        reader = conn.reader
        return Lane(
            conn,
            len(idx),
            op.lane_parts(idx, asking, nonce),
            op.lane_steps(reader, idx, asking),
            lambda: wire.read_sentinel(reader, nonce),
            window,
            deadline,
        )

    def _lane_failed(
        self,
        lane: Lane,
        pool: Any,
        idx: list[int],
        where: str,
        exc: BaseException,
        results: list[Any],
    ) -> None:
        """Drop the lane's connection; its keys get what was read, the rest the error."""
        pool.discard(lane.conn)
        lane_failed(lane.out, idx, self._map_error(exc, where), results)

    # -- put ---------------------------------------------------------

    def put(self, key: Key, memory_obj: MemoryObj, *, ttl: float | None = None) -> None:
        """Store ``memory_obj`` under ``key`` on its slot's master (see :meth:`RemoteStore.put`).

        It raises what :meth:`RedisStore.put` raises.
        """
        self.batched_put([key], [memory_obj], ttl=ttl)

    def batched_put(
        self, keys: Sequence[Key], memory_objs: Sequence[MemoryObj], *, ttl: float | None = None
    ) -> None:
        """Store each object under its key: grouped per master, pipelined in windows.

        Each entry is written atomically; after an error (raised once every
        master was tried), which entries were written is unspecified.

        It raises what :meth:`put` raises; the lists differing in length is an
        ``InvalidArgumentError`` (nothing is stored).
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
            results = self._route(action, self._put_op(kbs, held, px))
        finally:
            for obj in held:
                release(obj)
        self._put_result(action, kbs, results)

    # -- get ---------------------------------------------------------

    def get(
        self,
        key: Key,
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> MemoryObj | None:
        """Read ``key`` from its slot's master into a new object (see :meth:`RemoteStore.get`).

        It raises what :meth:`RedisStore.get` raises.
        """
        return self.batched_get([key], allocator, shapes, dtypes, fmt)[0]

    def batched_get(
        self,
        keys: Sequence[Key],
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> list[MemoryObj | None]:
        """``get`` for each key: grouped per master, pipelined in windows.

        Returns:
            One object (or None for a missing key) per key, in order.

        It raises what :meth:`get` raises; every object this call allocated is freed first.
        """
        kbs = key_list(keys)
        self._check_open()
        layout, fmt = get_request(allocator, shapes, dtypes, fmt)
        if not kbs:
            return []
        action = "get" if len(kbs) == 1 else "batched_get"
        results = self._route(action, self._get_op(action, kbs, allocator, layout, fmt))
        return self._get_result(results)

    # -- the rest ----------------------------------------------------

    def exists(self, key: Key) -> bool:
        """True when ``key`` exists (see :meth:`RemoteStore.exists`)."""
        return self.batched_exists([key])[0]

    def batched_exists(self, keys: Sequence[Key]) -> list[bool]:
        """``exists`` for each key, grouped per master and pipelined."""
        kbs = key_list(keys)
        self._check_open()
        if not kbs:
            return []
        action = "exists" if len(kbs) == 1 else "batched_exists"
        counts = self._count_result(action, self._route(action, self._exists_op(kbs)))
        return [bool(n) for n in counts]

    def delete(self, key: Key) -> bool:
        """Remove ``key`` (see :meth:`RemoteStore.delete`)."""
        return self.batched_delete([key]) == 1

    def batched_delete(self, keys: Sequence[Key]) -> int:
        """Remove every key (a ``DEL`` per slot, of at most 256 keys); returns how many existed."""
        kbs = key_list(keys)
        self._check_open()
        if not kbs:
            return 0
        action = "delete" if len(kbs) == 1 else "batched_delete"
        return sum(self._count_result(action, self._route(action, self._delete_op(kbs))))

    def delete_prefix(self, prefix: Key) -> int:
        """Remove every entry whose key starts with ``prefix``; how many were removed.

        As :meth:`RemoteStore.delete_prefix`, on every master of the slot
        map, one after the other: ``SCAN MATCH`` over the master's keys,
        one ``UNLINK`` per key found (:mod:`kvpool.remote.redis.prefix`).
        The whole call is bounded by ``timeout``, past which it raises
        ``StoreTimeoutError`` saying how many it removed.  A key moved to
        another master while the call runs may stay.  O(keys in the cluster).

        Raises:
            StoreConnectionError: a master cannot be reached (the others
                were cleared first).
        """
        pb = prefix_bytes(prefix)
        self._check_open()
        deadline = now() + self.timeout
        removed = [0]
        failed: BaseException | None = None
        try:
            if not self._nodes.has_map():
                self._nodes.refresh(deadline)
            for address in self.masters:
                pool = self._nodes.pool(address)
                where = f"delete_prefix {pb!r} on {pool.label}"
                plan = delete_prefix_plan(self._prefix + pb, where, removed, one_key_each=True)
                try:
                    conn = pool.acquire(deadline)
                except BaseException as exc:
                    failed = failed or self._map_error(exc, where)
                    continue
                try:
                    conn.run(plan(conn.reader), deadline)
                except BaseException as exc:
                    pool.discard(conn)
                    failed = failed or self._map_error(exc, where)
                    continue
                pool.release(conn)
        except StoreTimeoutError as exc:
            failed = exc
        if failed is not None:
            raise self._cut_off(failed, removed[0]) from None
        return removed[0]

    def head(self, key: Key) -> EntryInfo | None:
        """The stored header of ``key`` (see :meth:`RemoteStore.head`).

        It raises what :meth:`RedisStore.head` raises.
        """
        kb = key_bytes(key)
        self._check_open()
        length = wire.HEAD_READ
        for _ in range(2):
            info = self._head_result(self._route("head", self._head_op(kb, length)))
            if not isinstance(info, int):
                return info
            length = info  # a header longer than the first read
        raise self._head_grew(kb)

    def _close(self) -> None:
        self._nodes.close()

    def __repr__(self) -> str:
        return f"<RedisClusterStore {self.server}{' closed' if self._closed else ''}>"
