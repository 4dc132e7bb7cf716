"""LMCache's PinMonitor and LMCStatsMonitor see kvpool objects.

With the bridge installed, a kvpool object's pins reach LMCache's
``PinMonitor`` (made from an engine config, as LMCache's engine makes it)
and its counts and pool usage reach ``LMCStatsMonitor``; LMCache's own
timeout thread then force-unpins an overdue kvpool object.  Timeouts are
LMCache's whole seconds (1 s); waits are liveness deadlines.
"""

from __future__ import annotations

import torch

import kvpool

SHAPE = torch.Size([2, 2, 16, 128])
NBYTES = SHAPE.numel() * 2
MIB = 1 << 20


def mixed():
    from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator

    return MixedMemoryAllocator(MIB)


def test_pins_are_seen_by_lmcaches_monitors(lmc) -> None:
    monitor = lmc.pin_monitor(pin_timeout_sec=300, pin_check_interval_sec=30)
    with mixed() as pool:
        a, b = pool.allocate(SHAPE, torch.float16), pool.allocate(SHAPE, torch.float16)
        a.pin()
        a.pin()
        b.pin()
        assert monitor.get_monitored_count() == 2
        assert lmc.stats.pinned_memory_objs_count == 2  # objects, not pins
        a.unpin()
        assert monitor.get_monitored_count() == 2
        a.unpin()
        b.unpin()
        assert monitor.get_monitored_count() == 0
        assert lmc.stats.pinned_memory_objs_count == 0
        c = pool.allocate(SHAPE, torch.float16)
        c.pin()
        pool.free(c)  # freeing a pinned object unpins it
        assert monitor.get_monitored_count() == 0
        assert lmc.stats.pinned_memory_objs_count == 0
        a.ref_count_down()
        b.ref_count_down()


def test_lmcaches_pin_timeout_force_unpins_kvpool_objects(lmc, deadline) -> None:
    monitor = lmc.pin_monitor(pin_timeout_sec=1, pin_check_interval_sec=1)
    with mixed() as pool:
        kept = pool.allocate(SHAPE, torch.float16)  # pinned and referenced
        kept.pin()
        dropped = pool.allocate(SHAPE, torch.float16)  # pinned, reference dropped
        dropped.pin()
        dropped.ref_count_down()
        assert pool.stats().active_objects == 2
        deadline(lambda: monitor.get_monitored_count() == 0, "LMCache's PinMonitor to time out")
        assert not kept.is_pinned and kept.is_valid() and kept.get_ref_count() == 1
        assert not dropped.is_valid()  # its last pin was its last hold: freed
        assert pool.stats().active_objects == 1
        assert lmc.stats.interval_forced_unpin_count == 2
        assert lmc.stats.pinned_memory_objs_count == 0
        kept.ref_count_down()
        assert pool.memcheck()


def test_closing_a_pool_lets_lmcaches_monitor_go_of_its_pins(lmc) -> None:
    monitor = lmc.pin_monitor(pin_timeout_sec=300, pin_check_interval_sec=30)
    pool = mixed()
    obj = pool.allocate(SHAPE, torch.float16)
    obj.pin()
    assert monitor.get_monitored_count() == 1
    pool.close()
    assert monitor.get_monitored_count() == 0
    assert lmc.stats.pinned_memory_objs_count == 0
    assert obj.meta.pin_count == 0  # LMCache's "unpin while pinned" cannot loop on it


def test_pins_before_lmcache_made_its_monitor_are_counted_not_timed(lmc) -> None:
    # LMCache's own pin() fails ("config is required") before its engine
    # made the PinMonitor; kvpool's objects pin, and are counted.
    with mixed() as pool:
        obj = pool.allocate(SHAPE, torch.float16)
        assert obj.pin()
        assert lmc.stats.pinned_memory_objs_count == 1
        obj.unpin()
        assert lmc.stats.pinned_memory_objs_count == 0
        obj.ref_count_down()


def test_pool_usage_reaches_lmcaches_stats(lmc) -> None:
    with mixed() as pool, mixed() as other:
        objs = pool.batched_allocate(SHAPE, torch.float16, 3)
        one = other.allocate(SHAPE, torch.float16)
        assert lmc.stats.local_cache_usage_bytes == 4 * NBYTES  # summed over pools
        assert lmc.stats.active_memory_objs_count == 4
        objs[0].ref_count_down()
        assert lmc.stats.active_memory_objs_count == 3
        pool.batched_free(objs[1:])
        one.ref_count_down()
        assert lmc.stats.local_cache_usage_bytes == 0
        assert lmc.stats.active_memory_objs_count == 0


def test_kvpools_own_monitor_steps_aside_inside_lmcache() -> None:
    # LMCache's PinMonitor enforces the engine's timeout; kvpool's does not
    # run a second one.
    assert kvpool.PinMonitor.GetOrCreate().enabled is False
