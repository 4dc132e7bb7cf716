"""PinMonitor: records pins, reports (and optionally unpins) overdue objects, owns one thread.

Timeouts are short (0.2 s) so that the background thread acts within the
test; every wait is a liveness deadline (``wait_for`` / ``Event.wait``), no
assertion depends on how long anything took.
"""

from __future__ import annotations

import logging
import threading

import pytest
from pool_helpers import KV_DTYPE, KV_FMT, KV_SHAPE, MIB, paged_kwargs, threads_named, wait_for

import kvpool

THREAD = "kvpool-pin-monitor"
LIVENESS = 20.0


@pytest.fixture(params=["extent", "paged"])
def pool(request: pytest.FixtureRequest):
    if request.param == "paged":
        p = kvpool.PinMemoryAllocator(MIB, use_paging=True, **paged_kwargs())
    else:
        p = kvpool.PinMemoryAllocator(MIB)
    yield p
    p.close()


def kv(pool: kvpool.MemoryPool) -> kvpool.MemoryObj:
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    assert obj is not None
    return obj


def no_monitor_thread() -> bool:
    return not threads_named(THREAD)


def test_records_pins_and_unpins(pool, pin_monitor: kvpool.PinMonitor) -> None:
    a, b = kv(pool), kv(pool)
    assert pin_monitor.pinned_count() == 0
    a.pin()
    a.pin()  # one object, pinned twice: recorded once
    b.pin()
    assert pin_monitor.pinned_count() == 2
    a.unpin()
    assert pin_monitor.pinned_count() == 2  # still pinned once
    a.unpin()
    assert pin_monitor.pinned_count() == 1
    b.unpin()
    assert pin_monitor.pinned_count() == 0
    assert pool.stats().pinned_objects == 0


def test_freeing_a_pinned_object_tells_the_monitor(pool, pin_monitor: kvpool.PinMonitor) -> None:
    a, b, c = kv(pool), kv(pool), kv(pool)
    for obj in (a, b, c):
        obj.pin()
    assert pin_monitor.pinned_count() == 3
    pool.free(a)
    assert pin_monitor.pinned_count() == 2
    pool.batched_free([b, c])
    assert pin_monitor.pinned_count() == 0
    assert wait_for(no_monitor_thread, LIVENESS)


def test_reports_objects_pinned_longer_than_the_timeout(
    pool, pin_monitor: kvpool.PinMonitor, caplog: pytest.LogCaptureFixture
) -> None:
    reports: list[kvpool.PinnedReport] = []
    seen = threading.Event()

    def on_timeout(report: kvpool.PinnedReport) -> None:
        reports.append(report)
        seen.set()

    pin_monitor.configure(timeout=0.2, interval=0.05, on_timeout=on_timeout)
    obj, other = kv(pool), kv(pool)
    with caplog.at_level(logging.WARNING, logger="kvpool"):
        obj.pin()
        obj.pin()
        assert seen.wait(LIVENESS), "no report from the monitor's thread"
        # further checks do not report the same pinning again
        pin_monitor.check()
        pin_monitor.check()
    assert [r.obj for r in reports] == [obj]
    assert reports[0].pin_count == 2
    assert reports[0].pinned_for > 0.2
    assert obj.is_pinned and obj.is_valid()  # reported, not unpinned
    assert other.is_valid() and not other.is_pinned
    warned = [r for r in caplog.records if "pinned for" in r.getMessage()]
    assert len(warned) == 1
    assert [r.obj for r in pin_monitor.overdue()] == [obj]
    obj.unpin()
    obj.unpin()
    assert pin_monitor.overdue(timeout=0.0) == []


def test_force_unpin_frees_objects_without_references(pool, pin_monitor: kvpool.PinMonitor) -> None:
    done = threading.Event()
    pin_monitor.configure(
        timeout=0.2, interval=0.05, force_unpin=True, on_timeout=lambda r: done.set()
    )
    orphan, held = kv(pool), kv(pool)
    orphan.pin()
    orphan.pin()
    orphan.ref_count_down()  # only its pins keep it now
    held.pin()
    assert orphan.is_valid()
    assert done.wait(LIVENESS)
    assert wait_for(lambda: pin_monitor.pinned_count() == 0, LIVENESS)
    assert not orphan.is_valid()  # unpinned with no references left: freed
    assert held.is_valid() and not held.is_pinned and held.get_ref_count() == 1
    assert pool.num_active_allocations == 1
    assert pool.stats().pinned_objects == 0
    assert pool.memcheck()
    assert wait_for(no_monitor_thread, LIVENESS)


def test_thread_runs_only_while_something_is_pinned(pool, pin_monitor: kvpool.PinMonitor) -> None:
    pin_monitor.configure(interval=0.05)
    obj = kv(pool)
    assert not pin_monitor.running and no_monitor_thread()
    obj.pin()
    assert pin_monitor.running
    assert len(threads_named(THREAD)) == 1
    obj.pin()
    kv(pool).pin()
    assert len(threads_named(THREAD)) == 1  # one thread, however many pins
    pool.batched_free([obj])
    assert pin_monitor.pinned_count() == 1
    assert pin_monitor.running
    assert len(threads_named(THREAD)) == 1


def test_thread_exits_once_nothing_is_pinned(pool, pin_monitor: kvpool.PinMonitor) -> None:
    # The default interval is 10 s: the last unpin must wake the thread up.
    obj = kv(pool)
    obj.pin()
    assert pin_monitor.running
    obj.unpin()
    assert wait_for(lambda: not pin_monitor.running, LIVENESS)
    assert wait_for(no_monitor_thread, LIVENESS)


def test_stop_leaves_no_thread_and_the_next_pin_restarts_it(
    pool, pin_monitor: kvpool.PinMonitor
) -> None:
    obj = kv(pool)
    obj.pin()
    assert wait_for(lambda: pin_monitor.running, LIVENESS)
    pin_monitor.stop()
    assert no_monitor_thread() and not pin_monitor.running
    assert pin_monitor.pinned_count() == 1  # pins stay recorded
    obj.pin()
    assert pin_monitor.running
    obj.unpin()
    obj.unpin()
    assert wait_for(no_monitor_thread, LIVENESS)


def test_stop_right_after_the_first_pin_leaves_no_thread(
    pool, pin_monitor: kvpool.PinMonitor
) -> None:
    # stop() may come before the new thread first waits on its condition:
    # the stop request must not be lost (stop() would time out and return
    # with the thread still alive).
    for _ in range(5):
        obj = kv(pool)
        obj.pin()
        pin_monitor.stop()
        left = threads_named(THREAD)
        obj.unpin()
        obj.ref_count_down()
        assert not left, "stop() returned with the monitor thread still alive"


def test_reset_forgets_pins_and_stops(pool, pin_monitor: kvpool.PinMonitor) -> None:
    obj = kv(pool)
    obj.pin()
    assert wait_for(lambda: pin_monitor.running, LIVENESS)
    pin_monitor.reset()
    assert pin_monitor.pinned_count() == 0
    assert no_monitor_thread()
    assert obj.is_pinned  # the object itself is untouched
    obj.unpin()


def test_disabled_monitor_starts_no_thread_until_enabled(
    pool, pin_monitor: kvpool.PinMonitor
) -> None:
    pin_monitor.configure(enabled=False)
    obj = kv(pool)
    obj.pin()
    assert pin_monitor.pinned_count() == 1
    assert not pin_monitor.running and no_monitor_thread()
    pin_monitor.configure(enabled=True)
    assert pin_monitor.running
    obj.unpin()
    assert wait_for(no_monitor_thread, LIVENESS)


def test_closing_a_pool_with_pinned_objects_releases_them_from_the_monitor(
    pin_monitor: kvpool.PinMonitor,
) -> None:
    pool = kvpool.PinMemoryAllocator(MIB)
    buf = pool.backing.buffer
    obj = kv(pool)
    obj.pin()
    pool.close()
    del obj, pool
    recorded = pin_monitor.pinned_count()
    # (while something is recorded the thread cannot exit: no need to wait then)
    thread_gone = recorded == 0 and wait_for(no_monitor_thread, LIVENESS)
    unmapped = buf.unmapped
    pin_monitor.reset()  # the next tests must not inherit the leftovers
    assert recorded == 0, "the monitor still holds an object of a closed pool"
    assert thread_gone, "the monitor thread keeps running for a closed pool's object"
    assert unmapped, "the monitor keeps a closed pool's memory mapped"


@pytest.mark.parametrize("bad", [0, -1, "1", None.__class__, True, float("nan")])
def test_configure_rejects_bad_durations(pin_monitor: kvpool.PinMonitor, bad: object) -> None:
    if bad is None.__class__:
        bad = object()
    for name in ("timeout", "interval"):
        with pytest.raises(ValueError):
            pin_monitor.configure(**{name: bad})
    assert pin_monitor.timeout == 300.0 and pin_monitor.interval == 10.0


def test_get_or_create_is_one_instance_shared_by_threads() -> None:
    seen: list[kvpool.PinMonitor] = []
    threads = [
        threading.Thread(target=lambda: seen.append(kvpool.PinMonitor.GetOrCreate()))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(m) for m in seen}) == 1
    assert seen[0] is kvpool.PinMonitor.GetOrCreate()


def test_an_infinite_interval_is_refused_or_harmless(pool, pin_monitor: kvpool.PinMonitor) -> None:
    try:
        pin_monitor.configure(interval=float("inf"))
    except ValueError:
        return  # refused: fine
    obj = kv(pool)
    obj.pin()
    threads = threads_named(THREAD)
    assert threads
    # Accepted: the thread must then wait, not die on the first wait.  (A thread
    # that is merely slow to get there passes; it can never fail spuriously.)
    threads[0].join(timeout=1.0)
    alive = threads[0].is_alive()
    obj.unpin()
    assert alive, "configure(interval=inf) was accepted but the monitor thread died"
