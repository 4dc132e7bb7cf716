"""LazyMemoryAllocator: usable at once, grows in the background, closes cleanly mid-growth.

These tests need ``HostBuffer.commit`` (being added to kvpool.native.buffer); until
it lands every construction fails with AttributeError.
"""

from __future__ import annotations

import inspect
import threading

import pytest
import torch
from pool_helpers import (
    GIB,
    KV_FMT,
    MIB,
    count_mappings,
    pattern,
    threads_named,
    wait_for,
)

import kvpool
from kvpool import MemoryFormat

THREAD = "kvpool-lazy-grow"
LIVENESS = 120.0


def raw(n: int) -> tuple[torch.Size, torch.dtype]:
    return torch.Size([n]), torch.uint8


def test_signature_is_lmcaches() -> None:
    params = list(inspect.signature(kvpool.LazyMemoryAllocator.__init__).parameters.values())[1:]
    assert [(p.name, p.default) for p in params[:4]] == [
        ("init_size", inspect.Parameter.empty),
        ("final_size", inspect.Parameter.empty),
        ("align_bytes", 4096),
        ("numa_mapping", None),
    ]
    names = [p.name for p in params]
    assert "keep_free" in names
    assert issubclass(kvpool.LazyMemoryAllocator, kvpool.MemoryPool)
    assert kvpool.LazyMemoryAllocator.PIN_CHUNK_SIZE == 64 * MIB
    assert kvpool.LazyMemoryAllocator.COMMIT_SIZE == GIB
    assert kvpool.LazyMemoryAllocator.LOG_INTERVAL == 10 * GIB
    for method in ("allocate", "batched_allocate"):
        fmt = inspect.signature(getattr(kvpool.LazyMemoryAllocator, method)).parameters["fmt"]
        assert fmt.default is MemoryFormat.UNDEFINED


def test_lmcache_calls_positional_and_gets_undefined_objects() -> None:
    # As LMCache's L1 memory manager calls it: (init, final, align), then
    # batched_allocate without a format.
    with kvpool.LazyMemoryAllocator(2 * MIB, 4 * MIB, 4096) as pool:
        objs = pool.batched_allocate([torch.Size([2, 4, 16, 32])], [torch.float16], 3)
        assert objs is not None and len(objs) == 3
        assert {o.get_memory_format() for o in objs} == {MemoryFormat.UNDEFINED}
        assert all(o.parent() is pool for o in objs)
        assert pool.get_underlying_buffer().numel() == 4 * MIB
        assert pool.get_underlying_buffer().data_ptr() == pool.buffer.data_ptr()
        am = pool.get_address_manager()
        assert am is pool.allocator.address_manager
        assert am.get_heap_size() in (2 * MIB, 4 * MIB)  # grown or not yet
        pool.batched_free(objs)
        one = pool.allocate(torch.Size([100]), torch.uint8)
        assert one.get_memory_format() is MemoryFormat.UNDEFINED
        one.ref_count_down()


def test_allocations_beyond_the_current_size_wait_for_growth(
    mappings: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4 KiB pages, so that the 1 MiB steps are not rounded up to 2 MiB
    # hugepages when the machine has free ones.
    monkeypatch.setenv("KVPOOL_HUGEPAGES", "never")
    pool = kvpool.LazyMemoryAllocator(MIB, 8 * MIB, step_size=MIB, start=False)
    try:
        assert pool.usable_bytes == MIB
        assert pool.growing
        first = pool.allocate(*raw(MIB // 2), KV_FMT)
        assert first is not None
        first.byte_array[:] = pattern(MIB // 2, 1)
        address = first.data_ptr
        assert pool.allocate(*raw(2 * MIB), KV_FMT) is None  # beyond the current size
        assert pool.batched_allocate(*raw(MIB // 2), 2, KV_FMT) is None
        pool.start_growth()
        assert pool.wait_ready(LIVENESS)
        assert not pool.growing
        assert pool.usable_bytes == 8 * MIB
        assert pool.committed_bytes >= 8 * MIB
        # Objects no wider than a step: with CUDA each step is registered on
        # its own and no object crosses two (tests/pools/test_pool_registrations.py).
        big = pool.batched_allocate(*raw(MIB), 7, KV_FMT)  # all but the first step's rest
        assert big is not None
        # addresses never move: the first object is where it was, intact
        assert first.data_ptr == address
        assert bytes(first.byte_array) == pattern(MIB // 2, 1)
        assert pool.stats().total_bytes == 8 * MIB
        assert pool.memcheck()
    finally:
        pool.close()
    del pool, first, big
    assert count_mappings() == mappings


def test_grows_on_its_own_when_started() -> None:
    with kvpool.LazyMemoryAllocator(2 * MIB, 16 * MIB, step_size=2 * MIB) as pool:
        assert pool.wait_ready(LIVENESS)
        assert pool.usable_bytes == 16 * MIB
        # The whole grown space, in objects of one step (see above).
        assert pool.batched_allocate(*raw(2 * MIB), 8, KV_FMT) is not None
    assert wait_for(lambda: not threads_named(THREAD), LIVENESS)


def test_init_size_equal_to_size_is_ready_at_once() -> None:
    with kvpool.LazyMemoryAllocator(4 * MIB, 4 * MIB) as pool:
        assert not pool.growing
        assert pool.wait_ready(0)
        assert pool.usable_bytes == 4 * MIB
        assert not threads_named(THREAD)


def test_binary_buffers_go_to_byte_buffers() -> None:
    with kvpool.LazyMemoryAllocator(4 * MIB, 4 * MIB) as pool:
        obj = pool.allocate(torch.Size([10, 0, 0, 0]), torch.uint8, MemoryFormat.BINARY_BUFFER)
        assert isinstance(obj, kvpool.BytesBufferMemoryObj)
        assert pool.num_active_allocations == 0


def test_close_mid_growth_leaks_nothing(mappings: int) -> None:
    pool = kvpool.LazyMemoryAllocator(4 * MIB, 512 * MIB, step_size=4 * MIB)
    obj = pool.allocate(*raw(MIB), KV_FMT)
    assert obj is not None
    pool.close()
    assert not threads_named(THREAD)  # close() joined the growth thread
    assert not pool.growing
    assert not obj.is_valid()
    pool.close()  # twice is fine
    del pool, obj
    assert count_mappings() == mappings


def test_close_before_growth_starts(mappings: int) -> None:
    pool = kvpool.LazyMemoryAllocator(MIB, 64 * MIB, start=False)
    pool.close()
    assert not threads_named(THREAD)
    del pool
    assert count_mappings() == mappings


def test_dropped_while_growing_is_collected_after_growth(mappings: int) -> None:
    pool = kvpool.LazyMemoryAllocator(MIB, 32 * MIB, step_size=4 * MIB)
    del pool
    assert wait_for(lambda: not threads_named(THREAD), LIVENESS)
    assert count_mappings() == mappings


def _ram() -> int:
    from kvpool.native.machine import capabilities

    return capabilities().mem_total


def test_reserves_far_beyond_ram_and_serves_at_once(mappings: int) -> None:
    """A final size of 3x RAM is only reserved; the small first part is usable now."""
    size = 3 * _ram()
    pool = kvpool.LazyMemoryAllocator(32 * MIB, size, start=False)
    try:
        assert pool.size == size
        assert pool.committed_bytes == 32 * MIB
        obj = pool.allocate(*raw(MIB), KV_FMT)
        assert obj is not None
        obj.byte_array[:4] = b"kvkv"
        assert bytes(obj.byte_array[:4]) == b"kvkv"
        assert pool.allocate(*raw(128 * MIB), KV_FMT) is None  # not grown yet
        obj.ref_count_down()
    finally:
        pool.close()
    del pool, obj
    assert count_mappings() == mappings


def test_growth_stops_safely_at_the_machine_limit(
    mappings: int, caplog: pytest.LogCaptureFixture
) -> None:
    """keep_free as large as RAM: no step fits, growth stops at once without an error."""
    ram = _ram()
    with caplog.at_level("WARNING", logger="kvpool"):
        pool = kvpool.LazyMemoryAllocator(2 * MIB, 3 * ram, step_size=4 * MIB, keep_free=ram)
        try:
            assert pool.wait_ready(LIVENESS) is False  # not fully grown, and no exception
            assert not pool.growing
            assert pool.stopped_by is not None and "keep_free" in pool.stopped_by
            assert pool.committed_bytes == 2 * MIB
            assert pool.usable_bytes == 2 * MIB
            assert pool.allocate(*raw(MIB), KV_FMT) is not None  # still a working pool
        finally:
            pool.close()
    assert any("stopped growing" in r.getMessage() for r in caplog.records)
    del pool
    assert count_mappings() == mappings


def test_full_growth_has_no_stop_reason() -> None:
    with kvpool.LazyMemoryAllocator(2 * MIB, 8 * MIB, step_size=2 * MIB) as pool:
        assert pool.wait_ready(LIVENESS)
        assert pool.stopped_by is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"init_size": MIB, "final_size": 0},
        {"init_size": MIB, "final_size": -MIB},
        {"init_size": MIB, "final_size": 1.5},
        {"final_size": MIB, "init_size": 0},
        {"final_size": MIB, "init_size": 2 * MIB},
        {"final_size": MIB, "init_size": "1"},
        {"init_size": MIB, "final_size": MIB, "step_size": 0},
        {"init_size": MIB, "final_size": MIB, "step_size": True},
        {"init_size": MIB, "final_size": MIB, "align_bytes": 3},
        {"init_size": MIB, "final_size": MIB, "keep_free": -1},
        {"init_size": MIB, "final_size": MIB, "keep_free": 1.5},
    ],
    ids=lambda kw: ",".join(f"{k}={v!r}" for k, v in kw.items()),
)
def test_bad_arguments(kwargs: dict[str, object], mappings: int) -> None:
    with pytest.raises(kvpool.InvalidArgumentError) as info:
        kvpool.LazyMemoryAllocator(**kwargs, start=False)
    assert isinstance(info.value, ValueError)
    del info
    assert count_mappings() == mappings


@pytest.mark.slow
def test_grows_to_4_gib_while_another_thread_allocates_and_frees(mappings: int) -> None:
    size = 4 * GIB
    pool = kvpool.LazyMemoryAllocator(64 * MIB, size, step_size=256 * MIB)
    stop = threading.Event()
    seen_usable: list[int] = []
    errors: list[BaseException] = []

    def churn(pool: kvpool.LazyMemoryAllocator) -> None:
        try:
            n = 0
            while not stop.is_set():
                objs = pool.batched_allocate(*raw(MIB), 8, KV_FMT) or []
                one = pool.allocate(*raw(32 * MIB), KV_FMT)
                for i, obj in enumerate(objs):
                    obj.byte_array[:16] = pattern(16, n + i)
                for i, obj in enumerate(objs):
                    assert bytes(obj.byte_array[:16]) == pattern(16, n + i)
                pool.batched_free(objs)
                if one is not None:
                    one.ref_count_down()
                seen_usable.append(pool.usable_bytes)
                n += 1
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=churn, args=(pool,))
    worker.start()
    try:
        ready = pool.wait_ready(600)
    finally:
        stop.set()
        worker.join()
    try:
        assert not errors, errors
        assert ready
        assert pool.usable_bytes == size
        assert seen_usable == sorted(seen_usable)  # the usable size only grows
        assert pool.num_active_allocations == 0
        assert pool.memcheck()
        # The whole space, in 64 MiB objects: every step boundary (64 MiB, then
        # every 256 MiB) is a multiple of it, so they fill it with CUDA too.
        whole = pool.batched_allocate(*raw(64 * MIB), size // (64 * MIB), KV_FMT)
        assert whole is not None
        first, last = whole[0].byte_array, whole[-1].byte_array
        first[0] = 1
        last[64 * MIB - 1] = 2
        assert (first[0], last[64 * MIB - 1]) == (1, 2)
        assert whole[-1].data_ptr + 64 * MIB - whole[0].data_ptr == size
        del first, last
    finally:
        pool.close()
    del pool, whole
    assert not threads_named(THREAD)
    assert count_mappings() == mappings
