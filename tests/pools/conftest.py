"""Fixtures for the pool tests (kvpool.pool.pools, kvpool.allocators and friends).

* ``pin_monitor`` (autouse): every test starts and ends with the
  process-wide PinMonitor reset to its defaults (no pins, no thread, no
  callback).
* ``mappings``: native mappings alive when the test started (garbage
  collected first); compare with ``pool_helpers.count_mappings()``.
* ``hugepages_reserved``: at least 8 free 2 MiB pages during the test,
  reserved as root and given back right after it (or a skip with the reason).
* ``no_auto_hugepages``: pools not asked for hugepages use 4 KiB pages, so
  that a hugepage pool reserved by another test does not change them.

``strict``, ``lenient``, ``shm_name``, ``child_env`` and ``python`` come from
``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import pytest
from hugepage_pool import reserve_hugepages
from pool_helpers import count_mappings

import kvpool


def _reset_monitor() -> None:
    monitor = kvpool.PinMonitor.GetOrCreate()
    monitor.reset()
    monitor.configure(timeout=300.0, interval=10.0, force_unpin=False, enabled=True)
    # configure(on_timeout=None) means "leave it as it is": clear it directly.
    monitor.on_timeout = None


@pytest.fixture(autouse=True)
def pin_monitor() -> Iterator[kvpool.PinMonitor]:
    """The process-wide PinMonitor, reset before and after the test."""
    _reset_monitor()
    yield kvpool.PinMonitor.GetOrCreate()
    _reset_monitor()


@pytest.fixture
def mappings() -> int:
    """Native mappings alive before the test made any (after collecting garbage).

    pytest keeps the previous failure's traceback (sys.last_traceback, for
    post-mortem debugging) until this test's call starts; its frames may
    hold a pool, so drop it first or the baseline would count that pool.
    """
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        with contextlib.suppress(AttributeError):
            delattr(sys, name)
    return count_mappings()


@pytest.fixture
def hugepages_reserved() -> Iterator[int]:
    """At least 8 free 2 MiB pages during the test (the pool size is restored after)."""
    with reserve_hugepages(8) as free:
        yield free


@pytest.fixture
def no_auto_hugepages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pools that were not asked for hugepages use 4 KiB pages."""
    monkeypatch.setenv("KVPOOL_HUGEPAGES", "never")
