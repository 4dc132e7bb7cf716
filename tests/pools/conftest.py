"""Fixtures for the pool tests (kvpool.pool.pools, kvpool.allocators and friends).

* ``pin_monitor`` (autouse): every test starts and ends with the
  process-wide PinMonitor reset to its defaults (no pins, no thread, no
  callback).
* ``strict`` / ``lenient``: misuse raises / is logged (restored afterwards).
* ``mappings``: native mappings alive when the test started (garbage
  collected first); compare with ``pool_helpers.count_mappings()``.
* ``hugepages_reserved``: at least 8 free 2 MiB pages during the test,
  reserved as root and given back right after it (or a skip with the reason).
* ``no_auto_hugepages``: pools not asked for hugepages use 4 KiB pages, so
  that a hugepage pool reserved by another test does not change them.
* ``shm_name``: a fresh POSIX shared-memory name, unlinked afterwards if a
  test left it behind.
* ``child_env`` / ``python``: for child processes that import this kvpool.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hugepage_pool import reserve_hugepages
from pool_helpers import count_mappings

import kvpool


@pytest.fixture(scope="session", autouse=True)
def _fast_gc() -> Iterator[None]:
    """Move what exists now (torch's and pytest's objects) out of the collector's way.

    The leak checks call gc.collect() often; with torch imported each call
    walks ~10^6 objects (~0.1 s).  Frozen objects are never freed, so only
    objects that live for the whole session anyway are frozen.
    """
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


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
def strict() -> Iterator[None]:
    """Misuse raises for the duration of the test."""
    previous = kvpool.set_strict_mode(True)
    yield
    kvpool.set_strict_mode(previous)


@pytest.fixture
def lenient() -> Iterator[None]:
    """Misuse is logged as a warning, not raised, for the duration of the test."""
    previous = kvpool.set_strict_mode(False)
    yield
    kvpool.set_strict_mode(previous)


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


@pytest.fixture
def shm_name() -> Iterator[str]:
    """A unique shared-memory name; unlinked after the test if it still exists."""
    name = f"/kvpool-test-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    yield name
    with contextlib.suppress(kvpool.SharedMemoryNotFoundError):
        kvpool.unlink_shm(name)


@pytest.fixture(scope="session")
def child_env() -> dict[str, str]:
    """Environment for a child Python that must import this same kvpool."""
    env = dict(os.environ)
    package_parent = str(Path(kvpool.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    env["KVPOOL_CUDART"] = ""  # the child needs no CUDA
    return env


@pytest.fixture(scope="session")
def python() -> str:
    """The interpreter running the tests (children use the same one)."""
    return sys.executable
