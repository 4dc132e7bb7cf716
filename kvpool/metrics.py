"""Prometheus metrics: every live pool's statistics and every open store's counters.

::

    import kvpool.metrics

    server = kvpool.metrics.start_http_server(9400)   # http://127.0.0.1:9400/metrics
    ...
    server.close()

or, in a process that already serves ``prometheus_client``'s default
registry (as serving engines do)::

    kvpool.metrics.install()

Needs ``prometheus_client`` (``pip install 'kvpool[metrics]'``).

Nothing is counted on the allocation path: a scrape asks each open pool
for its :class:`~kvpool.pool.interface.PoolStats` (exact, under the pool's
lock) and each open store for its
:class:`~kvpool.remote.counters.StoreCounters`.  Pools and stores are
found in weak registries, so a pool or store that is closed or garbage
collected leaves the output at the next scrape.

Pool metrics (gauges; labels ``pool`` = the class, ``name``, ``backing``
= what the memory is, ``policy`` = extent or paged):

======================================  ==============================================
``kvpool_pool_total_bytes``             bytes the pool manages
``kvpool_pool_used_bytes``              bytes held by live objects
``kvpool_pool_free_bytes``              bytes free for new objects
``kvpool_pool_view_held_bytes``         bytes of freed objects still held by views
                                        (0 where the pool does not report it)
``kvpool_pool_objects``                 live objects
``kvpool_pool_pinned_objects``          live objects with a pin
``kvpool_pool_largest_free_block_bytes`` largest allocation that can succeed now
``kvpool_pool_fragmentation_ratio``     ``PoolStats.fragmentation``
``kvpool_pools``                        open pools (no labels)
======================================  ==============================================

Store metrics (labels ``store`` = the class, ``name``; ``op`` where given):

======================================  ==============================================
``kvpool_store_puts_total``             entries stored (put and batched_put)
``kvpool_store_gets_total``             entries looked up (get and batched_get)
``kvpool_store_get_misses_total``       of those, keys that were absent
``kvpool_store_put_bytes_total``        payload bytes stored
``kvpool_store_get_bytes_total``        payload bytes read back
``kvpool_store_operations_total``       entries handled, by ``op``
``kvpool_store_errors_total``           failed calls, by ``op`` and ``type``
``kvpool_store_latency_seconds``        call latency histogram, by ``op``
======================================  ==============================================
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterator
from typing import Any

try:
    import prometheus_client
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.registry import Collector, CollectorRegistry
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "kvpool.metrics needs prometheus_client: pip install 'kvpool[metrics]'"
    ) from exc

from kvpool.errors import InvalidArgumentError
from kvpool.pool.monitor import live_pools
from kvpool.remote.base import live_stores
from kvpool.remote.counters import LATENCY_BUCKETS

__all__ = [
    "VIEW_HELD_FIELDS",
    "KVPoolCollector",
    "MetricsServer",
    "install",
    "pool_labels",
    "watch",
    "default_registry",
    "start_http_server",
]

#: The :class:`~kvpool.pool.interface.PoolStats` field with the bytes held only
#: by views of freed objects; the first one present is exported (0 when
#: the pool's statistics have none).
VIEW_HELD_FIELDS = ("held_by_views_bytes",)

_POOL_LABELS = ["pool", "name", "backing", "policy"]
_STORE_LABELS = ["store", "name"]

# Pool names for pools without a shared-memory name: stable for the
# pool's life, unique in the process.
_pool_names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
# Owners of store counters that are not stores (see watch()).
_watched: weakref.WeakSet[Any] = weakref.WeakSet()
_pool_numbers = itertools.count()
_names_lock = threading.Lock()


def pool_labels(pool: Any) -> dict[str, str]:
    """The labels a pool's metrics carry: ``pool``, ``name``, ``backing``, ``policy``.

    ``name`` is the pool's shared-memory name, else ``"<class>-<n>"``,
    unique in the process and stable for the pool's life.
    """
    return dict(zip(_POOL_LABELS, _pool_labels(pool), strict=True))


def _pool_labels(pool: Any) -> list[str]:
    try:
        info = pool.describe()
    except Exception:  # a pool closing under us still gets a name
        info = {}
    kind = str(pool)
    name = info.get("shm_name")
    if not name:
        with _names_lock:
            name = _pool_names.get(pool)
            if name is None:
                name = _pool_names[pool] = f"{kind}-{next(_pool_numbers)}"
    return [kind, str(name), str(info.get("kind", "")), str(info.get("policy", ""))]


def _view_held(stats: Any) -> int:
    for field in VIEW_HELD_FIELDS:
        value = getattr(stats, field, None)
        if value is not None:
            return int(value)
    return 0


class KVPoolCollector(Collector):
    """A ``prometheus_client`` collector over the live pools and open stores.

    Each :meth:`collect` reads them afresh; see the module docstring for
    the metrics.  Register it in any ``CollectorRegistry``.
    """

    def collect(self) -> Iterator[Any]:
        """Yield the metric families of one scrape."""
        yield from self._pool_families()
        yield from self._store_families()

    def describe(self) -> list[Any]:
        """Nothing: the families depend on what is alive at scrape time."""
        return []

    @staticmethod
    def _pool_families() -> Iterator[Any]:
        gauges = {
            key: GaugeMetricFamily(f"kvpool_pool_{key}", doc, labels=_POOL_LABELS)
            for key, doc in (
                ("total_bytes", "Bytes the pool manages."),
                ("used_bytes", "Bytes held by the pool's live objects."),
                ("free_bytes", "Bytes free for new objects."),
                ("view_held_bytes", "Bytes of freed objects still held by views."),
                ("objects", "Live objects in the pool."),
                ("pinned_objects", "Live objects with a pin count above zero."),
                ("largest_free_block_bytes", "Largest allocation that can succeed now."),
                (
                    "fragmentation_ratio",
                    "Extent pools: 1 - largest free block / free bytes; paged pools: 0.",
                ),
            )
        }
        count = 0
        for pool in live_pools():
            try:
                stats = pool.stats()
            except Exception:  # closed between the listing and the question
                continue
            count += 1
            labels = _pool_labels(pool)
            values = {
                "total_bytes": stats.total_bytes,
                "used_bytes": stats.used_bytes,
                "free_bytes": stats.free_bytes,
                "view_held_bytes": _view_held(stats),
                "objects": stats.active_objects,
                "pinned_objects": stats.pinned_objects,
                "largest_free_block_bytes": stats.largest_free_block,
                "fragmentation_ratio": stats.fragmentation,
            }
            for key, value in values.items():
                gauges[key].add_metric(labels, value)
        yield from gauges.values()
        yield GaugeMetricFamily("kvpool_pools", "Open kvpool pools in this process.", value=count)

    @staticmethod
    def _store_families() -> Iterator[Any]:
        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=[*_STORE_LABELS, *extra])

        puts = counter("kvpool_store_puts", "Entries stored (put and batched_put).")
        gets = counter("kvpool_store_gets", "Entries looked up (get and batched_get).")
        misses = counter("kvpool_store_get_misses", "Entries looked up that were absent.")
        put_bytes = counter("kvpool_store_put_bytes", "Payload bytes stored.")
        get_bytes = counter("kvpool_store_get_bytes", "Payload bytes read back.")
        ops = counter("kvpool_store_operations", "Entries handled, by operation.", ("op",))
        errors = counter(
            "kvpool_store_errors", "Failed calls, by operation and type.", ("op", "type")
        )
        latency = HistogramMetricFamily(
            "kvpool_store_latency_seconds",
            "Latency of store calls, by operation.",
            labels=[*_STORE_LABELS, "op"],
        )
        bounds = [repr(float(b)) for b in LATENCY_BUCKETS] + ["+Inf"]
        for store in [*live_stores(), *(w for w in list(_watched) if not w.closed)]:
            counters = getattr(store, "counters", None)
            if counters is None:
                continue
            labels = [counters.kind, counters.name]
            snapshot = counters.snapshot()
            totals = dict.fromkeys(("puts", "gets", "misses", "put_bytes", "get_bytes"), 0)
            for op, c in snapshot.items():
                ops.add_metric([*labels, op], c.entries)
                for kind, n in sorted(c.errors.items()):
                    errors.add_metric([*labels, op, kind], n)
                cumulative = list(itertools.accumulate(c.buckets))
                latency.add_metric(
                    [*labels, op], list(zip(bounds, cumulative, strict=True)), c.seconds
                )
                if op in ("put", "batched_put"):
                    totals["puts"] += c.entries
                    totals["put_bytes"] += c.nbytes
                elif op in ("get", "batched_get"):
                    totals["gets"] += c.entries
                    totals["misses"] += c.misses
                    totals["get_bytes"] += c.nbytes
            puts.add_metric(labels, totals["puts"])
            gets.add_metric(labels, totals["gets"])
            misses.add_metric(labels, totals["misses"])
            put_bytes.add_metric(labels, totals["put_bytes"])
            get_bytes.add_metric(labels, totals["get_bytes"])
        yield from (puts, gets, misses, put_bytes, get_bytes, ops, errors, latency)


def watch(owner: Any) -> None:
    """Export the ``owner.counters`` of something that counts like a store but is not one.

    For example the LMCache plugin's connector.  Exported like an open
    store's counters while ``owner.closed`` is False; held weakly.
    """
    with _lock:
        _watched.add(owner)


_registry: CollectorRegistry | None = None
_installed: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


def default_registry() -> CollectorRegistry:
    """kvpool's own registry: the :class:`KVPoolCollector` and the process metrics.

    Made on first use; the same object afterwards.
    """
    global _registry
    with _lock:
        if _registry is None:
            reg = CollectorRegistry()
            reg.register(KVPoolCollector())
            prometheus_client.ProcessCollector(registry=reg)
            _registry = reg
        return _registry


def install(target: CollectorRegistry | None = None) -> CollectorRegistry:
    """Add a :class:`KVPoolCollector` to ``target`` (default: prometheus_client's
    default registry), once; returns ``target``.

    Use it where the process already serves a registry, so kvpool's
    metrics appear next to the engine's.
    """
    target = prometheus_client.REGISTRY if target is None else target
    with _lock:
        if target not in _installed:
            target.register(KVPoolCollector())
            _installed.add(target)
    return target


class MetricsServer:
    """An HTTP server for ``/metrics`` on a daemon thread (from :func:`start_http_server`).

    Attributes:
        addr: the address it listens on.
        port: the port it listens on (the one the system chose for port 0).
        url: ``http://addr:port/metrics``.
    """

    def __init__(self, server: Any, thread: threading.Thread, addr: str) -> None:
        self._server = server
        self._thread = thread
        self.addr = addr
        self.port: int = server.server_address[1]
        host = f"[{addr}]" if ":" in addr else addr
        self.url = f"http://{host}:{self.port}/metrics"

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving and close the socket.  Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        self._thread.join(timeout)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._server is None else "serving"
        return f"<MetricsServer {state} {self.url}>"


def start_http_server(
    port: int, addr: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> MetricsServer:
    """Serve the metrics at ``http://addr:port/metrics`` from a daemon thread.

    Args:
        port: TCP port; 0 lets the system choose (read it from ``.port``).
        addr: address to listen on; the default keeps the metrics on this
            machine (give ``"0.0.0.0"`` for a scraper elsewhere).
        registry: what to serve (default: :func:`default_registry`).

    Returns:
        The :class:`MetricsServer`; ``close()`` stops it.

    Raises:
        InvalidArgumentError: the port is not an int in 0..65535.
        OSError: the address cannot be bound (in use, not local...).
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidArgumentError(f"port must be an int in 0..65535, got {port!r}")
    reg = default_registry() if registry is None else registry
    server, thread = prometheus_client.start_http_server(port, addr=addr, registry=reg)
    return MetricsServer(server, thread, addr)
