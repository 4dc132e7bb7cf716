"""Memory objects: TensorMemoryObj (hand-built, pooled), BytesBufferMemoryObj, GDSMemoryObject."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from core_helpers import PAGED_BYTES, PAGED_DTYPE, PAGED_SHAPE

import kvpool
from kvpool import (
    BytesBufferMemoryObj,
    GDSMemoryObject,
    MemoryFormat,
    MemoryObjMetadata,
    TensorMemoryObj,
)

GROUP_SHAPES = [torch.Size([4, 8]), torch.Size([3, 5]), torch.Size([7])]
GROUP_DTYPES = [torch.float32, torch.float16, torch.uint8]
GROUP_BYTES = 4 * 8 * 4 + 3 * 5 * 2 + 7


def hand_built(
    nbytes: int = 64, parent: object = None, shape: torch.Size | None = None
) -> TensorMemoryObj:
    shape = torch.Size([nbytes // 4]) if shape is None else shape
    meta = MemoryObjMetadata(shape, torch.float32, 0, nbytes, 1, 0, MemoryFormat.KV_2TD)
    return TensorMemoryObj(torch.zeros(nbytes, dtype=torch.uint8), meta, parent)


class CountingParent:
    """Stands in for an allocator: counts free() calls."""

    def __init__(self) -> None:
        self.freed: list[object] = []

    def free(self, obj: object, allocator_type: str | None = None) -> None:
        self.freed.append(obj)


def pooled(kind: str, make_extent, make_paged):
    """(pool, object) of the default layout from either pool kind."""
    pool = make_extent() if kind == "extent" else make_paged()
    return pool, pool.allocate(PAGED_SHAPE, PAGED_DTYPE)


KINDS = ["extent", "paged"]


# -- hand-built objects ------------------------------------------------------------


def test_hand_built_object_basics() -> None:
    parent = CountingParent()
    obj = hand_built(64, parent)
    assert obj.is_valid()
    assert obj.get_size() == 64 and obj.get_physical_size() == 64
    assert obj.get_shape() == torch.Size([16]) and obj.get_dtype() is torch.float32
    assert obj.get_shapes() == [torch.Size([16])] and obj.get_dtypes() == [torch.float32]
    assert obj.get_memory_format() is MemoryFormat.KV_2TD
    assert obj.parent() is parent
    assert obj.metadata is obj.meta
    t = obj.tensor
    assert t.shape == torch.Size([16]) and t.dtype is torch.float32
    t.fill_(1.5)
    assert obj.raw_data.view(torch.float32).eq(1.5).all()  # zero-copy
    assert obj.data_ptr == obj.raw_data.data_ptr() == t.data_ptr()
    assert obj.raw_tensor is obj.raw_data


def test_hand_built_last_reference_frees_once() -> None:
    parent = CountingParent()
    obj = hand_built(parent=parent)
    obj.ref_count_up()
    assert obj.get_ref_count() == 2
    obj.ref_count_down()
    assert parent.freed == []
    obj.ref_count_down()
    assert parent.freed == [obj]
    assert not obj.is_valid()
    obj.ref_count_down()
    obj.unpin()
    assert parent.freed == [obj]


def test_hand_built_pin_holds_the_memory() -> None:
    parent = CountingParent()
    obj = hand_built(parent=parent)
    assert obj.pin() is True and obj.is_pinned
    obj.ref_count_down()  # ref 0, still pinned
    assert parent.freed == [] and obj.is_valid() and obj.get_ref_count() == 0
    assert obj.unpin() is True
    assert parent.freed == [obj] and not obj.is_pinned


def test_hand_built_multi_group_get_tensor() -> None:
    meta = MemoryObjMetadata(
        GROUP_SHAPES[0],
        GROUP_DTYPES[0],
        0,
        GROUP_BYTES,
        1,
        shapes=GROUP_SHAPES,
        dtypes=GROUP_DTYPES,
    )
    raw = torch.arange(GROUP_BYTES, dtype=torch.int64).to(torch.uint8)
    obj = TensorMemoryObj(raw, meta)
    assert obj.get_size() == GROUP_BYTES
    offset = 0
    for i, (shape, dtype) in enumerate(zip(GROUP_SHAPES, GROUP_DTYPES, strict=True)):
        g = obj.get_tensor(i)
        assert g.shape == shape and g.dtype is dtype
        n = shape.numel() * dtype.itemsize
        assert torch.equal(g.view(torch.uint8).flatten(), raw[offset : offset + n])
        assert g.data_ptr() == raw.data_ptr() + offset
        offset += n
    assert obj.get_tensor(-1).shape == GROUP_SHAPES[-1]
    with pytest.raises(IndexError):
        obj.get_tensor(len(GROUP_SHAPES))


# -- pooled objects ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_pooled_object_views(kind: str, make_extent, make_paged) -> None:
    pool, obj = pooled(kind, make_extent, make_paged)
    assert obj.get_size() == PAGED_BYTES
    assert obj.get_physical_size() >= PAGED_BYTES
    t = obj.tensor
    assert t.shape == PAGED_SHAPE and t.dtype is PAGED_DTYPE
    t.fill_(3.0)
    assert obj.raw_data.numel() == PAGED_BYTES
    assert obj.raw_data.view(PAGED_DTYPE).eq(3.0).all()
    assert obj.data_ptr == t.data_ptr() == obj.raw_data.data_ptr()
    assert obj.data_ptr == pool.buffer.data_ptr() + obj.shm_offset
    assert obj.parent() is pool
    assert obj.get_tensor(0).data_ptr() == obj.data_ptr


def test_shm_offset_is_bytes_and_meta_address_is_page_for_paged(make_paged) -> None:
    pool = make_paged(pages=4)
    objs = pool.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 4)
    for obj in objs:
        page = obj.meta.address
        assert 0 <= page < 4
        assert obj.shm_offset == page * PAGED_BYTES
        assert obj.shm_byte_length == PAGED_BYTES
        assert obj.data_ptr == pool.buffer.data_ptr() + page * PAGED_BYTES
    assert sorted(o.meta.address for o in objs) == [0, 1, 2, 3]


def test_shm_offset_equals_address_for_extent(make_extent) -> None:
    pool = make_extent()
    objs = [pool.allocate(torch.Size([n]), torch.uint8) for n in (1, 5000, 100)]
    for obj in objs:
        assert obj.shm_offset == obj.meta.address
        assert obj.shm_offset % 4096 == 0
        assert obj.data_ptr == pool.buffer.data_ptr() + obj.shm_offset
        assert obj.shm_byte_length == obj.get_size()
    assert [o.get_physical_size() for o in objs] == [4096, 8192, 4096]


@pytest.mark.parametrize("kind", KINDS)
def test_multi_group_get_tensor(kind: str, make_extent, make_paged) -> None:
    if kind == "extent":
        pool = make_extent()
    else:
        pool = make_paged(pages=3, shapes=GROUP_SHAPES, dtypes=GROUP_DTYPES)
    obj = pool.allocate(GROUP_SHAPES, GROUP_DTYPES, MemoryFormat.KV_MLA_FMT)
    assert obj.get_size() == GROUP_BYTES
    assert obj.get_shapes() == GROUP_SHAPES and obj.get_dtypes() == GROUP_DTYPES
    assert obj.get_shape() == GROUP_SHAPES[0] and obj.get_dtype() is GROUP_DTYPES[0]
    offset = 0
    for i, (shape, dtype) in enumerate(zip(GROUP_SHAPES, GROUP_DTYPES, strict=True)):
        g = obj.get_tensor(i)
        assert g.shape == shape and g.dtype is dtype
        assert g.data_ptr() == obj.data_ptr + offset
        g.view(torch.uint8).fill_(i + 1)
        offset += shape.numel() * dtype.itemsize
    # The groups are back to back and cover the object exactly.
    expected = torch.cat(
        [
            torch.full((s.numel() * d.itemsize,), i + 1, dtype=torch.uint8)
            for i, (s, d) in enumerate(zip(GROUP_SHAPES, GROUP_DTYPES, strict=True))
        ]
    )
    assert torch.equal(obj.raw_data, expected)
    assert bytes(obj.byte_array) == expected.numpy().tobytes()


@pytest.mark.parametrize(
    ("fmt", "shape", "tokens"),
    [
        (MemoryFormat.KV_2LTD, [2, 4, 37, 8], 37),
        (MemoryFormat.KV_T2D, [5, 2, 8], 2),  # token_dim() is 1, as in the reference
        (MemoryFormat.KV_2TD, [2, 11, 8], 2),
        (MemoryFormat.KV_MLA_FMT, [1, 4, 19, 8], 19),
        (MemoryFormat.EC_TD, [23, 8], 23),
        (MemoryFormat.HS_TD, [29, 8], 29),
        (MemoryFormat.BINARY, [31], 31),
    ],
)
def test_get_num_tokens(fmt: MemoryFormat, shape: list[int], tokens: int, make_extent) -> None:
    obj = make_extent().allocate(torch.Size(shape), torch.float16, fmt)
    assert obj.get_memory_format() is fmt
    assert obj.get_num_tokens() == tokens == shape[fmt.token_dim()]


@pytest.mark.parametrize("kind", KINDS)
def test_ref_and_pin_counting(kind: str, make_extent, make_paged) -> None:
    pool, obj = pooled(kind, make_extent, make_paged)
    assert obj.get_ref_count() == 1 and not obj.is_pinned and obj.can_evict
    obj.ref_count_up()
    assert obj.get_ref_count() == 2 and not obj.can_evict  # shared: not evictable
    obj.ref_count_down()
    assert obj.can_evict
    assert obj.pin() and obj.pin()
    assert obj.meta.pin_count == 2 and obj.is_pinned and not obj.can_evict
    assert pool.stats().pinned_objects == 1
    obj.ref_count_down()  # ref 0 but pinned: still alive
    assert obj.is_valid() and pool.stats().active_objects == 1
    assert obj.unpin()
    assert obj.is_valid()
    assert obj.unpin()  # last pin, no references: freed
    assert not obj.is_valid()
    st = pool.stats()
    assert (st.active_objects, st.pinned_objects, st.used_bytes) == (0, 0, 0)
    assert pool.memcheck()


@pytest.mark.parametrize("kind", KINDS)
def test_set_used_size(kind: str, make_extent, make_paged) -> None:
    pool, obj = pooled(kind, make_extent, make_paged)
    obj.raw_data.copy_(torch.arange(PAGED_BYTES, dtype=torch.int64).to(torch.uint8))
    phy = obj.get_physical_size()
    obj.set_used_size(10)
    assert obj.get_size() == 10 and obj.shm_byte_length == 10
    assert obj.get_physical_size() == phy
    ba = obj.byte_array
    assert len(ba) == 10 and bytes(ba) == bytes(range(10))
    t = obj.tensor
    assert t.dtype is torch.uint8 and t.shape == torch.Size([10])
    assert t.data_ptr() == obj.data_ptr
    t[0] = 200  # still zero-copy
    assert obj.raw_data[0] == 200
    obj.set_used_size(0)
    assert obj.get_size() == 0 and len(obj.byte_array) == 0 and obj.tensor.numel() == 0
    obj.set_used_size(phy)
    assert obj.get_size() == phy and len(obj.byte_array) == phy
    for bad in (-1, phy + 1):
        with pytest.raises(kvpool.InvalidArgumentError, match=str(bad)):
            obj.set_used_size(bad)
    assert obj.get_size() == phy  # unchanged by the rejected calls
    obj.ref_count_down()
    assert pool.memcheck()


def test_set_used_size_hand_built() -> None:
    obj = hand_built(64)
    obj.set_used_size(7)
    assert obj.get_size() == 7 and len(obj.byte_array) == 7 and obj.tensor.numel() == 7
    with pytest.raises(ValueError):
        obj.set_used_size(65)


@pytest.mark.parametrize("kind", KINDS)
def test_freed_object_views(kind: str, make_extent, make_paged, kvlog) -> None:
    pool, obj = pooled(kind, make_extent, make_paged)
    obj.ref_count_down()
    assert not obj.is_valid()
    kvlog.clear()
    assert obj.tensor is None
    assert obj.get_tensor(0) is None
    assert obj.raw_tensor is None
    assert len(kvlog.messages()) == 3
    with pytest.raises(kvpool.InvalidHandleError):
        obj.byte_array  # noqa: B018
    with pytest.raises(kvpool.InvalidHandleError):
        obj.data_ptr  # noqa: B018
    assert pool.memcheck()


@pytest.mark.parametrize("kind", KINDS)
def test_freed_object_tensor_views_raise_in_strict_mode(
    kind: str, make_extent, make_paged, strict
) -> None:
    # By default they give None, as LMCache's objects do (test_freed_object_views); strict
    # mode raises there, naming the object, as it does for every other use of a dead handle.
    pool, obj = pooled(kind, make_extent, make_paged)
    obj.ref_count_down()
    views = {
        "tensor": lambda: obj.tensor,
        "raw_tensor": lambda: obj.raw_tensor,
        "get_tensor": lambda: obj.get_tensor(0),
    }
    for what, view in views.items():
        with pytest.raises(kvpool.InvalidHandleError) as caught:
            view()
        assert str(caught.value).startswith(f"{what} of a freed memory object {obj!r}")
    assert pool.memcheck()


def test_invalidated_byte_buffer_tensor_raises_in_strict_mode(strict) -> None:
    obj = BytesBufferMemoryObj(bytearray(8))
    assert obj.tensor is None  # a valid one has no tensor view, strict or not
    obj.invalidate()
    with pytest.raises(kvpool.InvalidHandleError, match="invalidated memory object"):
        obj.tensor  # noqa: B018


# -- BytesBufferMemoryObj ------------------------------------------------------------------


def _address(buf: object) -> int:
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data


def test_bytes_buffer_basics() -> None:
    data = bytearray(b"hello kv")
    obj = BytesBufferMemoryObj(data)
    assert obj.get_size() == 8
    assert obj.get_shape() == torch.Size([8, 0, 0, 0]) and obj.get_shapes() == [obj.get_shape()]
    assert obj.get_dtype() is None and obj.get_dtypes() == []
    assert obj.get_memory_format() is MemoryFormat.BINARY_BUFFER
    assert obj.get_physical_size() == 0
    assert obj.byte_array is data
    assert obj.tensor is None and obj.raw_tensor is None and obj.get_tensor(0) is None
    assert obj.parent() is None
    assert obj.get_num_tokens() == 1
    obj.ref_count_up()
    obj.ref_count_down()
    obj.ref_count_down()
    assert obj.get_ref_count() == 1 and obj.is_valid()
    assert obj.can_evict
    assert obj.pin() and obj.is_pinned and not obj.can_evict
    assert obj.unpin() and not obj.is_pinned
    obj.invalidate()
    assert not obj.is_valid()


@pytest.mark.parametrize(
    "make",
    [
        lambda: b"0123456789abcdef",
        lambda: bytearray(b"0123456789abcdef"),
        lambda: memoryview(bytearray(b"0123456789abcdef"))[3:],
        lambda: memoryview(b"0123456789abcdef")[3:],  # read-only
    ],
    ids=["bytes", "bytearray", "memoryview", "readonly-memoryview"],
)
def test_bytes_buffer_data_ptr_is_the_buffer_address(make) -> None:
    buf = make()
    obj = BytesBufferMemoryObj(buf)
    assert obj.data_ptr == _address(buf)


def test_bytes_buffer_metadata_given() -> None:
    meta = MemoryObjMetadata(torch.Size([3]), None, 5, 3, 1, fmt=MemoryFormat.BINARY)
    obj = BytesBufferMemoryObj(b"abc", meta)
    assert obj.meta is meta and obj.get_memory_format() is MemoryFormat.BINARY


# -- GDSMemoryObject ----------------------------------------------------------------------


def test_gds_object() -> None:
    meta = MemoryObjMetadata(torch.Size([2, 4, 16, 8]), torch.bfloat16, 1 << 20, 8192, 1)
    obj = GDSMemoryObject(meta)
    assert obj.slab_offset == 1 << 20 and obj.shm_offset == 1 << 20
    # As in LMCache 0.5.6: the layout's bytes, and the layout's shapes/dtypes.
    assert obj.get_size() == 2048 and obj.get_physical_size() == 8192
    assert obj.get_shapes() == [meta.shape] and obj.get_dtypes() == [torch.bfloat16]
    assert obj.get_shape() == meta.shape and obj.get_dtype() is torch.bfloat16
    assert obj.get_memory_format() is MemoryFormat.UNDEFINED
    assert obj.tensor is None and obj.raw_tensor is None and obj.get_tensor(0) is None
    assert obj.parent() is None and obj.metadata is meta
    assert obj.is_valid()
    obj.invalidate()
    assert not obj.is_valid()


@pytest.mark.parametrize(
    "call",
    [
        lambda o: o.ref_count_up(),
        lambda o: o.ref_count_down(),
        lambda o: o.get_ref_count(),
        lambda o: o.get_num_tokens(),
        lambda o: o.pin(),
        lambda o: o.unpin(),
        lambda o: o.byte_array,
        lambda o: o.data_ptr,
        lambda o: o.is_pinned,
        lambda o: o.can_evict,
        lambda o: o.raw_data,
    ],
)
def test_gds_object_unsupported_calls(call) -> None:
    # kvpool's typed error (an OSError), not NotImplementedError, saying why.
    obj = GDSMemoryObject(MemoryObjMetadata(torch.Size([4]), torch.uint8, 0, 4, 1))
    with pytest.raises(kvpool.FeatureUnavailableError, match=r"GDSMemoryObject\..* not supported"):
        call(obj)
