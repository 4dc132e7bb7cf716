"""FileStore with io_threads > 1: a large batch runs in parts at once, the first in the caller.

The parts are contiguous runs of the batch (``kvpool.remote.file.parts``):
they run at the same time (a barrier only two calls at once pass), one in
the calling thread; small batches, a repeated key and one I/O thread stay
one call; a failing part neither stops the other nor leaks what it read;
the call returns only once every part has stopped reading the objects.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import RemoteStoreError
from kvpool.remote import FileStore
from kvpool.remote.file.parts import SPLIT_MIN_BYTES, run_parts, split_bounds

from .conftest import assert_clean, fill

BIG = torch.Size([2, 4, 128, 128])  # 256 KiB of float16: one part's worth
DTYPE = torch.float16
FMT = kvpool.MemoryFormat.KV_2LTD
assert BIG.numel() * 2 == SPLIT_MIN_BYTES


class Recorder:
    """Wraps a FileStore part method: each call's keys and thread; optionally a barrier."""

    def __init__(self, real: Callable[..., Any], barrier: threading.Barrier | None = None) -> None:
        self.real, self.barrier = real, barrier
        self.calls: list[list[Any]] = []
        self.threads: list[str] = []

    def __call__(self, keys: Any, *args: Any) -> Any:
        self.calls.append([k.decode() if isinstance(k, bytes) else k for k in keys])
        self.threads.append(threading.current_thread().name)
        if self.barrier is not None:
            self.barrier.wait()  # BrokenBarrierError unless the other part runs meanwhile
        return self.real(keys, *args)


def _objects(pool: kvpool.TensorMemoryAllocator, n: int, shape: torch.Size = BIG) -> Any:
    objs = pool.batched_allocate(shape, DTYPE, n, FMT)
    assert objs is not None
    return objs, [fill(o, i) for i, o in enumerate(objs)]


def _free(objs: list[Any]) -> None:
    for o in objs:
        o.ref_count_down()


def test_a_large_batch_runs_in_parts_at_once_the_first_in_the_caller(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs, datas = _objects(pool, 6)
    keys = [f"k{i}" for i in range(6)]
    with FileStore(tmp_path / "s", io_threads=2) as store:
        puts = Recorder(store._write_batch, threading.Barrier(2, timeout=10))
        gets = Recorder(store._read_batch, threading.Barrier(2, timeout=10))
        store._write_batch = puts  # type: ignore[method-assign]
        store._read_batch = gets  # type: ignore[method-assign]
        store.batched_put(keys, objs)
        back = store.batched_get(keys, pool, BIG, DTYPE, FMT)
        assert [bytes(b.byte_array) for b in back] == datas
        _free(back)
        for rec in (puts, gets):
            assert sorted(rec.calls) == [keys[:3], keys[3:]]
            assert threading.current_thread().name in rec.threads  # no hop for one part
            assert any(t.startswith("kvpool-FileStore") for t in rec.threads)
        snap = store.counters.snapshot()
        assert set(snap) == {"batched_put", "batched_get"}  # the parts are not counted again
        assert snap["batched_put"].calls == 1 and snap["batched_put"].entries == 6
    _free(objs)
    assert_clean(pool)


@pytest.mark.parametrize("how", ["io_threads=1", "small entries", "a key twice"])
def test_batches_that_stay_one_call(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, how: str
) -> None:
    shape = torch.Size([2, 4, 16, 32]) if how == "small entries" else BIG
    objs, datas = _objects(pool, 4, shape)
    keys = ["k0", "k1", "k0", "k3"] if how == "a key twice" else [f"k{i}" for i in range(4)]
    with FileStore(tmp_path / "s", io_threads=1 if how == "io_threads=1" else 2) as store:
        puts = Recorder(store._write_batch)
        store._write_batch = puts  # type: ignore[method-assign]
        store.batched_put(keys, objs)
        assert len(puts.calls) == 1
        back = store.batched_get(["k0", "k3"], pool, shape, DTYPE, FMT)
        # in order, in one call: a key named twice ends with its last object
        want = [datas[2], datas[3]] if how == "a key twice" else [datas[0], datas[3]]
        assert [bytes(b.byte_array) for b in back] == want
        _free(back)
    _free(objs)
    assert_clean(pool)


def test_a_failing_part_does_not_stop_the_other(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs, datas = _objects(pool, 4)
    keys = ["a0", "a1", "b0", "b1"]
    with FileStore(tmp_path / "s", io_threads=2) as store:
        real_put, real_get = store._write_batch, store._read_batch

        def put_refusing_a(ks: list[Any], os_: list[Any]) -> Any:
            done = real_put(ks, os_)
            if ks[0] == "a0":
                raise RemoteStoreError(28, "part a refused (a full disk)")
            return done

        store._write_batch = put_refusing_a  # type: ignore[method-assign]
        with pytest.raises(RemoteStoreError, match="part a refused"):
            store.batched_put(keys, objs)
        assert store.exists("b1")  # the other part was written

        def get_failing_b(ks: list[Any], *args: Any) -> Any:
            got = real_get(ks, *args)
            if ks[0] == b"b0":  # the get passes its keys as bytes
                _free(got)
                raise RemoteStoreError(5, "part b failed")
            return got

        store._read_batch = get_failing_b  # type: ignore[method-assign]
        with pytest.raises(RemoteStoreError, match="part b failed"):
            store.batched_get(keys, pool, BIG, DTYPE, FMT)
        assert pool.stats().active_objects == 4  # what part a read was freed
        store._read_batch = real_get  # type: ignore[method-assign]
        back = store.batched_get(keys, pool, BIG, DTYPE, FMT)
        assert [bytes(b.byte_array) for b in back] == datas
        _free(back)
    _free(objs)
    assert_clean(pool)


def test_a_split_put_returns_only_once_every_part_ended(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs, _ = _objects(pool, 4)
    keys = [f"k{i}" for i in range(4)]
    gate, held, returned = threading.Event(), threading.Event(), threading.Event()
    with FileStore(tmp_path / "s", io_threads=2) as store:
        real = store._write_batch

        def held_in_a_thread(ks: list[Any], os_: list[Any]) -> Any:
            if threading.current_thread().name.startswith("kvpool-FileStore"):
                held.set()
                gate.wait(10)  # still to read the caller's objects
            return real(ks, os_)

        store._write_batch = held_in_a_thread  # type: ignore[method-assign]
        caller = threading.Thread(target=lambda: (store.batched_put(keys, objs), returned.set()))
        caller.start()
        assert held.wait(10)
        time.sleep(0.2)
        assert not returned.is_set()  # the caller's part is done; the other still reads
        gate.set()
        caller.join(10)
        assert returned.is_set()
    _free(objs)
    assert_clean(pool)


def test_split_bounds_and_run_parts() -> None:
    assert split_bounds(6, 6 * SPLIT_MIN_BYTES, 2) == [(0, 3), (3, 6)]
    assert split_bounds(6, SPLIT_MIN_BYTES, 4) == [(0, 6)]  # too small to split
    assert split_bounds(3, 100 * SPLIT_MIN_BYTES, 4) == [(0, 1), (1, 2), (2, 3)]
    from concurrent.futures import ThreadPoolExecutor

    def part(n: int) -> int:
        if n == 2:
            raise ValueError("part 2")
        return n * 10

    with ThreadPoolExecutor(2) as pool:
        got = run_parts(pool, part, [(1,), (2,), (3,)])
    assert got[0] == 10 and isinstance(got[1], ValueError) and got[2] == 30
