"""How fast a host pool becomes resident: ``allocate_host`` against ``torch.zeros``.

The subject is ``allocate_host(size, hugepages="auto")``: 2 MiB hugetlb
pages when the hugepage pool has enough free pages (else 4 KiB pages),
populated by every CPU with ``MADV_POPULATE_WRITE``, pinned as well as
the machine allows.  The baseline is ``torch.zeros(size, dtype=uint8)``.
Both end with every page resident; each ``allocate_host`` result is
checked to be fully resident (mincore) after its timing, and only one
buffer is alive at a time.

``kvpool.cli.bench.populate_variants`` reuses the timing functions here and adds more
variants (threads, THP, pinning) and the cost of ``mlock``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import torch

from kvpool.cli.args import parse_size
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
    "POOL_READY",
    "QUICK_SIZE",
    "mem_available",
    "parse_size",
    "time_allocate_host",
    "time_torch_zeros",
]

#: Pool size of ``--quick`` runs when ``--size`` is not given.
QUICK_SIZE = 256 * MiB


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


def time_allocate_host(size: int, **kwargs: Any) -> tuple[float, str]:
    """Seconds until ``allocate_host(size, **kwargs)`` returns, and what it got.

    The residency check (every page resident, via mincore) and the close
    are not timed.

    Raises:
        RuntimeError: the buffer was not fully resident.
    """
    import kvpool.native.calls as _native
    from kvpool.native.buffer import allocate_host

    gc.collect()
    start = time.perf_counter()
    buf = allocate_host(size, **kwargs)
    elapsed = time.perf_counter() - start
    try:
        resident = _native.resident_bytes(buf.address, buf.mapped_size)
        if resident != buf.mapped_size:
            raise RuntimeError(f"only {resident} of {buf.mapped_size} bytes resident")
        how = (
            f"{buf.kind}, hugepages={buf.hugepages}, pinned={buf.pinned}, "
            f"{buf.threads_used} thread(s), populate={buf.populate_method}"
        )
    finally:
        buf.close()
    return elapsed, how


def time_torch_zeros(size: int) -> tuple[float, str]:
    """Seconds for ``torch.zeros(size, dtype=torch.uint8)``, and a description."""
    gc.collect()
    start = time.perf_counter()
    t = torch.zeros(size, dtype=torch.uint8)
    elapsed = time.perf_counter() - start
    del t
    return elapsed, f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)"


def _setup(settings: Settings) -> Case:
    size = settings.size
    avail = mem_available()
    if avail is not None and size > 0.8 * avail:
        raise SkipBenchmark(
            f"a {format_bytes(size)} pool does not fit in the {format_bytes(avail)} available; "
            "pass a smaller --size"
        )
    from kvpool.native.machine import capabilities

    caps = capabilities()
    pool = caps.hugepage_pool(2048)
    subject = "kvpool allocate_host(hugepages='auto')"
    baseline = "torch.zeros"
    info: dict[str, Any] = {
        "size_bytes": size,
        "hugepages_2MiB_free": pool.free if pool else None,
        "populate_threads": caps.default_populate_threads,
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

    return Case(
        metrics=[Metric("ready", f"{format_bytes(size)} pool resident", "GB/s", True)],
        variants={
            subject: variant(subject, lambda: time_allocate_host(size, hugepages="auto")),
            baseline: variant(baseline, lambda: time_torch_zeros(size)),
        },
        subject=subject,
        baseline=baseline,
        info=info,
    )


POOL_READY = Benchmark(
    "pool_ready", "pool readiness: a host pool made resident (default 4 GiB, --size)", _setup
)
