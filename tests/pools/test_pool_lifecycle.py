"""Every pool class through allocate / write / read / free / close, and garbage collection.

The ownership contract under test: close() is idempotent and invalidates
every object; a view made before close stays usable and keeps the native
mapping alive exactly as long as it exists; garbage collection is a
backstop that never frees anything twice.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from pool_helpers import (
    KV_BYTES,
    KV_DTYPE,
    KV_FMT,
    KV_SHAPE,
    MIB,
    count_mappings,
    paged_kwargs,
    pattern,
)

import kvpool
from kvpool import MemoryFormat

Factory = Callable[[], kvpool.MemoryPool]

# Pools whose memory is a native mapping (counted by live_mappings()).
NATIVE: dict[str, Factory] = {
    "host-extent": lambda: kvpool.HostMemoryAllocator(MIB),
    "host-paged": lambda: kvpool.HostMemoryAllocator(MIB, use_paging=True, **paged_kwargs()),
    "pin-extent": lambda: kvpool.PinMemoryAllocator(MIB),
    "pin-paged": lambda: kvpool.PinMemoryAllocator(MIB, use_paging=True, **paged_kwargs()),
    "mixed-extent": lambda: kvpool.MixedMemoryAllocator(MIB),
    "mixed-paged": lambda: kvpool.MixedMemoryAllocator(MIB, use_paging=True, **paged_kwargs()),
}
# Every pool class of the MemoryPool family (the GPU pool is CPU memory here).
ALL: dict[str, Factory] = {
    **NATIVE,
    "gpu-extent": lambda: kvpool.GPUMemoryAllocator(MIB),
    "gpu-paged": lambda: kvpool.GPUMemoryAllocator(MIB, use_paging=True, **paged_kwargs()),
}


def kv(pool: kvpool.MemoryAllocatorInterface) -> kvpool.MemoryObj:
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    assert obj is not None
    return obj


def host_only(name: str) -> None:
    if name.startswith("gpu") and torch.cuda.is_available():
        pytest.skip("the GPU pool is device memory here: no byte views")


@pytest.fixture(params=sorted(ALL))
def pool_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=sorted(NATIVE))
def native_name(request: pytest.FixtureRequest) -> str:
    return request.param


def test_allocate_write_read_free_close(pool_name: str) -> None:
    host_only(pool_name)
    pool = ALL[pool_name]()
    try:
        assert pool.num_active_allocations == 0
        a = kv(pool)
        b = kv(pool)
        assert a.get_size() == KV_BYTES == b.get_size()
        assert a.get_shape() == KV_SHAPE and a.get_dtype() == KV_DTYPE
        assert a.get_memory_format() is KV_FMT
        assert a.get_ref_count() == 1 and not a.is_pinned
        data_a, data_b = pattern(KV_BYTES, 1), pattern(KV_BYTES, 2)
        a.byte_array[:] = data_a
        b.tensor.view(torch.uint8).view(-1).copy_(
            torch.frombuffer(bytearray(data_b), dtype=torch.uint8)
        )
        # The bytes are in the pool's own memory, where shm_offset says.
        for obj, data in ((a, data_a), (b, data_b)):
            assert bytes(obj.byte_array) == data
            assert obj.tensor.shape == KV_SHAPE
            assert bytes(obj.tensor.contiguous().view(torch.uint8).view(-1).numpy()) == data
            off = obj.shm_offset
            assert bytes(pool.buffer[off : off + KV_BYTES].numpy()) == data
        assert pool.num_active_allocations == 2
        assert pool.memcheck()

        batch = pool.batched_allocate(KV_SHAPE, KV_DTYPE, 3, KV_FMT)
        assert batch is not None and len(batch) == 3
        spans = sorted((o.shm_offset, o.shm_offset + o.get_physical_size()) for o in [a, b, *batch])
        assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))
        assert pool.num_active_allocations == 5

        a.ref_count_down()  # the last reference frees
        assert not a.is_valid()
        with pytest.raises(kvpool.InvalidHandleError):
            a.byte_array  # noqa: B018
        pool.free(b)
        assert not b.is_valid()
        pool.batched_free(batch)
        assert not any(o.is_valid() for o in batch)
        assert pool.num_active_allocations == 0
        assert pool.memcheck()
    finally:
        pool.close()
    assert pool.closed
    pool.close()  # twice is fine
    assert pool.closed
    with pytest.raises(kvpool.PoolClosedError):
        pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    with pytest.raises(kvpool.PoolClosedError):
        pool.batched_allocate(KV_SHAPE, KV_DTYPE, 2, KV_FMT)
    with pytest.raises(kvpool.PoolClosedError):
        pool.stats()


def test_context_manager_closes(pool_name: str) -> None:
    with ALL[pool_name]() as pool:
        obj = kv(pool)
    assert pool.closed
    assert not obj.is_valid()


def test_full_pool_returns_none_and_recovers(pool_name: str) -> None:
    pool = ALL[pool_name]()
    try:
        objs = []
        while (obj := pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)) is not None:
            objs.append(obj)
            assert len(objs) <= MIB // KV_BYTES
        assert objs
        assert pool.batched_allocate(KV_SHAPE, KV_DTYPE, 1, KV_FMT) is None
        objs.pop().ref_count_down()
        assert pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) is not None
        assert pool.memcheck()
    finally:
        pool.close()


def test_pin_keeps_an_object_until_unpinned(pool_name: str) -> None:
    with ALL[pool_name]() as pool:
        obj = kv(pool)
        assert obj.pin()
        obj.ref_count_down()
        assert obj.is_valid()  # held by its pin
        assert pool.num_active_allocations == 1
        assert obj.unpin()
        assert not obj.is_valid()
        assert pool.num_active_allocations == 0


# -- closing with live objects and views ------------------------------------


def test_close_invalidates_objects_and_views_raise(native_name: str) -> None:
    pool = NATIVE[native_name]()
    obj = kv(pool)
    pool.close()
    assert not obj.is_valid()
    with pytest.raises(kvpool.PoolClosedError):
        obj.byte_array  # noqa: B018
    with pytest.raises(kvpool.PoolClosedError):
        obj.data_ptr  # noqa: B018
    assert obj.tensor is None


@pytest.mark.parametrize("mode", ["strict", "lenient"])
def test_counting_calls_after_close_are_ignored_quietly(
    native_name: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Closing a pool ends every object's life; a user that closes its
    # allocator before dropping its references (LMCache's shut-down order)
    # is not misusing anything: nothing is reported, not even in strict mode.
    previous = kvpool.set_strict_mode(mode == "strict")
    try:
        pool = NATIVE[native_name]()
        obj, other = kv(pool), kv(pool)
        pool.close()
        with caplog.at_level(logging.WARNING, logger="kvpool"):
            obj.ref_count_down()
            assert obj.pin() is False
            assert obj.unpin() is False
            obj.ref_count_up()
            pool.free(other)
            pool.batched_free([obj, other])
    finally:
        kvpool.set_strict_mode(previous)
    assert not [r for r in caplog.records if r.name == "kvpool"]
    assert obj.get_ref_count() == 1  # nothing changed
    assert not obj.is_valid() and not other.is_valid()


def test_a_real_double_free_is_still_reported(native_name: str, strict: None) -> None:
    with NATIVE[native_name]() as pool:
        obj = kv(pool)
        obj.ref_count_down()
        with pytest.raises(kvpool.InvalidHandleError):
            obj.ref_count_down()
        with pytest.raises(kvpool.InvalidHandleError):
            pool.free(obj)


def test_byte_array_view_survives_close(native_name: str) -> None:
    pool = NATIVE[native_name]()
    obj = kv(pool)
    data = pattern(KV_BYTES, 3)
    view = obj.byte_array
    view[:] = data
    pool.close()
    assert bytes(view) == data  # readable
    view[:4] = b"\x01\x02\x03\x04"  # and writable
    assert bytes(view[:4]) == b"\x01\x02\x03\x04"
    del view


def test_view_keeps_the_mapping_until_dropped_with_the_pool_gone(
    native_name: str, mappings: int
) -> None:
    pool = NATIVE[native_name]()
    buf = pool.backing.buffer  # the HostBuffer (it does not hold the mapping itself)
    view = kv(pool).byte_array
    assert count_mappings() == mappings + 1
    pool.close()
    del pool
    gc.collect()
    assert not buf.unmapped  # the view still reaches it
    view[0] = 1
    del view
    gc.collect()
    assert buf.unmapped
    assert count_mappings() == mappings


# The next tests drop every reference to the pool's memory before asserting,
# so that a failure (whose traceback pytest keeps) leaks nothing into the
# tests after it.


def test_view_keeps_the_mapping_until_dropped_while_the_pool_object_lives(
    native_name: str, mappings: int
) -> None:
    # The closed pool object stays referenced, as a long-lived owner keeps it:
    # the mapping must go when the last view goes, not when the pool object does.
    pool = NATIVE[native_name]()
    buf = pool.backing.buffer
    view = kv(pool).byte_array
    pool.close()
    held_by_view = not buf.unmapped
    view[0] = 1
    del view
    gc.collect()
    unmapped_without_views = buf.unmapped
    left = count_mappings() - mappings
    del pool
    assert held_by_view
    assert unmapped_without_views, "close() + last view dropped, but the mapping lives on"
    assert left == 0


def test_close_without_views_unmaps_at_once(native_name: str) -> None:
    pool = NATIVE[native_name]()
    buf = pool.backing.buffer
    kv(pool).ref_count_down()
    pool.close()
    gc.collect()
    unmapped = buf.unmapped
    del pool
    assert unmapped, "close() with no view alive left the mapping mapped"


def test_tensor_view_survives_close(native_name: str) -> None:
    pool = NATIVE[native_name]()
    buf = pool.backing.buffer
    obj = kv(pool)
    tensor = obj.tensor
    tensor.fill_(2.0)
    pool.close()
    del pool, obj
    gc.collect()
    assert not buf.unmapped
    assert bool((tensor == 2.0).all())
    tensor.fill_(3.0)
    del tensor
    gc.collect()
    assert buf.unmapped


# -- garbage collection --------------------------------------------------------


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_dropping_an_unclosed_pool_frees_its_mapping_once(
    native_name: str, mappings: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        pool = NATIVE[native_name]()
        buf = pool.backing.buffer
        objs = [kv(pool) for _ in range(3)]
        objs[0].ref_count_down()
        del pool, objs
        gc.collect()
        assert buf.unmapped
        assert count_mappings() == mappings
    assert _errors(caplog) == []


def test_dropping_the_pool_first_then_its_objects(
    native_name: str, mappings: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        pool = NATIVE[native_name]()
        buf = pool.backing.buffer
        obj = kv(pool)
        view = obj.byte_array
        del pool
        gc.collect()
        # A live object keeps its pool (and the pool's memory) alive.
        assert obj.is_valid() and not buf.closed
        view[:4] = b"live"
        del obj  # the last object goes: the garbage-collection backstop
        gc.collect()  # releases it, then closes the pool
        assert buf.closed
        assert not buf.unmapped  # the view still holds the mapping
        del view
        gc.collect()
        assert buf.unmapped
        assert count_mappings() == mappings
    assert _errors(caplog) == []


def test_a_pool_in_a_reference_cycle_is_collected(native_name: str, mappings: int) -> None:
    pool = NATIVE[native_name]()
    buf = pool.backing.buffer
    obj = kv(pool)
    holder: dict[str, object] = {"pool": pool, "obj": obj}
    holder["self"] = holder
    del pool, obj, holder
    gc.collect()
    assert buf.unmapped
    assert count_mappings() == mappings


def test_many_pools_dropped_and_closed_in_any_order(
    mappings: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        buffers = []
        for round_ in range(3):
            pools = [factory() for factory in NATIVE.values()]
            buffers += [p.backing.buffer for p in pools]
            objs = [kv(p) for p in pools]
            for i, p in enumerate(pools):
                if (i + round_) % 2:
                    p.close()
            # drop the objects first in one round, the pools first in the others
            if round_ == 1:
                del objs
                del pools, p
            else:
                del pools, p
                gc.collect()
                del objs
        gc.collect()
        assert all(b.unmapped for b in buffers)
        assert count_mappings() == mappings
    assert _errors(caplog) == []


def test_dead_handles_do_not_keep_the_memory(native_name: str) -> None:
    # An object of a closed pool is dead, not a view: it must not pin the mapping.
    pool = NATIVE[native_name]()
    buf = pool.backing.buffer
    obj = kv(pool)
    pool.close()
    del pool
    gc.collect()
    dead = not obj.is_valid()
    unmapped = buf.unmapped
    del obj
    assert dead
    assert unmapped, "a dead handle keeps its closed pool's mapping alive"


def test_dropped_objects_are_reclaimed_once_when_the_pool_runs_dry(
    native_name: str, lenient: None
) -> None:
    with NATIVE[native_name]() as pool:
        kept = []
        while (obj := pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)) is not None:
            kept.append(obj)
        full = len(kept)
        with pytest.warns(kvpool.LeakedHandleWarning, match="reclaiming"):
            del kept[::2], obj  # dropped without ref_count_down
            gc.collect()
            again = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        assert again is not None
        assert pool.num_active_allocations == len(kept) + 1
        assert pool.num_active_allocations <= full
        assert pool.memcheck()


# A program that drops one live object, with Python's default logging and warnings.
LEAK_CHILD = """
import gc, torch, kvpool
pool = kvpool.MixedMemoryAllocator(1 << 20)
obj = pool.allocate(torch.Size([2, 2, 16, 8]), torch.float16, kvpool.MemoryFormat.KV_2LTD)
del obj
gc.collect()
print("active after the leak:", pool.stats().active_objects)
pool.close()
"""


def test_a_leak_is_reported_once() -> None:
    # It was reported twice: on the kvpool logger and as a LeakedHandleWarning.
    done = subprocess.run(
        [sys.executable, "-c", LEAK_CHILD],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        env={k: v for k, v in os.environ.items() if k not in ("KVPOOL_STRICT", "PYTHONWARNINGS")},
    )
    assert done.returncode == 0, done.stderr
    assert "active after the leak: 0" in done.stdout
    assert done.stderr.count("reclaiming <TensorMemoryObj") == 1, done.stderr
    assert "LeakedHandleWarning" in done.stderr, done.stderr


# -- the other classes -----------------------------------------------------------


def test_buffer_allocator_gives_byte_buffers() -> None:
    alloc = kvpool.BufferAllocator()
    obj = alloc.allocate(torch.Size([100, 0, 0, 0]), torch.uint8)
    assert isinstance(obj, kvpool.BytesBufferMemoryObj)
    assert obj.get_size() == 100
    assert obj.get_memory_format() is MemoryFormat.BINARY_BUFFER
    obj.byte_array[:3] = b"abc"
    assert bytes(obj.byte_array[:3]) == b"abc"
    batch = alloc.batched_allocate(torch.Size([10, 0, 0, 0]), torch.uint8, 4)
    assert [o.get_size() for o in batch] == [10] * 4
    assert len({id(o.byte_array) for o in batch}) == 4
    alloc.free(obj)
    alloc.batched_free(batch)
    alloc.close()
    alloc.close()


def test_adhoc_allocator_lifecycle() -> None:
    alloc = kvpool.AdHocMemoryAllocator()
    obj = alloc.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    assert isinstance(obj, kvpool.TensorMemoryObj)
    assert obj.get_size() == KV_BYTES
    obj.byte_array[:] = pattern(KV_BYTES, 4)
    assert bytes(obj.byte_array) == pattern(KV_BYTES, 4)
    assert obj.parent() is alloc
    other = alloc.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    assert obj.data_ptr != other.data_ptr  # each object has its own tensor
    with pytest.raises(kvpool.FeatureUnavailableError, match="AdHocMemoryAllocator"):
        alloc.batched_allocate(KV_SHAPE, KV_DTYPE, 2)
    # The allocator's own counting methods do nothing, as in the reference.
    alloc.ref_count_up(obj)
    alloc.ref_count_down(obj)
    assert alloc.get_ref_count(obj) == 0
    assert obj.get_ref_count() == 1
    obj.ref_count_down()
    assert not obj.is_valid()
    alloc.free(other)
    alloc.batched_free([other])
    alloc.close()
    alloc.close()


def test_paged_cpu_gpu_allocator_lifecycle(mappings: int) -> None:
    alloc = kvpool.PagedCpuGpuMemoryAllocator()
    alloc.init_cpu_memory_allocator(MIB, [KV_SHAPE], [KV_DTYPE], KV_FMT)
    alloc.init_gpu_memory_allocator(MIB, [KV_SHAPE], [KV_DTYPE], KV_FMT)
    if not torch.cuda.is_available():
        assert alloc.gpu_pool.describe()["device"] == "cpu"  # falls back to CPU memory
    assert alloc.align_bytes == KV_BYTES
    assert alloc.cpu_size == MIB and alloc.cpu_numa_mapping is None
    assert alloc.cpu_buffer.numel() == MIB
    assert alloc.cpu_buffer.data_ptr() == alloc.cpu_pool.buffer.data_ptr()
    cpu = alloc.allocate(KV_SHAPE, KV_DTYPE, KV_FMT, allocator_type="cpu")
    gpu = alloc.allocate(KV_SHAPE, KV_DTYPE, KV_FMT, allocator_type="gpu")
    assert cpu.parent() is alloc.cpu_pool
    assert gpu.parent() is alloc.gpu_pool
    cpu.byte_array[:] = pattern(KV_BYTES, 5)
    assert bytes(alloc.cpu_pool.buffer[cpu.shm_offset : cpu.shm_offset + KV_BYTES].numpy()) == (
        pattern(KV_BYTES, 5)
    )
    batch = alloc.batched_allocate(KV_SHAPE, KV_DTYPE, 3, KV_FMT)  # "gpu" by default
    assert all(o.parent() is alloc.gpu_pool for o in batch)
    cpu_batch = alloc.batched_allocate(KV_SHAPE, KV_DTYPE, 2, KV_FMT, allocator_type="cpu")
    assert all(o.parent() is alloc.cpu_pool for o in cpu_batch)
    # batched_free takes objects of both pools and frees each into its own.
    alloc.batched_free([*batch, *cpu_batch, gpu])
    assert alloc.cpu_pool.num_active_allocations == 1
    assert alloc.gpu_pool.num_active_allocations == 0
    alloc.free(cpu)
    assert alloc.cpu_pool.num_active_allocations == 0
    assert alloc.memcheck()
    alloc.close()
    alloc.close()
    assert alloc.cpu_pool.closed and alloc.gpu_pool.closed
    assert alloc.cpu_buffer.numel() == 0 and alloc.cpu_size == 0
    del cpu, gpu, batch, cpu_batch, alloc
    assert count_mappings() == mappings
