"""LMCache's StorageManager on kvpool memory: local CPU, fs, redis and local-disk backends.

Each test builds LMCache's own ``StorageManager`` from an engine config, as
its cache engine does; the LocalCPUBackend makes its allocator from the
served modules, so every chunk lives in a kvpool pool.  Chunks are written
with known bytes, put through ``batched_put`` (asynchronous for the remote
and disk backends: the tests wait for ``contains`` with a deadline), read
back from each backend and compared byte for byte.  Shut-down runs in
LMCache's order (the allocator is closed before the hot cache is cleared)
and must be quiet, in strict mode as well.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

import kvpool
from kvpool import MemoryFormat

CHUNK_SHAPE = torch.Size([2, 2, 16, 128])  # [kv, layers, tokens, hidden]: 16 KiB of fp16
CHUNK_BYTES = CHUNK_SHAPE.numel() * 2


class Collect(logging.Handler):
    """Keeps every record at WARNING or above."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def complaints() -> Iterator[Collect]:
    """Warnings and errors of kvpool and of LMCache's storage manager."""
    handler = Collect()
    names = ["kvpool", "lmcache.v1.storage_backend.storage_manager"]
    for name in names:
        logging.getLogger(name).addHandler(handler)
    yield handler
    for name in names:
        logging.getLogger(name).removeHandler(handler)


@pytest.fixture(params=["lenient", "strict"])
def strictness(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run in kvpool's lenient and strict (KVPOOL_STRICT=1) modes."""
    previous = kvpool.set_strict_mode(request.param == "strict")
    yield request.param
    kvpool.set_strict_mode(previous)


def chunk_keys(n: int, first: int = 0):
    from lmcache.utils import CacheEngineKey

    return [
        CacheEngineKey(
            model_name="kvpool/compat",
            world_size=1,
            worker_id=0,
            chunk_hash=first + i,
            dtype=torch.float16,
        )
        for i in range(n)
    ]


def make_manager(lmc, **config):
    from lmcache.v1.event_manager import EventManager
    from lmcache.v1.storage_backend.storage_manager import StorageManager

    return StorageManager(lmc.config(**config), lmc.metadata(), EventManager())


def put_chunks(manager, n: int) -> tuple[list, list[bytes]]:
    """Allocate ``n`` chunks through LMCache, fill them, ``batched_put`` them."""
    objs = manager.batched_allocate(CHUNK_SHAPE, torch.float16, n, MemoryFormat.KV_2LTD)
    assert objs is not None and len(objs) == n
    expected = []
    for i, obj in enumerate(objs):
        gen = torch.Generator().manual_seed(1000 + i)
        obj.tensor.copy_(torch.randn(CHUNK_SHAPE, generator=gen).to(torch.float16))
        expected.append(bytes(obj.byte_array))
    keys = chunk_keys(n)
    manager.batched_put(keys, objs)  # takes over our references
    return keys, expected


def read_back(backend, keys) -> list[bytes]:
    out = []
    for key in keys:
        obj = backend.get_blocking(key)
        assert obj is not None, f"{type(backend).__name__} lost {key}"
        assert type(obj) is kvpool.TensorMemoryObj
        out.append(bytes(obj.byte_array))
        obj.ref_count_down()
    return out


def check_backends(manager, names: list[str], deadline, n: int = 6) -> None:
    assert list(manager.storage_backends) == names
    allocator = manager.allocator_backend.memory_allocator
    assert type(allocator) is kvpool.MixedMemoryAllocator
    keys, expected = put_chunks(manager, n)
    for name in names:
        backend = manager.storage_backends[name]
        deadline(lambda b=backend: all(b.contains(k) for k in keys), f"{name} to hold the chunks")
        assert read_back(backend, keys) == expected, name
    # A get through the manager finds the chunk too (LocalCPUBackend first).
    obj = manager.get(keys[0])
    assert obj is not None and bytes(obj.byte_array) == expected[0]
    obj.ref_count_down()
    assert allocator.memcheck()
    stats = allocator.stats()
    assert stats.active_objects == n  # the hot cache holds one reference each
    assert stats.used_bytes == n * CHUNK_BYTES


def close_quietly(manager, complaints: Collect) -> None:
    allocator = manager.allocator_backend.memory_allocator
    manager.close()
    assert allocator.closed
    assert not complaints.records, [r.getMessage() for r in complaints.records]


def test_local_cpu_backend(lmc, deadline, complaints, strictness) -> None:
    manager = make_manager(lmc)
    try:
        check_backends(manager, ["LocalCPUBackend"], deadline)
    finally:
        close_quietly(manager, complaints)


def test_fs_remote_backend(lmc, deadline, complaints, strictness, tmp_path) -> None:
    manager = make_manager(lmc, remote_url=f"fs://localhost:0/{tmp_path}", remote_serde="naive")
    try:
        check_backends(manager, ["LocalCPUBackend", "RemoteBackend"], deadline)
        assert len(list(tmp_path.iterdir())) == 6  # one file per chunk
    finally:
        close_quietly(manager, complaints)


def defuse_redis_close(manager) -> None:
    """Shut LMCache's Redis connector's executor down the way that works.

    LMCache 0.5.6's ``RedisConnector.close()`` runs on the storage manager's
    event loop and calls the *blocking* ``pq_executor.shutdown()``, which
    waits for a coroutine on that same loop: it never returns.  Its async
    form is awaited here instead, so that ``StorageManager.close()`` (which
    then closes the connection) finishes.
    """
    import asyncio

    connector = manager.storage_backends["RemoteBackend"].connection.getWrappedConnector()
    executor = connector.pq_executor
    asyncio.run_coroutine_threadsafe(executor.shutdown_async(wait=True), manager.loop).result(30)

    async def already_shut_down(wait: bool = True) -> None:
        return None

    executor.shutdown = already_shut_down


@pytest.mark.redis
def test_redis_remote_backend(lmc, deadline, complaints, strictness, redis_server) -> None:
    redis_server.flush()
    manager = make_manager(lmc, remote_url=redis_server.url, remote_serde="naive")
    try:
        check_backends(manager, ["LocalCPUBackend", "RemoteBackend"], deadline)
        assert redis_server.dbsize() == 2 * 6  # LMCache stores metadata and bytes apart
    finally:
        defuse_redis_close(manager)
        close_quietly(manager, complaints)


def test_local_disk_backend(lmc, deadline, complaints, strictness, tmp_path) -> None:
    manager = make_manager(lmc, local_disk=f"file://{tmp_path}/", max_local_disk_size=0.01)
    try:
        check_backends(manager, ["LocalCPUBackend", "LocalDiskBackend"], deadline)
    finally:
        close_quietly(manager, complaints)


def test_eviction_frees_kvpool_memory_for_new_chunks(lmc, complaints) -> None:
    # A 1 MiB cache holds 64 chunks of 16 KiB; LMCache's LocalCPUBackend
    # evicts the least recently used to make room for the next ones.
    manager = make_manager(lmc, max_local_cpu_size=1 / 1024)
    try:
        allocator = manager.allocator_backend.memory_allocator
        keys = chunk_keys(3 * 64)
        for key in keys:
            obj = manager.allocate(CHUNK_SHAPE, torch.float16, MemoryFormat.KV_2LTD)
            assert obj is not None, f"no room for {key}: eviction did not free kvpool memory"
            manager.batched_put([key], [obj])
        stats = allocator.stats()
        assert stats.used_bytes == stats.total_bytes == 64 * CHUNK_BYTES
        assert stats.active_objects == 64
        local = manager.storage_backends["LocalCPUBackend"]
        assert not local.contains(keys[0]) and local.contains(keys[-1])
        assert allocator.memcheck()
    finally:
        close_quietly(manager, complaints)
