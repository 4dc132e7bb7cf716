"""What a store counts: calls, entries, bytes, misses, errors by type, latency histograms.

Every :class:`~kvpool.remote.base.RemoteStore` has one
:class:`StoreCounters` (``store.counters``).  The base class feeds it
without any help from the stores: it wraps each store's ``put``,
``get``, ``exists``, ``delete``, ``head`` and their batched forms (those
a store defines itself as well as the base's), and each *outermost* call
is recorded once.  A call made from inside another counted call of the
same store (``super().put``, or the base's batched forms calling ``put``
per key, threaded or not) is not counted again, so a batch of 8 puts
counts 8 entries once, however the store implements it.

A store that moves entries outside these methods (say, a background
flush) reports them itself with one ``self.counters.observe(...)`` per
call.

Thread safety and cost: each thread records into a shard of its own
(no lock on the call path: a few additions, about a microsecond);
:meth:`StoreCounters.snapshot` adds the shards up under the counters'
lock.  Once the calls have returned, a snapshot is exact; taken during
calls on other threads, it may miss the ones still being recorded.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvpool.remote.objects import let_go

__all__ = [
    "LATENCY_BUCKETS",
    "OPERATIONS",
    "OpCounts",
    "StoreCounters",
    "counted_calls",
    "counted_method",
]

#: The calls a store counts.  A batched call counts one call and
#: ``len(keys)`` entries.
OPERATIONS = (
    "put",
    "get",
    "exists",
    "delete",
    "head",
    "batched_put",
    "batched_get",
    "batched_exists",
    "batched_delete",
    "delete_prefix",
)

#: Upper bounds (seconds) of the latency histogram buckets; one more
#: bucket takes everything slower.  From 20 µs (a file put on /dev/shm)
#: to 10 s (a remote store under a timeout).
LATENCY_BUCKETS: tuple[float, ...] = (
    20e-6,
    50e-6,
    100e-6,
    250e-6,
    500e-6,
    1e-3,
    2.5e-3,
    5e-3,
    10e-3,
    25e-3,
    50e-3,
    100e-3,
    250e-3,
    500e-3,
    1.0,
    2.5,
    10.0,
)

_NBUCKETS = len(LATENCY_BUCKETS) + 1
_bucket = bisect.bisect_left
_names = itertools.count()

# A shard's row for one operation: calls, seconds, entries, bytes, misses,
# then one count per latency bucket.
_CALLS, _SECONDS, _ENTRIES, _BYTES, _MISSES, _FIRST_BUCKET = range(6)


@dataclass(slots=True)
class OpCounts:
    """The counts of one operation (a copy, in :meth:`StoreCounters.snapshot`).

    Attributes:
        calls: calls that returned or raised.
        entries: entries the successful calls handled (1 per single call,
            ``len(keys)`` per batched call, the entries removed by
            ``delete_prefix``).
        nbytes: payload bytes moved by the successful calls (put: stored,
            get: read back).
        misses: keys a successful get found absent (``None`` returned).
        errors: failed calls by exception type name.
        buckets: calls per latency bucket (``len(LATENCY_BUCKETS) + 1``,
            not cumulative; the last one is above the largest bound).
        seconds: total seconds of all calls.
    """

    calls: int = 0
    entries: int = 0
    nbytes: int = 0
    misses: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    buckets: list[int] = field(default_factory=lambda: [0] * _NBUCKETS)
    seconds: float = 0.0


class _Shard:
    """One thread's counts for one store (only that thread writes it)."""

    __slots__ = ("depth", "errors", "rows")

    def __init__(self) -> None:
        self.depth = 0
        self.rows: dict[str, list[Any]] = {}
        self.errors: dict[tuple[str, str], int] = {}

    def record(self, op: str, seconds: float, entries: int, nbytes: int, misses: int) -> None:
        row = self.rows.get(op)
        if row is None:
            row = self.rows[op] = [0, 0.0, 0, 0, 0] + [0] * _NBUCKETS
        row[_CALLS] += 1
        row[_SECONDS] += seconds
        row[_ENTRIES] += entries
        row[_BYTES] += nbytes
        row[_MISSES] += misses
        row[_FIRST_BUCKET + _bucket(LATENCY_BUCKETS, seconds)] += 1

    def record_error(self, op: str, seconds: float, kind: str) -> None:
        self.record(op, seconds, 0, 0, 0)
        key = (op, kind)
        self.errors[key] = self.errors.get(key, 0) + 1


class StoreCounters:
    """The counters of one store.

    Args:
        kind: the store's kind (its class name, e.g. ``"FileStore"``).
        name: a name for reports; default ``"<kind>-<n>"`` with ``n``
            unique in the process.

    Attributes:
        kind: as given.
        name: as given or made.

    Read the counts with :meth:`snapshot` (``{op: OpCounts}``, copies);
    ``repr()`` shows them in one line.
    """

    def __init__(self, kind: str, name: str | None = None) -> None:
        self.kind = kind
        self.name = name if name is not None else f"{kind}-{next(_names)}"
        self._lock = threading.Lock()
        self._local = threading.local()
        self._shards: list[_Shard] = []

    def shard(self) -> _Shard:
        """The calling thread's shard (made on its first call)."""
        try:
            return self._local.shard  # type: ignore[no-any-return]
        except AttributeError:
            shard = self._local.shard = _Shard()
            with self._lock:
                self._shards.append(shard)  # kept after the thread ends
            return shard

    def observe(
        self,
        op: str,
        seconds: float,
        *,
        entries: int = 1,
        nbytes: int = 0,
        misses: int = 0,
        error: BaseException | None = None,
    ) -> None:
        """Record one call of ``op`` that took ``seconds``.

        Args:
            op: the call, one of :data:`OPERATIONS` (or a store's own name).
            seconds: its duration.
            entries: entries it handled (ignored when it failed).
            nbytes: payload bytes it moved (ignored when it failed).
            misses: keys it found absent (ignored when it failed).
            error: the exception it raised, if any (counted by type name).
        """
        if error is None:
            self.shard().record(op, seconds, entries, nbytes, misses)
        else:
            self.shard().record_error(op, seconds, type(error).__name__)

    def run_nested(self, fn: Callable[[Any], Any], item: Any) -> Any:
        """``fn(item)`` with this thread's calls counted as part of an outer one.

        For a store's worker threads running the pieces of a batched call
        (the batch is counted; its pieces are not counted again).
        """
        shard = self.shard()
        depth = shard.depth
        shard.depth = depth + 1
        try:
            return fn(item)
        finally:
            shard.depth = depth

    def snapshot(self) -> dict[str, OpCounts]:
        """The counts so far, per operation.

        Returns:
            ``{op: OpCounts}`` for every operation called at least once
            (``"put"``, ``"get"``, ``"batched_get"``... see
            :data:`OPERATIONS`); an operation never called is absent.  The
            :class:`OpCounts` are copies: later calls do not change them,
            and changing them does not change the counters.  For example::

                counts = store.counters.snapshot()
                get = counts.get("get")
                if get is not None:
                    hit_rate = 1 - get.misses / max(get.entries, 1)
                    mean_s = get.seconds / get.calls

        Exact once the calls have returned; taken while other threads are
        in calls, it may miss the ones still being recorded.  Costs one
        pass over the threads' shards (O(threads x operations)).
        """
        out: dict[str, OpCounts] = {}
        with self._lock:
            shards = list(self._shards)
        for shard in shards:
            for op, row in list(shard.rows.items()):
                counts = out.get(op)
                if counts is None:
                    counts = out[op] = OpCounts()
                row = list(row)  # one read of a row another thread may be adding to
                counts.calls += row[_CALLS]
                counts.seconds += row[_SECONDS]
                counts.entries += row[_ENTRIES]
                counts.nbytes += row[_BYTES]
                counts.misses += row[_MISSES]
                for i in range(_NBUCKETS):
                    counts.buckets[i] += row[_FIRST_BUCKET + i]
            for (op, kind), n in list(shard.errors.items()):
                errors = out.setdefault(op, OpCounts()).errors
                errors[kind] = errors.get(kind, 0) + n
        return out

    def __repr__(self) -> str:
        """The counts at a glance, one clause per operation called.

        E.g. ``<StoreCounters FileStore-0: put calls=2 entries=2 bytes=16384;
        get calls=3 entries=3 misses=1 bytes=16384 errors=CorruptEntryError:1>``;
        zero counts other than ``calls`` are left out.
        """
        counts = self.snapshot()
        if not counts:
            return f"<StoreCounters {self.name}: no calls>"
        ordered = [op for op in OPERATIONS if op in counts]
        ordered += sorted(op for op in counts if op not in OPERATIONS)
        clauses = []
        for op in ordered:
            c = counts[op]
            parts = [op, f"calls={c.calls}"]
            parts += [
                f"{label}={n}"
                for label, n in (("entries", c.entries), ("misses", c.misses), ("bytes", c.nbytes))
                if n
            ]
            if c.errors:
                parts.append("errors=" + ",".join(f"{k}:{n}" for k, n in sorted(c.errors.items())))
            clauses.append(" ".join(parts))
        return f"<StoreCounters {self.name}: {'; '.join(clauses)}>"


def payload_bytes(obj: Any) -> int:
    """Bytes an object carries (``get_size()``), 0 for None or a dead object."""
    if obj is None:
        return 0
    try:
        return int(obj.get_size())
    except Exception:  # freed meanwhile by another thread: count nothing
        return 0


# (entries, bytes, misses) of a successful call, from its arguments and result.
Measure = Callable[[tuple[Any, ...], dict[str, Any], Any], tuple[int, int, int]]


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _put(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> tuple[int, int, int]:
    return 1, payload_bytes(_arg(args, kwargs, 1, "memory_obj")), 0


def _get(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> tuple[int, int, int]:
    return 1, payload_bytes(result), result is None


def _one(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> tuple[int, int, int]:
    return 1, 0, 0


def _batched_put(
    args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
) -> tuple[int, int, int]:
    objs = _arg(args, kwargs, 1, "memory_objs") or ()
    return len(objs), sum(payload_bytes(o) for o in objs), 0


def _batched_get(
    args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
) -> tuple[int, int, int]:
    found = result or ()
    return len(found), sum(payload_bytes(o) for o in found), sum(o is None for o in found)


def _batched_keys(
    args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
) -> tuple[int, int, int]:
    keys = _arg(args, kwargs, 0, "keys")
    return (len(keys) if hasattr(keys, "__len__") else 0), 0, 0


def _put_ranges(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> tuple[int, int, int]:
    sizes = _arg(args, kwargs, 2, "sizes") or ()
    return len(sizes), sum(int(n) for n in sizes), 0


def _get_ranges(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> tuple[int, int, int]:
    sizes = _arg(args, kwargs, 2, "sizes") or ()
    found = result or ()
    read = sum(int(n) for n, ok in zip(sizes, found, strict=False) if ok)
    return len(found), read, sum(not ok for ok in found)


def _removed(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> tuple[int, int, int]:
    return (result if isinstance(result, int) else 0), 0, 0


_MEASURES: dict[str, Measure] = {
    "put": _put,
    "get": _get,
    "batched_put": _batched_put,
    "batched_get": _batched_get,
    "batched_exists": _batched_keys,
    "batched_delete": _batched_keys,
    "delete_prefix": _removed,
    "put_ranges": _put_ranges,
    "get_ranges": _get_ranges,
}


def counted_method(op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a store method) recording its outermost calls in ``self.counters``.

    A store without ``counters`` (one whose ``__init__`` did not run the
    base's) is not counted.  Every call that raises, counted or not, lets
    go of what its finished frames hold (:func:`kvpool.remote.objects.let_go`)
    before the exception leaves the store.
    """
    measure = _MEASURES.get(op, _one)
    clock = time.perf_counter

    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        counters = self.__dict__.get("counters")
        shard = counters.shard() if counters is not None else None
        if shard is None or shard.depth:  # not counted, or inside another counted call
            try:
                return fn(self, *args, **kwargs)
            except BaseException as exc:
                let_go(exc)
                raise
        shard.depth = 1
        start = clock()
        try:
            result = fn(self, *args, **kwargs)
        except BaseException as exc:
            if isinstance(exc, Exception):
                shard.record_error(op, clock() - start, type(exc).__name__)
            # The store's boundary: the failed call's frames keep no view of
            # the caller's objects (kvpool.remote.objects, "Letting go of views").
            let_go(exc)
            raise
        finally:
            shard.depth = 0
        seconds = clock() - start
        shard.record(op, seconds, *measure(args, kwargs, result))
        return result

    call._kvpool_counted = True  # type: ignore[attr-defined]
    return call


def counted_calls(*ops: str) -> Callable[[type], type]:
    """A class decorator counting the class's ``ops`` (:func:`counted_method`).

    For a mixin that holds a store's calls but is no
    :class:`~kvpool.remote.base.RemoteStore` subclass (which wraps its own
    operations when the class is defined): applied above the mixin's
    keyword guard, so a refused keyword is an error of the call, counted
    once, as the base counts it.
    """

    def count(cls: type) -> type:
        for op in ops:
            setattr(cls, op, counted_method(op, vars(cls)[op]))
        return cls

    return count
