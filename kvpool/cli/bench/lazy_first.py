"""How soon a LazyMemoryAllocator of a huge final size serves its first allocation.

Each trial constructs ``LazyMemoryAllocator(init_size, size)`` (the whole
range reserved, the first ``--init`` bytes, default 32 MiB, resident and
pinned, background growth started in LMCache's 1 GiB steps), allocates
one KV chunk (512 KiB), writes and reads it back, and times construction
to first allocation.  Then it frees the chunk, waits
``--grow`` seconds (to see how far growth got) and closes the pool.  The
final size may exceed RAM (64 GiB on a 24 GiB machine): it is only address
space until growth commits it, and growth stops at the machine's limit.

Usage::

    python -m kvpool.cli.bench.lazy_first [--size 64G] [--init 32M] [--trials 5] [--grow 1.0]

Reported: construction and first-allocation latency (median and worst, ms),
and the bytes committed after ``--grow`` seconds.  A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import torch

from kvpool.cli.args import parse_size

__all__ = ["first_allocation", "main"]


def first_allocation(size: int, grow: float, init_size: int = 32 << 20) -> dict[str, float]:
    """One trial: seconds to construct and to the first allocation, bytes grown after grow s."""
    from kvpool.formats import MemoryFormat
    from kvpool.pool.lazy import LazyMemoryAllocator

    gc.collect()
    start = time.perf_counter()
    pool = LazyMemoryAllocator(init_size, size)
    constructed = time.perf_counter()
    try:
        obj = pool.allocate(torch.Size([2, 32, 16, 128]), torch.bfloat16, MemoryFormat.KV_2LTD)
        if obj is None:
            raise RuntimeError("the first allocation returned None")
        obj.byte_array[:8] = b"kvpool!!"
        served = time.perf_counter()
        if bytes(obj.byte_array[:8]) != b"kvpool!!":
            raise RuntimeError("the first allocation did not read back")
        obj.ref_count_down()
        time.sleep(grow)  # not synchronisation: how far growth gets in that time
        grown = pool.committed_bytes
        stopped = pool.stopped_by
    finally:
        pool.close()
    return {
        "construct_s": constructed - start,
        "first_s": served - start,
        "committed_after_grow": grown,
        "stopped": stopped is not None,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the trials and print the figures; return 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="64G", help="final pool size (default 64G)")
    parser.add_argument("--init", default="32M", help="bytes usable at once (default 32M)")
    parser.add_argument("--trials", type=int, default=5, help="trials (default 5)")
    parser.add_argument("--grow", type=float, default=1.0, help="seconds of growth per trial")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.grow < 0:
        parser.error("--trials must be >= 1 and --grow >= 0")
    size = parse_size(args.size)
    runs = []
    for trial in range(args.trials):
        r = first_allocation(size, args.grow, parse_size(args.init))
        runs.append(r)
        print(
            f"  trial {trial + 1}: constructed in {r['construct_s'] * 1e3:.1f} ms, first "
            f"allocation served at {r['first_s'] * 1e3:.1f} ms; "
            f"{r['committed_after_grow'] / 2**30:.2f} GiB committed after {args.grow:g} s",
            flush=True,
        )
    first = [r["first_s"] * 1e3 for r in runs]
    construct = [r["construct_s"] * 1e3 for r in runs]
    print(
        f"LazyMemoryAllocator({size / 2**30:.3g} GiB): first allocation at "
        f"{statistics.median(first):.1f} ms median, {max(first):.1f} ms worst "
        f"(construction {statistics.median(construct):.1f} ms median) over {len(runs)} trials"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
