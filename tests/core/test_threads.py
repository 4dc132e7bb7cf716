"""Eight threads hammering one allocator.

Each thread allocates, frees (one by one, batched, through the counts),
takes and drops references and pins, and makes late calls on handles it
already freed.  It writes its own byte pattern into every object it owns
and checks the pattern before it lets the object go, so an address handed
to two owners shows up as a corrupted pattern.  All threads also share a
few objects whose counts they move up and down in pairs: no update may be
lost.  Afterwards the pool must pass ``memcheck()``, its ``stats()`` must
equal a recount of what the threads hold, and no two live objects may
overlap.

Each run lasts ``KVPOOL_STRESS_SECONDS`` (default 1.5) per allocator.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time

import numpy as np
import pytest
import torch
from core_helpers import PAGED_BYTES, PAGED_DTYPE, PAGED_SHAPE

import kvpool

THREADS = 8
SECONDS = float(os.environ.get("KVPOOL_STRESS_SECONDS", "1.5"))
SHARED = 4
SHARED_PATTERN = 0xEE


class Held:
    """An object a worker owns, with the extra references and pins it took."""

    __slots__ = ("obj", "pins", "refs")

    def __init__(self, obj) -> None:
        self.obj = obj
        self.refs = 1
        self.pins = 0


def _run_workers(worker, seed: int) -> list:
    start = threading.Barrier(THREADS)
    results: list = [None] * THREADS
    errors: list[BaseException] = []

    def run(tid: int) -> None:
        try:
            start.wait()
            results[tid] = worker(tid, random.Random(seed * 100 + tid))
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    if errors:
        raise errors[0]
    return results


def _pool_worker(pool, shapes: list[torch.Size], dtype, shared: list):
    def worker(tid: int, rng: random.Random) -> list[Held]:
        pattern = tid + 1
        held: list[Held] = []
        deadline = time.monotonic() + SECONDS
        ops = 0

        def own(obj) -> None:
            assert obj.is_valid() and obj.get_ref_count() == 1 and not obj.is_pinned
            obj.raw_data.fill_(pattern)
            held.append(Held(obj))

        def check(h: Held) -> None:
            data = h.obj.raw_data
            assert bool(data.eq(pattern).all()), (
                f"thread {tid}: object {h.obj!r} was overwritten by another owner"
            )

        def release(h: Held) -> None:
            """Drop every reference and pin, in a random order; the object must be freed."""
            check(h)
            steps = ["ref"] * h.refs + ["pin"] * h.pins
            rng.shuffle(steps)
            for step in steps:
                if step == "ref":
                    h.obj.ref_count_down()
                else:
                    assert h.obj.unpin()
            assert not h.obj.is_valid()

        while time.monotonic() < deadline or ops < 200:
            ops += 1
            op = rng.random()
            shape = rng.choice(shapes)
            if op < 0.18:
                obj = pool.allocate(shape, dtype)
                if obj is not None:
                    own(obj)
            elif op < 0.30:
                objs = pool.batched_allocate(shape, dtype, rng.randint(1, 4))
                for obj in objs or ():
                    own(obj)
            elif op < 0.42 and held:
                h = held.pop(rng.randrange(len(held)))
                release(h)
            elif op < 0.50 and held:
                h = held.pop(rng.randrange(len(held)))
                check(h)
                pool.free(h.obj)  # whatever its counts
                assert not h.obj.is_valid()
                if rng.random() < 0.1:  # a late call on the dead handle
                    h.obj.ref_count_down()
            elif op < 0.60 and held:
                rng.shuffle(held)
                k = rng.randint(1, min(4, len(held)))
                batch, held[:] = held[:k], held[k:]
                for h in batch:
                    check(h)
                objs = [h.obj for h in batch]
                if rng.random() < 0.1:
                    objs.append(objs[0])  # listed twice: freed once
                pool.batched_free(objs)
                assert not any(h.obj.is_valid() for h in batch)
            elif op < 0.70 and held:
                h = rng.choice(held)
                if h.refs > 1 and rng.random() < 0.5:
                    h.obj.ref_count_down()
                    h.refs -= 1
                else:
                    h.obj.ref_count_up()
                    h.refs += 1
                assert h.obj.get_ref_count() == h.refs
            elif op < 0.80 and held:
                h = rng.choice(held)
                if h.pins and rng.random() < 0.5:
                    assert h.obj.unpin()
                    h.pins -= 1
                else:
                    assert h.obj.pin()
                    h.pins += 1
                assert h.obj.meta.pin_count == h.pins
            else:
                s = rng.choice(shared)
                s.ref_count_up()
                s.pin()
                s.unpin()
                s.ref_count_down()
        for h in held:
            check(h)
        return held

    return worker


def _assert_recount(pool, held: list[Held], shared: list) -> None:
    assert pool.memcheck()
    live = [h.obj for h in held] + shared
    assert all(o.is_valid() for o in live)
    st = pool.stats()
    assert st.active_objects == len(live) == pool.num_active_allocations
    assert st.used_bytes == sum(o.get_physical_size() for o in live)
    assert st.pinned_objects == sum(h.pins > 0 for h in held)
    for h in held:
        assert h.obj.get_ref_count() == h.refs and h.obj.meta.pin_count == h.pins
    for s in shared:
        assert s.get_ref_count() == 1 and s.meta.pin_count == 0
        assert bool(s.raw_data.eq(SHARED_PATTERN).all())
    spans = sorted((o.shm_offset, o.shm_offset + o.get_physical_size()) for o in live)
    for (a0, a1), (b0, b1) in itertools.pairwise(spans):
        assert a1 <= b0, f"[{a0}, {a1}) and [{b0}, {b1}) are owned twice"


def _stress(pool, shapes: list[torch.Size], dtype, seed: int) -> None:
    shared = [pool.allocate(shapes[0], dtype) for _ in range(SHARED)]
    for s in shared:
        s.raw_data.fill_(SHARED_PATTERN)
    results = _run_workers(_pool_worker(pool, shapes, dtype, shared), seed)
    held = [h for r in results for h in r]
    _assert_recount(pool, held, shared)
    # Let everything go; the pool must end empty and consistent.
    for h in held:
        for _ in range(h.pins):
            h.obj.unpin()
        for _ in range(h.refs - 1):
            h.obj.ref_count_down()
    pool.batched_free([h.obj for h in held] + shared)
    st = pool.stats()
    assert (st.active_objects, st.used_bytes, st.pinned_objects) == (0, 0, 0)
    assert pool.memcheck()


@pytest.mark.parametrize("seed", [1])
def test_extent_pool_under_eight_threads(seed: int) -> None:
    pool = kvpool.TensorMemoryAllocator(torch.zeros(192 * 1024, dtype=torch.uint8), 512)
    shapes = [torch.Size([n]) for n in (100, 512, 700, 1500, 3000)]
    _stress(pool, shapes, torch.uint8, seed)


@pytest.mark.parametrize("seed", [2])
def test_paged_pool_under_eight_threads(seed: int) -> None:
    pool = kvpool.PagedTensorMemoryAllocator(
        torch.zeros(PAGED_BYTES * 96, dtype=torch.uint8), [PAGED_SHAPE], [PAGED_DTYPE]
    )
    # Full pages and a partial chunk; uint8 views of the same bytes.
    _stress(pool, [PAGED_SHAPE, torch.Size([2, 2, 5, 8])], PAGED_DTYPE, seed)


def test_address_manager_under_eight_threads() -> None:
    align = 64
    units = 4096
    am = kvpool.AddressManager(units * align, align)
    owner = np.zeros(units, dtype=np.uint8)  # who owns each unit, 0 = nobody

    def take(tid: int, addr: int, size: int) -> None:
        lo, hi = addr // align, (addr + size) // align
        assert hi <= units
        assert not owner[lo:hi].any(), f"thread {tid} got units {lo}..{hi} that are owned"
        owner[lo:hi] = tid

    def give(tid: int, addr: int, size: int) -> None:
        lo, hi = addr // align, (addr + size) // align
        assert (owner[lo:hi] == tid).all(), f"units {lo}..{hi} of thread {tid} were taken"
        owner[lo:hi] = 0  # before the free: the range may be reused at once

    def worker(tid: int, rng: random.Random) -> list[tuple[int, int]]:
        tid += 1
        mine: list[tuple[int, int]] = []
        deadline = time.monotonic() + SECONDS / 2
        ops = 0
        while time.monotonic() < deadline or ops < 200:
            ops += 1
            op = rng.random()
            if op < 0.35:
                try:
                    addr, size = am.allocate(rng.randint(1, 40 * align))
                except kvpool.AddressSpaceExhaustedError:
                    continue
                take(tid, addr, size)
                mine.append((addr, size))
            elif op < 0.5:
                try:
                    out = am.batched_allocate(rng.randint(1, 8 * align), rng.randint(1, 6))
                except kvpool.AddressSpaceExhaustedError:
                    continue
                for addr, size in out:
                    take(tid, addr, size)
                mine.extend(out)
            elif mine:
                addr, size = mine.pop(rng.randrange(len(mine)))
                give(tid, addr, size)
                am.free(addr, size)
        return mine

    results = _run_workers(worker, 3)
    live = [r for rs in results for r in rs]
    assert am.check_consistency()
    assert am.total_allocated_size == sum(size for _, size in live)
    assert am.get_free_size() == units * align - am.total_allocated_size
    spans = sorted((a, a + n) for a, n in live)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start
    for addr, size in live:
        am.free(addr, size)
    assert am.free_blocks() == [kvpool.FreeBlock(0, units * align)]
