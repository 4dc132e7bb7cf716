"""Fixtures for the native-layer tests (libpinmem, kvpool.native.buffer, kvpool.native.machine).

* Every test here starts with CUDA switched off (``cuda_reload("")``) so
  results do not depend on the machine; GPU tests switch it back on, and
  the fake-CUDA tests load the fake runtime.  Discovery is restored after.
* ``options`` restores every libpinmem option a test changed.
* ``hugepages`` makes sure some 2 MiB pages are free, reserving them as
  root if needed (and restoring the pool size afterwards), or skips with
  the reason.
* ``fake_cudart`` (tests/conftest.py) is the path of the test-only CUDA
  runtime, built if missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hugepage_pool import reserve_hugepages

from kvpool import native

ROOT = Path(__file__).resolve().parents[2]
HUGEPAGES_WANTED = 16


@pytest.fixture(autouse=True)
def _no_cuda_by_default(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("gpu") is None:
        native.cuda_reload("")
    yield
    # Back to discovery, so tests elsewhere see the machine as it is (the
    # reload is refused, and skipped, while CUDA mappings are still live).
    with contextlib.suppress(Exception):
        native.cuda_reload(None)


@pytest.fixture
def options() -> Iterator[None]:
    """Restore every libpinmem option after the test."""
    saved = {name: native.option_get(name) for name in native.OPTIONS}
    yield
    for name, value in saved.items():
        native.option_set(name, value)


@pytest.fixture(scope="session")
def hugepages() -> Iterator[int]:
    """Yield the number of free 2 MiB pages (>= 16), reserving them as root."""
    with reserve_hugepages(HUGEPAGES_WANTED) as free:
        yield free


class Smaps:
    """Reads /proc/self/smaps and /proc/self/maps for a range of addresses."""

    @staticmethod
    def fields(address: int, length: int) -> dict[str, int]:
        """Sum the kB fields (as bytes) of every VMA inside [address, address+length)."""
        totals: dict[str, int] = {}
        inside = False
        end = address + length
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo >= address and hi <= end
                    continue
                if inside and line.rstrip().endswith(" kB"):
                    key, value = line.split(":", 1)
                    totals[key] = totals.get(key, 0) + int(value.split()[0]) * 1024
        return totals

    @staticmethod
    def mapped(address: int) -> bool:
        """True when some VMA covers address."""
        with open("/proc/self/maps") as f:
            for line in f:
                lo, hi = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
                if lo <= address < hi:
                    return True
        return False


@pytest.fixture
def smaps() -> type[Smaps]:
    """The /proc/self/smaps reader."""
    return Smaps
