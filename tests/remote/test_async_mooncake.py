"""AsyncMooncakeStore against a real Mooncake master and storage node on loopback.

The asyncio contract runs in ``test_async_stores.py``; here the thread
mechanics, with the real client and one of its calls held at a gate (so a
call is provably in flight): a cancelled or timed-out get frees its
objects in its thread, a queued call whose caller gave up never runs,
``aclose`` with calls in flight returns in time and leaves no thread, and
never closes the store under a running call.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    PoolClosedError,
    RemoteStoreError,
    StoreTimeoutError,
)
from kvpool.remote import AsyncMooncakeStore

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, assert_clean, fill, until
from .test_async_stores import run

pytestmark = pytest.mark.mooncake

THREAD_PREFIX = "kvpool-AsyncMooncakeStore"


class Gated:
    """The real Mooncake client with one method held at a gate until :attr:`gate` is set."""

    def __init__(self, real: Any, method: str) -> None:
        self._real = real
        self._method = method
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if name != self._method:
            return attr

        def gated(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            self.entered.set()
            self.gate.wait(30)
            return attr(*args, **kwargs)

        return gated


def _store(client: Any, **options: Any) -> AsyncMooncakeStore:
    return AsyncMooncakeStore(client=client, prefix=f"am-{uuid.uuid4().hex[:12]}:", **options)


def _gate(store: AsyncMooncakeStore, method: str) -> Gated:
    gated = Gated(store.store.client, method)
    store.store.client = gated  # the store's own calls go through the gate
    return gated


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


@pytest.mark.parametrize("batched", [False, True])
def test_cancelled_get_frees_its_objects_in_its_thread(
    mooncake_client: Any, pool: kvpool.TensorMemoryAllocator, batched: bool
) -> None:
    async def main() -> None:
        store = _store(mooncake_client)
        srcs = pool.batched_allocate(KV_SHAPE, KV_DTYPE, 3, KV_FMT)
        assert srcs is not None
        for i, src in enumerate(srcs):
            fill(src, i)
        await store.batched_put(["a", "b", "c"], srcs)
        pool.batched_free(srcs)
        gated = _gate(store, "batch_get_into_multi_buffers")
        if batched:
            call = store.batched_get(["a", "b", "c"], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        else:
            call = store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        task = asyncio.create_task(call)
        await until(gated.entered.is_set)
        assert pool.stats().active_objects == (3 if batched else 1)  # allocated, being read
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gated.gate.set()  # the read finishes in its thread, which frees what nobody receives
        await until(lambda: pool.stats().active_objects == 0)
        await store.aclose()

    run(main())
    assert_clean(pool)


def test_timeout_bounds_the_call_and_a_queued_call_never_runs(
    mooncake_client: Any, pool: kvpool.TensorMemoryAllocator
) -> None:
    async def main() -> None:
        store = _store(mooncake_client, threads=1, timeout=0.5)
        src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        fill(src, 7)
        await store.put("a", src)
        src.ref_count_down()
        gated = _gate(store, "batch_get_into_multi_buffers")
        start = time.monotonic()
        first = asyncio.create_task(store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT))
        queued = asyncio.create_task(store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT))
        for task in (first, queued):
            with pytest.raises(StoreTimeoutError, match=r"0\.5 s"):
                await task
        assert time.monotonic() - start < 2.0
        gated.gate.set()
        await until(lambda: pool.stats().active_objects == 0)  # the first's object, freed
        assert gated.calls == 1  # the queued call was dropped before it ran
        await store.aclose()

    run(main())
    assert_clean(pool)


def test_aclose_with_calls_in_flight(
    mooncake_client: Any, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs = pool.batched_allocate(KV_SHAPE, KV_DTYPE, 8, KV_FMT)
    assert objs is not None
    for i, o in enumerate(objs):
        fill(o, i)
    outcomes: list[Any] = []

    async def main() -> None:
        store = _store(mooncake_client, threads=4)
        keys = [[f"k{j}-{i}" for i in range(8)] for j in range(12)]
        tasks = [asyncio.create_task(store.batched_put(k, objs)) for k in keys]
        await asyncio.sleep(0.01)  # some run, some wait for a thread
        start = time.monotonic()
        await store.aclose()
        assert time.monotonic() - start < 2.0
        assert store.store.closed and not _threads()
        outcomes.extend(await asyncio.gather(*tasks, return_exceptions=True))
        with pytest.raises(PoolClosedError):
            await store.exists("k")
        written = [k for batch, o in zip(keys, outcomes, strict=True) if o is None for k in batch]
        mooncake_client.batch_remove([store.store.object_key(k) for k in written], True)

    run(main())
    assert all(o is None or isinstance(o, (RemoteStoreError, PoolClosedError)) for o in outcomes)
    pool.batched_free(objs)


def test_aclose_never_closes_the_store_under_a_running_call(
    mooncake_client: Any, pool: kvpool.TensorMemoryAllocator
) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 9)

    async def main() -> None:
        store = _store(mooncake_client, timeout=0.5)
        gated = _gate(store, "batch_put_from_multi_buffers")
        put = asyncio.create_task(store.put("a", src))
        await until(gated.entered.is_set)
        start = time.monotonic()
        await store.aclose()  # waits for the put at most the timeout, then returns
        assert time.monotonic() - start < 2.0
        with pytest.raises(StoreTimeoutError):
            await put
        assert not store.store.closed  # the running put still has it
        gated.gate.set()
        await until(lambda: store.store.closed and not _threads())  # closed by the put's end
        # It outlived its deadline (its caller may reuse the memory by then):
        # what it wrote was removed before the store closed.
        assert mooncake_client.get_size(store.store.object_key("a")) < 0

    run(main())
    src.ref_count_down()


def test_bad_options() -> None:
    with pytest.raises(InvalidArgumentError, match="threads"):
        AsyncMooncakeStore(threads=0)
    with pytest.raises(ArgumentTypeError, match="io_threads"):
        AsyncMooncakeStore(io_threads=2)
    with pytest.raises(InvalidArgumentError, match="threads"):
        AsyncMooncakeStore.from_url("mooncake://127.0.0.1:1", threads=1000)


def test_loop_keeps_running_while_a_call_waits(
    mooncake_client: Any, pool: kvpool.TensorMemoryAllocator
) -> None:
    async def main() -> None:
        store = _store(mooncake_client)
        src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        fill(src, 3)
        gated = _gate(store, "batch_put_from_multi_buffers")
        put = asyncio.create_task(store.put("a", src))
        await until(gated.entered.is_set)
        ticks = 0
        for _ in range(20):  # the loop runs other work while the put is held
            await asyncio.sleep(0)
            ticks += 1
        assert ticks == 20 and not put.done()
        gated.gate.set()
        await put
        assert await store.exists("a") and await store.delete("a")
        src.ref_count_down()
        await store.aclose()

    run(main())
    assert_clean(pool)


def test_own_client_closed_by_aclose(mooncake: Any, pool: kvpool.TensorMemoryAllocator) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, 11)

    async def main() -> None:
        store = AsyncMooncakeStore(mooncake.master, metadata=mooncake.metadata, prefix="own:")
        await store.put("k", src)
        got = await store.get("k", pool, torch.Size(KV_SHAPE), KV_DTYPE, KV_FMT)
        assert got is not None and bytes(got.byte_array) == data
        got.ref_count_down()
        await store.delete("k")
        await store.aclose()
        assert store.store.closed and not _threads()

    run(main())
    src.ref_count_down()
