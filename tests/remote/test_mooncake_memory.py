"""Caller-registered memory on MooncakeStore: ``register_memory`` against a real Mooncake.

A range registered once serves every object whose bytes lie in it (no
registration per call, byte-exact round trips, headerless too); bad
arguments and overlaps are refused; closing the store or
``unregister_memory`` gives the range back to Mooncake.  Also: a read
answered LEASE_EXPIRED (-707) is retried.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import ArgumentTypeError, InvalidArgumentError, PoolClosedError
from kvpool.remote import MooncakeStore
from kvpool.remote.mooncake import codes
from kvpool.remote.mooncake.aio import AsyncMooncakeStore

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, fill

NBYTES = KV_SHAPE.numel() * KV_DTYPE.itemsize

pytestmark = pytest.mark.mooncake


class CountingClient:
    """A real Mooncake client whose ``register_buffer`` calls are recorded."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.registered: list[tuple[int, int]] = []

    def register_buffer(self, address: int, nbytes: int) -> int:
        self.registered.append((address, nbytes))
        return self._client.register_buffer(address, nbytes)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class SliceAllocator:
    """Objects over consecutive slices of one tensor, with no ``memory_region()``.

    Like LMCache's own allocators as the store sees them: it cannot tell
    where the memory is, so without ``register_memory`` each call
    registers each object's bytes.
    """

    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer
        self.used = 0

    def allocate(
        self,
        shapes: torch.Size | Sequence[torch.Size],
        dtypes: torch.dtype | Sequence[torch.dtype],
        fmt: kvpool.MemoryFormat | None = None,
    ) -> kvpool.TensorMemoryObj:
        shape = shapes if isinstance(shapes, torch.Size) else shapes[0]
        dtype = dtypes if isinstance(dtypes, torch.dtype) else dtypes[0]
        nbytes = shape.numel() * dtype.itemsize
        raw = self.buffer[self.used : self.used + nbytes]
        self.used += nbytes
        meta = kvpool.MemoryObjMetadata(shape, dtype, 0, nbytes, 1, fmt=fmt or KV_FMT)
        return kvpool.TensorMemoryObj(raw, meta, None)


def _inside(calls: list[tuple[int, int]], buffer: torch.Tensor) -> list[tuple[int, int]]:
    start, end = buffer.data_ptr(), buffer.data_ptr() + buffer.numel()
    return [(a, n) for a, n in calls if start <= a < end]


def _store(client: Any, **kwargs: Any) -> MooncakeStore:
    return MooncakeStore(client=client, prefix=f"t-{uuid.uuid4().hex[:12]}:", **kwargs)


@pytest.mark.parametrize("headerless", [False, True])
def test_registered_range_serves_every_call_without_registering(
    mooncake_client: Any, headerless: bool
) -> None:
    counting = CountingClient(mooncake_client)
    store = _store(counting, headerless=headerless)
    buffer = torch.empty(16 * NBYTES, dtype=torch.uint8)
    memory = SliceAllocator(buffer)
    try:
        first = memory.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        fill(first, 1)
        store.put("before", first)
        # Without register_memory the object's bytes are registered for the call.
        assert _inside(counting.registered, buffer) == [(first.data_ptr, NBYTES)]
        counting.registered.clear()

        assert store.register_memory(buffer) == (buffer.data_ptr(), buffer.numel())
        assert counting.registered == [(buffer.data_ptr(), buffer.numel())]
        counting.registered.clear()
        objs = [memory.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(4)]
        for i, obj in enumerate(objs):
            fill(obj, 10 + i)
        store.batched_put([f"k{i}" for i in range(4)], objs)
        store.put("one", objs[0])
        got = store.batched_get([f"k{i}" for i in range(4)], memory, KV_SHAPE, KV_DTYPE, KV_FMT)
        single = store.get("before", memory, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert _inside(counting.registered, buffer) == []  # no per-call registration
        for obj, back in zip(objs, got, strict=True):
            assert back is not None and bytes(back.byte_array) == bytes(obj.byte_array)
        assert single is not None and bytes(single.byte_array) == bytes(first.byte_array)
    finally:
        store.close()


def test_register_memory_refuses_bad_arguments(mooncake_client: Any) -> None:
    store = _store(mooncake_client)
    buffer = torch.empty(1 << 20, dtype=torch.uint8)
    try:
        with pytest.raises(ArgumentTypeError, match="str"):
            store.register_memory("0x1000", 4096)
        with pytest.raises(ArgumentTypeError, match="bool"):
            store.register_memory(True, 4096)
        with pytest.raises(InvalidArgumentError, match="host memory"):
            store.register_memory(torch.empty(16, device="meta"))
        with pytest.raises(InvalidArgumentError, match="contiguous"):
            store.register_memory(torch.empty(64, 64)[:, 0])
        with pytest.raises(InvalidArgumentError, match="empty"):
            store.register_memory(torch.empty(0, dtype=torch.uint8))
        with pytest.raises(InvalidArgumentError, match="nbytes"):
            store.register_memory(buffer, buffer.numel() + 1)
        with pytest.raises(InvalidArgumentError, match="nbytes"):
            store.register_memory(buffer, 0)
        with pytest.raises(InvalidArgumentError, match="nbytes is required"):
            store.register_memory(buffer.data_ptr())
        with pytest.raises(InvalidArgumentError, match="positive"):
            store.register_memory(-4096, 4096)
        with pytest.raises(InvalidArgumentError, match="no range registered"):
            store.unregister_memory(buffer)
        assert store.register_memory(buffer.data_ptr(), 4096) == (buffer.data_ptr(), 4096)
        # Never twice, nor overlapping: refused before Mooncake is asked.
        with pytest.raises(InvalidArgumentError, match="overlap"):
            store.register_memory(buffer)
        with pytest.raises(InvalidArgumentError, match="overlap"):
            store.register_memory(buffer[2048:])
        store.unregister_memory(buffer.data_ptr())
        with pytest.raises(InvalidArgumentError, match="no range registered"):
            store.unregister_memory(buffer.data_ptr())
    finally:
        store.close()
    with pytest.raises(PoolClosedError):
        store.register_memory(buffer)


def test_unregister_and_close_give_the_range_back(mooncake_client: Any) -> None:
    store = _store(mooncake_client)
    a = torch.empty(1 << 20, dtype=torch.uint8)
    b = torch.empty(1 << 20, dtype=torch.uint8)
    store.register_memory(a)
    store.register_memory(b, 4096)
    # Mooncake holds both: registering them again directly is refused.
    assert mooncake_client.register_buffer(a.data_ptr(), a.numel()) != 0
    assert mooncake_client.register_buffer(b.data_ptr(), 4096) != 0
    store.unregister_memory(a)
    assert mooncake_client.register_buffer(a.data_ptr(), a.numel()) == 0
    assert mooncake_client.unregister_buffer(a.data_ptr()) == 0
    store.close()
    assert mooncake_client.register_buffer(b.data_ptr(), 4096) == 0
    assert mooncake_client.unregister_buffer(b.data_ptr()) == 0


def test_async_store_forwards_registration(mooncake_client: Any) -> None:
    store = AsyncMooncakeStore(client=mooncake_client, prefix=f"t-{uuid.uuid4().hex[:12]}:")
    buffer = torch.empty(1 << 20, dtype=torch.uint8)
    assert store.register_memory(buffer) == (buffer.data_ptr(), buffer.numel())
    assert mooncake_client.register_buffer(buffer.data_ptr(), buffer.numel()) != 0
    store.unregister_memory(buffer)
    store.register_memory(buffer, 8192)
    store.close()
    assert mooncake_client.register_buffer(buffer.data_ptr(), buffer.numel()) == 0
    assert mooncake_client.unregister_buffer(buffer.data_ptr()) == 0
    with pytest.raises(PoolClosedError):
        store.register_memory(buffer)


class ExpiringClient(CountingClient):
    """A real client whose first ``batch_get_into`` answers LEASE_EXPIRED for every key."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.expired = 0

    def batch_get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        if not self.expired:
            self.expired = len(keys)
            return [codes.LEASE_EXPIRED] * len(keys)
        return self._client.batch_get_into(keys, ptrs, sizes)  # type: ignore[no-any-return]


def test_expired_lease_on_a_read_is_retried(mooncake_client: Any) -> None:
    client = ExpiringClient(mooncake_client)
    store = _store(client, headerless=True)
    pool = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
    try:
        obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        data = fill(obj, 7)
        store.put("k", obj)
        obj.ref_count_down()
        got = store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert client.expired == 1  # the first read was answered -707, the retry read it
        assert got is not None and bytes(got.byte_array) == data
        got.ref_count_down()
    finally:
        store.close()
        pool.close()
