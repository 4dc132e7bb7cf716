"""Fixtures every test folder shares; folder conftests add only their own.

Its presence puts ``tests/`` on ``sys.path``, so test helpers that more
than one folder needs (``hugepage_pool``) are imported from there.

* ``strict`` / ``lenient``: misuse raises / is logged, for one test
  (the previous setting is restored afterwards).
* ``shm_name``: a fresh POSIX shared-memory name, unlinked afterwards if a
  test left it behind.
* ``child_env`` / ``python``: for child processes that import this kvpool.
* ``_fast_gc`` (session, autouse): objects alive at the start are moved out
  of the cycle collector's way, so the many ``gc.collect()`` calls of the
  leak checks stay cheap.
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
def shm_name() -> Iterator[str]:
    """A unique shared-memory name; unlinked after the test if it still exists."""
    name = f"/kvpool-test-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    yield name
    with contextlib.suppress(kvpool.SharedMemoryNotFoundError):
        kvpool.unlink_shm(name)


@pytest.fixture(scope="session")
def child_env() -> dict[str, str]:
    """Environment for a child Python that must import this same kvpool (without CUDA)."""
    env = dict(os.environ)
    package_parent = str(Path(kvpool.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    env["KVPOOL_CUDART"] = ""  # the child needs no CUDA
    return env


@pytest.fixture(scope="session")
def python() -> str:
    """The interpreter running the tests (children use the same one)."""
    return sys.executable
