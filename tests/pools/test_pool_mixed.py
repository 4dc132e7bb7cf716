"""MixedMemoryAllocator: byte buffers for BINARY_BUFFER, the pinned pool for KV formats."""

from __future__ import annotations

import pytest
import torch
from pool_helpers import KV_BYTES, KV_DTYPE, KV_FMT, KV_SHAPE, MIB, paged_kwargs, pattern

import kvpool
from kvpool import MemoryFormat

BUF_SHAPE = torch.Size([300, 0, 0, 0])
KV_FORMATS = [
    MemoryFormat.KV_2LTD,
    MemoryFormat.KV_T2D,
    MemoryFormat.KV_2TD,
    MemoryFormat.KV_MLA_FMT,
]


@pytest.fixture(params=["extent", "paged"])
def mixed(request: pytest.FixtureRequest):
    if request.param == "paged":
        pool = kvpool.MixedMemoryAllocator(MIB, use_paging=True, **paged_kwargs())
    else:
        pool = kvpool.MixedMemoryAllocator(MIB)
    yield pool
    pool.close()


def test_binary_buffer_gives_byte_buffers_outside_the_pool(mixed) -> None:
    obj = mixed.allocate(BUF_SHAPE, torch.uint8, MemoryFormat.BINARY_BUFFER)
    assert isinstance(obj, kvpool.BytesBufferMemoryObj)
    assert obj.get_size() == 300
    assert obj.get_memory_format() is MemoryFormat.BINARY_BUFFER
    assert mixed.num_active_allocations == 0  # not in the pinned pool
    obj.byte_array[:] = pattern(300, 1)
    assert bytes(obj.byte_array) == pattern(300, 1)
    batch = mixed.batched_allocate(BUF_SHAPE, torch.uint8, 3, MemoryFormat.BINARY_BUFFER)
    assert all(isinstance(o, kvpool.BytesBufferMemoryObj) for o in batch)
    assert mixed.num_active_allocations == 0
    mixed.free(obj)  # nothing to do, and no error
    mixed.batched_free(batch)


@pytest.mark.parametrize("fmt", KV_FORMATS, ids=lambda f: f.name)
def test_kv_formats_go_to_the_pinned_pool(mixed, fmt: MemoryFormat) -> None:
    obj = mixed.allocate(KV_SHAPE, KV_DTYPE, fmt)
    assert isinstance(obj, kvpool.TensorMemoryObj)
    assert obj.get_memory_format() is fmt
    assert obj.parent() is mixed  # the outer allocator owns its objects, as in LMCache
    assert mixed.num_active_allocations == 1
    lo = mixed.buffer.data_ptr()
    assert lo <= obj.data_ptr < lo + mixed.size
    batch = mixed.batched_allocate(KV_SHAPE, KV_DTYPE, 2, fmt)
    assert all(o.get_memory_format() is fmt for o in batch)
    assert mixed.num_active_allocations == 3
    mixed.batched_free([obj, *batch])
    assert mixed.num_active_allocations == 0


def test_batched_free_of_a_mixed_list_frees_each_by_its_format(mixed) -> None:
    kv_objs = mixed.batched_allocate(KV_SHAPE, KV_DTYPE, 3, KV_FMT)
    buffers = mixed.batched_allocate(BUF_SHAPE, torch.uint8, 2, MemoryFormat.BINARY_BUFFER)
    other_kv = mixed.allocate(KV_SHAPE, KV_DTYPE, MemoryFormat.KV_T2D)
    keep = mixed.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    keep.byte_array[:] = pattern(KV_BYTES, 9)
    listed = [buffers[0], kv_objs[0], other_kv, buffers[1], kv_objs[1], kv_objs[2]]
    snapshot = list(listed)
    # The first element is a byte buffer: the reference would have treated
    # the whole list as byte buffers and leaked the pool objects.
    mixed.batched_free(listed)
    assert listed == snapshot  # the caller's list is not modified
    assert not any(o.is_valid() for o in [*kv_objs, other_kv])
    assert mixed.num_active_allocations == 1
    assert keep.is_valid() and bytes(keep.byte_array) == pattern(KV_BYTES, 9)
    assert mixed.memcheck()
    # The freed space is reusable.
    again = mixed.batched_allocate(KV_SHAPE, KV_DTYPE, 4, KV_FMT)
    assert again is not None
    mixed.batched_free([keep, *again])


def test_batched_free_of_a_list_starting_with_a_kv_object(mixed) -> None:
    kv_obj = mixed.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    buf = mixed.allocate(BUF_SHAPE, torch.uint8, MemoryFormat.BINARY_BUFFER)
    mixed.batched_free([kv_obj, buf])
    assert not kv_obj.is_valid()
    assert mixed.num_active_allocations == 0


@pytest.mark.parametrize("method", ["allocate", "batched_allocate"])
def test_undefined_format_is_a_value_error_naming_the_supported_ones(mixed, method: str) -> None:
    args = (KV_SHAPE, KV_DTYPE, 1) if method == "batched_allocate" else (KV_SHAPE, KV_DTYPE)
    with pytest.raises(ValueError) as info:
        getattr(mixed, method)(*args, fmt=MemoryFormat.UNDEFINED)
    assert isinstance(info.value, kvpool.InvalidArgumentError)
    message = str(info.value)
    assert "UNDEFINED" in message
    supported = message.split("supported:", 1)[1]
    for fmt in [*KV_FORMATS, MemoryFormat.BINARY_BUFFER]:
        assert fmt.name in supported, message
    assert "UNDEFINED" not in supported
    assert mixed.num_active_allocations == 0


def test_a_format_that_is_not_a_memory_format_is_refused(mixed) -> None:
    with pytest.raises(kvpool.InvalidArgumentError):
        mixed.allocate(KV_SHAPE, KV_DTYPE, "KV_2LTD")


def test_pools_without_byte_buffers_refuse_binary_buffer() -> None:
    with kvpool.PinMemoryAllocator(MIB) as pool:
        with pytest.raises(kvpool.InvalidArgumentError) as info:
            pool.allocate(BUF_SHAPE, torch.uint8, MemoryFormat.BINARY_BUFFER)
        assert "BINARY_BUFFER" in str(info.value)
        # and a byte buffer made elsewhere is not theirs to free
        stray = kvpool.BufferAllocator().allocate(BUF_SHAPE, torch.uint8)
        with pytest.raises(kvpool.InvalidHandleError):
            pool.free(stray)
