"""A pool's memory region and close hooks: what a transfer engine registration relies on."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

import kvpool
from kvpool.errors import FeatureUnavailableError, InvalidArgumentError


def _extent(size: int = 1 << 20) -> tuple[kvpool.TensorMemoryAllocator, torch.Tensor]:
    buf = torch.empty(size, dtype=torch.uint8)
    return kvpool.TensorMemoryAllocator(buf), buf


def test_memory_region_is_the_whole_buffer_until_close() -> None:
    pool, buf = _extent()
    assert pool.memory_region() == (buf.data_ptr(), buf.numel())
    obj = pool.allocate(torch.Size([256]), torch.float32, kvpool.MemoryFormat.BINARY)
    start, size = pool.memory_region()  # type: ignore[misc]
    assert start <= obj.data_ptr and obj.data_ptr + obj.get_size() <= start + size
    obj.ref_count_down()
    pool.close()
    assert pool.memory_region() is None


def test_hooks_run_once_in_order_after_objects_die() -> None:
    pool, _ = _extent()
    obj = pool.allocate(torch.Size([16]), torch.uint8, kvpool.MemoryFormat.BINARY)
    seen: list[tuple[str, bool, object]] = []
    for name in ("first", "second"):
        pool.add_close_hook(lambda n=name: seen.append((n, obj.is_valid(), pool.memory_region())))
    pool.close()
    pool.close()
    assert seen == [("first", False, None), ("second", False, None)]


def test_removed_hook_does_not_run_and_remove_is_idempotent() -> None:
    pool, _ = _extent()
    calls: list[int] = []
    remove = pool.add_close_hook(lambda: calls.append(1))
    keep = pool.add_close_hook(lambda: calls.append(2))
    remove()
    remove()
    pool.close()
    keep()  # after close: nothing left to remove, no error
    assert calls == [2]


def test_hook_added_after_close_runs_at_once() -> None:
    pool, _ = _extent()
    pool.close()
    calls: list[int] = []
    remove = pool.add_close_hook(lambda: calls.append(1))
    assert calls == [1]
    remove()


def test_failing_hook_is_logged_and_the_others_run(caplog: pytest.LogCaptureFixture) -> None:
    pool, _ = _extent()
    calls: list[int] = []

    def boom() -> None:
        raise RuntimeError("hook failed")

    pool.add_close_hook(boom)
    pool.add_close_hook(lambda: calls.append(1))
    with caplog.at_level(logging.ERROR, logger="kvpool"):
        pool.close()
    assert calls == [1]
    assert "close hook" in caplog.text and "hook failed" in caplog.text


def test_hook_runs_outside_the_pool_lock() -> None:
    pool, _ = _extent()
    done = threading.Event()

    def hook() -> None:
        # Another thread can use the pool's lock while the hook runs.
        t = threading.Thread(target=lambda: (pool.memcheck(), done.set()))
        t.start()
        t.join(10)

    pool.add_close_hook(hook)
    pool.close()
    assert done.is_set()


def test_paged_and_memory_pools_offer_the_same() -> None:
    shape, dtype = torch.Size([4, 64]), torch.float16
    page = shape.numel() * dtype.itemsize
    paged = kvpool.PagedTensorMemoryAllocator(
        torch.empty(8 * page, dtype=torch.uint8), [shape], [dtype], kvpool.MemoryFormat.KV_2LTD
    )
    mixed = kvpool.MixedMemoryAllocator(1 << 20)
    calls: list[str] = []
    for name, pool in (("paged", paged), ("mixed", mixed)):
        region = pool.memory_region()
        assert region is not None and region[1] >= 8 * page
        pool.add_close_hook(lambda n=name: calls.append(n))
    assert mixed.memory_region() == mixed.allocator.memory_region()
    mixed.close()
    paged.close()
    assert calls == ["mixed", "paged"]


def test_allocators_without_a_region_say_so() -> None:
    buffers = kvpool.BufferAllocator("cpu")
    assert buffers.memory_region() is None
    with pytest.raises(FeatureUnavailableError, match="no close hooks"):
        buffers.add_close_hook(lambda: None)


def test_hook_must_be_callable() -> None:
    pool, _ = _extent()
    with pytest.raises(InvalidArgumentError, match="callable"):
        pool.add_close_hook("not a function")  # type: ignore[arg-type]
    pool.close()
