"""A cancelled put never reads the caller's memory after it returns, in every asyncio store.

An engine that lends its own memory to a put (LMCache's chunks, SGLang's
host pool: :mod:`kvpool.pool.borrowed`) reuses it as soon as the call
ends.  Each test lends a buffer, starts a put, holds the work that reads
the buffer (a thread of the file and Mooncake stores, held at a gate; the
socket of the Redis and cluster stores, whose server is stopped), cancels
the put, overwrites the buffer the moment the put returns - as the engine
would - and then reads the entry: it is absent or the original bytes,
never the bytes written after the return.  The stores that read in a
thread must also not return before the gate opens.

The Redis and cluster stores send from the event loop: ``sendmsg`` copies
into the kernel, so a cancellation between two sends leaves nothing that
still reads the buffer (those two tests pass before and after the change
that brought in this file; they guard the claim).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import StoreTimeoutError
from kvpool.pool.borrowed import BorrowedMemory
from kvpool.remote import (
    AsyncFileStore,
    AsyncMooncakeStore,
    AsyncRedisClusterStore,
    AsyncRedisStore,
    AsyncRemoteStore,
)

from .cluster_servers import RedisCluster, start_cluster
from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, RedisServer, fill, until
from .mooncake_servers import LEASE_MS
from .test_async_stores import run

#: 256 KiB of float16 per object: two make a batch the file store splits.
BIG = torch.Size([2, 4, 128, 128])
BIG_BYTES = BIG.numel() * 2


class Held:
    """A blocking call held at :attr:`gate` before it runs (and so before it reads anything).

    Args:
        real: the call.
        holds: which calls to hold, by their first argument (default all).
    """

    def __init__(
        self,
        real: Callable[..., Any],
        holds: Callable[[Any], bool] | None = None,
        after: Callable[[], None] = lambda: None,
    ):
        self.real = real
        self.holds = holds or (lambda first: True)
        self.after = after  # runs in the call's thread once it returned, before ``left``
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.left = threading.Event()  # a held call returned: it reads nothing any more

    def __call__(self, *args: Any) -> Any:
        if not self.holds(args[0]):
            return self.real(*args)
        self.entered.set()
        self.gate.wait(30)
        try:
            return self.real(*args)
        finally:
            self.after()
            self.left.set()


def _lent(n: int, shape: torch.Size = BIG) -> tuple[torch.Tensor, list[Any], list[bytes]]:
    """``n`` objects lent from one engine buffer, filled; the buffer, objects, bytes."""
    size = shape.numel() * 2
    memory = torch.zeros(n * size, dtype=torch.uint8)
    lender = BorrowedMemory(memory)
    objs = [lender.lend(lender.address + i * size, size, [shape], [torch.float16], KV_FMT)
            for i in range(n)]  # fmt: skip
    return memory, objs, [fill(o, 10 + i) for i, o in enumerate(objs)]


async def _cancel_held(task: asyncio.Task[Any], held: Held) -> bool:
    """Cancel ``task`` twice while ``held`` waits, open the gate 0.3 s later; await the task.

    Returns:
        True when the held call had returned before the task did.
    """
    await until(held.entered.is_set, "the held call to start")
    loop = asyncio.get_running_loop()
    task.cancel()
    loop.call_later(0.1, task.cancel)  # a second cancellation does not cut the wait short
    loop.call_later(0.3, held.gate.set)
    with pytest.raises(asyncio.CancelledError):
        await task
    return held.left.is_set()


async def _read_back(
    store: AsyncRemoteStore, keys: list[str], pool: kvpool.TensorMemoryAllocator, shape: torch.Size
) -> list[bytes | None]:
    back = await store.batched_get(keys, pool, shape, KV_DTYPE, KV_FMT)
    out = [None if b is None else bytes(b.byte_array) for b in back]
    for b in back:
        if b is not None:
            b.ref_count_down()
    return out


@pytest.mark.parametrize("how", ["put", "batched_put", "split batched_put"])
def test_file_put_cancelled_in_its_thread(tmp_path: Path, how: str) -> None:
    pool = kvpool.TensorMemoryAllocator(torch.empty(4 << 20, dtype=torch.uint8))
    memory, objs, datas = _lent(4)
    keys = [f"k{i}" for i in range(4)]
    split = how == "split batched_put"

    async def main() -> None:
        # threads=2: the calls run in threads (the default off tmpfs, where a disk may stall).
        store = AsyncFileStore(tmp_path / "s", threads=2, batch_threads=2 if split else 1)
        async with store:
            method = "put" if how == "put" else "batched_put"
            held = Held(getattr(store.store, method), (lambda ks: ks[0] == "k2") if split else None)
            setattr(store.store, method, held)
            if how == "put":
                task = asyncio.create_task(store.put(keys[0], objs[0]))
            else:
                task = asyncio.create_task(store.batched_put(keys, objs))
            held_returned_first = await _cancel_held(task, held)
            memory.fill_(0x5A)  # the engine reuses its memory as soon as the call returns
            held.gate.set()
            await until(held.left.is_set, "the held write to end")
            setattr(store.store, method, held.real)
            written = keys[:1] if how == "put" else keys
            assert await _read_back(store, written, pool, BIG) == datas[: len(written)]
            assert held_returned_first

    run(main())
    pool.close()


@pytest.fixture
def lent_kv() -> Iterator[tuple[torch.Tensor, list[Any], list[bytes]]]:
    """Three KV_SHAPE objects lent from one buffer."""
    yield _lent(3, KV_SHAPE)


def _mooncake_store(client: Any, headerless: bool, **options: Any) -> AsyncMooncakeStore:
    return AsyncMooncakeStore(
        client=client, prefix=f"cp-{uuid.uuid4().hex[:12]}:", headerless=headerless, **options
    )


def _held_client(store: AsyncMooncakeStore, after: Callable[[], None] = lambda: None) -> Held:
    """Hold the Mooncake call that reads a put's objects (the store's own client calls)."""
    real = store.store.client
    method = "batch_put_from" if store.headerless else "batch_put_from_multi_buffers"
    held = Held(getattr(real, method), after=after)

    class Client:
        def __getattr__(self, name: str) -> Any:
            return held if name == method else getattr(real, name)

    store.store.client = Client()
    return held


@pytest.mark.mooncake
@pytest.mark.parametrize("headerless", [False, True], ids=["header", "headerless"])
@pytest.mark.parametrize("batched", [False, True], ids=["put", "batched_put"])
def test_mooncake_put_cancelled_in_its_thread(
    mooncake_client: Any,
    pool: kvpool.TensorMemoryAllocator,
    lent_kv: Any,
    headerless: bool,
    batched: bool,
) -> None:
    memory, objs, datas = lent_kv
    keys = ["a", "b", "c"] if batched else ["a"]

    async def main() -> None:
        store = _mooncake_store(mooncake_client, headerless, timeout=10.0)
        held = _held_client(store)
        if batched:
            task = asyncio.create_task(store.batched_put(keys, objs))
        else:
            task = asyncio.create_task(store.put(keys[0], objs[0]))
        held_returned_first = await _cancel_held(task, held)
        memory.fill_(0x5A)
        held.gate.set()
        await until(held.left.is_set, "the held put to end")
        assert await _read_back(store, keys, pool, KV_SHAPE) == datas[: len(keys)]
        assert held_returned_first
        await store.batched_delete(keys)
        await store.aclose()

    run(main())


@pytest.mark.mooncake
@pytest.mark.parametrize("read", [False, True], ids=["unread", "read meanwhile"])
@pytest.mark.parametrize("ends", ["cancelled", "timed out"])
def test_mooncake_put_past_its_deadline_removes_what_it_wrote(
    mooncake_client: Any, lent_kv: Any, ends: str, read: bool
) -> None:
    memory, objs, _ = lent_kv

    # "read meanwhile": a reader checks the written keys the moment the late
    # put ends and keeps its lease for 2 s, four times the store's timeout.
    def reader(mkeys: list[str]) -> None:
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            time.sleep(0.05)
            mooncake_client.batch_is_exist(mkeys)  # a lease of LEASE_MS

    async def main() -> None:
        store = _mooncake_store(mooncake_client, False, timeout=0.5)
        mkeys = [store.store.object_key(k) for k in ("a", "b")]
        checking = threading.Thread(target=reader, args=(mkeys,))
        looks: list[list[int]] = []

        def first_look() -> None:  # in the put's thread: before its removal begins
            looks.append(mooncake_client.batch_is_exist(mkeys))
            checking.start()

        held = _held_client(store, after=first_look if read else lambda: None)
        start = time.monotonic()
        task = asyncio.create_task(store.batched_put(["a", "b"], objs[:2]))
        await until(held.entered.is_set, "the held put to start")
        if ends == "cancelled":
            task.cancel()
        with pytest.raises(asyncio.CancelledError if ends == "cancelled" else StoreTimeoutError):
            await task
        took = time.monotonic() - start
        assert 0.4 < took < 2.0  # it waited for the put until its deadline, no longer
        memory.fill_(0x5A)  # read by the put still held: its entries must not stay
        held.gate.set()
        await until(held.left.is_set, "the held put to end")
        if read:
            assert looks == [[1, 1]]  # the reader saw the late put's entries, and holds them
            await asyncio.to_thread(checking.join)
        # Each look takes a lease of its own: look less often than one lasts.
        deadline = time.monotonic() + 10
        while await store.batched_exists(["a", "b"]) != [False, False]:
            assert time.monotonic() < deadline, "the late put's entries stayed"
            await asyncio.sleep(2 * LEASE_MS / 1000)
        await store.aclose()

    run(main())


# -- the stores that send from the loop --------------------------------------

#: Far more than loopback's socket buffers hold: the send waits for the server.
HUGE = 48 << 20


async def _cancel_mid_send(store: AsyncRemoteStore, stop: Callable[[], None],
                           resume: Callable[[], None]) -> None:  # fmt: skip
    memory = torch.full((HUGE,), 0x11, dtype=torch.uint8)
    obj = BorrowedMemory(memory).lend(memory.data_ptr(), HUGE)
    await store.ping()  # type: ignore[attr-defined]  # connected before the server stops
    stop()
    try:
        task = asyncio.create_task(store.put("huge", obj))
        await asyncio.sleep(0.3)
        assert not task.done()  # the send waits for the stopped server
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        memory.fill_(0x22)  # the engine reuses its memory at once
    finally:
        resume()
    obj.ref_count_down()
    await store.ping()  # type: ignore[attr-defined]  # the server read what it got
    if await store.exists("huge"):  # a truncated command is never applied; a whole one is ours
        pool = kvpool.TensorMemoryAllocator(torch.empty(HUGE + (1 << 20), dtype=torch.uint8))
        try:
            got = await store.get("huge", pool, torch.Size([HUGE]), torch.uint8)
            assert got is not None and bool((got.tensor == 0x11).all())
            got.ref_count_down()
        finally:
            pool.close()
        await store.delete("huge")


@pytest.mark.redis
def test_redis_put_cancelled_mid_send(own_redis_server: RedisServer) -> None:
    pid = own_redis_server.proc.pid

    async def main() -> None:
        async with AsyncRedisStore(own_redis_server.url, prefix="cp:", timeout=30.0) as store:
            await _cancel_mid_send(
                store, lambda: os.kill(pid, signal.SIGSTOP), lambda: os.kill(pid, signal.SIGCONT)
            )

    run(main())


@pytest.fixture
def own_cluster() -> Iterator[RedisCluster]:
    """Three masters for this test alone (it stops them)."""
    cluster = start_cluster()
    yield cluster
    cluster.stop()


@pytest.mark.redis
def test_cluster_put_cancelled_mid_send(own_cluster: RedisCluster) -> None:
    def signal_all(sig: int) -> None:
        for proc in own_cluster.procs.values():
            os.kill(proc.pid, sig)

    async def main() -> None:
        async with AsyncRedisClusterStore(own_cluster.url, prefix="cp:", timeout=30.0) as store:
            await _cancel_mid_send(
                store, lambda: signal_all(signal.SIGSTOP), lambda: signal_all(signal.SIGCONT)
            )

    run(main())
