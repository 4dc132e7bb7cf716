"""Forward kvpool's pin events and statistics to LMCache's monitors.

Inside LMCache, a memory object's pins are watched by LMCache's
``PinMonitor`` (which force-unpins objects pinned past the engine's
``pin_timeout_sec``) and counted by its ``LMCStatsMonitor`` (the
``pinned_memory_objs_count``, ``forced_unpin_count``, local cache usage and
active object gauges of its metrics).  kvpool objects report to kvpool's
:class:`~kvpool.PinMonitor`; :class:`LMCacheMonitorBridge` listens there and
passes every event on:

=======================  ==================================================
kvpool event             LMCache call
=======================  ==================================================
first pin of an object   ``LMCStatsMonitor.update_pinned_memory_objs_count(1)``
every pin                ``PinMonitor.on_pin(obj)`` (restarts its clock)
no longer pinned         ``update_pinned_memory_objs_count(-1)``,
                         ``PinMonitor.on_unpin(obj)``
forced unpin (kvpool's)  ``update_forced_unpin_count(1)``
pool usage changed       ``update_local_cache_usage(bytes)``,
                         ``update_active_memory_objs_count(n)``, summed
                         over every pool made since :func:`connect`
=======================  ==================================================

LMCache's ``PinMonitor`` exists once an engine made it from its config
(``PinMonitor.GetOrCreate(config)``); before that, pins are counted but
not timed (LMCache itself would fail the pin with "config is required").
Its forced unpins call the object's own ``unpin()``, which kvpool handles
as any other unpin, and it counts them itself.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

__all__ = ["LMCacheMonitorBridge", "connect", "current_bridge"]

logger = logging.getLogger("kvpool")

_bridge: LMCacheMonitorBridge | None = None


class LMCacheMonitorBridge:
    """A kvpool :class:`~kvpool.PinMonitor` listener that reports to LMCache.

    The LMCache singletons are looked up on every event (LMCache's tests
    destroy and re-create them), never cached.

    Thread safety: the per-pool usage table has a lock of its own; LMCache's
    monitors take theirs.
    """

    def __init__(self) -> None:
        from lmcache.observability import LMCStatsMonitor
        from lmcache.v1.pin_monitor import PinMonitor

        self._stats_monitor = LMCStatsMonitor
        self._pin_monitor = PinMonitor
        self._lock = threading.Lock()
        self._usage: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()

    def _lmcache_pin_monitor(self) -> Any:
        # GetOrCreate() without a config asserts while no engine made the
        # monitor; its singleton attribute says whether one exists.
        if self._pin_monitor._instance is None:
            return None
        return self._pin_monitor.GetOrCreate()

    def on_pin(self, obj: Any, first: bool) -> None:
        """A pin of ``obj`` (``first``: it was not pinned before)."""
        if first:
            self._stats_monitor.GetOrCreate().update_pinned_memory_objs_count(1)
        monitor = self._lmcache_pin_monitor()
        if monitor is not None:
            monitor.on_pin(obj)

    def on_unpin(self, obj: Any) -> None:
        """``obj`` is no longer pinned."""
        self._stats_monitor.GetOrCreate().update_pinned_memory_objs_count(-1)
        monitor = self._lmcache_pin_monitor()
        if monitor is not None:
            monitor.on_unpin(obj)

    def on_forced_unpin(self, obj: Any) -> None:
        """kvpool's own monitor unpinned the overdue ``obj``."""
        self._stats_monitor.GetOrCreate().update_forced_unpin_count(1)

    def on_pool_usage(self, policy: Any) -> None:
        """A pool's usage changed (called under its lock): push the totals."""
        with self._lock:
            if policy.closed:
                self._usage.pop(policy, None)
            else:
                self._usage[policy] = (policy.total_allocated_size, policy.num_active_allocations)
            used = sum(u for u, _ in self._usage.values())
            active = sum(a for _, a in self._usage.values())
        stats = self._stats_monitor.GetOrCreate()
        stats.update_local_cache_usage(used)
        stats.update_active_memory_objs_count(active)


def current_bridge() -> LMCacheMonitorBridge | None:
    """The connected bridge, or None before :func:`connect`."""
    return _bridge


def connect() -> LMCacheMonitorBridge:
    """Attach the bridge to kvpool's monitor (idempotent).

    kvpool's own pin-timeout thread is switched off: inside LMCache, its
    ``PinMonitor`` enforces the engine's timeout.  Pools made from now on
    report their usage to the bridge.

    Returns:
        The bridge.
    """
    global _bridge
    from kvpool.pool.monitor import PinMonitor, set_usage_listener

    if _bridge is None:
        _bridge = LMCacheMonitorBridge()
    monitor = PinMonitor.GetOrCreate()
    monitor.add_listener(_bridge)
    monitor.configure(enabled=False)
    set_usage_listener(_bridge.on_pool_usage)
    return _bridge
