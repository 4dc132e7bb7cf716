"""The asyncio stores: the same contract awaited, many calls on one loop, cancellation.

Each test runs its coroutine with :func:`run`, which bounds it in time.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import InvalidArgumentError, PoolClosedError, StoreTimeoutError
from kvpool.remote import (
    AsyncFileStore,
    AsyncMooncakeStore,
    AsyncRedisClusterStore,
    AsyncRedisStore,
    AsyncRemoteStore,
    open_async_store,
)

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, RedisServer, assert_clean, fill, until
from .hostile_server import HostileServer, Trickle

KV_BYTES = KV_SHAPE.numel() * KV_DTYPE.itemsize


def run(coro: Awaitable[Any], seconds: float = 30.0) -> Any:
    """Run ``coro`` on a new event loop; fail if it takes longer than ``seconds``."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coro, seconds)

    return asyncio.run(bounded())


@pytest.fixture(
    params=[
        "file",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("valkey", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.redis),
        pytest.param("mooncake", marks=pytest.mark.mooncake),
    ]
)
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., AsyncRemoteStore]]:
    """A factory of async stores of one kind (closed at the end)."""
    made: list[AsyncRemoteStore] = []
    if request.param == "file":

        def make(**options: Any) -> AsyncRemoteStore:
            options.pop("max_connections", None)
            made.append(AsyncFileStore(tmp_path / "store", **options))
            return made[-1]

    elif request.param == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        prefix = f"a-{uuid.uuid4().hex[:12]}:"

        def make(**options: Any) -> AsyncRemoteStore:
            made.append(AsyncRedisClusterStore(cluster.url, prefix=prefix, **options))
            return made[-1]

    elif request.param == "mooncake":
        client = request.getfixturevalue("mooncake_client")  # the session's Mooncake client
        prefix = f"a-{uuid.uuid4().hex[:12]}:"

        def make(**options: Any) -> AsyncRemoteStore:
            threads = options.pop("max_connections", 4)  # calls at once: its threads
            made.append(
                AsyncMooncakeStore(client=client, prefix=prefix, threads=threads, **options)
            )
            return made[-1]

    else:
        server: RedisServer = request.getfixturevalue(f"{request.param}_server")
        prefix = f"a-{uuid.uuid4().hex[:12]}:"

        def make(**options: Any) -> AsyncRemoteStore:
            made.append(AsyncRedisStore(server.url, prefix=prefix, **options))
            return made[-1]

    yield make
    for store in made:
        store.close()


def test_round_trip_and_batches(
    make_store: Callable[..., AsyncRemoteStore], pool: kvpool.TensorMemoryAllocator
) -> None:
    objs = pool.batched_allocate(KV_SHAPE, KV_DTYPE, 6, KV_FMT)
    assert objs is not None
    datas = [fill(o, i) for i, o in enumerate(objs)]
    keys = [f"k{i}" for i in range(6)]

    async def main() -> None:
        async with make_store() as store:
            await store.put("one", objs[0])
            got = await store.get("one", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
            assert got is not None and bytes(got.byte_array) == datas[0]
            got.ref_count_down()
            info = await store.head("one")
            assert info is not None and info.size == KV_BYTES
            assert await store.exists("one") and not await store.exists("none")
            assert await store.get("none", pool) is None
            await store.batched_put(keys, objs)
            back = await store.batched_get([*keys, "none"], pool)
            assert back[-1] is None
            assert [bytes(b.byte_array) for b in back[:-1]] == datas  # type: ignore[union-attr]
            for b in back[:-1]:
                b.ref_count_down()  # type: ignore[union-attr]
            assert await store.batched_exists(["k0", "none"]) == [True, False]
            assert await store.batched_delete([*keys, "none"]) == 6
            assert await store.delete("one") and not await store.delete("one")
        assert store.closed
        with pytest.raises(PoolClosedError):
            await store.get("one", pool)

    run(main())
    pool.batched_free(objs)
    assert_clean(pool)


def test_many_concurrent_gets_on_one_loop(
    make_store: Callable[..., AsyncRemoteStore], pool: kvpool.TensorMemoryAllocator
) -> None:
    objs = pool.batched_allocate(KV_SHAPE, KV_DTYPE, 64, KV_FMT)
    assert objs is not None
    datas = [fill(o, 100 + i) for i, o in enumerate(objs)]
    keys = [f"c{i}" for i in range(64)]
    big = kvpool.TensorMemoryAllocator(torch.empty(4 << 20, dtype=torch.uint8))

    async def main() -> None:
        async with make_store(max_connections=8) as store:
            await store.batched_put(keys, objs)
            for _ in range(3):
                got = await asyncio.gather(
                    *(store.get(k, big, KV_SHAPE, KV_DTYPE, KV_FMT) for k in keys)
                )
                assert [bytes(g.byte_array) for g in got] == datas  # type: ignore[union-attr]
                for g in got:
                    g.ref_count_down()  # type: ignore[union-attr]

    run(main())
    pool.batched_free(objs)
    assert_clean(big)
    big.close()


async def _put_async(store: AsyncRedisStore, pool: kvpool.TensorMemoryAllocator, key: str) -> bytes:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, len(key))
    await store.put(key, src)
    src.ref_count_down()
    return data


@pytest.mark.parametrize("stage", ["waiting", "mid-value"])
def test_cancelled_get_frees_its_destination_and_drops_the_connection(
    hostile: HostileServer, pool: kvpool.TensorMemoryAllocator, stage: str
) -> None:
    async def main() -> None:
        store = AsyncRedisStore(hostile.url, prefix="c:", timeout=20.0)
        data = await _put_async(store, pool, "a")
        trickles: list[Trickle] = []

        def stall(args: list[bytes], honest: bytes) -> Trickle:
            # "waiting": nothing comes; "mid-value": the header and half the bytes come.
            cut = 0 if stage == "waiting" else len(honest) // 2
            trickles.append(Trickle(honest[cut:], 1.0, 8.0, prefix=honest[:cut]))
            return trickles[-1]

        hostile.rule(b"GET", stall)
        opened = hostile.connections
        tasks = [
            asyncio.create_task(store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT)) for _ in range(4)
        ]
        await until(lambda: len(trickles) == 4 and all(t.sent.is_set() for t in trickles))
        if stage == "mid-value":
            await until(lambda: pool.stats().active_objects == 4)  # destinations allocated
        for task in tasks:
            task.cancel()
        for task in tasks:
            with pytest.raises(asyncio.CancelledError):
                await task
        assert_clean(pool)  # every destination was freed
        hostile.rules.clear()
        got = await store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert got is not None and bytes(got.byte_array) == data
        got.ref_count_down()
        assert hostile.connections > opened  # the cancelled calls' connections were dropped
        await store.aclose()

    run(main())
    assert_clean(pool)


def test_async_timeout_bounds_the_whole_call(
    hostile: HostileServer, pool: kvpool.TensorMemoryAllocator
) -> None:
    async def main() -> None:
        store = AsyncRedisStore(hostile.url, prefix="t:", timeout=1.0)
        await _put_async(store, pool, "a")
        hostile.rule(b"GET", lambda args, honest: Trickle(honest, 0.25, 4.0))
        with pytest.raises(StoreTimeoutError, match=r"1\.0 s"):
            await store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert_clean(pool)
        await store.aclose()

    run(main())


def test_cancelled_file_get_frees_its_object_in_its_thread(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    gate = threading.Event()
    started = threading.Event()

    async def main() -> None:
        store = AsyncFileStore(tmp_path / "s", threads=2)
        src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        fill(src, 1)
        await store.put("a", src)
        src.ref_count_down()
        real_get = store.store.get

        def gated_get(*args: Any) -> Any:
            obj = real_get(*args)
            started.set()
            gate.wait(10)
            return obj

        store.store.get = gated_get  # type: ignore[method-assign]
        task = asyncio.create_task(store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT))
        await until(started.is_set)
        assert pool.stats().active_objects == 1  # allocated and filled in the thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()
        await store.aclose()  # waits for the thread: the orphan is freed by then

    run(main())
    assert_clean(pool)


@pytest.mark.redis
def test_async_redis_store_takes_clients_and_refuses_bad_options(
    redis_server: RedisServer, pool: kvpool.TensorMemoryAllocator
) -> None:
    import redis
    import redis.asyncio

    async def main() -> None:
        for given in (
            redis.asyncio.Redis(port=redis_server.port, db=2),
            redis.Redis(port=redis_server.port, db=2),
            redis.asyncio.ConnectionPool.from_url(f"redis://127.0.0.1:{redis_server.port}/2"),
        ):
            store = AsyncRedisStore(given, prefix="ac:")
            assert store.server.endswith(f":{redis_server.port}/2")
            await store.ping()
            data = await _put_async(store, pool, "k")
            got = await store.get("k", pool)
            assert got is not None and bytes(got.byte_array) == data
            got.ref_count_down()
            await store.aclose()

    run(main())
    with pytest.raises(InvalidArgumentError, match="window"):
        AsyncRedisStore(redis_server.url, window=0)
    with pytest.raises(InvalidArgumentError, match="threads"):
        AsyncFileStore("/tmp/x-unused", threads=-1)


@pytest.mark.redis
def test_open_async_store(tmp_path: Path, redis_server: RedisServer) -> None:
    store = open_async_store(str(tmp_path / "o"))
    assert isinstance(store, AsyncFileStore)
    store.close()
    store = open_async_store(f"valkey://127.0.0.1:{redis_server.port}/0")
    assert isinstance(store, AsyncRedisStore)
    run(store.ping())
    store.close()


@pytest.mark.parametrize("threads", [None, 0, 3])
def test_async_file_store_on_the_loop_or_in_threads(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, threads: int | None
) -> None:
    from kvpool.remote.file.aio import on_tmpfs

    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, 5)

    async def main() -> None:
        async with AsyncFileStore(tmp_path / "s", threads=threads) as store:
            expected = threads if threads is not None else (0 if on_tmpfs(str(tmp_path)) else 4)
            assert store.threads == expected
            await store.put("k", src)
            got = await asyncio.gather(*(store.get("k", pool) for _ in range(8)))
            assert all(bytes(g.byte_array) == data for g in got)  # type: ignore[union-attr]
            for g in got:
                g.ref_count_down()  # type: ignore[union-attr]

    run(main())
    src.ref_count_down()


def test_tmpfs_detection(tmp_path: Path) -> None:
    from kvpool.remote.file.aio import on_tmpfs

    if os.path.isdir("/dev/shm"):
        assert on_tmpfs("/dev/shm")
    assert not on_tmpfs("/proc")
    assert not on_tmpfs(str(tmp_path / "missing"))
