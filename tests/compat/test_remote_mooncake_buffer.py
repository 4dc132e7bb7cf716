"""The LMCache plugin's Mooncake hook: LMCache's CPU buffer registered once, on a real Mooncake.

:func:`~kvpool.integrations.lmcache.remote_memory.register_backend_buffer`
registers the buffer an LMCache allocator exposes (``pin_allocator.buffer``,
else ``buffer``) with a store that takes ``register_memory``; it leaves
alone a kvpool allocator (the store registers its ``memory_region()``) and
a store without ``register_memory``.  This folder installs kvpool's memory
into LMCache, so LMCache's own allocator is stood in for by an object with
the same attributes; the bench (``kvpool.cli.bench.lmcache_remote``) runs the
real one.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

import kvpool
from kvpool.integrations.lmcache.remote_memory import register_backend_buffer
from kvpool.remote.mooncake.aio import AsyncMooncakeStore

pytestmark = pytest.mark.mooncake


def _backend(**allocator: Any) -> SimpleNamespace:
    return SimpleNamespace(memory_allocator=SimpleNamespace(**allocator))


def test_lmcache_buffer_is_registered_until_the_store_closes(mooncake: Any) -> None:
    store = AsyncMooncakeStore(mooncake.master, metadata=mooncake.metadata)
    client = store.store.client
    pinned = torch.empty(2 << 20, dtype=torch.uint8)
    whole = torch.empty(1 << 20, dtype=torch.uint8)
    try:
        backend = _backend(pin_allocator=SimpleNamespace(buffer=pinned), buffer=whole)
        assert register_backend_buffer(store, backend) == (pinned.data_ptr(), pinned.numel())
        # Mooncake holds it now: a second registration of the range is refused.
        assert client.register_buffer(pinned.data_ptr(), pinned.numel()) != 0
        assert register_backend_buffer(store, backend) is None  # an overlap: refused, not raised
        fallback = _backend(buffer=whole)
        assert register_backend_buffer(store, fallback) == (whole.data_ptr(), whole.numel())
    finally:
        store.close()
    owner = AsyncMooncakeStore(mooncake.master, metadata=mooncake.metadata)
    try:  # closed with the store: the ranges can be registered again
        other = owner.store.client
        for buffer in (pinned, whole):
            assert other.register_buffer(buffer.data_ptr(), buffer.numel()) == 0
            assert other.unregister_buffer(buffer.data_ptr()) == 0
    finally:
        owner.close()


def test_kvpool_memory_and_other_stores_are_left_alone(mooncake: Any) -> None:
    pool = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
    buffer = torch.empty(1 << 20, dtype=torch.uint8)
    store = AsyncMooncakeStore(mooncake.master, metadata=mooncake.metadata)
    try:
        assert register_backend_buffer(store, SimpleNamespace(memory_allocator=pool)) is None
        assert register_backend_buffer(store, None) is None
        assert register_backend_buffer(store, _backend(buffer="not a tensor")) is None
        not_mooncake = SimpleNamespace()  # e.g. a Redis store: no register_memory
        assert register_backend_buffer(not_mooncake, _backend(buffer=buffer)) is None
        assert store.store.client.register_buffer(buffer.data_ptr(), buffer.numel()) == 0
        assert store.store.client.unregister_buffer(buffer.data_ptr()) == 0
    finally:
        store.close()
        pool.close()
