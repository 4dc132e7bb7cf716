"""PagedTensorMemoryAllocator(tensor, shapes, dtypes, fmt): pages, dead handles, recycling."""

from __future__ import annotations

import pytest
import torch
from core_helpers import PAGED_BYTES, PAGED_DTYPE, PAGED_SHAPE

import kvpool
from kvpool import MemoryFormat

PARTIAL = torch.Size([2, 2, 5, 8])  # 5 of 16 tokens
PARTIAL_BYTES = PARTIAL.numel() * 2


def alloc(pool, shape=PAGED_SHAPE, dtype=PAGED_DTYPE, **kw):
    return pool.allocate(shape, dtype, **kw)


def assert_exact(pool, objs: list) -> None:
    """memcheck holds and the counters equal a recount of the handles held."""
    assert pool.memcheck()
    valid = [o for o in objs if o.is_valid()]
    st = pool.stats()
    assert st.active_objects == pool.num_active_allocations == len(valid)
    assert st.used_bytes == len(valid) * PAGED_BYTES == pool.total_allocated_size
    assert st.free_bytes == pool.address_manager.get_free_size()
    assert st.pinned_objects == sum(o.is_pinned for o in valid)
    pages = [o.meta.address for o in valid]
    assert len(set(pages)) == len(pages), "a page has two owners"
    assert not set(pages) & set(pool.free_blocks), "a live page is on the free list"


def test_pages(make_paged) -> None:
    pool = make_paged(pages=4)
    assert pool.align_bytes == PAGED_BYTES and pool.num_pages == 4
    assert pool.address_manager.get_heap_size() == 4 * PAGED_BYTES
    assert pool.free_blocks == [0, 1, 2, 3]
    objs = [alloc(pool) for _ in range(4)]
    assert [o.meta.address for o in objs] == [0, 1, 2, 3]
    assert all(o.get_physical_size() == PAGED_BYTES == o.get_size() for o in objs)
    assert all(o.get_memory_format() is MemoryFormat.KV_2LTD for o in objs)
    assert alloc(pool) is None
    objs[2].ref_count_down()
    objs[0].ref_count_down()
    assert pool.free_blocks == [2, 0]  # FIFO
    again = alloc(pool)
    assert again.meta.address == 2
    assert len(pool.paged_buffers) == 4
    assert all(b.numel() == PAGED_BYTES for b in pool.paged_buffers)
    assert str(pool) == "PagedTensorMemoryAllocator"
    assert_exact(pool, [*objs, again])


def test_batched_allocate_all_or_nothing(make_paged) -> None:
    pool = make_paged(pages=4)
    assert pool.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 0) == []
    held = pool.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 3)
    assert len(held) == 3
    assert pool.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 2) is None
    assert pool.free_blocks == [3] and pool.num_active_allocations == 3
    more = pool.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 1)
    assert_exact(pool, held + more)


def test_partial_chunk_reports_its_real_size(make_paged) -> None:
    pool = make_paged(pages=2)
    obj = alloc(pool, PARTIAL)
    assert obj.get_size() == PARTIAL_BYTES == obj.shm_byte_length
    assert obj.raw_data.numel() == PARTIAL_BYTES
    assert len(obj.byte_array) == PARTIAL_BYTES
    assert obj.tensor.shape == PARTIAL
    assert obj.get_num_tokens() == 5
    assert obj.get_physical_size() == PAGED_BYTES
    batch = pool.batched_allocate(PARTIAL, PAGED_DTYPE, 1)
    assert batch[0].get_size() == PARTIAL_BYTES
    assert_exact(pool, [obj, *batch])


def test_layout_larger_than_a_page_is_refused(make_paged) -> None:
    pool = make_paged(pages=2)
    with pytest.raises(kvpool.InvalidArgumentError):
        alloc(pool, torch.Size([2, 2, 17, 8]))
    with pytest.raises(kvpool.InvalidArgumentError):
        pool.batched_allocate(torch.Size([2, 2, 16, 8]), torch.float32, 1)
    assert_exact(pool, [])


# -- a freed handle is dead --------------------------------------------------------------


def _reuse(pool):
    """Allocate a page, free it, hand it to a new owner; return (stale, new)."""
    stale = alloc(pool)
    page = stale.meta.address
    stale.ref_count_down()
    new = alloc(pool)
    assert new.meta.address == page
    new.raw_data.fill_(0x5C)
    return stale, new


LATE_CALLS = {
    "ref_count_down": lambda pool, stale: stale.ref_count_down(),
    "ref_count_down-twice": lambda pool, stale: (stale.ref_count_down(), stale.ref_count_down()),
    "unpin": lambda pool, stale: stale.unpin(),
    "pin-unpin": lambda pool, stale: (stale.pin(), stale.unpin()),
    "ref_count_up-down": lambda pool, stale: (stale.ref_count_up(), stale.ref_count_down()),
    "free": lambda pool, stale: pool.free(stale),
    "batched_free": lambda pool, stale: pool.batched_free([stale]),
    "batched_free-dup": lambda pool, stale: pool.batched_free([stale, stale]),
}


@pytest.mark.parametrize("call", list(LATE_CALLS))
def test_late_call_on_a_stale_handle_spares_the_new_owner(call: str, make_paged) -> None:
    pool = make_paged(pages=1)
    stale, new = _reuse(pool)
    LATE_CALLS[call](pool, stale)
    assert not stale.is_valid()
    assert new.is_valid() and new.get_ref_count() == 1 and not new.is_pinned
    assert new.raw_data.eq(0x5C).all()
    assert alloc(pool) is None  # the page is still new's alone
    assert_exact(pool, [stale, new])


def test_unpin_after_the_pool_freed_a_pinned_object(make_paged) -> None:
    pool = make_paged(pages=1)
    obj = alloc(pool)
    obj.pin()
    pool.free(obj)  # frees regardless of counts, drops the pin
    assert not obj.is_valid() and pool.stats().pinned_objects == 0
    new = alloc(pool)
    new.pin()
    obj.unpin()
    obj.unpin()
    assert new.is_valid() and new.is_pinned and new.meta.pin_count == 1
    assert_exact(pool, [obj, new])


def test_batched_free_after_free(make_paged) -> None:
    pool = make_paged(pages=3)
    a, b, c = pool.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 3)
    pool.free(b)
    d = alloc(pool)  # b's page
    pool.batched_free([a, b, c])
    assert not a.is_valid() and not c.is_valid() and d.is_valid()
    assert_exact(pool, [a, b, c, d])
    pool.batched_free([a, b, c, a])
    assert_exact(pool, [a, b, c, d])


def test_stats_exact_with_invalid_objects_in_lists(make_paged) -> None:
    pool = make_paged(pages=6)
    objs = pool.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 6)
    objs[1].ref_count_down()
    objs[3].pin()
    replacement = alloc(pool)
    pool.batched_free([objs[0], objs[1], objs[0], objs[3], objs[1]])
    assert_exact(pool, [*objs, replacement])
    assert pool.num_active_allocations == 4  # objs 2, 4, 5 and the replacement
    pool.batched_free(objs)
    assert_exact(pool, [*objs, replacement])
    assert pool.num_active_allocations == 1


def test_objects_of_another_allocator_are_rejected(make_paged, make_extent) -> None:
    pool = make_paged(pages=4)
    other = make_paged(pages=4)
    extent = make_extent()
    mine = pool.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 2)
    theirs = alloc(other)
    ext_obj = extent.allocate(PAGED_SHAPE, PAGED_DTYPE)
    for pinned in (False, True):
        if pinned:
            mine[1].pin()
        for foreign in (theirs, ext_obj, kvpool.BytesBufferMemoryObj(b"x"), None):
            with pytest.raises(kvpool.InvalidHandleError):
                pool.free(foreign)
            with pytest.raises(kvpool.InvalidHandleError):
                pool.batched_free([mine[0], mine[1], foreign])
        assert all(o.is_valid() for o in mine) and theirs.is_valid() and ext_obj.is_valid()
        assert mine[1].is_pinned is pinned
        assert_exact(pool, mine)
        assert other.memcheck() and extent.memcheck()


# -- reset on reuse ------------------------------------------------------------------------


def _assert_default(obj) -> None:
    assert obj.is_valid()
    assert obj.get_shape() == PAGED_SHAPE and obj.get_dtype() is PAGED_DTYPE
    assert obj.get_shapes() == [PAGED_SHAPE] and obj.get_dtypes() == [PAGED_DTYPE]
    assert obj.get_memory_format() is MemoryFormat.KV_2LTD
    assert obj.get_ref_count() == 1 and obj.meta.pin_count == 0 and not obj.is_pinned
    assert obj.get_size() == PAGED_BYTES == obj.shm_byte_length
    assert obj.raw_data.numel() == PAGED_BYTES and len(obj.byte_array) == PAGED_BYTES
    assert obj.tensor.shape == PAGED_SHAPE and obj.tensor.dtype is PAGED_DTYPE
    assert obj.get_num_tokens() == 16
    assert obj.can_evict


def _partial(pool):
    obj = alloc(pool, PARTIAL)
    obj.ref_count_down()


def _other_fmt(pool):
    obj = alloc(pool, fmt=MemoryFormat.KV_MLA_FMT)
    obj.ref_count_down()


def _other_dtype(pool):
    obj = alloc(pool, torch.Size([PAGED_BYTES]), torch.uint8)
    obj.ref_count_down()


def _pinned_then_freed(pool):
    obj = alloc(pool)
    obj.pin()
    obj.pin()
    pool.free(obj)


def _pinned_batched_free(pool):
    objs = pool.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 1)
    objs[0].pin()
    pool.batched_free(objs)


def _used_size(pool):
    obj = alloc(pool)
    obj.set_used_size(3)
    obj.ref_count_down()


def _ref_counted(pool):
    obj = alloc(pool)
    obj.ref_count_up()
    obj.ref_count_up()
    pool.free(obj)


def _meta_changed(pool):
    obj = alloc(pool)
    obj.meta.fmt = MemoryFormat.BINARY
    obj.meta.shape = torch.Size([1])
    obj.ref_count_down()


PREVIOUS_OWNERS = {
    "partial-chunk": _partial,
    "other-fmt": _other_fmt,
    "other-dtype": _other_dtype,
    "pinned-then-freed": _pinned_then_freed,
    "pinned-batched-free": _pinned_batched_free,
    "set_used_size": _used_size,
    "ref_count-up": _ref_counted,
    "meta-changed": _meta_changed,
}


@pytest.mark.parametrize("previous", list(PREVIOUS_OWNERS))
@pytest.mark.parametrize("batched", [False, True], ids=["allocate", "batched"])
def test_everything_per_allocation_is_reset_on_reuse(
    previous: str, batched: bool, make_paged
) -> None:
    pool = make_paged(pages=1)
    for _ in range(2):  # once on a fresh page, once on a recycled handle
        PREVIOUS_OWNERS[previous](pool)
        assert pool.num_active_allocations == 0
        obj = pool.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 1)[0] if batched else alloc(pool)
        _assert_default(obj)
        assert_exact(pool, [obj])
        obj.ref_count_down()


def test_partial_chunk_after_a_full_one_reports_its_real_size(make_paged) -> None:
    pool = make_paged(pages=1)
    for shape in (PAGED_SHAPE, PARTIAL, PAGED_SHAPE, PARTIAL):
        obj = alloc(pool, shape)
        assert obj.get_size() == shape.numel() * 2 == len(obj.byte_array)
        assert obj.tensor.shape == shape
        obj.ref_count_down()


# -- handle recycling -----------------------------------------------------------------------


def test_a_held_stale_handle_is_never_handed_out_again(make_paged) -> None:
    pool = make_paged(pages=2)
    stale = alloc(pool)
    stale_page = stale.meta.address
    stale.ref_count_down()
    stale_id = id(stale)
    seen_page = 0
    for i in range(500):
        objs = pool.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 2) if i % 2 else [alloc(pool)]
        for obj in objs:
            assert obj is not stale and id(obj) != stale_id
            assert obj.is_valid() and obj.get_ref_count() == 1
            seen_page += obj.meta.address == stale_page
        assert not stale.is_valid()
        if i % 3:
            pool.batched_free(objs)
        else:
            for obj in objs:
                obj.ref_count_down()
        del objs, obj
    assert seen_page > 100  # the page itself was reused many times
    stale.ref_count_down()
    stale.unpin()
    assert not stale.is_valid() and pool.num_active_allocations == 0
    assert_exact(pool, [stale])


def test_exposed_metadata_is_not_reused(make_paged) -> None:
    pool = make_paged(pages=1)
    for expose in ("meta", "metadata"):
        obj = alloc(pool)
        meta = getattr(obj, expose)
        obj.ref_count_down()
        del obj
        new = alloc(pool)
        assert new.meta is not meta
        assert meta.ref_count == 0  # the new owner's counts are not in the old record
        new.ref_count_up()
        new.pin()
        assert meta.ref_count == 0 and meta.pin_count == 0
        new.unpin()
        pool.free(new)


def test_dropped_handles_are_reclaimed_when_the_pool_runs_dry(make_paged) -> None:
    pool = make_paged(pages=2)
    kept = alloc(pool)
    with pytest.warns(kvpool.LeakedHandleWarning, match="reclaiming"):
        alloc(pool)  # dropped without ref_count_down
        obj = alloc(pool)
    assert obj is not None
    assert kept.is_valid() and obj.is_valid()
    assert alloc(pool) is None
    assert_exact(pool, [kept, obj])


def test_close(make_paged) -> None:
    pool = make_paged(pages=2)
    obj = alloc(pool)
    pool.close()
    pool.close()
    assert pool.closed and not obj.is_valid()
    with pytest.raises(kvpool.PoolClosedError):
        alloc(pool)
    with pytest.raises(kvpool.PoolClosedError):
        pool.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 1)
    obj.ref_count_down()
    assert pool.memcheck()
