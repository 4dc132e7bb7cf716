"""The nodes of a Redis Cluster as one store sees them: seeds, a connection pool each, the slot map.

:func:`resolve_cluster` turns what the user gave (a ``redis-cluster://``
URL, a list of seeds, a ``redis.cluster.RedisCluster``) into seed
addresses and the connection options every node shares (password, TLS,
timeouts: a :class:`~kvpool.remote.redis.config.Target`, aimed at each node
with ``with_address``).  :class:`ClusterNodes` keeps one
:class:`~kvpool.remote.redis.connection.NodePool` per node (or the asyncio
store's pool class), opened on first use, and the current
:class:`~kvpool.remote.cluster.slots.SlotMap`, read with ``CLUSTER SLOTS``
from the first node that answers (:func:`slots_plan`, a plan the blocking
and the asyncio connections both serve).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import kvpool.remote.redis.wire as wire
from kvpool.errors import (
    InvalidArgumentError,
    KVPoolError,
    RemoteStoreError,
    StoreConnectionError,
    StoreTimeoutError,
)
from kvpool.remote.cluster.slots import Address, SlotMap, parse_cluster_slots
from kvpool.remote.redis.config import Target, import_redis, redact_url, resolve_target
from kvpool.remote.redis.connection import NodePool
from kvpool.remote.redis.opener import connector
from kvpool.remote.redis.resp import Limits, Reader, Send, Steps, command
from kvpool.remote.urls import CLUSTER_SCHEMES

__all__ = ["SCHEMES", "ClusterNodes", "resolve_cluster", "slot_map_from", "slots_plan"]

#: URL schemes of a cluster (the ``s`` ones use TLS), as every store spec reads them.
SCHEMES = CLUSTER_SCHEMES

_CLUSTER_SLOTS = command(b"CLUSTER", b"SLOTS")
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s:/@\[\]]+):([0-9]{1,5})")


def _address(text: str, where: str) -> Address:
    match = _HOST_PORT.fullmatch(text.strip())
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise InvalidArgumentError(f"{where}: {text!r} is not host:port")
    return match.group(1).strip("[]"), int(match.group(2))


def _from_url(url: str) -> tuple[list[Address], str]:
    shown = redact_url(url)
    scheme, _, rest = url.partition("://")
    userinfo, at, hosts_and_more = (
        rest.rpartition("@") if "@" in rest.split("/")[0] else ("", "", rest)
    )
    hosts, slash, tail = hosts_and_more.partition("/")
    query = ""
    if "?" in hosts:
        hosts, _, query = hosts.partition("?")
    if not hosts:
        raise InvalidArgumentError(
            f"cluster URL {shown!r} names no node; write redis-cluster://host1:port1,host2:port2"
        )
    seeds = [_address(h, f"cluster URL {shown!r}") for h in hosts.split(",")]
    path = urlsplit("//x/" + tail).path if slash else ""
    if path not in ("", "/", "/0"):
        raise InvalidArgumentError(f"cluster URL {shown!r}: a cluster has only database 0")
    tls = scheme.lower() in ("rediss-cluster", "valkeys-cluster")
    host, port = seeds[0]
    node = f"{'rediss' if tls else 'redis'}://{userinfo}{at}{_bracket(host)}:{port}"
    if query or "?" in tail:
        node += "?" + (query or tail.partition("?")[2])
    resolve_target(node)  # a malformed URL fails here, shown without its secrets
    return seeds, node


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def slots_plan(reader: Reader) -> Steps:
    """A plan asking ``CLUSTER SLOTS`` (then the end-of-call marker); it returns the raw reply."""
    nonce = wire.new_nonce()
    yield Send([_CLUSTER_SLOTS, wire.sentinel_command(nonce)])
    reply = yield from reader.reply()
    yield from wire.read_sentinel(reader, nonce)
    return reply


def slot_map_from(reply: Any, address: Address, where: str) -> SlotMap:
    """The :class:`SlotMap` of a ``CLUSTER SLOTS`` reply :func:`slots_plan` returned.

    Raises:
        RemoteStoreError: the node refused (not a cluster node) or answered nonsense.
    """
    if not isinstance(reply, list):
        raise RemoteStoreError(
            f"{where} answered {getattr(reply, 'text', reply)!r:.200}: is it a cluster node "
            "(cluster-enabled yes)?"
        )
    return parse_cluster_slots(reply, address)


def resolve_cluster(nodes: Any) -> tuple[list[Address], Any]:
    """Seed addresses, and one node as ``RedisStore`` takes it, from the user's ``nodes``.

    Returns:
        ``(seeds, node)``: ``node`` (a ``redis://`` URL with the cluster
        URL's credentials and options, or a ``redis.Redis`` client) carries
        the connection options every node shares; resolve it with
        :func:`~kvpool.remote.redis.config.resolve_target`.

    Raises:
        FeatureUnavailableError: the ``redis`` client is not installed.
        InvalidArgumentError: anything malformed (shown without secrets).
    """
    redis = import_redis()
    if isinstance(nodes, str):
        if nodes.split("://", 1)[0].lower() not in SCHEMES:
            raise InvalidArgumentError(
                f"{redact_url(nodes)!r} is not a cluster URL: write "
                "redis-cluster://host1:port1,host2:port2 (rediss-cluster:// for TLS)"
            )
        return _from_url(nodes)
    cluster_cls = getattr(getattr(redis, "cluster", None), "RedisCluster", None)
    if cluster_cls is not None and isinstance(nodes, cluster_cls):
        seeds = [(n.host, int(n.port)) for n in nodes.get_nodes()]
        default = nodes.get_default_node()
        if not seeds or default is None or default.redis_connection is None:
            raise InvalidArgumentError("the RedisCluster client knows no node yet")
        return seeds, default.redis_connection
    if isinstance(nodes, (list, tuple)) and nodes:
        seeds = []
        for node in nodes:
            if isinstance(node, str):
                seeds.append(_address(node, "seed node"))
            elif (
                isinstance(node, tuple)
                and len(node) == 2
                and isinstance(node[0], str)
                and isinstance(node[1], int)
            ):
                seeds.append(_address(f"{_bracket(node[0])}:{node[1]}", "seed node"))
            else:
                raise InvalidArgumentError(
                    f"a seed node is 'host:port' or (host, port), got {node!r}"
                )
        host, port = seeds[0]
        return seeds, f"redis://{_bracket(host)}:{port}"
    raise InvalidArgumentError(
        "nodes must be a redis-cluster:// URL, a non-empty list of 'host:port' or (host, port), "
        f"or a redis.cluster.RedisCluster; got {type(nodes).__name__}"
    )


class ClusterNodes:
    """Connection pools per node and the slot map of one cluster store.

    Thread safety: every method may be called from any thread; refreshes
    of the map run one at a time.

    Args:
        seeds: addresses to ask for the slot map first.
        target: the connection options of every node.
        connect_timeout: longest wait for one connection, seconds.
        max_connections: connections per node (None: no limit).
        limits: bounds on replies.
        map_error: ``(exc, where) -> kvpool error`` of the store.
        pool_class: the pool of one node's connections, made as
            ``pool_class(connect, label, max_connections)`` (:class:`NodePool`,
            or the asyncio store's ``AsyncNodePool``, whose store reads the
            map with :meth:`candidates`, :func:`slots_plan` and :meth:`accept`
            instead of :meth:`refresh`).
    """

    def __init__(
        self,
        seeds: list[Address],
        target: Target,
        connect_timeout: float,
        max_connections: int | None,
        limits: Limits,
        map_error: Callable[[BaseException, str], BaseException],
        pool_class: Callable[..., Any] = NodePool,
    ) -> None:
        self._seeds = list(dict.fromkeys(seeds))
        self._target = target
        self._connect_timeout = connect_timeout
        self._max = max_connections
        self._limits = limits
        self.map_error = map_error
        self._pool_class = pool_class
        self._pools: dict[Address, Any] = {}
        self._closed = False
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._map: SlotMap | None = None
        self.label = "cluster " + ",".join(f"{_bracket(h)}:{p}" for h, p in self._seeds)

    def pool(self, address: Address) -> Any:
        """The connection pool of one node (made on first use)."""
        pool = self._pools.get(address)
        if pool is not None:
            return pool
        with self._lock:
            pool = self._pools.get(address)
            if pool is None:
                target = self._target.with_address(*address)
                connect = connector(
                    target.connection_class,
                    target.options,
                    target.label,
                    self._connect_timeout,
                    self._limits,
                )
                pool = self._pools[address] = self._pool_class(connect, target.label, self._max)
                if self._closed:  # a redirect after close: its pool refuses, nothing stays open
                    pool.close()
            return pool

    def has_map(self) -> bool:
        """True once a slot map was read."""
        return self._map is not None

    def slot_map(self) -> SlotMap:
        """The current slot map (read one with :meth:`refresh` first)."""
        if self._map is None:
            raise RemoteStoreError(f"{self.label}: the slot map was not read yet")
        return self._map

    def refresh(self, deadline: float) -> SlotMap:
        """Read the slot map from the first node that answers (masters known, then seeds).

        Raises:
            StoreConnectionError / StoreTimeoutError: no node answered.
            RemoteStoreError: a node is not part of a cluster.
        """
        with self._refresh_lock:
            last: BaseException | None = None
            for address in self.candidates():
                try:
                    found = self._ask_slots(address, deadline)
                except KVPoolError as exc:
                    if not isinstance(exc, (StoreConnectionError, StoreTimeoutError)):
                        raise
                    last = exc
                    continue
                if self.accept(found):
                    return found
            raise self.no_map(last)

    def candidates(self) -> list[Address]:
        """The nodes to ask for the slot map, in order: the known masters, then the seeds."""
        known = self._map.masters if self._map is not None else []
        return list(dict.fromkeys([*known, *self._seeds]))

    def accept(self, found: SlotMap) -> bool:
        """Make ``found`` the current map if it names a master; True when it did."""
        if not found.masters:
            return False
        self._map = found
        return True

    def no_map(self, last: BaseException | None) -> StoreConnectionError | StoreTimeoutError:
        """The error of a refresh no node answered (``last``: the last node's error).

        A :class:`StoreTimeoutError` when the last node tried timed out (the
        nodes share the call's deadline: once it passed, every node left
        times out too), else a :class:`StoreConnectionError`.
        """
        if isinstance(last, StoreTimeoutError):
            return StoreTimeoutError(
                f"{self.label}: could not read the slot map (CLUSTER SLOTS) from any node in time "
                f"({last})"
            )
        return StoreConnectionError(
            f"{self.label}: could not read the slot map (CLUSTER SLOTS) from any node ({last})"
        )

    def _ask_slots(self, address: Address, deadline: float) -> SlotMap:
        pool = self.pool(address)
        where = f"CLUSTER SLOTS on {pool.label}"
        try:
            conn = pool.acquire(deadline)
        except BaseException as exc:
            raise self.map_error(exc, where) from None
        try:
            reply = conn.run(slots_plan(conn.reader), deadline)
        except BaseException as exc:
            pool.discard(conn)
            raise self.map_error(exc, where) from None
        pool.release(conn)
        return slot_map_from(reply, address, where)

    def close(self) -> None:
        """Close every node's idle connections."""
        with self._lock:
            self._closed = True
            pools = list(self._pools.values())
        for pool in pools:
            pool.close()
