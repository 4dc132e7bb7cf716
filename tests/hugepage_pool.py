"""Reserve free 2 MiB hugepages for a test, as root, and give them back."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpool.native.machine import read_hugepage_info

NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")


def _pool() -> tuple[int, int] | None:
    info = read_hugepage_info()
    return None if info is None else (info[0], info[1])


@contextlib.contextmanager
def reserve_hugepages(wanted: int) -> Iterator[int]:
    """Make at least ``wanted`` 2 MiB pages free; restore the pool size on exit.

    Yields the number of free pages.  Skips the test (with the reason) when
    the kernel has no 2 MiB pool or it cannot be grown.
    """
    pool = _pool()
    if pool is None:
        pytest.skip("this kernel has no 2 MiB hugepage pool")
    total, free = pool
    if free >= wanted:
        yield free
        return
    if os.geteuid() != 0:
        pytest.skip(
            f"only {free} free 2 MiB hugepages and not root to reserve more "
            f"(echo {total + wanted - free} | sudo tee {NR_HUGEPAGES})"
        )
    old = int(NR_HUGEPAGES.read_text())
    try:
        NR_HUGEPAGES.write_text(str(old + wanted - free))
    except OSError as exc:
        pytest.skip(f"could not reserve 2 MiB hugepages: {exc}")
    try:
        pool = _pool()
        if pool is None or pool[1] < wanted:
            pytest.skip(f"asked for {wanted} free hugepages but the pool is {pool} (fragmented?)")
        yield pool[1]
    finally:
        gc.collect()  # pools the test dropped give their pages back first
        NR_HUGEPAGES.write_text(str(old))
