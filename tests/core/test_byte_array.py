"""byte_array: a writable, zero-copy, 1-D ``'B'`` memoryview of exactly ``get_size()`` bytes.

It keeps its memory alive, and reading it costs no per-size type or cache
(the reference built a ctypes array type per distinct size and kept them
all: +56 MiB over 20,000 sizes).
"""

from __future__ import annotations

import gc
import os

import pytest
import torch
from core_helpers import PAGED_BYTES, PAGED_DTYPE, PAGED_SHAPE

import kvpool
from kvpool import MemoryFormat, MemoryObjMetadata, TensorMemoryObj


def assert_byte_view(view: object, size: int) -> None:
    assert type(view) is memoryview
    assert view.format == "B" and view.ndim == 1 and view.itemsize == 1
    assert not view.readonly
    assert len(view) == view.nbytes == size
    assert view.c_contiguous


def _objects(make_extent, make_paged):
    extent = make_extent()
    paged = make_paged()
    meta = MemoryObjMetadata(torch.Size([40]), torch.float32, 0, 160, 1)
    return {
        "extent": extent.allocate(torch.Size([3, 333]), torch.uint8),
        "extent-batched": extent.batched_allocate(torch.Size([3, 333]), torch.uint8, 3)[1],
        "paged": paged.allocate(PAGED_SHAPE, PAGED_DTYPE),
        "paged-partial": paged.allocate(torch.Size([2, 2, 5, 8]), PAGED_DTYPE),
        "hand-built": TensorMemoryObj(torch.zeros(160, dtype=torch.uint8), meta),
    }


KINDS = ["extent", "extent-batched", "paged", "paged-partial", "hand-built"]


@pytest.mark.parametrize("kind", KINDS)
def test_byte_array_shape_and_size(kind: str, make_extent, make_paged) -> None:
    obj = _objects(make_extent, make_paged)[kind]
    assert_byte_view(obj.byte_array, obj.get_size())
    assert obj.get_size() == obj.raw_data.numel()
    obj.set_used_size(obj.get_size() // 2)
    assert_byte_view(obj.byte_array, obj.get_size())


@pytest.mark.parametrize("kind", KINDS)
def test_byte_array_is_zero_copy(kind: str, make_extent, make_paged) -> None:
    obj = _objects(make_extent, make_paged)[kind]
    n = obj.get_size()
    pattern = bytes((7 * i + 3) % 256 for i in range(n))
    obj.byte_array[:] = pattern
    assert obj.raw_data.numpy().tobytes() == pattern
    assert obj.tensor.view(torch.uint8).flatten().numpy().tobytes() == pattern
    obj.raw_data.fill_(0xAB)
    assert bytes(obj.byte_array) == b"\xab" * n
    view = obj.byte_array
    view[0] = 1
    assert obj.raw_data[0] == 1  # the same bytes, not a snapshot


def test_byte_array_keeps_pool_memory_alive() -> None:
    buffer = torch.zeros(1 << 20, dtype=torch.uint8)
    pool = kvpool.TensorMemoryAllocator(buffer)
    obj = pool.allocate(torch.Size([1 << 19]), torch.uint8)
    view = obj.byte_array
    view[:] = b"\x5a" * len(view)
    del obj, pool, buffer
    gc.collect()
    # If the buffer had been released, these would likely reuse its memory.
    decoys = [torch.full((1 << 20,), 0xEE, dtype=torch.uint8) for _ in range(4)]
    assert bytes(view[:16]) == b"\x5a" * 16 and view[len(view) - 1] == 0x5A
    view[:4] = b"abcd"
    assert bytes(view[:4]) == b"abcd"
    assert all(int(d[0]) == 0xEE for d in decoys)


def test_byte_array_keeps_paged_pool_memory_alive() -> None:
    pool = kvpool.PagedTensorMemoryAllocator(
        torch.zeros(PAGED_BYTES * 256, dtype=torch.uint8), [PAGED_SHAPE], [PAGED_DTYPE]
    )
    obj = pool.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 200)[-1]
    view = obj.byte_array
    view[:] = b"\x11" * len(view)
    del obj, pool
    gc.collect()
    decoys = [torch.full((PAGED_BYTES * 256,), 0x22, dtype=torch.uint8) for _ in range(4)]
    assert bytes(view) == b"\x11" * PAGED_BYTES
    assert all(int(d[-1]) == 0x22 for d in decoys)


def test_byte_array_keeps_hand_built_tensor_alive() -> None:
    raw = torch.full((1 << 18,), 0x33, dtype=torch.uint8)
    meta = MemoryObjMetadata(torch.Size([1 << 18]), torch.uint8, 0, 1 << 18, 1)
    obj = TensorMemoryObj(raw, meta)
    view = obj.byte_array
    del obj, raw
    gc.collect()
    decoys = [torch.full((1 << 18,), 0x44, dtype=torch.uint8) for _ in range(4)]
    assert view[0] == 0x33 and view[len(view) - 1] == 0x33
    assert all(int(d[0]) == 0x44 for d in decoys)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc/self/statm")
def test_byte_array_of_20000_distinct_sizes_does_not_grow_memory() -> None:
    pool = kvpool.TensorMemoryAllocator(torch.zeros(64 * 1024, dtype=torch.uint8), 64)
    pool.buffer.fill_(1)  # fault the pool in before measuring

    def churn(sizes: range) -> int:
        total = 0
        for n in sizes:
            obj = pool.allocate(torch.Size([n]), torch.uint8, MemoryFormat.BINARY)
            view = obj.byte_array
            total += len(view) + view[n - 1]
            del view
            obj.ref_count_down()
        return total

    churn(range(20_001, 22_001))  # warm up with sizes not measured below
    # Count objects outside the RSS window: the list gc.get_objects() builds
    # is itself megabytes that malloc may keep resident.
    objects_before = len(gc.get_objects())
    gc.collect()
    rss_before = _rss()
    total = churn(range(1, 20_001))
    gc.collect()
    growth = _rss() - rss_before
    objects_after = len(gc.get_objects())
    assert total == sum(range(1, 20_001)) + 20_000
    assert growth < 1 << 20, f"RSS grew by {growth / 1024:.0f} KiB over 20,000 sizes"
    assert objects_after - objects_before < 1000
    assert pool.memcheck() and pool.num_active_allocations == 0
