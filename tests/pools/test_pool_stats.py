"""pool.stats() against an independent recount after concurrent work, and StatsMonitor."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

import pytest
import torch
from pool_helpers import KV_BYTES, KV_DTYPE, KV_FMT, KV_SHAPE, MIB, paged_kwargs

import kvpool

THREADS = 8
OPS = 300
ALIGN = kvpool.AddressManager.ALIGN_BYTES


@dataclass
class Tracked:
    """What the test expects of one object (its own model, not the pool's)."""

    obj: kvpool.MemoryObj
    nbytes: int
    refs: int = 1
    pins: int = 0
    freed: bool = False


def round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


class Worker:
    """Random allocate / batched_allocate / ref counting / pins / batched_free on one pool."""

    def __init__(self, pool: kvpool.MemoryPool, paged: bool, seed: int) -> None:
        self.pool = pool
        self.paged = paged
        self.rng = random.Random(seed)
        self.mine: list[Tracked] = []
        self.all: list[Tracked] = []
        self.error: BaseException | None = None

    def layout(self) -> tuple[torch.Size, torch.dtype]:
        if self.paged:
            tokens = self.rng.choice([16, 16, 16, 3, 9])  # full pages, some partial
            return torch.Size([2, 4, tokens, 8]), KV_DTYPE
        return torch.Size([self.rng.randint(1, 3 * ALIGN)]), torch.uint8

    def track(self, obj: kvpool.MemoryObj) -> None:
        t = Tracked(obj, obj.get_size())
        self.mine.append(t)
        self.all.append(t)

    def drop(self, t: Tracked) -> None:
        t.freed = True
        self.mine.remove(t)

    def step(self) -> None:
        rng = self.rng
        op = rng.random()
        if op < 0.25 or not self.mine:
            shape, dtype = self.layout()
            obj = self.pool.allocate(shape, dtype, KV_FMT)
            if obj is not None:
                self.track(obj)
        elif op < 0.35:
            shape, dtype = self.layout()
            objs = self.pool.batched_allocate(shape, dtype, rng.randint(0, 4), KV_FMT)
            for obj in objs or []:
                self.track(obj)
        elif op < 0.50:
            t = rng.choice(self.mine)
            t.obj.ref_count_up()
            t.refs += 1
        elif op < 0.70:
            t = rng.choice(self.mine)
            if t.refs > 0:
                t.obj.ref_count_down()
                t.refs -= 1
                if t.refs == 0 and t.pins == 0:
                    self.drop(t)
        elif op < 0.80:
            t = rng.choice(self.mine)
            assert t.obj.pin()
            t.pins += 1
        elif op < 0.90:
            t = rng.choice(self.mine)
            if t.pins > 0:
                assert t.obj.unpin()
                t.pins -= 1
                if t.pins == 0 and t.refs == 0:
                    self.drop(t)
        else:
            victims = rng.sample(self.mine, min(len(self.mine), rng.randint(1, 4)))
            self.pool.batched_free([t.obj for t in victims])
            for t in victims:
                self.drop(t)

    def run(self, barrier: threading.Barrier) -> None:
        try:
            barrier.wait()
            for _ in range(OPS):
                self.step()
        except BaseException as exc:  # reported by the test
            self.error = exc


def largest_gap(spans: list[tuple[int, int]], heap: int) -> int:
    spans = sorted(spans)
    largest, cursor = 0, 0
    for start, end in spans:
        assert start >= cursor, f"objects overlap at {start}"
        largest = max(largest, start - cursor)
        cursor = end
    return max(largest, heap - cursor)


@pytest.fixture(params=["extent", "paged"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


def make_pool(kind: str) -> kvpool.MemoryPool:
    if kind == "paged":
        return kvpool.MixedMemoryAllocator(MIB, use_paging=True, **paged_kwargs())
    return kvpool.MixedMemoryAllocator(MIB)


def test_stats_equal_a_recount_after_concurrent_work(kind: str) -> None:
    paged = kind == "paged"
    with make_pool(kind) as pool:
        workers = [Worker(pool, paged, seed) for seed in range(THREADS)]
        barrier = threading.Barrier(THREADS)
        threads = [threading.Thread(target=w.run, args=(barrier,)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for w in workers:
            if w.error is not None:
                raise w.error

        tracked = [t for w in workers for t in w.all]
        live = [t for t in tracked if not t.freed]
        # The model and the objects agree on who is alive.
        assert [t.obj.is_valid() for t in tracked] == [not t.freed for t in tracked]
        for t in live:
            assert t.obj.get_ref_count() == t.refs
            assert t.obj.is_pinned == (t.pins > 0)

        phy = KV_BYTES if paged else None
        spans = []
        for t in live:
            size = phy if paged else round_up(t.nbytes, ALIGN)
            assert t.obj.get_physical_size() == size
            spans.append((t.obj.shm_offset, t.obj.shm_offset + size))
        used = sum(end - start for start, end in spans)
        free = MIB - used
        # paged: any free page is a largest block; extent: the widest gap
        largest = (KV_BYTES if free else 0) if paged else largest_gap(spans, MIB)
        stats = pool.stats()
        assert stats.total_bytes == MIB
        assert stats.used_bytes == used
        assert stats.free_bytes == free
        assert stats.active_objects == len(live) == pool.num_active_allocations
        assert stats.pinned_objects == sum(t.pins > 0 for t in live)
        assert stats.largest_free_block == largest
        # Any free page fits any request: a paged pool has no external
        # fragmentation (PoolStats' formula would say ~1 for an empty pool).
        extent_frag = 1.0 - largest / free if free else 0.0
        expected_frag = 0.0 if paged else extent_frag
        assert stats.fragmentation == pytest.approx(expected_frag)
        assert pool.memcheck()
        assert len(live) > 0, "the workload should leave objects behind"

        # The largest free block can really be allocated, and no more.
        if largest:
            shape = KV_SHAPE if paged else torch.Size([largest])
            dtype = KV_DTYPE if paged else torch.uint8
            got = pool.allocate(shape, dtype, KV_FMT)
            assert got is not None
            assert pool.stats().used_bytes == used + largest
            got.ref_count_down()
        for t in live:
            for _ in range(t.pins):
                t.obj.unpin()
        pool.batched_free([t.obj for t in live])
        after = pool.stats()
        assert (after.used_bytes, after.active_objects, after.pinned_objects) == (0, 0, 0)
        assert after.largest_free_block == (KV_BYTES if paged else MIB)
        assert after.fragmentation == 0.0


def test_stats_of_an_empty_and_a_full_pool(kind: str) -> None:
    with make_pool(kind) as pool:
        empty = pool.stats()
        assert empty == kvpool.PoolStats(
            MIB, 0, MIB, 0, 0, KV_BYTES if kind == "paged" else MIB, 0.0
        )
        objs = []
        while (obj := pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)) is not None:
            objs.append(obj)
        full = pool.stats()
        assert full.free_bytes == 0 and full.largest_free_block == 0
        assert full.fragmentation == 0.0
        assert full.active_objects == len(objs)
        objs[0].pin()
        objs[1].pin()
        objs[1].pin()
        assert pool.stats().pinned_objects == 2


def test_extent_fragmentation_is_measured() -> None:
    with kvpool.MixedMemoryAllocator(MIB) as pool:
        objs = pool.batched_allocate(torch.Size([ALIGN]), torch.uint8, MIB // ALIGN, KV_FMT)
        assert objs is not None
        pool.batched_free(objs[::2])  # every other block: free space in 1-block holes
        stats = pool.stats()
        assert stats.free_bytes == MIB // 2
        assert stats.largest_free_block == ALIGN
        assert stats.fragmentation == pytest.approx(1 - ALIGN / (MIB // 2))
        assert pool.allocate(torch.Size([2 * ALIGN]), torch.uint8, KV_FMT) is None


def test_paged_fragmentation_is_zero_as_documented() -> None:
    # PoolStats documents 0 for paged pools (any free page fits any
    # allocation), not the extent formula, which would give 1 - page / free.
    with kvpool.MixedMemoryAllocator(MIB, use_paging=True, **paged_kwargs()) as pool:
        objs = [pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(MIB // KV_BYTES)]
        for obj in objs[::2]:
            obj.ref_count_down()
        stats = pool.stats()
        assert stats.free_bytes == MIB // 2 and stats.largest_free_block == KV_BYTES
        assert stats.fragmentation == 0.0
        assert "Paged pool: always" in (kvpool.PoolStats.__doc__ or "")
        for obj in objs[1::2]:
            obj.ref_count_down()


def test_stats_monitor_includes_open_pools() -> None:
    monitor = kvpool.StatsMonitor.GetOrCreate()
    assert monitor is kvpool.StatsMonitor.GetOrCreate()
    a = kvpool.MixedMemoryAllocator(MIB)
    b = kvpool.HostMemoryAllocator(2 * MIB, use_paging=True, **paged_kwargs())
    try:
        kept = [a.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(3)]
        kept += b.batched_allocate(KV_SHAPE, KV_DTYPE, 5, KV_FMT)
        kept[0].pin()
        snap = monitor.snapshot()
        entries = {k: v for k, v in snap.items() if k != "total"}
        for pool in (a, b):
            mine = [k for k, v in entries.items() if k.startswith(f"{pool}#") and v == pool.stats()]
            assert mine, f"{pool} is missing from {sorted(entries)}"
        total = snap["total"]
        for key in ("total_bytes", "used_bytes", "active_objects", "pinned_objects"):
            assert total[key] == sum(getattr(v, key) for v in entries.values())
        assert total["pinned_in_monitor"] == kvpool.PinMonitor.GetOrCreate().pinned_count() >= 1
        a.close()
        after = monitor.snapshot()
        assert len(after) == len(snap) - 1  # the closed pool is gone
        assert any(k.startswith(f"{b}#") and v == b.stats() for k, v in after.items())
    finally:
        a.close()
        b.close()
