"""AsyncFileStore's large batches: split into parts that run at once, every outcome kept.

A batched put or get of at least ``SPLIT_MIN_BYTES`` per part is split
into ``batch_threads`` parts, each a call of the blocking FileStore in a
thread of its own.  The tests prove the parts run at the same time (a
barrier that only two calls at once pass), that small batches and
``batch_threads=1`` stay one call, that a failing part neither stops the
others nor leaks what they read, that a cancelled split get frees every
object, those of parts still running included, and that a cancelled split
put returns only once its parts stopped reading the caller's objects.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import InvalidArgumentError, RemoteStoreError
from kvpool.remote import AsyncFileStore
from kvpool.remote.file.aio import SPLIT_MIN_BYTES, default_batch_threads

from .conftest import assert_clean, fill, until
from .test_async_stores import run

#: 256 KiB of float16: two of them make a batch worth splitting in two.
BIG = torch.Size([2, 4, 128, 128])
DTYPE = torch.float16
FMT = kvpool.MemoryFormat.KV_2LTD
assert BIG.numel() * 2 == SPLIT_MIN_BYTES


class Recorder:
    """Wraps a blocking FileStore method: records each call's keys, optionally meets a barrier."""

    def __init__(self, real: Callable[..., Any], barrier: threading.Barrier | None = None) -> None:
        self.real = real
        self.barrier = barrier
        self.calls: list[list[Any]] = []
        self.threads: set[str] = set()

    def __call__(self, keys: Any, *args: Any) -> Any:
        self.calls.append(list(keys))
        self.threads.add(threading.current_thread().name)
        if self.barrier is not None:
            self.barrier.wait()  # BrokenBarrierError unless another part runs at the same time
        return self.real(keys, *args)


def _objects(pool: kvpool.TensorMemoryAllocator, n: int) -> tuple[list[Any], list[bytes]]:
    objs = pool.batched_allocate(BIG, DTYPE, n, FMT)
    assert objs is not None
    return objs, [fill(o, i) for i, o in enumerate(objs)]


def test_a_large_batch_runs_in_parts_at_once(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs, datas = _objects(pool, 6)
    keys = [f"k{i}" for i in range(6)]

    async def main() -> None:
        async with AsyncFileStore(tmp_path / "s", batch_threads=2) as store:
            puts = Recorder(store.store.batched_put, threading.Barrier(2, timeout=10))
            gets = Recorder(store.store.batched_get, threading.Barrier(2, timeout=10))
            store.store.batched_put = puts  # type: ignore[method-assign]
            store.store.batched_get = gets  # type: ignore[method-assign]
            await store.batched_put(keys, objs)
            back = await store.batched_get(keys, pool, BIG, DTYPE, FMT)
            assert [bytes(b.byte_array) for b in back] == datas  # type: ignore[union-attr]
            for b in back:
                b.ref_count_down()  # type: ignore[union-attr]
            # in order, in two halves, each in a thread of the parts' pool
            assert puts.calls == [keys[:3], keys[3:]] or puts.calls == [keys[3:], keys[:3]]
            assert sorted(map(len, gets.calls)) == [3, 3]
            assert len(puts.threads) == 2
            assert all(t.startswith("kvpool-AsyncFileStore-part") for t in puts.threads)

    run(main())
    for o in objs:
        o.ref_count_down()
    assert_clean(pool)


@pytest.mark.parametrize("how", ["batch_threads=1", "small entries", "no layout for the get"])
def test_batches_that_stay_one_call(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, how: str
) -> None:
    shape = torch.Size([2, 4, 16, 32]) if how == "small entries" else BIG
    objs = pool.batched_allocate(shape, DTYPE, 4, FMT)
    assert objs is not None
    datas = [fill(o, i) for i, o in enumerate(objs)]
    keys = [f"k{i}" for i in range(4)]
    layout = () if how == "no layout for the get" else (shape, DTYPE, FMT)

    async def main() -> None:
        threads = 1 if how == "batch_threads=1" else 2
        async with AsyncFileStore(tmp_path / "s", batch_threads=threads) as store:
            puts = Recorder(store.store.batched_put)
            gets = Recorder(store.store.batched_get)
            store.store.batched_put = puts  # type: ignore[method-assign]
            store.store.batched_get = gets  # type: ignore[method-assign]
            await store.batched_put(keys, objs)
            back = await store.batched_get(keys, pool, *layout)
            assert [bytes(b.byte_array) for b in back] == datas  # type: ignore[union-attr]
            for b in back:
                b.ref_count_down()  # type: ignore[union-attr]
            expect_put = 1 if how != "no layout for the get" else 2
            assert (len(puts.calls), len(gets.calls)) == (expect_put, 1)

    run(main())
    for o in objs:
        o.ref_count_down()
    assert_clean(pool)


def test_a_failing_part_does_not_stop_the_others(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs, datas = _objects(pool, 4)
    keys = ["a0", "a1", "b0", "b1"]

    async def main() -> None:
        async with AsyncFileStore(tmp_path / "s", batch_threads=2) as store:
            real_put = store.store.batched_put

            def put_refusing_a(ks: list[Any], os_: list[Any]) -> None:
                real_put(ks, os_)
                if ks[0] == "a0":
                    raise RemoteStoreError(28, "part a refused (a full disk)")

            store.store.batched_put = put_refusing_a  # type: ignore[method-assign]
            with pytest.raises(RemoteStoreError, match="part a refused"):
                await store.batched_put(keys, objs)
            assert await store.exists("b1")  # the other part was written

            real_get = store.store.batched_get

            def get_failing_b(ks: list[Any], *args: Any) -> Any:
                got = real_get(ks, *args)
                if ks[0] == "b0":
                    for g in got:
                        g.ref_count_down()
                    raise RemoteStoreError(5, "part b failed")
                return got

            store.store.batched_get = get_failing_b  # type: ignore[method-assign]
            with pytest.raises(RemoteStoreError, match="part b failed"):
                await store.batched_get(keys, pool, BIG, DTYPE, FMT)
            # what part a read was freed: only the 4 sources are left
            assert pool.stats().active_objects == 4
            store.store.batched_get = real_get  # type: ignore[method-assign]
            back = await store.batched_get(keys, pool, BIG, DTYPE, FMT)
            assert [bytes(b.byte_array) for b in back] == datas  # type: ignore[union-attr]
            for b in back:
                b.ref_count_down()  # type: ignore[union-attr]

    run(main())
    for o in objs:
        o.ref_count_down()
    assert_clean(pool)


def test_a_cancelled_split_get_frees_every_part(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs, _ = _objects(pool, 4)
    keys = [f"k{i}" for i in range(4)]
    gate = threading.Event()
    second_read = threading.Event()

    async def main() -> None:
        store = AsyncFileStore(tmp_path / "s", batch_threads=2)
        await store.batched_put(keys, objs)
        real_get = store.store.batched_get

        def held_second(ks: list[Any], *args: Any) -> Any:
            got = real_get(ks, *args)
            if ks[0] == "k2":
                second_read.set()
                gate.wait(10)  # read, not yet returned
            return got

        store.store.batched_get = held_second  # type: ignore[method-assign]
        task = asyncio.create_task(store.batched_get(keys, pool, BIG, DTYPE, FMT))
        await until(second_read.is_set, "the second part's read")
        await until(lambda: pool.stats().active_objects == 8, "both parts' reads")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.stats().active_objects == 6  # the first part's objects are freed
        gate.set()
        await store.aclose()  # waits for the parts' threads: the second part's too
        assert pool.stats().active_objects == 4

    run(main())
    for o in objs:
        o.ref_count_down()
    assert_clean(pool)


def test_a_cancelled_split_put_returns_once_its_parts_ended(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs, datas = _objects(pool, 4)
    keys = [f"k{i}" for i in range(4)]
    gate = threading.Event()
    held = threading.Event()

    async def main() -> None:
        async with AsyncFileStore(tmp_path / "s", batch_threads=2) as store:
            real_put = store.store.batched_put

            def held_second(ks: list[Any], os_: list[Any]) -> None:
                if ks[0] == "k2":
                    held.set()
                    gate.wait(10)  # still to read the caller's objects
                real_put(ks, os_)

            store.store.batched_put = held_second  # type: ignore[method-assign]
            task = asyncio.create_task(store.batched_put(keys, objs))
            await until(held.is_set, "the second part to start")
            task.cancel()
            await asyncio.sleep(0.1)
            assert not task.done()  # the second part still reads the objects
            task.cancel()  # a second cancellation does not cut the wait short either
            await asyncio.sleep(0.05)
            assert not task.done()
            gate.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            back = await store.batched_get(keys, pool, BIG, DTYPE, FMT)
            assert [bytes(b.byte_array) for b in back] == datas  # type: ignore[union-attr]
            for b in back:
                b.ref_count_down()  # type: ignore[union-attr]

    run(main())
    for o in objs:
        o.ref_count_down()
    assert_clean(pool)


def test_batch_threads_is_checked_and_defaults_to_the_cpus(tmp_path: Path) -> None:
    for bad in (0, -1, 65, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="batch_threads"):
            AsyncFileStore(tmp_path / "s", batch_threads=bad)
    store = AsyncFileStore(tmp_path / "s")
    assert store.batch_threads == default_batch_threads()
    assert 1 <= default_batch_threads() <= 4
    store.close()


def test_a_split_puts_evictions_run_off_the_loop(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs, _ = _objects(pool, 4)
    keys = [f"k{i}" for i in range(4)]
    evicted_in: list[str] = []
    entry = BIG.numel() * 2 + 4096  # the payload and room for its header

    def on_evict(_keys: list[bytes]) -> None:
        evicted_in.append(threading.current_thread().name)

    async def main() -> None:
        async with AsyncFileStore(
            tmp_path / "s", batch_threads=2, max_bytes=3 * entry, on_evict=on_evict
        ) as store:
            # The batch protects its own entries: the one over the bound is
            # evicted when the guard of the whole batch ends.
            await store.batched_put(keys, objs)
            assert store.store.bound is not None and len(store.store.bound) == 3

    run(main())
    assert evicted_in and all(t.startswith("kvpool-AsyncFileStore") for t in evicted_in)
    for o in objs:
        o.ref_count_down()
    assert_clean(pool)
