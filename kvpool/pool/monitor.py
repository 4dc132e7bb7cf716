"""Process-wide monitors: pinned objects, and the pools' statistics.

:class:`PinMonitor` records which memory objects are pinned and since
when, reports those pinned longer than a timeout and, if asked, unpins
them.  Its background thread runs only while something is pinned and
monitoring is on; :meth:`PinMonitor.stop` leaves no thread behind.

:class:`StatsMonitor` gathers :class:`~kvpool.pool.interface.PoolStats` from
every open pool on demand.  Pools are not told about each allocation (no
hot-path cost): the monitor asks them, and each answers from its own
state under its own lock, so every figure is exact.  A bridge that must
push usage to another project's metrics sets a *usage listener*
(:func:`set_usage_listener`); pools made afterwards call it, under their
lock, after every allocation and free.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from kvpool.checks import check_bool, check_callable, check_seconds

__all__ = [
    "PinMonitor",
    "PinnedReport",
    "StatsMonitor",
    "live_pools",
    "register_pool",
    "set_usage_listener",
    "usage_listener",
]

logger = logging.getLogger("kvpool")


@dataclass(frozen=True)
class PinnedReport:
    """One object pinned longer than the timeout.

    Attributes:
        obj: the memory object.
        pinned_for: seconds since it was first pinned.
        pin_count: its pin count when reported.
    """

    obj: Any
    pinned_for: float
    pin_count: int


class PinMonitor:
    """Tracks pinned memory objects and reports the ones pinned too long.

    Use the process-wide instance: ``PinMonitor.GetOrCreate()``.  Memory
    objects call :meth:`on_pin` and :meth:`on_unpin` themselves.

    Configuration (:meth:`configure`, or an LMCache engine config given to
    :meth:`GetOrCreate`): ``timeout`` seconds after which a pinned object is
    reported (default 300), ``interval`` between checks (default 10 s),
    ``force_unpin`` (default True, as in LMCache: an overdue object loses its
    pins, which frees it if nothing references it; False only reports), and
    an optional ``on_timeout`` callback receiving each :class:`PinnedReport`.
    Forced unpins are counted by :class:`StatsMonitor`.

    Listeners (:meth:`add_listener`) hear of every recorded pin, unpin and
    forced unpin; a bridge uses them to report kvpool objects to another
    project's monitors (see :mod:`kvpool.integrations.lmcache`).

    Thread safety: all methods may be called from any thread.  The
    background thread is started by the first pin (while monitoring is
    enabled) and exits on its own once nothing is pinned.  Listeners are
    called outside the monitor's lock, possibly under the pool's lock of
    the object, so they must not call back into that pool.
    """

    _instance: ClassVar[PinMonitor | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        timeout: float = 300.0,
        interval: float = 10.0,
        force_unpin: bool = True,
        on_timeout: Callable[[PinnedReport], None] | None = None,
        enabled: bool = True,
    ) -> None:
        self._cond = threading.Condition()
        self._pinned: dict[int, tuple[Any, float]] = {}
        self._reported: set[int] = set()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.timeout: float = check_seconds("timeout", timeout)  # type: ignore[assignment]
        self.interval: float = check_seconds("interval", interval)  # type: ignore[assignment]
        self.force_unpin = check_bool("force_unpin", force_unpin)
        self.on_timeout = check_callable("on_timeout", on_timeout, allow_none=True)
        self.enabled = check_bool("enabled", enabled)
        self._listeners: tuple[Any, ...] = ()

    @classmethod
    def GetOrCreate(cls, config: Any = None, metadata: Any = None) -> PinMonitor:
        """Return the process-wide monitor, creating it on first use.

        Args:
            config: optional; an LMCache-style engine config whose
                ``pin_timeout_sec`` and ``pin_check_interval_sec`` become the
                monitor's timeout and interval (on every call that gives one).
            metadata: accepted for LMCache's signature (it labels LMCache's
                metrics); unused.

        Raises:
            ValueError: the config's timeout or interval is not a positive number.
        """
        inst = cls._instance
        if inst is None:
            with cls._instance_lock:
                if cls._instance is None:
                    cls._instance = cls()
                inst = cls._instance
        if config is not None:
            inst.configure(
                timeout=getattr(config, "pin_timeout_sec", None),
                interval=getattr(config, "pin_check_interval_sec", None),
            )
        return inst

    def configure(
        self,
        *,
        timeout: float | None = None,
        interval: float | None = None,
        force_unpin: bool | None = None,
        on_timeout: Callable[[PinnedReport], None] | None = None,
        enabled: bool | None = None,
    ) -> None:
        """Change the settings (only the arguments given).

        Raises:
            InvalidArgumentError: a timeout or interval that is not a finite
                positive number of seconds, a flag that is not a bool, or an
                ``on_timeout`` that cannot be called (all ``ValueError``).
        """
        timeout = check_seconds("timeout", timeout, allow_none=True)
        interval = check_seconds("interval", interval, allow_none=True)
        if force_unpin is not None:
            force_unpin = check_bool("force_unpin", force_unpin)
        if enabled is not None:
            enabled = check_bool("enabled", enabled)
        check_callable("on_timeout", on_timeout, allow_none=True)
        with self._cond:
            if timeout is not None:
                self.timeout = timeout
            if interval is not None:
                self.interval = interval
            if force_unpin is not None:
                self.force_unpin = force_unpin
            if on_timeout is not None:
                self.on_timeout = on_timeout
            if enabled is not None:
                self.enabled = enabled
            self._cond.notify_all()
        self._ensure_thread()

    # -- listeners --------------------------------------------------------

    def add_listener(self, listener: Any) -> None:
        """Tell ``listener`` of every pin event from now on (no-op if already added).

        ``listener`` has ``on_pin(obj, first)`` (``first``: the pin that
        made the object pinned), ``on_unpin(obj)`` (the object is no longer
        pinned: last unpin, freed or its pool closed) and
        ``on_forced_unpin(obj)`` (this monitor unpinned an overdue object).
        """
        with self._cond:
            if listener not in self._listeners:
                self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: Any) -> None:
        """Stop telling ``listener`` (no-op if it was not added)."""
        with self._cond:
            self._listeners = tuple(x for x in self._listeners if x is not listener)

    # -- events from memory objects -------------------------------------

    def on_pin(self, obj: Any) -> None:
        """Record a pin of ``obj`` (the first pin starts its clock)."""
        with self._cond:
            key = id(obj)
            first = key not in self._pinned
            if first:
                self._pinned[key] = (obj, time.monotonic())
            listeners = self._listeners
        for listener in listeners:
            listener.on_pin(obj, first)
        self._ensure_thread()

    def on_unpin(self, obj: Any) -> None:
        """Record that ``obj`` is no longer pinned."""
        with self._cond:
            key = id(obj)
            known = self._pinned.pop(key, None) is not None
            self._reported.discard(key)
            if not self._pinned:
                self._cond.notify_all()  # lets the thread exit now
            listeners = self._listeners if known else ()
        for listener in listeners:
            listener.on_unpin(obj)

    def forget_owner(self, owner: Any) -> int:
        """Forget every pinned object whose pool is ``owner`` (a closed pool).

        The objects are dead with their pool, so their pin counts drop to 0:
        a monitor that unpins "while pinned" (LMCache's) cannot loop on them.

        Returns:
            How many objects were forgotten.
        """
        with self._cond:
            gone = [
                (k, obj)
                for k, (obj, _) in self._pinned.items()
                if getattr(obj, "owner", None) is owner
            ]
            for key, obj in gone:
                del self._pinned[key]
                self._reported.discard(key)
                meta = getattr(obj, "record", None)
                if meta is not None:
                    meta.pin_count = 0
            if not self._pinned:
                self._cond.notify_all()
            listeners = self._listeners
        for _, obj in gone:
            for listener in listeners:
                listener.on_unpin(obj)
        return len(gone)

    # -- queries ----------------------------------------------------------

    def pinned_count(self) -> int:
        """Objects currently recorded as pinned."""
        with self._cond:
            return len(self._pinned)

    def get_monitored_count(self) -> int:
        """Objects currently recorded as pinned (LMCache's name)."""
        return self.pinned_count()

    def overdue(self, timeout: float | None = None) -> list[PinnedReport]:
        """Objects pinned for longer than ``timeout`` (default: the configured one).

        Raises:
            InvalidArgumentError: ``timeout`` is not a finite number of seconds >= 0.
        """
        limit = (
            self.timeout if timeout is None else check_seconds("timeout", timeout, allow_zero=True)
        )
        now = time.monotonic()
        with self._cond:
            entries = list(self._pinned.values())
        out = []
        for obj, since in entries:
            age = now - since
            if age > limit:
                meta = getattr(obj, "_meta", None) or getattr(obj, "meta", None)
                out.append(PinnedReport(obj, age, getattr(meta, "pin_count", 0)))
        return out

    def check(self) -> list[PinnedReport]:
        """Report (and, if configured, unpin) overdue objects once; returns them.

        Each object is logged once per pinning; with ``force_unpin`` every
        pin it holds is dropped (which frees it if nothing references it).
        """
        reports = self.overdue()
        for report in reports:
            key = id(report.obj)
            with self._cond:
                first = key not in self._reported
                self._reported.add(key)
            if first:
                logger.warning(
                    "memory object %s has been pinned for %.1f s (timeout %.1f s)%s",
                    repr(report.obj),
                    report.pinned_for,
                    self.timeout,
                    "; unpinning it" if self.force_unpin else "",
                )
                if self.on_timeout is not None:
                    self.on_timeout(report)
            if self.force_unpin:
                StatsMonitor.GetOrCreate()._count_forced_unpin()
                for listener in self._listeners:
                    listener.on_forced_unpin(report.obj)
                for _ in range(max(report.pin_count, 1)):
                    if not report.obj.unpin():
                        break
        return reports

    # -- the background thread ------------------------------------------

    @property
    def running(self) -> bool:
        """True while the background thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _ensure_thread(self) -> None:
        with self._cond:
            if not self.enabled or not self._pinned or self._stopping:
                return
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(
                target=self._run, name="kvpool-pin-monitor", daemon=True
            )
            self._thread.start()

    def _idle(self) -> bool:
        """True when the thread has nothing to watch (the caller holds the lock)."""
        return self._stopping or not self.enabled or not self._pinned

    def _run(self) -> None:
        while True:
            with self._cond:
                # wait_for tests before it waits: a stop() or a last unpin that
                # came before this thread first reached the wait is not lost.
                if self._cond.wait_for(self._idle, self.interval):
                    self._thread = None
                    return
            try:
                self.check()
            except Exception:  # keep monitoring; the error is logged
                logger.exception("PinMonitor check failed")

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the background thread and wait for it (pins stay recorded).

        The thread starts again with the next pin.

        Raises:
            InvalidArgumentError: ``timeout`` is not None or a finite number
                of seconds > 0.
        """
        timeout = check_seconds("timeout", timeout, allow_none=True)
        with self._cond:
            thread = self._thread
            self._stopping = True
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            self._stopping = False
            if self._thread is thread:
                self._thread = None

    def reset(self) -> None:
        """Stop the thread and forget every pin (for tests)."""
        self.stop()
        with self._cond:
            self._pinned.clear()
            self._reported.clear()


_pools: weakref.WeakSet[Any] = weakref.WeakSet()
_pools_lock = threading.Lock()
_usage_listener: Callable[[Any], None] | None = None


def set_usage_listener(listener: Callable[[Any], None] | None) -> Callable[[Any], None] | None:
    """Have pools made from now on call ``listener(policy)`` when their usage changes.

    The call comes under the pool's lock after every allocation and free, and
    at close; ``policy`` offers ``closed``, ``total_allocated_size`` and
    ``num_active_allocations``.
    The listener must be quick and must not call back into the pool.

    Returns:
        The previous listener (None: there was none).
    """
    global _usage_listener
    previous, _usage_listener = _usage_listener, listener
    return previous


def usage_listener() -> Callable[[Any], None] | None:
    """The listener set by :func:`set_usage_listener`, or None."""
    return _usage_listener


def register_pool(pool: Any) -> None:
    """Add a pool to the process-wide registry read by :class:`StatsMonitor`.

    The registry holds pools weakly: it never keeps one alive.  A pool
    must offer ``closed`` (bool) and ``stats()``.
    """
    with _pools_lock:
        _pools.add(pool)


def live_pools() -> list[Any]:
    """The registered pools of this process that are not closed (for monitoring)."""
    with _pools_lock:
        return [p for p in _pools if not p.closed]


class StatsMonitor:
    """Statistics of every open pool of the process, gathered on demand.

    Use the process-wide instance: ``StatsMonitor.GetOrCreate()``.
    """

    _instance: ClassVar[StatsMonitor | None] = None
    _instance_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._forced_unpins = 0

    @property
    def forced_unpin_count(self) -> int:
        """Objects the :class:`PinMonitor` force-unpinned since the process started."""
        with self._lock:
            return self._forced_unpins

    def _count_forced_unpin(self) -> None:
        with self._lock:
            self._forced_unpins += 1

    @classmethod
    def GetOrCreate(cls) -> StatsMonitor:
        """Return the process-wide monitor."""
        if cls._instance is None:
            with cls._instance_lock:
                if cls._instance is None:
                    cls._instance = cls()
        return cls._instance

    def snapshot(self) -> dict[str, Any]:
        """``{"<pool name>#<n>": PoolStats}`` for every open pool, plus totals.

        Returns:
            A dict with one entry per pool and a ``"total"`` entry summing
            bytes, objects and pins; the pinned-object count also comes
            from the :class:`PinMonitor`, and ``forced_unpins`` counts its
            forced unpins.
        """
        out: dict[str, Any] = {}
        totals = {"total_bytes": 0, "used_bytes": 0, "active_objects": 0, "pinned_objects": 0}
        for index, pool in enumerate(live_pools()):
            try:
                stats = pool.stats()
            except Exception:  # closed meanwhile
                continue
            out[f"{pool}#{index}"] = stats
            for key in totals:
                totals[key] += getattr(stats, key)
        totals["pinned_in_monitor"] = PinMonitor.GetOrCreate().pinned_count()
        totals["forced_unpins"] = self.forced_unpin_count
        out["total"] = totals
        return out
