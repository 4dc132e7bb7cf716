"""Cost does not grow with fragmentation (or with the number of live objects).

No clocks here: an operation's cost is measured as the number of Python
line events it executes (``sys.settrace``) plus the number of times it
iterates over one of the manager's internal tables (the tables are swapped
for dicts that count ``__iter__``/``keys``/``values``/``items``, so a scan
done in C is caught too).  The same operation is run on a manager with a
few holes and on one with thousands; the counts must agree (up to a few line events:
whether a size class empties, say, is a constant-time branch), while any
walk over the holes would add thousands.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

import pytest
import torch

import kvpool
from kvpool import AddressManager

U = 4096
FEW = 16
MANY = 2048
# Constant-time branches (a class emptying, a hole merging) may differ.
SLACK = 8


class CountingDict(dict):
    """A dict that counts full iterations over itself."""

    scans = 0

    def __iter__(self):
        CountingDict.scans += 1
        return super().__iter__()

    def keys(self):
        CountingDict.scans += 1
        return super().keys()

    def values(self):
        CountingDict.scans += 1
        return super().values()

    def items(self):
        CountingDict.scans += 1
        return super().items()


def instrument(am: AddressManager) -> None:
    am._hole_start = CountingDict(am._hole_start)
    am._hole_end = CountingDict(am._hole_end)
    am._live = CountingDict(am._live)
    am._bins = [CountingDict(b) for b in am._bins]


def cost(fn: Callable[[], object]) -> tuple[int, int]:
    """(Python line events, table scans) executed by ``fn()``."""
    lines = 0

    def tracer(frame, event, arg):
        nonlocal lines
        if event in ("call", "line"):
            lines += 1
        return tracer

    CountingDict.scans = 0
    # Garbage left by earlier tests must not be finalized inside the
    # measurement (a finalizer's lines would be counted here).
    gc.collect()
    gc.disable()
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(previous)
        gc.enable()
    return lines, CountingDict.scans


def holey(n: int, hole_units: Callable[[int], int] = lambda i: 1, top_units: int = 64):
    """A manager with ``n`` holes (sizes from ``hole_units``) between live extents."""
    sizes = [hole_units(i) for i in range(n)]
    am = AddressManager((sum(sizes) + n + top_units) * U)
    holes = []
    separators = []
    for size in sizes:
        holes.append(am.allocate(size * U))
        separators.append(am.allocate(U)[0])  # a live extent between holes
    for addr, size in holes:
        am.free(addr, size)
    assert am.num_free_blocks() == n + (top_units > 0)
    instrument(am)
    am.test_separator = separators[0]  # between hole 0 and hole 1
    return am


def assert_flat(
    few: tuple[int, int], many: tuple[int, int], what: str, unit: str = "holes"
) -> None:
    assert few[1] == 0 and many[1] == 0, f"{what} scans a table: {few} vs {many}"
    assert abs(many[0] - few[0]) <= SLACK, (
        f"{what}: {few[0]} operations with {FEW} {unit}, {many[0]} with {MANY}"
    )


def _alloc_free_top(am: AddressManager) -> None:
    addr, size = am.allocate(40 * U)  # no hole is that large: from the top
    am.free(addr, size)


def _alloc_free_hole(am: AddressManager) -> None:
    addr, size = am.allocate(U)  # takes a 1-unit hole
    am.free(addr, size)  # gives it back between two live extents


def _free_coalescing_both_sides(am: AddressManager) -> None:
    am.free(am.test_separator, U)  # merges hole 0, itself and hole 1
    am.allocate(U)  # the merged hole is re-split (good fit may pick any hole)


def _batched_from_top(am: AddressManager) -> None:
    out = am.batched_allocate(U, 8)
    am.free(out[0][0], 8 * U)


def _sbrk(am: AddressManager) -> None:
    am.sbrk(U)


def _queries(am: AddressManager) -> None:
    am.num_free_blocks()
    am.get_free_size()
    am.get_heap_size()


OPERATIONS = {
    "allocate+free via the top": _alloc_free_top,
    "allocate+free of a hole": _alloc_free_hole,
    "free coalescing both sides": _free_coalescing_both_sides,
    "batched_allocate+free": _batched_from_top,
    "sbrk": _sbrk,
    "num_free_blocks/get_free_size": _queries,
}


@pytest.mark.parametrize("op", list(OPERATIONS))
def test_cost_is_flat_in_the_number_of_small_holes(op: str) -> None:
    # Build outside the measurement, then measure the operation alone.
    few_am = holey(FEW)
    many_am = holey(MANY)
    few = cost(lambda: OPERATIONS[op](few_am))
    many = cost(lambda: OPERATIONS[op](many_am))
    assert_flat(few, many, op)
    assert few_am.check_consistency() and many_am.check_consistency()


def test_cost_is_flat_with_many_holes_in_one_large_class() -> None:
    """Holes of 33..64 units crowd a few size classes; allocate must not walk them."""

    def sizes(i: int) -> int:
        return 33 + i % 32

    few_am = holey(FEW, sizes, top_units=256)
    many_am = holey(MANY, sizes, top_units=256)

    def op(am: AddressManager) -> None:
        addr, size = am.allocate(70 * U)  # larger than every hole: from the top
        am.free(addr, size)
        addr, size = am.allocate(20 * U)  # any large hole will do
        am.free(addr, size)

    assert_flat(cost(lambda: op(few_am)), cost(lambda: op(many_am)), "allocate")
    assert many_am.check_consistency()


def test_failed_allocate_cost_is_flat_in_the_number_of_holes() -> None:
    """A full, fragmented manager: allocate must fail without walking the holes."""
    few_am = holey(FEW, top_units=0)
    many_am = holey(MANY, top_units=0)

    def op(am: AddressManager) -> None:
        with pytest.raises(RuntimeError):
            am.allocate(2 * U)

    assert_flat(cost(lambda: op(few_am)), cost(lambda: op(many_am)), "failing allocate")


# -- the pools -------------------------------------------------------------------


def _extent(n: int) -> tuple[kvpool.TensorMemoryAllocator, list]:
    pool = kvpool.TensorMemoryAllocator(torch.zeros((2 * n + 64) * U, dtype=torch.uint8))
    objs = pool.batched_allocate(torch.Size([U]), torch.uint8, 2 * n)
    pool.batched_free(objs[::2])  # n holes
    return pool, objs[1::2]


def _paged(n: int) -> tuple[kvpool.PagedTensorMemoryAllocator, list]:
    shape = torch.Size([256])
    pool = kvpool.PagedTensorMemoryAllocator(
        torch.zeros(256 * (n + 8), dtype=torch.uint8), [shape], [torch.uint8]
    )
    return pool, pool.batched_allocate(shape, torch.uint8, n)


POOLS = {"extent": (_extent, torch.Size([U])), "paged": (_paged, torch.Size([256]))}


@pytest.mark.parametrize("kind", list(POOLS))
def test_pool_allocate_free_cost_is_flat_in_live_objects(kind: str) -> None:
    build, shape = POOLS[kind]
    few_pool, few_live = build(FEW)
    many_pool, many_live = build(MANY)

    def op(pool) -> None:
        obj = pool.allocate(shape, torch.uint8)
        obj.ref_count_down()
        objs = pool.batched_allocate(shape, torch.uint8, 4)
        pool.batched_free(objs)

    op(few_pool)  # warm up (first use of a page builds its handle)
    op(many_pool)
    assert_flat(
        cost(lambda: op(few_pool)), cost(lambda: op(many_pool)), f"{kind} pool", "live objects"
    )
    assert few_pool.memcheck() and many_pool.memcheck()
    assert len(few_live) == FEW and len(many_live) == MANY


@pytest.mark.parametrize("kind", list(POOLS))
def test_pool_failed_allocate_cost_is_flat_in_live_objects(kind: str) -> None:
    """A full pool answers None; finding that out must not walk every live object."""
    build, shape = POOLS[kind]

    def full(n: int):
        pool, live = build(n)
        rest = []
        while (obj := pool.allocate(shape, torch.uint8)) is not None:
            rest.append(obj)
        return pool, live + rest

    few_pool, few_live = full(FEW)
    many_pool, many_live = full(MANY)

    def op(pool) -> None:
        assert pool.allocate(shape, torch.uint8) is None

    assert_flat(
        cost(lambda: op(few_pool)), cost(lambda: op(many_pool)), f"full {kind} pool", "live objects"
    )
    assert len(few_live) > FEW and len(many_live) > MANY
