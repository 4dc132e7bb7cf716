"""The LMCache plugin's put views: lent from LMCache's CPU buffer, wrapped once.

With LMCache's own memory a put sends a kvpool object over each LMCache
object's bytes (no copy).  :class:`~kvpool.integrations.lmcache.remote_memory.Sender`
wraps the buffer LMCache's allocator allocates from once and lends every
view from it; an object outside that buffer, or a backend without one,
gets a view of its own; kvpool's objects go as they are.  This folder
installs kvpool's memory into LMCache, so LMCache's objects and allocator
are stood in for by objects with the attributes the plugin reads (the
``lmcache_remote`` benchmark runs the real ones).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

import kvpool
from kvpool import MemoryFormat
from kvpool.errors import InvalidArgumentError
from kvpool.integrations.lmcache.remote_memory import Sender, backend_buffer, unsend

SHAPE = torch.Size([2, 4, 16, 32])
DTYPE = torch.bfloat16
SIZE = SHAPE.numel() * 2


class _Chunk:
    """What the plugin reads of an LMCache memory object."""

    def __init__(self, raw: torch.Tensor) -> None:
        self.raw_data = raw
        self.meta = SimpleNamespace(fmt=MemoryFormat.KV_2LTD)

    def get_shapes(self) -> list[torch.Size]:
        return [SHAPE]

    def get_dtypes(self) -> list[torch.dtype]:
        return [DTYPE]

    def get_size(self) -> int:
        return int(self.raw_data.numel())


def _backend(buffer: Any) -> SimpleNamespace:
    return SimpleNamespace(
        memory_allocator=SimpleNamespace(pin_allocator=SimpleNamespace(buffer=buffer))
    )


def test_views_are_lent_from_lmcaches_buffer_without_a_copy() -> None:
    buffer = torch.randint(0, 256, (4 * SIZE,), dtype=torch.uint8)
    sender = Sender(_backend(buffer))
    chunks = [_Chunk(buffer[i * SIZE : (i + 1) * SIZE]) for i in (1, 3)]
    views = [sender(c) for c in chunks]
    lender = views[0].parent_allocator
    assert lender is views[1].parent_allocator and lender.nbytes == buffer.numel()  # one wrapper
    for chunk, view in zip(chunks, views, strict=True):
        assert view.tensor.data_ptr() == chunk.raw_data.data_ptr()  # the same bytes
        assert bytes(view.byte_array) == bytes(chunk.raw_data.numpy())
        assert view.get_shapes() == [SHAPE] and view.get_dtypes() == [DTYPE]
        assert view.get_memory_format() is MemoryFormat.KV_2LTD
    views[0].byte_array[:4] = b"kvpo"  # a write through the view is LMCache's byte
    assert bytes(chunks[0].raw_data[:4].numpy()) == b"kvpo"
    before = bytes(buffer.numpy())
    for chunk, view in zip(chunks, views, strict=True):
        unsend(chunk, view)
        assert not view.is_valid()  # ended; LMCache's memory untouched
    assert bytes(buffer.numpy()) == before


def test_an_object_outside_the_buffer_gets_a_view_of_its_own() -> None:
    buffer = torch.zeros(2 * SIZE, dtype=torch.uint8)
    elsewhere = _Chunk(torch.ones(SIZE, dtype=torch.uint8))
    for sender in (Sender(_backend(buffer)), Sender(None)):
        view = sender(elsewhere)
        assert view.tensor.data_ptr() == elsewhere.raw_data.data_ptr()
        assert view.parent_allocator.nbytes == SIZE  # wrapped by itself
        unsend(elsewhere, view)


def test_kvpool_objects_go_as_they_are_and_foreign_ones_are_refused() -> None:
    pool = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
    obj = pool.allocate(SHAPE, DTYPE, MemoryFormat.KV_2LTD)
    sender = Sender(_backend(torch.zeros(SIZE, dtype=torch.uint8)))
    assert sender(obj) is obj
    obj.ref_count_down()
    pool.close()
    with pytest.raises(InvalidArgumentError, match="host tensor"):
        sender(SimpleNamespace(raw_data=None))


def test_backend_buffer_is_lmcaches_host_buffer_only() -> None:
    pinned, whole = torch.zeros(SIZE, dtype=torch.uint8), torch.zeros(SIZE, dtype=torch.uint8)
    backend = SimpleNamespace(
        memory_allocator=SimpleNamespace(pin_allocator=SimpleNamespace(buffer=pinned), buffer=whole)
    )
    assert backend_buffer(backend) is pinned
    assert backend_buffer(SimpleNamespace(memory_allocator=SimpleNamespace(buffer=whole))) is whole
    assert backend_buffer(None) is None
    pool = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
    assert backend_buffer(SimpleNamespace(memory_allocator=pool)) is None  # kvpool's own
    pool.close()
    strided = torch.zeros(4, SIZE, dtype=torch.uint8)[:, :8]
    assert backend_buffer(SimpleNamespace(memory_allocator=SimpleNamespace(buffer=strided))) is None
