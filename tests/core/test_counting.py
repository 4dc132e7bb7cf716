"""Counting errors: a ref or pin count pushed below zero never frees twice.

By default the event is logged as a warning on the ``kvpool`` logger and
ignored; in strict mode it raises ``RefCountError`` (counts) or
``InvalidHandleError`` (calls on a freed handle).  Either way the pool
stays consistent and no one else's memory is touched.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from core_helpers import PAGED_DTYPE, PAGED_SHAPE

import kvpool
import kvpool.misuse
from kvpool import BytesBufferMemoryObj, MemoryObjMetadata, TensorMemoryObj

KINDS = ["extent", "paged"]


def make_pool(kind: str, make_extent, make_paged):
    # One-object pools: a freed object's memory goes straight to the next owner.
    if kind == "extent":
        return make_extent(nbytes=4096)
    return make_paged(pages=1)


def alloc(pool):
    return pool.allocate(PAGED_SHAPE, PAGED_DTYPE)


def assert_exact(pool, live: list) -> None:
    """memcheck holds and the stats match the objects the test holds."""
    assert pool.memcheck()
    valid = [o for o in live if o.is_valid()]
    st = pool.stats()
    assert st.active_objects == len(valid) == pool.num_active_allocations
    assert st.used_bytes == sum(o.get_physical_size() for o in valid)
    assert st.pinned_objects == sum(o.is_pinned for o in valid)


@pytest.mark.parametrize("kind", KINDS)
def test_double_ref_count_down_warns_and_spares_the_next_owner(
    kind: str, make_extent, make_paged, kvlog
) -> None:
    pool = make_pool(kind, make_extent, make_paged)
    old = alloc(pool)
    old.ref_count_down()
    new = alloc(pool)
    assert new is not None and new is not old
    assert new.data_ptr == pool.buffer.data_ptr()  # the same memory, a new owner
    new.raw_data.fill_(0x42)
    kvlog.clear()
    old.ref_count_down()
    old.unpin()
    old.ref_count_up()
    assert not old.pin()
    assert len(kvlog.messages()) == 4
    assert all("freed" in m for m in kvlog.messages())
    assert new.is_valid() and new.get_ref_count() == 1 and not new.is_pinned
    assert alloc(pool) is None  # the page/extent is still taken by `new`
    assert new.raw_data.eq(0x42).all()
    assert_exact(pool, [old, new])


@pytest.mark.parametrize("kind", KINDS)
def test_unpin_below_zero_warns_and_frees_nothing(kind: str, make_extent, make_paged, kvlog):
    pool = make_pool(kind, make_extent, make_paged)
    obj = alloc(pool)
    assert obj.unpin() is False
    assert len(kvlog.messages()) == 1
    assert obj.is_valid() and obj.meta.pin_count == 0 and obj.get_ref_count() == 1
    assert_exact(pool, [obj])
    obj.ref_count_down()
    assert_exact(pool, [obj])


@pytest.mark.parametrize("kind", KINDS)
def test_ref_count_below_zero_while_pinned(kind: str, make_extent, make_paged, kvlog) -> None:
    pool = make_pool(kind, make_extent, make_paged)
    obj = alloc(pool)
    obj.pin()
    obj.ref_count_down()  # 0 references, held by the pin
    assert obj.is_valid() and obj.get_ref_count() == 0
    kvlog.clear()
    obj.ref_count_down()  # below zero: reported, ignored
    assert len(kvlog.messages()) == 1
    assert obj.is_valid() and obj.get_ref_count() == 0 and obj.is_pinned
    assert_exact(pool, [obj])
    obj.unpin()  # frees, once
    assert not obj.is_valid()
    assert_exact(pool, [obj])
    obj.unpin()
    obj.ref_count_down()
    assert_exact(pool, [obj])
    assert alloc(pool) is not None


@pytest.mark.parametrize("kind", KINDS)
def test_double_free_warns(kind: str, make_extent, make_paged, kvlog) -> None:
    pool = make_pool(kind, make_extent, make_paged)
    obj = alloc(pool)
    pool.free(obj)
    new = alloc(pool)
    kvlog.clear()
    pool.free(obj)
    pool.batched_free([obj])
    assert len(kvlog.messages()) == 2
    assert new.is_valid()
    assert_exact(pool, [obj, new])


# -- strict mode ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_strict_mode_raises_on_dead_handles(kind: str, make_extent, make_paged, strict) -> None:
    pool = make_pool(kind, make_extent, make_paged)
    old = alloc(pool)
    old.ref_count_down()
    new = alloc(pool)
    for call in (old.ref_count_down, old.ref_count_up, old.pin, old.unpin):
        with pytest.raises(kvpool.InvalidHandleError):
            call()
    with pytest.raises(kvpool.InvalidHandleError):
        pool.free(old)
    with pytest.raises(kvpool.InvalidHandleError):
        pool.batched_free([old])
    assert new.is_valid() and new.get_ref_count() == 1
    assert_exact(pool, [old, new])


@pytest.mark.parametrize("kind", KINDS)
def test_strict_mode_raises_on_counts_below_zero(
    kind: str, make_extent, make_paged, strict
) -> None:
    pool = make_pool(kind, make_extent, make_paged)
    obj = alloc(pool)
    with pytest.raises(kvpool.RefCountError):
        obj.unpin()
    assert obj.is_valid() and obj.meta.pin_count == 0
    obj.pin()
    obj.ref_count_down()
    with pytest.raises(kvpool.RefCountError):
        obj.ref_count_down()
    assert obj.is_valid() and obj.get_ref_count() == 0 and obj.is_pinned
    assert_exact(pool, [obj])
    obj.unpin()
    assert not obj.is_valid()
    assert_exact(pool, [obj])


@pytest.mark.parametrize("kind", KINDS)
def test_strict_batched_free_with_a_freed_entry_keeps_the_pool_exact(
    kind: str, make_extent, make_paged, strict
) -> None:
    pool = make_extent(nbytes=8 * 4096) if kind == "extent" else make_paged(pages=8)
    objs = pool.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 4)
    objs[2].ref_count_down()
    with pytest.raises(kvpool.InvalidHandleError):
        pool.batched_free([objs[0], objs[1], objs[2], objs[3]])
    # Whatever was freed before the raise, handles and memory must agree.
    assert_exact(pool, objs)
    with pytest.raises(kvpool.InvalidHandleError):
        pool.batched_free([objs[0], objs[0]])
    assert_exact(pool, objs)


def test_bytes_buffer_unpin_below_zero(kvlog) -> None:
    obj = BytesBufferMemoryObj(b"abc")
    assert obj.unpin() is False
    assert len(kvlog.messages()) == 1 and obj.meta.pin_count == 0
    kvpool.set_strict_mode(True)
    with pytest.raises(kvpool.RefCountError):
        obj.unpin()
    assert obj.meta.pin_count == 0


def test_hand_built_without_parent_below_zero(kvlog) -> None:
    meta = MemoryObjMetadata(torch.Size([8]), torch.uint8, 0, 8, 1)
    obj = TensorMemoryObj(torch.zeros(8, dtype=torch.uint8), meta)
    obj.ref_count_down()
    assert obj.get_ref_count() == 0 and kvlog.messages() == []
    obj.ref_count_down()
    assert obj.get_ref_count() == 0 and len(kvlog.messages()) == 1
    kvpool.set_strict_mode(True)
    with pytest.raises(kvpool.RefCountError):
        obj.ref_count_down()
    assert obj.get_ref_count() == 0


def test_set_strict_mode_returns_previous() -> None:
    assert kvpool.strict_mode() is False
    assert kvpool.set_strict_mode(True) is False
    assert kvpool.strict_mode() is True
    assert kvpool.set_strict_mode(False) is True
    assert kvpool.strict_mode() is False


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("true", True), (" YES ", True), ("on", True), ("0", False), ("", False)],
)
def test_strict_mode_from_environment(
    value: str, expected: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A private copy of kvpool.misuse, imported with the variable set.
    monkeypatch.setenv("KVPOOL_STRICT", value)
    spec = importlib.util.spec_from_file_location("_misuse_copy", kvpool.misuse.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.strict_mode() is expected
    assert module.STRICT_ENV == "KVPOOL_STRICT"
