"""TensorMemoryAllocator(tensor, align_bytes=4096, init_address_space=None)."""

from __future__ import annotations

import itertools

import pytest
import torch
from core_helpers import PAGED_DTYPE, PAGED_SHAPE

import kvpool
from kvpool import MemoryFormat, MemoryObjMetadata, TensorMemoryAllocator, TensorMemoryObj

U = 4096
SHAPE = torch.Size([3, 1000])  # 3000 bytes of uint8: aligned to one 4 KiB unit


def stats_tuple(pool) -> tuple:
    st = pool.stats()
    return (st.active_objects, st.used_bytes, st.pinned_objects, pool.num_active_allocations)


def assert_disjoint(objs: list) -> None:
    spans = sorted((o.shm_offset, o.shm_offset + o.get_physical_size()) for o in objs)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start, f"overlapping objects: {spans}"


def test_allocate_and_batched_allocate_give_the_same_logical_size(make_extent) -> None:
    pool = make_extent()
    one = pool.allocate(SHAPE, torch.uint8)
    batch = pool.batched_allocate(SHAPE, torch.uint8, 4)
    for obj in [one, *batch]:
        assert obj.raw_data.numel() == 3000 == obj.get_size()
        assert obj.get_physical_size() == U
        assert obj.tensor.shape == SHAPE
        assert obj.meta.address % U == 0
        assert obj.get_memory_format() is MemoryFormat.KV_2LTD  # the default
    addrs = [o.meta.address for o in batch]
    assert addrs == [addrs[0] + i * U for i in range(4)]  # one consecutive run
    assert_disjoint([one, *batch])
    assert stats_tuple(pool) == (5, 5 * U, 0, 5)
    assert pool.total_allocated_size == 5 * U
    assert pool.memcheck()


def test_objects_do_not_share_bytes(make_extent) -> None:
    pool = make_extent()
    objs = [pool.allocate(torch.Size([n]), torch.uint8) for n in (1, 4095, 4096, 4097, 9000)]
    objs += pool.batched_allocate(torch.Size([100]), torch.uint8, 3)
    for i, obj in enumerate(objs):
        obj.raw_data.fill_(i + 1)
    for i, obj in enumerate(objs):
        assert obj.raw_data.eq(i + 1).all()
    assert_disjoint(objs)


def test_custom_alignment(make_extent) -> None:
    pool = make_extent(nbytes=4096, align_bytes=64)
    objs = [pool.allocate(torch.Size([n]), torch.uint8) for n in (1, 64, 65, 200)]
    assert [o.get_physical_size() for o in objs] == [64, 64, 128, 256]
    assert all(o.meta.address % 64 == 0 for o in objs)
    assert pool.memcheck()


def test_multi_group_allocation_size(make_extent) -> None:
    pool = make_extent()
    shapes = [torch.Size([10, 10]), torch.Size([7])]
    dtypes = [torch.float32, torch.int16]
    obj = pool.allocate(shapes, dtypes)
    assert obj.get_size() == 400 + 14 == obj.raw_data.numel()
    batch = pool.batched_allocate(shapes, dtypes, 2)
    assert [o.get_size() for o in batch] == [414, 414]


def test_batched_allocate_zero(make_extent) -> None:
    pool = make_extent()
    assert pool.batched_allocate(SHAPE, torch.uint8, 0) == []
    assert stats_tuple(pool) == (0, 0, 0, 0)


# -- full ------------------------------------------------------------------------------


def test_allocate_returns_none_when_full(make_extent) -> None:
    pool = make_extent(nbytes=4 * U)
    objs = [pool.allocate(SHAPE, torch.uint8) for _ in range(4)]
    before = stats_tuple(pool)
    assert pool.allocate(SHAPE, torch.uint8) is None
    assert pool.allocate(torch.Size([5 * U]), torch.uint8) is None
    assert stats_tuple(pool) == before
    objs[1].ref_count_down()
    assert pool.allocate(SHAPE, torch.uint8) is not None
    assert pool.memcheck()


def test_batched_allocate_is_all_or_nothing(make_extent) -> None:
    pool = make_extent(nbytes=8 * U)
    held = pool.batched_allocate(SHAPE, torch.uint8, 5)
    before = stats_tuple(pool)
    assert pool.batched_allocate(SHAPE, torch.uint8, 4) is None
    assert stats_tuple(pool) == before
    more = pool.batched_allocate(SHAPE, torch.uint8, 3)
    assert len(more) == 3
    assert pool.allocate(SHAPE, torch.uint8) is None
    assert len(held) == 5 and pool.memcheck()


def test_dropped_objects_are_reclaimed_when_the_pool_runs_dry(make_extent) -> None:
    pool = make_extent(nbytes=2 * U)
    kept = pool.allocate(SHAPE, torch.uint8)
    with pytest.warns(kvpool.LeakedHandleWarning, match="reclaiming"):
        pool.allocate(SHAPE, torch.uint8)  # dropped without ref_count_down
        obj = pool.allocate(SHAPE, torch.uint8)
    assert obj is not None  # the dropped one was reclaimed...
    assert kept.is_valid() and obj.is_valid()  # ...but never a held one
    assert pool.allocate(SHAPE, torch.uint8) is None
    assert pool.memcheck()


# -- batched_free ------------------------------------------------------------------------


def test_batched_free_keeps_the_callers_list(make_extent) -> None:
    pool = make_extent()
    objs = pool.batched_allocate(SHAPE, torch.uint8, 6)
    shuffled = [objs[i] for i in (4, 0, 5, 2, 1, 3)]
    listed = list(shuffled)
    pool.batched_free(listed)
    assert len(listed) == 6
    assert all(a is b for a, b in zip(listed, shuffled, strict=True))
    assert not any(o.is_valid() for o in objs)
    assert stats_tuple(pool) == (0, 0, 0, 0)
    assert pool.address_manager.free_blocks() == [kvpool.FreeBlock(0, 64 * 1024)]
    assert pool.memcheck()


def test_batched_free_frees_each_object_once(make_extent, kvlog) -> None:
    pool = make_extent()
    a, b, c, d = pool.batched_allocate(SHAPE, torch.uint8, 4)
    b.ref_count_down()  # already freed
    e = pool.allocate(SHAPE, torch.uint8)  # takes b's place
    assert e.meta.address == b.meta.address
    pool.batched_free([a, b, a, c, c, b])
    assert not a.is_valid() and not c.is_valid()
    assert d.is_valid() and e.is_valid()
    assert len(kvlog.messages()) == 4  # b, the second a, the second c, b again
    assert stats_tuple(pool) == (2, 2 * U, 0, 2)
    assert pool.memcheck()
    e.raw_data.fill_(9)
    f = pool.allocate(SHAPE, torch.uint8)
    assert f.meta.address != e.meta.address and e.raw_data.eq(9).all()


def test_batched_free_of_pinned_objects(make_extent) -> None:
    pool = make_extent()
    objs = pool.batched_allocate(SHAPE, torch.uint8, 3)
    objs[0].pin()
    objs[2].pin()
    objs[2].pin()
    assert pool.stats().pinned_objects == 2
    pool.batched_free(objs)
    assert stats_tuple(pool) == (0, 0, 0, 0)
    assert pool.memcheck()


# -- ownership -----------------------------------------------------------------------


def test_objects_of_another_allocator_are_rejected(make_extent, make_paged) -> None:
    pool = make_extent()
    other = make_extent()
    paged = make_paged()
    mine = pool.allocate(SHAPE, torch.uint8)
    theirs = other.allocate(SHAPE, torch.uint8)
    paged_obj = paged.allocate(PAGED_SHAPE, PAGED_DTYPE)
    hand = TensorMemoryObj(
        torch.zeros(8, dtype=torch.uint8),
        MemoryObjMetadata(torch.Size([8]), torch.uint8, 0, 8, 1),
    )
    bytes_obj = kvpool.BytesBufferMemoryObj(b"x")
    for foreign in (theirs, paged_obj, hand, bytes_obj, None, "obj"):
        with pytest.raises(kvpool.InvalidHandleError):
            pool.free(foreign)  # type: ignore[arg-type]
        with pytest.raises(kvpool.InvalidHandleError):
            pool.batched_free([mine, foreign])  # type: ignore[list-item]
    assert mine.is_valid() and theirs.is_valid() and paged_obj.is_valid() and hand.is_valid()
    assert stats_tuple(pool) == (1, U, 0, 1) and stats_tuple(other) == (1, U, 0, 1)
    assert pool.memcheck() and other.memcheck() and paged.memcheck()


# -- address space ----------------------------------------------------------------------


def test_init_address_space_and_sbrk(make_extent) -> None:
    pool = make_extent(nbytes=8 * U, init_address_space=2 * U)
    assert pool.address_manager.get_heap_size() == 2 * U
    a = pool.batched_allocate(SHAPE, torch.uint8, 2)
    assert pool.allocate(SHAPE, torch.uint8) is None
    pool.address_manager.sbrk(6 * U)
    b = pool.batched_allocate(SHAPE, torch.uint8, 6)
    assert b is not None and pool.allocate(SHAPE, torch.uint8) is None
    assert_disjoint(a + b)
    assert pool.stats().total_bytes == 8 * U
    assert pool.memcheck()


def test_objects_stay_inside_the_tensor_after_sbrk(make_extent) -> None:
    """sbrk past the tensor must not produce objects outside the caller's memory."""
    pool = make_extent(nbytes=4 * U, init_address_space=2 * U)
    buffer_end = pool.buffer.data_ptr() + pool.buffer.numel()
    try:
        pool.address_manager.sbrk(8 * U)  # twice what the tensor has left
    except ValueError:
        return  # refusing to grow past the tensor is a fine answer
    objs = [pool.allocate(SHAPE, torch.uint8) for _ in range(10)]
    for obj in objs:
        if obj is not None:
            assert obj.data_ptr + obj.get_physical_size() <= buffer_end, (
                f"{obj!r} lies outside the pool tensor"
            )
            assert len(obj.byte_array) == obj.get_size() == 3000
    assert pool.memcheck()


# -- lifecycle --------------------------------------------------------------------------


def test_close_is_idempotent_and_final(make_extent) -> None:
    pool = make_extent()
    obj = pool.allocate(SHAPE, torch.uint8)
    pool.close()
    pool.close()
    assert pool.closed and not obj.is_valid()
    with pytest.raises(kvpool.PoolClosedError):
        pool.allocate(SHAPE, torch.uint8)
    with pytest.raises(kvpool.PoolClosedError):
        pool.batched_allocate(SHAPE, torch.uint8, 2)
    obj.ref_count_down()  # a dead handle: ignored


def test_stats_fields(make_extent) -> None:
    pool = make_extent(nbytes=8 * U)
    a, b, c = (pool.allocate(SHAPE, torch.uint8) for _ in range(3))
    b.pin()
    a.ref_count_down()
    st = pool.stats()
    assert st.total_bytes == 8 * U
    assert st.used_bytes == 2 * U and st.free_bytes == 6 * U
    assert st.active_objects == 2 and st.pinned_objects == 1
    assert st.largest_free_block == 5 * U
    assert st.fragmentation == pytest.approx(1 - 5 / 6)
    assert isinstance(pool, kvpool.MemoryAllocatorInterface)
    assert str(pool) == "TensorMemoryAllocator"
    assert c.is_valid()


def test_accepts_any_contiguous_dtype() -> None:
    pool = TensorMemoryAllocator(torch.zeros(2, 4096, dtype=torch.float32))
    assert pool.buffer.dtype is torch.uint8 and pool.buffer.numel() == 2 * 4096 * 4
    obj = pool.allocate(torch.Size([4096]), torch.float32)
    assert obj.tensor.shape == torch.Size([4096])
