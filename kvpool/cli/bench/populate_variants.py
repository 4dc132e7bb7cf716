"""How fast does a host-memory pool become resident?  (W6 in DESIGN.md.)

Times, side by side and interleaved (best of --trials), the making of a
resident pool of --size bytes by

* ``torch.zeros(size, dtype=torch.uint8)``  -- the reference;
* ``kvpool.native.buffer.allocate_host(size, hugepages="auto")`` -- the fast path:
  2 MiB hugetlb pages when the pool has enough free pages, populated by
  every CPU with MADV_POPULATE_WRITE, pinned as well as the machine allows;
* informative variants: 4 KiB pages with 1 and N threads, THP, mlock.

Each allocate_host result is checked to be fully resident (mincore) after
its timing.  Then it measures what mlock costs on an already populated
region (4 KiB and 2 MiB pages), which decides how libpinmem pins.

Usage::

    python -m kvpool.cli.bench.populate_variants [--size 4G] [--trials 3] [--reserve-hugepages 2100]

--reserve-hugepages (root only) sets /proc/sys/vm/nr_hugepages for the run
and restores the old value afterwards.  This is a benchmark, not a test:
it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from kvpool.cli.bench.pool_ready import parse_size, time_allocate_host, time_torch_zeros
from kvpool.native.buffer import allocate_host
from kvpool.native.machine import capabilities

NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


@contextlib.contextmanager
def reserved_hugepages(pages: int | None) -> Iterator[None]:
    """Set nr_hugepages for the block (root only) and restore it after."""
    if not pages:
        yield
        return
    old = int(NR_HUGEPAGES.read_text())
    NR_HUGEPAGES.write_text(str(max(pages, old)))
    print(f"nr_hugepages {old} -> {NR_HUGEPAGES.read_text().strip()} for the run")
    try:
        yield
    finally:
        NR_HUGEPAGES.write_text(str(old))
        print(f"nr_hugepages restored to {NR_HUGEPAGES.read_text().strip()}")


def mlock_cost(size: int, hugepages: str) -> dict[str, object] | None:
    """Seconds to mlock and munlock a region that is already resident."""
    try:
        buf = allocate_host(size, pin="none", hugepages=hugepages)
    except Exception as exc:  # reported, not fatal
        print(f"  mlock cost ({hugepages}): skipped: {exc}")
        return None
    try:
        start = time.perf_counter()
        rc = _libc.mlock(buf.address, buf.mapped_size)
        locked = time.perf_counter() - start
        if rc != 0:
            print(f"  mlock cost ({hugepages}): mlock refused, errno {ctypes.get_errno()}")
            return None
        start = time.perf_counter()
        _libc.munlock(buf.address, buf.mapped_size)
        unlocked = time.perf_counter() - start
        return {"mlock_s": locked, "munlock_s": unlocked, "kind": buf.kind}
    finally:
        buf.close()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; return 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="4G", help="pool size (default 4G)")
    parser.add_argument("--trials", type=int, default=3, help="interleaved trials (best of)")
    parser.add_argument("--reserve-hugepages", type=int, default=None, metavar="N")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--quick", action="store_true", help="only torch.zeros and the fast path")
    args = parser.parse_args(argv)
    size = parse_size(args.size)
    if args.reserve_hugepages and os.geteuid() != 0:
        parser.error("--reserve-hugepages needs root")

    with reserved_hugepages(args.reserve_hugepages):
        caps = capabilities()
        pool = caps.hugepage_pool(2048)
        threads = caps.default_populate_threads
        print(
            f"pool {size / 2**30:.2f} GiB, {caps.cpu_affinity} CPUs, populate threads {threads}, "
            f"2 MiB pages free {pool.free if pool else 'n/a'}, THP {caps.thp_mode}, "
            f"MADV_POPULATE_WRITE {'yes' if caps.populate_write else 'no'}"
        )
        variants: dict[str, Callable[[], tuple[float, str]]] = {
            "torch.zeros": lambda: time_torch_zeros(size),
            "allocate_host(hugepages='auto')": lambda: time_allocate_host(size, hugepages="auto"),
        }
        if not args.quick:
            variants |= {
                "4K, 1 thread, pin=none": lambda: time_allocate_host(size, pin="none", threads=1),
                f"4K, {threads} threads, pin=none": lambda: time_allocate_host(
                    size, pin="none", threads=threads
                ),
                f"4K, {threads} threads, pin=mlock": lambda: time_allocate_host(
                    size, pin="mlock", threads=threads
                ),
                f"THP, {threads} threads, pin=none": lambda: time_allocate_host(
                    size, pin="none", hugepages="thp"
                ),
                "hugetlb, 1 thread, pin=none": lambda: time_allocate_host(
                    size, pin="none", hugepages="auto", threads=1
                ),
                f"hugetlb, {threads} threads, pin=none": lambda: time_allocate_host(
                    size, pin="none", hugepages="auto"
                ),
            }
        names = list(variants)
        samples: dict[str, list[float]] = {n: [] for n in names}
        how: dict[str, str] = {}
        for trial in range(args.trials):
            order = names[trial % len(names) :] + names[: trial % len(names)]
            for name in order:
                seconds, desc = variants[name]()
                samples[name].append(seconds)
                how[name] = desc
                print(f"  trial {trial + 1} {name:36s} {size / seconds / 1e9:6.2f} GB/s")

        base = size / min(samples["torch.zeros"]) / 1e9
        print()
        print(f"{'variant':36s} {'best GB/s':>9s} {'median':>7s} {'x torch':>8s}  what it got")
        results = {}
        for name in names:
            best = size / min(samples[name]) / 1e9
            median = size / statistics.median(samples[name]) / 1e9
            results[name] = {"best_gbps": best, "median_gbps": median, "ratio": best / base}
            print(f"{name:36s} {best:9.2f} {median:7.2f} {best / base:7.2f}x  {how[name]}")

        print("\nmlock of an already populated region:")
        costs = {}
        for hp in ("never", "required"):
            cost = mlock_cost(size, hp)
            if cost:
                costs[hp] = cost
                print(
                    f"  {cost['kind']:10s} mlock {cost['mlock_s'] * 1e3:8.1f} ms "
                    f"({size / cost['mlock_s'] / 1e9:6.1f} GB/s)   "
                    f"munlock {cost['munlock_s'] * 1e3:7.1f} ms"
                )
    if args.json:
        Path(args.json).write_text(json.dumps({"size": size, "results": results, "mlock": costs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
