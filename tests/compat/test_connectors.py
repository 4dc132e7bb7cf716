"""LMCache's remote connectors on kvpool objects: fs and Redis, full and partial chunks.

The connectors are LMCache's own classes, made as its adapters make them,
over a LocalCPUBackend whose allocator is kvpool's.  They run their
coroutines on an event loop in a thread of its own (as LMCache's storage
manager does); every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import torch

import kvpool
from kvpool import MemoryFormat

FULL_SHAPE = torch.Size([2, 2, 16, 128])  # one chunk of 16 tokens, fp16: 16 KiB
TOKEN_BYTES = 2 * 2 * 128 * 2
FULL_BYTES = 16 * TOKEN_BYTES
CALL_TIMEOUT = 30.0


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="compat-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(CALL_TIMEOUT)
    loop.close()


def run(loop: asyncio.AbstractEventLoop, coro):
    """Run ``coro`` on ``loop`` and wait for it (bounded)."""
    return asyncio.run_coroutine_threadsafe(coro, loop).result(CALL_TIMEOUT)


@pytest.fixture
def backend(lmc) -> Iterator:
    """LMCache's LocalCPUBackend (its allocator: kvpool's MixedMemoryAllocator)."""
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

    config = lmc.config(extra_config={"save_chunk_meta": False}, save_unfull_chunk=True)
    cpu = LocalCPUBackend(config, lmc.metadata())
    assert type(cpu.memory_allocator) is kvpool.MixedMemoryAllocator
    yield cpu
    allocator = cpu.memory_allocator
    assert allocator.memcheck()
    assert allocator.stats().active_objects == 0, "a test leaked a chunk"
    cpu.close()


def key(i: int):
    from lmcache.utils import CacheEngineKey

    return CacheEngineKey(
        model_name="kvpool/compat", world_size=1, worker_id=0, chunk_hash=i, dtype=torch.float16
    )


def chunk(backend, shape: torch.Size, seed: int):
    obj = backend.allocate(shape, torch.float16, MemoryFormat.KV_2LTD)
    assert obj is not None
    gen = torch.Generator().manual_seed(seed)
    obj.tensor.copy_(torch.randn(shape, generator=gen).to(torch.float16))
    return obj, bytes(obj.byte_array)


def test_reshape_partial_chunk_narrows_a_kvpool_object(backend) -> None:
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

    class Probe(RemoteConnector):  # the base class's own reshape, nothing else
        async def exists(self, key): ...
        def exists_sync(self, key): ...
        async def get(self, key): ...
        async def put(self, key, memory_obj): ...
        async def list(self): ...
        async def close(self): ...

    connector = Probe(backend.config, backend.metadata)
    obj, data = chunk(backend, FULL_SHAPE, 1)
    assert connector.reshape_partial_chunk(obj, FULL_BYTES) is obj  # a full chunk: as is
    narrowed = connector.reshape_partial_chunk(obj, 5 * TOKEN_BYTES)
    assert narrowed is obj
    assert obj.get_shape() == torch.Size([2, 2, 5, 128])
    assert obj.group_prefix_sum == [0, 5 * TOKEN_BYTES]
    assert obj.get_size() == len(obj.byte_array) == 5 * TOKEN_BYTES
    assert obj.get_physical_size() == FULL_BYTES  # the allocation is unchanged
    assert obj.tensor.shape == torch.Size([2, 2, 5, 128])
    assert bytes(obj.byte_array) == data[: 5 * TOKEN_BYTES]
    with pytest.raises(ValueError, match="illegal"):
        connector.reshape_partial_chunk(obj, TOKEN_BYTES + 1)
    obj.ref_count_down()  # the whole physical allocation goes back


def test_fs_connector_puts_and_gets_full_and_partial_chunks(backend, loop, tmp_path) -> None:
    from lmcache.v1.storage_backend.connector.fs_connector import FSConnector

    connector = FSConnector(loop, backend, backend.config, base_paths_str=str(tmp_path))
    full, full_data = chunk(backend, FULL_SHAPE, 2)
    part, part_data = chunk(backend, torch.Size([2, 2, 7, 128]), 3)
    run(loop, connector.put(key(1), full))
    run(loop, connector.put(key(2), part))
    full.ref_count_down()
    part.ref_count_down()
    assert run(loop, connector.exists(key(1))) and connector.exists_sync(key(2))
    assert not connector.exists_sync(key(3))
    got = run(loop, connector.get(key(1)))
    assert type(got) is kvpool.TensorMemoryObj and bytes(got.byte_array) == full_data
    got.ref_count_down()
    # A partial chunk is read into a full one and narrowed by reshape_partial_chunk.
    got = run(loop, connector.get(key(2)))
    assert got.get_shape() == torch.Size([2, 2, 7, 128])
    assert bytes(got.byte_array) == part_data
    assert torch.equal(
        got.tensor.view(torch.uint8).flatten(),
        torch.frombuffer(bytearray(part_data), dtype=torch.uint8),
    )
    got.ref_count_down()
    assert run(loop, connector.get(key(3))) is None
    run(loop, connector.close())


@pytest.mark.redis
def test_redis_connector_puts_and_gets_chunks(backend, loop, redis_server) -> None:
    from lmcache.v1.storage_backend.connector.redis_connector import RedisConnector

    redis_server.flush()
    connector = RedisConnector(redis_server.url, loop, backend)
    try:
        objs = [chunk(backend, FULL_SHAPE, 10 + i) for i in range(4)]
        run(loop, connector.batched_put([key(i) for i in range(4)], [o for o, _ in objs]))
        for obj, _ in objs:
            obj.ref_count_down()
        assert all(run(loop, connector.exists(key(i))) for i in range(4))
        for i, (_, data) in enumerate(objs):
            got = run(loop, connector.get(key(i)))
            assert type(got) is kvpool.TensorMemoryObj
            assert bytes(got.byte_array) == data
            got.ref_count_down()
        assert run(loop, connector.get(key(99))) is None
    finally:
        # LMCache 0.5.6's close() blocks its own event loop (see
        # test_storage_manager.defuse_redis_close); shut down its way.
        run(loop, connector.pq_executor.shutdown_async(wait=True))
        run(loop, connector.connection.aclose())
