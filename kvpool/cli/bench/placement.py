"""Placement benchmarks: AddressManager churn and allocation past many holes.

Both compare :class:`kvpool.AddressManager` with
:class:`~kvpool.cli.bench.naive.FirstFitAllocator` (a sorted free list
scanned from the start) on the same operation sequence.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from kvpool.cli.bench.core import Benchmark, Case, GiB, KiB, Metric, MiB, Settings
from kvpool.cli.bench.naive import FirstFitAllocator
from kvpool.pool.address import AddressManager

__all__ = ["CHURN", "FRAGMENTATION"]

SUBJECT = "kvpool AddressManager"
BASELINE = "first-fit list"
_ALIGN = 4096


class _Placement(Protocol):
    """What both placement benchmarks call: AddressManager and FirstFitAllocator have it."""

    def allocate(self, size: int) -> tuple[int, int]: ...
    def free(self, address: int, size: int) -> None: ...
    def num_free_blocks(self) -> int: ...


_MAKERS: dict[str, Callable[[int], _Placement]] = {
    SUBJECT: lambda size: AddressManager(size, _ALIGN),
    BASELINE: lambda size: FirstFitAllocator(size, _ALIGN),
}


# ---------------------------------------------------------------------------
# churn
# ---------------------------------------------------------------------------


def _churn_trial(
    make: Callable[[int], _Placement],
    capacity: int,
    sizes: list[int],
    coins: list[float],
    picks: list[float],
) -> tuple[float, int, int]:
    """Fill to 70 % (untimed), then run len(coins) random allocate/free ops.

    Returns (seconds for the ops, allocation failures, free blocks at the end).
    """
    am = make(capacity)
    target = 0.7 * capacity
    live: list[tuple[int, int]] = []
    used = 0
    si = 0
    while used < target:
        addr, size = am.allocate(sizes[si])
        si += 1
        live.append((addr, size))
        used += size
    failures = 0
    pi = 0
    start = time.perf_counter()
    for coin in coins:
        if live and coin >= (0.45 if used > target else 0.55):
            do_free = True
        else:
            try:
                addr, size = am.allocate(sizes[si])
            except RuntimeError:
                failures += 1
                do_free = True
            else:
                live.append((addr, size))
                used += size
                do_free = False
            si += 1
        if do_free:
            j = int(picks[pi] * len(live))
            pi += 1
            addr, size = live[j]
            live[j] = live[-1]
            live.pop()
            am.free(addr, size)
            used -= size
    elapsed = time.perf_counter() - start
    blocks = am.num_free_blocks()
    return elapsed, failures, blocks


def _setup_churn(settings: Settings) -> Case:
    ops = settings.count(100_000, minimum=100)
    capacity = 1 * GiB
    rng = np.random.default_rng(settings.seed)
    # Enough sizes for the fill (at most capacity / 4 KiB) and for every op.
    n_sizes = ops + capacity // (4 * KiB)
    sizes = np.exp(rng.uniform(math.log(4 * KiB), math.log(1 * MiB), n_sizes))
    size_list = sizes.astype(np.int64).tolist()
    coins = rng.random(ops).tolist()
    picks = rng.random(ops).tolist()
    info: dict[str, Any] = {
        "ops": ops,
        "capacity_bytes": capacity,
        "align_bytes": _ALIGN,
        "sizes": "log-uniform 4 KiB .. 1 MiB",
        "occupancy_target": 0.7,
        "failures": {},
        "free_blocks_end": {},
    }

    def variant(name: str) -> Callable[[], dict[str, float]]:
        def trial() -> dict[str, float]:
            elapsed, failures, blocks = _churn_trial(
                _MAKERS[name], capacity, size_list, coins, picks
            )
            info["failures"][name] = failures
            info["free_blocks_end"][name] = blocks
            return {"op": elapsed / ops * 1e6}

        return trial

    return Case(
        metrics=[Metric("op", "allocate/free op at 70% full", "us/op")],
        variants={name: variant(name) for name in _MAKERS},
        subject=SUBJECT,
        baseline=BASELINE,
        info=info,
    )


CHURN = Benchmark(
    "churn",
    "AddressManager churn: random allocate/free, 4 KiB-1 MiB, around 70% of 1 GiB",
    _setup_churn,
)


# ---------------------------------------------------------------------------
# fragmentation
# ---------------------------------------------------------------------------


def _fragment(am: _Placement, holes: int) -> None:
    """Leave ``holes`` free 4 KiB holes, each between two live 8 KiB blocks."""
    small = []
    for _ in range(holes):
        small.append(am.allocate(4 * KiB))
        am.allocate(8 * KiB)
    for addr, size in small:
        am.free(addr, size)


def _setup_fragmentation(settings: Settings) -> Case:
    holes = 10_000
    pairs = settings.count(2_000, minimum=20)
    request = 16 * KiB  # larger than every hole: a first-fit scan passes all of them
    managers: dict[str, _Placement] = {}
    for name, make in _MAKERS.items():
        am = make(1 * GiB)
        _fragment(am, holes)
        managers[name] = am
    info: dict[str, Any] = {
        "holes": holes,
        "pairs": pairs,
        "request_bytes": request,
        "free_blocks": {name: am.num_free_blocks() for name, am in managers.items()},
    }

    def variant(name: str) -> Callable[[], dict[str, float]]:
        am = managers[name]

        def trial() -> dict[str, float]:
            allocate, free = am.allocate, am.free
            start = time.perf_counter()
            for _ in range(pairs):
                addr, size = allocate(request)
                free(addr, size)
            return {"pair": (time.perf_counter() - start) / pairs * 1e6}

        return trial

    def cleanup() -> None:
        kv = managers[SUBJECT]
        if isinstance(kv, AddressManager):
            info["consistent"] = kv.check_consistency()
        managers.clear()

    return Case(
        metrics=[Metric("pair", f"16 KiB alloc+free past {holes:,} holes", "us/pair")],
        variants={name: variant(name) for name in _MAKERS},
        subject=SUBJECT,
        baseline=BASELINE,
        info=info,
        cleanup=cleanup,
    )


FRAGMENTATION = Benchmark(
    "fragmentation",
    "allocate+free of a block larger than any of 10,000 holes",
    _setup_fragmentation,
)
