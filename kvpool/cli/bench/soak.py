"""Soak: N put/get cycles through a FileStore; reports resident-memory growth.

::

    python -m kvpool.cli.bench.soak                        # 1,000,000 cycles on /dev/shm
    python -m kvpool.cli.bench.soak --cycles 20000 --json  # the short form the tests run

Each cycle puts one of ``--keys`` source objects under its key and gets it
back into a new object from the same pool, then frees that object.  RSS
(``/proc/self/statm``) is read after ``--warmup`` cycles and at the end;
the growth between the two is the figure (a leak of one small object per
cycle would show as tens of MiB over a million cycles).  Every
``--verify-every`` cycles the bytes are compared, and at the end the pool
must be empty and pass ``memcheck()``.

This measures memory, not speed (the cycle rate is printed for context).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import torch

from kvpool.formats import MemoryFormat
from kvpool.native.machine import rss_bytes
from kvpool.pool.extent import TensorMemoryAllocator
from kvpool.remote import FileStore

PAGE = os.sysconf("SC_PAGESIZE")


def default_directory() -> str:
    """/dev/shm when it exists (tmpfs: the store lives in memory), else the temp dir."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(base, f"kvpool-soak-{os.getpid()}")


def run_soak(
    cycles: int = 1_000_000,
    *,
    directory: str | None = None,
    warmup: int = 2000,
    keys: int = 16,
    shape: tuple[int, ...] = (2, 4, 16, 32),
    dtype: torch.dtype = torch.float16,
    checksum: bool = False,
    verify_every: int = 997,
    samples: int = 10,
) -> dict[str, Any]:
    """Run the soak and return its figures.

    Args:
        cycles: put/get cycles after the warm-up.
        directory: the store's directory (removed afterwards when this
            function created it); default: a fresh one under /dev/shm.
        warmup: cycles before the first RSS reading.
        keys: distinct keys (and source objects) cycled through.
        shape: shape of each object.
        dtype: dtype of each object.
        checksum: FileStore's payload CRC.
        verify_every: compare the bytes read back every this many cycles.
        samples: RSS readings taken along the run (for the trend).

    Returns:
        ``rss_growth_bytes`` (end minus after warm-up), the RSS samples,
        the cycle rate and the settings.

    Raises:
        AssertionError: bytes read back differ, or the pool leaked.
    """
    own_dir = directory is None
    directory = directory or default_directory()
    size = torch.Size(shape)
    fmt = MemoryFormat.KV_2LTD
    nbytes = size.numel() * dtype.itemsize
    pool = TensorMemoryAllocator(torch.zeros((2 * keys + 8) * nbytes, dtype=torch.uint8))
    store = FileStore(directory, checksum=checksum)
    try:
        names = [f"soak-{i}" for i in range(keys)]
        sources = []
        expected = []
        for i in range(keys):
            obj = pool.allocate(size, dtype, fmt)
            assert obj is not None
            gen = torch.Generator().manual_seed(i)
            obj.byte_array[:] = torch.randint(
                0, 256, (nbytes,), dtype=torch.uint8, generator=gen
            ).numpy()
            sources.append(obj)
            expected.append(bytes(obj.byte_array))

        def cycle(i: int) -> None:
            k = i % keys
            store.put(names[k], sources[k])
            got = store.get(names[k], pool, size, dtype, fmt)
            if i % verify_every == 0:
                assert got is not None and got.byte_array == expected[k], f"cycle {i}: bytes differ"
            got.ref_count_down()  # type: ignore[union-attr]

        for i in range(warmup):
            cycle(i)
        gc.collect()
        rss0 = rss_bytes()
        trace = [rss0]
        step = max(1, cycles // max(1, samples))
        t0 = time.perf_counter()
        for i in range(cycles):
            cycle(warmup + i)
            if (i + 1) % step == 0:
                trace.append(rss_bytes())
        elapsed = time.perf_counter() - t0
        gc.collect()
        rss1 = rss_bytes()
        for obj in sources:
            obj.ref_count_down()
        stats = pool.stats()
        assert stats.active_objects == 0 and pool.memcheck(), f"the pool leaked: {stats}"
        return {
            "cycles": cycles,
            "warmup": warmup,
            "keys": keys,
            "object_bytes": nbytes,
            "checksum": checksum,
            "directory": directory,
            "rss_after_warmup_bytes": rss0,
            "rss_end_bytes": rss1,
            "rss_growth_bytes": rss1 - rss0,
            "rss_max_growth_bytes": max([*trace, rss1]) - rss0,
            "rss_trace_MiB": [round(r / 2**20, 2) for r in [*trace, rss1]],
            "cycles_per_s": cycles / elapsed if elapsed > 0 else float("inf"),
            "elapsed_s": elapsed,
        }
    finally:
        store.close()
        pool.close()
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Command line: run the soak and print its figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cycles", type=int, default=1_000_000)
    p.add_argument("--warmup", type=int, default=2000)
    p.add_argument("--keys", type=int, default=16)
    p.add_argument("--dir", default=None, help="store directory (default: fresh, under /dev/shm)")
    p.add_argument("--checksum", action="store_true", help="FileStore(checksum=True)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    res = run_soak(
        args.cycles,
        directory=args.dir,
        warmup=args.warmup,
        keys=args.keys,
        checksum=args.checksum,
    )
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(
            f"{res['cycles']:,} put/get cycles of {res['object_bytes']} B objects "
            f"({res['cycles_per_s']:,.0f} cycles/s, {res['elapsed_s']:.1f} s)\n"
            f"RSS after warm-up {res['rss_after_warmup_bytes'] / 2**20:.2f} MiB, "
            f"at the end {res['rss_end_bytes'] / 2**20:.2f} MiB: "
            f"growth {res['rss_growth_bytes'] / 2**20:+.3f} MiB "
            f"(max {res['rss_max_growth_bytes'] / 2**20:+.3f} MiB)\n"
            f"trace (MiB): {res['rss_trace_MiB']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
