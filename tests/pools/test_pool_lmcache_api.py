"""LMCache 0.5.6's additions to the API, as kvpool offers them without LMCache.

Helpers (synchronized, align_to, get_numa_id, PinnedAllocFree and
_resolve_pinned_alloc_free, _allocate_gpu_memory, the bounded ubyte-array
type cache), the L1 owner tag, writable ``group_prefix_sum``,
``get_paged_buffers``, ``parent()`` being the outer pool, the errors that are
also LMCache's ``RuntimeError``, and the monitors' LMCache-style interface
(``GetOrCreate(config)``, ``get_monitored_count``, forced unpins counted,
listeners, the usage listener).
"""

from __future__ import annotations

import ctypes
import os
import threading
import uuid
from types import SimpleNamespace

import pytest
import torch
from pool_helpers import KV_BYTES, KV_DTYPE, KV_FMT, KV_SHAPE, MIB, paged_kwargs, pattern

import kvpool
from kvpool import MemoryFormat
from kvpool.helpers import UBYTE_TYPE_CACHE_SIZE, _cached_array_type
from kvpool.pool import monitor as monitor_module

# -- helpers ---------------------------------------------------------------------


def test_synchronized_runs_the_method_under_the_named_lock() -> None:
    class Counter:
        def __init__(self) -> None:
            self.guard = threading.Lock()
            self.seen: list[bool] = []

        @kvpool.synchronized("guard")
        def step(self, value: int) -> int:
            self.seen.append(self.guard.locked())
            return value + 1

    counter = Counter()
    assert counter.step(1) == 2
    assert counter.seen == [True] and not counter.guard.locked()
    assert Counter.step.__name__ == "step"
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool.synchronized(5)  # type: ignore[arg-type]


def test_align_to() -> None:
    assert [kvpool.align_to(n, 4096) for n in (0, 1, 4096, 4097)] == [0, 4096, 4096, 8192]
    for size, align in ((-1, 4096), (10, 3), (10, 0), (1.5, 8)):
        with pytest.raises(kvpool.InvalidArgumentError):
            kvpool.align_to(size, align)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks GPU 0, the CPU-only answer")
def test_get_numa_id_uses_gpu_0_without_cuda() -> None:
    assert kvpool.get_numa_id(kvpool.NUMAMapping({0: 1, 1: 0})) == 1
    assert kvpool.get_numa_id(SimpleNamespace(gpu_to_numa_mapping={0: 0})) == 0  # LMCache's
    with pytest.raises(KeyError, match="GPU 0"):
        kvpool.get_numa_id(kvpool.NUMAMapping({1: 0}))
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool.get_numa_id(object())


def test_ubyte_array_types_are_cached_and_bounded() -> None:
    assert kvpool._get_cached_ubyte_array_type(100) is kvpool._get_cached_ubyte_array_type(100)
    assert ctypes.sizeof(kvpool._get_cached_ubyte_array_type(100)) == 100
    for n in range(UBYTE_TYPE_CACHE_SIZE + 500):
        kvpool._get_cached_ubyte_array_type(1 << 20 | n)
    assert _cached_array_type.cache_info().currsize <= UBYTE_TYPE_CACHE_SIZE
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool._get_cached_ubyte_array_type(-1)


def test_pinned_alloc_free_pair() -> None:
    pair = kvpool._resolve_pinned_alloc_free(size=MIB)
    assert isinstance(pair, kvpool.PinnedAllocFree)
    ptr = pair.alloc()
    view = (ctypes.c_ubyte * 4).from_address(ptr)
    view[:] = [1, 2, 3, 4]
    assert bytes(view) == b"\x01\x02\x03\x04"
    del view
    pair.free(ptr)
    with pytest.raises(kvpool.InvalidHandleError):
        pair.free(ptr)  # twice: refused, nothing freed again


def test_pinned_alloc_free_in_shared_memory() -> None:
    name = f"/kvpool-pair-{uuid.uuid4().hex[:12]}"
    pair = kvpool._resolve_pinned_alloc_free(shm_name=name, size=MIB)
    ptr = pair.alloc()
    try:
        assert os.path.exists(f"/dev/shm{name}")
    finally:
        pair.free(ptr)
    assert not os.path.exists(f"/dev/shm{name}")
    with pytest.raises(kvpool.InvalidArgumentError, match="shared memory"):
        kvpool._resolve_pinned_alloc_free(shm_name=name, size=MIB, use_hugepages=True)


def test_allocate_gpu_memory_is_page_aligned() -> None:
    base, aligned = kvpool._allocate_gpu_memory(10_000, "cpu")
    assert aligned.numel() == 10_000 and aligned.data_ptr() % os.sysconf("SC_PAGESIZE") == 0
    assert base.data_ptr() <= aligned.data_ptr() < base.data_ptr() + base.numel()


# -- memory objects ------------------------------------------------------------


@pytest.fixture(params=["extent", "paged"])
def pool(request: pytest.FixtureRequest):
    extra = paged_kwargs() if request.param == "paged" else {}
    with kvpool.MixedMemoryAllocator(MIB, use_paging=request.param == "paged", **extra) as p:
        yield p


def test_parent_is_the_pool_the_object_came_from(pool) -> None:
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    batch = pool.batched_allocate(KV_SHAPE, KV_DTYPE, 2, KV_FMT)
    assert obj.parent() is pool and obj.parent_allocator is pool
    assert all(o.parent() is pool for o in batch)
    pool.batched_free([obj, *batch])
    with kvpool.HostMemoryAllocator(MIB) as host, kvpool.PinMemoryAllocator(MIB) as pin:
        for p in (host, pin):
            o = p.allocate(KV_SHAPE, KV_DTYPE)
            assert o.parent() is p
            o.ref_count_down()
    inner = kvpool.TensorMemoryAllocator(torch.empty(MIB, dtype=torch.uint8))
    o = inner.allocate(KV_SHAPE, KV_DTYPE)
    assert o.parent() is inner  # no outer pool: the policy itself
    o.ref_count_down()
    inner.close()


def test_group_prefix_sum_narrows_a_partial_chunk(pool) -> None:
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    obj.byte_array[:] = pattern(KV_BYTES, 4)
    assert obj.group_prefix_sum == [0, KV_BYTES]
    for bad in ([1, 10], [0, KV_BYTES + 8192], [0, 20, 10], "0,10", [], [0, 1.5]):
        with pytest.raises(kvpool.InvalidArgumentError):
            obj.group_prefix_sum = bad  # type: ignore[assignment]
    obj.group_prefix_sum = [0, KV_BYTES // 4]
    assert obj.get_size() == len(obj.byte_array) == KV_BYTES // 4
    assert bytes(obj.byte_array) == pattern(KV_BYTES, 4)[: KV_BYTES // 4]
    assert obj.get_physical_size() >= KV_BYTES
    obj.ref_count_down()
    again = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)  # a new object has its full size
    assert again.get_size() == KV_BYTES and again.group_prefix_sum == [0, KV_BYTES]
    again.ref_count_down()


def test_l1_owner_tag(pool) -> None:
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    assert obj.get_l1_manager() is None
    obj.set_l1_manager(7)
    obj.set_l1_manager(7)
    with pytest.raises(kvpool.InvalidArgumentError, match="L1 manager 7"):
        obj.set_l1_manager(8)
    obj.ref_count_down()
    for _ in range(4):  # the next owners of the memory start with no tag
        fresh = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        assert fresh.get_l1_manager() is None
        fresh.ref_count_down()
    buffer = kvpool.BytesBufferMemoryObj(b"abc")
    buffer.set_l1_manager(1)
    assert buffer.get_l1_manager() == 1
    buffer.reset_l1_manager()
    assert buffer.get_l1_manager() is None


def test_get_paged_buffers(pool) -> None:
    pages = pool.get_paged_buffers()
    if pool.allocator.kind == "extent":
        assert pages is None
        return
    assert len(pages) == MIB // KV_BYTES
    assert [p.data_ptr() for p in pages[:2]] == [
        pool.buffer.data_ptr(),
        pool.buffer.data_ptr() + KV_BYTES,
    ]
    assert pages == pool.allocator.get_paged_buffers()
    pool.close()
    assert pool.allocator.get_paged_buffers() == ()


@pytest.mark.parametrize("fmt", [MemoryFormat.EC_TD, MemoryFormat.HS_TD])
def test_mixed_places_encoder_and_hidden_state_formats(fmt: MemoryFormat) -> None:
    with kvpool.MixedMemoryAllocator(MIB) as pool:
        obj = pool.allocate(torch.Size([16, 64]), torch.float16, fmt)
        assert isinstance(obj, kvpool.TensorMemoryObj) and obj.get_memory_format() is fmt
        obj.ref_count_down()


# -- errors LMCache's callers catch ---------------------------------------------


def test_batch_size_errors_are_also_runtime_errors() -> None:
    am = kvpool.AddressManager(MIB)
    with pytest.raises(RuntimeError) as info:
        am.batched_allocate(4096, -1)
    assert isinstance(info.value, kvpool.BatchSizeError)
    assert isinstance(info.value, ValueError) and "non-negative" in str(info.value)
    with kvpool.MixedMemoryAllocator(MIB) as pool, pytest.raises(RuntimeError):
        pool.batched_allocate(KV_SHAPE, KV_DTYPE, -2)


def test_exhaustion_and_size_wording_match_lmcaches() -> None:
    am = kvpool.AddressManager(8192)
    am.allocate(8192)
    with pytest.raises(RuntimeError, match="no memory is available"):
        am.allocate(4096)
    with pytest.raises(ValueError, match="size must be greater than 0"):
        am.allocate(0)


# -- monitors ---------------------------------------------------------------------


def test_pin_monitor_takes_an_lmcache_style_config(pin_monitor: kvpool.PinMonitor) -> None:
    config = SimpleNamespace(pin_timeout_sec=7, pin_check_interval_sec=2)
    assert kvpool.PinMonitor.GetOrCreate(config, metadata=None) is pin_monitor
    assert (pin_monitor.timeout, pin_monitor.interval) == (7.0, 2.0)
    with pytest.raises(ValueError):
        kvpool.PinMonitor.GetOrCreate(SimpleNamespace(pin_timeout_sec=0))
    assert kvpool.PinMonitor().force_unpin is True  # LMCache's default


def test_listeners_hear_pins_and_forced_unpins(pin_monitor: kvpool.PinMonitor) -> None:
    events: list[tuple] = []

    class Listener:
        def on_pin(self, obj, first):
            events.append(("pin", first))

        def on_unpin(self, obj):
            events.append(("unpin",))

        def on_forced_unpin(self, obj):
            events.append(("forced",))

    listener = Listener()
    pin_monitor.add_listener(listener)
    pin_monitor.add_listener(listener)  # once is enough
    stats = kvpool.StatsMonitor.GetOrCreate()
    forced_before = stats.forced_unpin_count
    try:
        with kvpool.MixedMemoryAllocator(MIB) as pool:
            obj = pool.allocate(KV_SHAPE, KV_DTYPE)
            obj.pin()
            obj.pin()
            assert pin_monitor.get_monitored_count() == 1
            obj.unpin()
            obj.unpin()
            obj.pin()
            # Checked here, not by the monitor's thread (switched off).
            pin_monitor.configure(enabled=False, force_unpin=True, timeout=1e-9)
            assert len(pin_monitor.overdue()) == 1
            pin_monitor.check()
            assert not obj.is_pinned and obj.is_valid()
            obj.ref_count_down()
    finally:
        pin_monitor.remove_listener(listener)
    assert events == [
        ("pin", True),
        ("pin", False),
        ("unpin",),
        ("pin", True),
        ("forced",),
        ("unpin",),
    ]
    assert stats.forced_unpin_count == forced_before + 1
    assert stats.snapshot()["total"]["forced_unpins"] == forced_before + 1


def test_usage_listener_hears_every_change_of_pools_made_after_it() -> None:
    seen: list[tuple[int, int, bool]] = []

    def listener(policy) -> None:
        seen.append((policy.total_allocated_size, policy.num_active_allocations, policy.closed))

    previous = monitor_module.set_usage_listener(listener)
    try:
        pool = kvpool.MixedMemoryAllocator(MIB)
    finally:
        monitor_module.set_usage_listener(previous)
    obj = pool.allocate(KV_SHAPE, KV_DTYPE)
    batch = pool.batched_allocate(KV_SHAPE, KV_DTYPE, 2)
    obj.ref_count_down()
    pool.batched_free(batch)
    pool.close()
    unit = 4096
    assert seen == [
        (unit, 1, False),
        (3 * unit, 3, False),
        (2 * unit, 2, False),
        (0, 0, False),
        (0, 0, True),
    ]
