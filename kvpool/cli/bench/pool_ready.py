"""How fast a host pool becomes resident: the default pool, torch.zeros and the bare methods.

The subject is the default pool, ``MixedMemoryAllocator(size)``: 4 KiB pages
(hugetlb pages go to pools that ask for them: ``use_hugepages=True`` or
``KVPOOL_HUGEPAGES=auto``), populated as libpinmem's populate plan says (the
method measured on this machine, the threads by rule; see ``kvpool info``),
pinned as well as the machine allows.  The baseline is ``torch.zeros(size,
dtype=uint8)``.  The extras are ``allocate_host(size, hugepages="auto")``
and the bare methods of :mod:`kvpool.cli.bench.bare` (touch,
``MAP_POPULATE``, ``MADV_POPULATE_WRITE`` with one and with every CPU), so
one run shows every method's GB/s side by side.  Every result is checked to
be fully resident (mincore) after its timing, and only one buffer is alive
at a time.

``python -m kvpool.cli.bench.populate_variants`` runs the same with the
locking variants, with and without hugepages, takes medians and draws a plot.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from kvpool.cli.args import parse_size
from kvpool.cli.bench import bare
from kvpool.cli.bench.core import (
    Benchmark,
    Case,
    Metric,
    MiB,
    Settings,
    SkipBenchmark,
    format_bytes,
)

__all__ = [
    "DEFAULT_POOL",
    "POOL_READY",
    "QUICK_SIZE",
    "mem_available",
    "parse_size",
    "time_allocate_host",
    "time_default_pool",
    "time_torch_zeros",
    "warm_up",
]

#: Pool size of ``--quick`` runs when ``--size`` is not given.
QUICK_SIZE = 256 * MiB

#: The subject's name in tables.
DEFAULT_POOL = "kvpool MixedMemoryAllocator(size)"


def mem_available() -> int | None:
    """MemAvailable from /proc/meminfo in bytes, or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _describe(buf: Any) -> str:
    return (
        f"{buf.kind}, hugepages={buf.hugepages}, pinned={buf.pinned}, "
        f"{buf.threads_used} thread(s), populate={buf.populate_method}"
    )


def _check_resident(buf: Any) -> None:
    import kvpool.native.calls as _native

    resident = _native.resident_bytes(buf.address, buf.mapped_size)
    if resident != buf.mapped_size:
        raise RuntimeError(f"only {resident} of {buf.mapped_size} bytes resident")


def time_default_pool(size: int, **kwargs: Any) -> tuple[float, str]:
    """Seconds until ``MixedMemoryAllocator(size, **kwargs)`` exists, and what its memory got.

    No keywords: the default pool.  The residency check and the close are
    not timed.

    Raises:
        RuntimeError: the pool's memory was not fully resident.
    """
    from kvpool.allocators import MixedMemoryAllocator

    gc.collect()
    start = time.perf_counter()
    pool = MixedMemoryAllocator(size, **kwargs)
    elapsed = time.perf_counter() - start
    try:
        buf = pool.backing.buffer
        _check_resident(buf)
        how = _describe(buf)
    finally:
        pool.close()
    return elapsed, how


def time_allocate_host(size: int, **kwargs: Any) -> tuple[float, str]:
    """Seconds until ``allocate_host(size, **kwargs)`` returns, and what it got.

    The residency check (every page resident, via mincore) and the close
    are not timed.

    Raises:
        RuntimeError: the buffer was not fully resident.
    """
    from kvpool.native.buffer import allocate_host

    gc.collect()
    start = time.perf_counter()
    buf = allocate_host(size, **kwargs)
    elapsed = time.perf_counter() - start
    try:
        _check_resident(buf)
        how = _describe(buf)
    finally:
        buf.close()
    return elapsed, how


def time_torch_zeros(size: int) -> tuple[float, str]:
    """Seconds for ``torch.zeros(size, dtype=torch.uint8)``, and a description."""
    return bare.torch_zeros(size), f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)"


def warm_up(size: int, *, hugetlb: bool) -> None:
    """Fault size bytes once, untimed, so that every variant meets memory in the same state.

    On a VM the first touch of memory the host has not backed yet (or of
    freshly reserved hugepages) is several times slower; without this the
    variant that happens to run first pays for it.  With ``hugetlb`` the
    hugepage pool's pages are touched too (when enough are free).
    """
    bare.torch_zeros(size)
    if hugetlb:
        with contextlib.suppress(OSError):
            bare.BareMethod("warm-up", bare.MAP_POPULATE, hugetlb=True)(size)


def _setup(settings: Settings) -> Case:
    size = settings.size
    avail = mem_available()
    if avail is not None and size > 0.8 * avail:
        raise SkipBenchmark(
            f"a {format_bytes(size)} pool does not fit in the {format_bytes(avail)} available; "
            "pass a smaller --size"
        )
    from kvpool.native.machine import capabilities

    caps = capabilities(probe_populate=True)
    pool = caps.hugepage_pool(2048)
    threads = max(1, min(len(os.sched_getaffinity(0)), 16))
    warm_up(size, hugetlb=bool(pool and pool.free * 2 * MiB >= size))
    subject = DEFAULT_POOL
    baseline = "torch.zeros"
    info: dict[str, Any] = {
        "size_bytes": size,
        "hugepages_2MiB_free": pool.free if pool else None,
        "populate_method": caps.populate_method,
        "populate_threads": caps.default_populate_threads,
        "populate_probe": caps.populate_probe,
        "populate_write": caps.populate_write,
        "thp_mode": caps.thp_mode,
        "got": {},
    }

    def variant(name: str, timer: Callable[[], tuple[float, str]]) -> Callable[[], dict]:
        def trial() -> dict[str, float]:
            seconds, how = timer()
            info["got"][name] = how
            return {"ready": size / seconds / 1e9}

        return trial

    def bare_variant(method: bare.BareMethod) -> Callable[[], dict]:
        return lambda: {"ready": size / method(size) / 1e9}

    variants = {
        subject: variant(subject, lambda: time_default_pool(size)),
        baseline: variant(baseline, lambda: time_torch_zeros(size)),
        "kvpool allocate_host(hugepages='auto')": variant(
            "allocate_host", lambda: time_allocate_host(size, hugepages="auto")
        ),
    }
    for method in bare.bare_methods(threads, locking=False):
        variants[f"bare {method.name}"] = bare_variant(method)
    return Case(
        metrics=[Metric("ready", f"{format_bytes(size)} pool resident", "GB/s", True)],
        variants=variants,
        subject=subject,
        baseline=baseline,
        info=info,
    )


POOL_READY = Benchmark(
    "pool_ready", "pool readiness: a host pool made resident (default 4 GiB, --size)", _setup
)
