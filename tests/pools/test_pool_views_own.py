"""Views own their allocation: no view ever sees another owner's bytes.

Each test keeps a view of an object, lets the object die (garbage
collection, ref_count_down, free, batched_free, a free during a store's
put), then allocates again: the new objects must never get the bytes the
view still covers, and once the view is gone the bytes are reusable.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pool_helpers import KV_BYTES, KV_DTYPE, KV_FMT, KV_SHAPE, MIB, paged_kwargs

import kvpool
from kvpool.remote import FileStore

ONE_MIB_OF_CHUNKS = MIB // KV_BYTES


def _extent() -> kvpool.TensorMemoryAllocator:
    return kvpool.TensorMemoryAllocator(torch.zeros(16 * KV_BYTES, dtype=torch.uint8))


def _paged() -> kvpool.PagedTensorMemoryAllocator:
    return kvpool.PagedTensorMemoryAllocator(
        torch.zeros(16 * KV_BYTES, dtype=torch.uint8), [KV_SHAPE], [KV_DTYPE], KV_FMT
    )


def _mixed_paged() -> kvpool.MixedMemoryAllocator:
    return kvpool.MixedMemoryAllocator(MIB, use_paging=True, **paged_kwargs())


POOLS = {"extent": _extent, "paged": _paged, "mixed": lambda: kvpool.MixedMemoryAllocator(MIB)}
POOLS["mixed-paged"] = _mixed_paged

VIEWS = {
    "tensor": lambda obj: obj.tensor,
    "byte_array": lambda obj: obj.byte_array,
    "raw_data": lambda obj: obj.raw_data,
    "get_tensor": lambda obj: obj.get_tensor(0),
    "tensor-slice": lambda obj: obj.tensor[1:].view(-1)[3:],
    "memoryview-slice": lambda obj: obj.byte_array[100:200],
    "numpy": lambda obj: np.asarray(obj.byte_array),
    "numpy-from-tensor": lambda obj: obj.tensor.numpy(),
    # numpy collapses a slice's base to the last array in the chain: these
    # must still keep the allocation (not only the pool) alive.
    "numpy-slice": lambda obj: np.asarray(obj.byte_array)[64:],
    "numpy-from-tensor-slice": lambda obj: obj.tensor.numpy().reshape(-1)[5:][::2],
    "numpy-over-raw-data": lambda obj: obj.raw_data.numpy()[8:],
}


@pytest.fixture(params=sorted(POOLS))
def pool(request: pytest.FixtureRequest, lenient: None) -> Iterator[Any]:
    p = POOLS[request.param]()
    yield p
    p.close()


def _fill_everything(pool, value: float) -> list[kvpool.MemoryObj]:
    """Allocate until the pool is full; fill every new object with ``value``."""
    objs = []
    while (obj := pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)) is not None:
        obj.tensor.fill_(value)
        objs.append(obj)
    return objs


def _view_reads(view: object) -> float:
    if isinstance(view, memoryview):
        return float(np.frombuffer(view, dtype=np.uint8)[0])
    arr = np.asarray(view)
    return float(arr.reshape(-1)[0])


@pytest.mark.parametrize("view_kind", sorted(VIEWS))
@pytest.mark.parametrize("how", ["gc", "ref_count_down", "free", "batched_free"])
def test_a_view_keeps_its_bytes_from_the_next_owner(pool: Any, view_kind: str, how: str) -> None:
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    obj.tensor.fill_(1.0)
    view = VIEWS[view_kind](obj)
    before = _view_reads(view)
    if how == "gc":
        del obj
        gc.collect()
    elif how == "ref_count_down":
        obj.ref_count_down()
    elif how == "free":
        pool.free(obj)
    else:
        pool.batched_free([obj])
    others = _fill_everything(pool, 2.0)
    assert others, "the pool should still have room for other objects"
    assert _view_reads(view) == before, "a new owner wrote into bytes a live view covers"
    stats = pool.stats()
    assert stats.held_by_views_bytes > 0
    assert stats.active_objects == len(others)
    # Once the view is gone, its bytes can be allocated again.
    pool.batched_free(others)
    del view
    gc.collect()
    assert pool.stats().held_by_views_bytes == 0
    assert len(_fill_everything(pool, 3.0)) == len(others) + 1
    assert pool.memcheck()


def test_without_views_freed_bytes_are_reused_at_once(pool: Any) -> None:
    capacity = _fill_everything(pool, 0.0)
    pool.batched_free(capacity)
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    obj.byte_array[:4] = b"abcd"  # a view, gone at the end of the statement
    _ = obj.tensor.sum()
    obj.ref_count_down()
    assert pool.stats().held_by_views_bytes == 0
    again = _fill_everything(pool, 1.0)
    assert len(again) == len(capacity)
    pool.batched_free(again)


def test_a_freed_handle_is_still_dead_while_its_views_live(pool: Any) -> None:
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    view = obj.byte_array
    obj.ref_count_down()
    assert not obj.is_valid()
    assert obj.tensor is None
    with pytest.raises(kvpool.InvalidHandleError):
        _ = obj.byte_array
    view[:3] = b"xyz"  # the view itself stays usable
    assert bytes(view[:3]) == b"xyz"


def test_a_free_under_live_views_is_counted_and_logged_only_at_debug(
    pool: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Safe (the bytes wait for the views) and usual in asynchronous code:
    # counted, named at DEBUG, never a warning outside strict mode.
    before = pool.stats().freed_under_views
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    name = repr(obj)
    view = obj.tensor
    with caplog.at_level(logging.DEBUG, logger="kvpool"):
        obj.ref_count_down()
    assert not [r for r in caplog.records if r.levelno > logging.DEBUG], caplog.records
    named = [r for r in caplog.records if "views of its bytes are alive" in r.getMessage()]
    assert named and name.split(" ")[-1] in named[0].getMessage()
    assert pool.stats().freed_under_views == before + 1
    del view
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    obj.ref_count_down()  # no view: not counted
    assert pool.stats().freed_under_views == before + 1


def test_strict_mode_raises_for_views_left_behind(strict: None) -> None:
    pool = _extent()
    obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    view = obj.byte_array
    with pytest.raises(kvpool.ViewsOutliveHandleError):
        obj.ref_count_down()
    # The free happened; only the reuse waits for the view.
    assert not obj.is_valid()
    assert pool.stats().held_by_views_bytes == obj.get_physical_size()
    del view
    assert pool.stats().held_by_views_bytes == 0
    pool.close()


def test_a_free_during_a_store_put_does_not_reuse_the_bytes_under_the_io(
    tmp_path: Path, lenient: None, faults: Any
) -> None:
    pool = kvpool.TensorMemoryAllocator(torch.zeros(4 * MIB, dtype=torch.uint8))
    store = FileStore(str(tmp_path))
    shape = torch.Size([2, 4, 256, 128])  # 512 KiB
    src = pool.allocate(shape, torch.float16, KV_FMT)
    src.byte_array[:] = bytes([7]) * src.get_size()
    expected = bytes(src.byte_array)
    started = threading.Event()
    resume = threading.Event()

    def pause() -> None:  # libpinmem's hook: the put is about to write the bytes
        started.set()
        assert resume.wait(30), "the test never resumed the write"

    errors: list[BaseException] = []

    def put() -> None:
        try:
            store.put("k", src)
        except BaseException as exc:  # reported below
            errors.append(exc)

    faults.hook("write_before_data", pause)
    try:
        writer = threading.Thread(target=put)
        writer.start()
        assert started.wait(30)
        pool.free(src)  # while the put still holds the object's bytes
        for obj in _fill_everything(pool, 9.0):
            obj.byte_array[:] = bytes([9]) * obj.get_size()
        resume.set()
        writer.join(30)
        assert not writer.is_alive()
    finally:
        resume.set()
    assert not errors, errors
    entries = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(entries) == 1, entries
    stored = entries[0].read_bytes()
    assert stored.endswith(expected), "the store saved bytes of the next owner"
    store.close()


def test_close_unmaps_once_no_view_holds_the_mapping_and_dead_handles_never_do() -> None:
    pool = kvpool.MixedMemoryAllocator(MIB)
    buf = pool.backing.buffer
    dead = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    _ = dead.tensor, dead.raw_data, dead.byte_array  # every view once
    dead.ref_count_down()
    live = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    _ = live.tensor, live.raw_data
    view = live.byte_array
    pool.close()
    gc.collect()
    assert not buf.unmapped, "a view made before close() must keep the mapping"
    del view, _
    gc.collect()
    assert buf.unmapped, "handles (dead or alive) must not hold the mapping after close()"
    assert dead is not None and live is not None  # both handles are still referenced here
