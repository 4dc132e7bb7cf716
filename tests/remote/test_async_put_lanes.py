"""AsyncRedisStore: a batched put of large values runs on two connections at once.

Values that fill the pipeline window (512 KiB) go one ``SET`` in flight
at a time; the batch is then split into ``PUT_LANES`` contiguous parts,
each on a connection of its own, so the server reads one part's value
while the client sends the other's.  A fake server whose first ``SET`` on
each connection waits for the other's (a barrier only two connections at
once pass) proves the parts run side by side; small values, one-entry
batches, a batch that repeats a key and ``max_connections=1`` stay on one
connection; a refusal in one
part is raised after the other part was stored; the entries round-trip
through a real redis-server.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import RemoteStoreError
from kvpool.remote import AsyncRedisStore
from kvpool.remote.redis.aio import PUT_LANES

from .conftest import KV_DTYPE, KV_FMT, RedisServer, assert_clean, fill
from .hostile_server import HostileServer
from .test_async_stores import run

#: 512 KiB of float16: one value fills the window.
LARGE = torch.Size([2, 4, 256, 128])
SMALL = torch.Size([2, 4, 16, 32])


@pytest.fixture
def big_pool() -> Iterator[kvpool.TensorMemoryAllocator]:
    p = kvpool.TensorMemoryAllocator(torch.empty(16 << 20, dtype=torch.uint8))
    yield p
    assert_clean(p)
    p.close()


class SetsSeen:
    """A SET rule: records each SET's connection (its server thread); the first SET of each
    connection can wait at a barrier that only two connections at once pass."""

    def __init__(self, barrier: threading.Barrier | None = None) -> None:
        self.barrier = barrier
        self.connections: list[str] = []
        self.keys: dict[str, list[bytes]] = {}  # per connection, in order
        self.met = 0
        self._lock = threading.Lock()

    def __call__(self, args: list[bytes], honest: bytes) -> bytes:
        me = threading.current_thread().name
        with self._lock:
            first = me not in self.connections
            self.connections.append(me)
            self.keys.setdefault(me, []).append(args[1].rsplit(b":", 1)[-1])
        if first and self.barrier is not None:
            self.barrier.wait()  # BrokenBarrierError (the connection closes) unless two meet
            with self._lock:
                self.met += 1
        return honest


def _objects(pool: kvpool.TensorMemoryAllocator, shape: torch.Size, n: int) -> list[Any]:
    objs = pool.batched_allocate(shape, KV_DTYPE, n, KV_FMT)
    assert objs is not None
    for i, o in enumerate(objs):
        fill(o, i)
    return objs


def test_large_values_are_put_on_two_connections_at_once(
    hostile: HostileServer, big_pool: kvpool.TensorMemoryAllocator
) -> None:
    assert PUT_LANES == 2
    seen = SetsSeen(threading.Barrier(2, timeout=10))
    hostile.rule(b"SET", seen)
    objs = _objects(big_pool, LARGE, 6)

    async def main() -> None:
        async with AsyncRedisStore(hostile.url, prefix="l:", timeout=20.0) as store:
            await store.batched_put([f"k{i}" for i in range(6)], objs)

    run(main())
    assert seen.met == 2 and len(set(seen.connections)) == 2
    # Contiguous parts: the first three keys on one connection, the rest on the other.
    assert sorted(seen.keys.values()) == [[b"k0", b"k1", b"k2"], [b"k3", b"k4", b"k5"]]
    big_pool.batched_free(objs)


@pytest.mark.parametrize(
    "case", ["small values", "one entry", "max_connections=1", "a repeated key"]
)
def test_other_batches_stay_on_one_connection(
    hostile: HostileServer, big_pool: kvpool.TensorMemoryAllocator, case: str
) -> None:
    seen = SetsSeen()
    hostile.rule(b"SET", seen)
    objs = _objects(
        big_pool, SMALL if case == "small values" else LARGE, 1 if case == "one entry" else 6
    )
    options = {"max_connections": 1} if case == "max_connections=1" else {}

    async def main() -> None:
        async with AsyncRedisStore(hostile.url, prefix="l:", timeout=20.0, **options) as store:
            keys = [f"k{i}" for i in range(len(objs))]
            if case == "a repeated key":
                keys[-1] = "k0"  # the last value of k0 must win, as without lanes
            await store.batched_put(keys, objs)

    run(main())
    assert len(seen.connections) == len(objs) and len(set(seen.connections)) == 1
    big_pool.batched_free(objs)


def test_a_refusal_in_one_part_is_raised_after_the_other_part_was_stored(
    hostile: HostileServer, big_pool: kvpool.TensorMemoryAllocator
) -> None:
    def refuse_k1(args: list[bytes], honest: bytes) -> bytes:
        if args[1].endswith(b"k1"):
            return b"-OOM command not allowed when used memory > 'maxmemory'\r\n"
        return honest

    hostile.rule(b"SET", refuse_k1)
    objs = _objects(big_pool, LARGE, 4)

    async def main() -> None:
        async with AsyncRedisStore(hostile.url, prefix="l:", timeout=20.0) as store:
            with pytest.raises(RemoteStoreError, match="k1"):
                await store.batched_put(["k0", "k1", "k2", "k3"], objs)
            assert await store.batched_exists(["k2", "k3"]) == [True, True]  # the other part

    run(main())
    big_pool.batched_free(objs)


@pytest.mark.redis
def test_lanes_round_trip_on_a_real_server(
    redis_server: RedisServer, big_pool: kvpool.TensorMemoryAllocator
) -> None:
    objs = _objects(big_pool, LARGE, 7)
    datas = [bytes(o.byte_array) for o in objs]
    keys = [f"k{i}" for i in range(7)]

    async def main() -> None:
        async with AsyncRedisStore(redis_server.url, prefix="lanes-rt:") as store:
            await store.batched_put(keys, objs)
            back = await store.batched_get(keys, big_pool, LARGE, KV_DTYPE, KV_FMT)
            assert [bytes(b.byte_array) for b in back] == datas  # type: ignore[union-attr]
            big_pool.batched_free(back)  # type: ignore[arg-type]
            assert await store.batched_delete(keys) == 7

    run(main())
    big_pool.batched_free(objs)
