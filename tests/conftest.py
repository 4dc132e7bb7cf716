"""Fixtures every test folder shares; folder conftests add only their own.

Its presence puts ``tests/`` on ``sys.path``, so test helpers that more
than one folder needs (``hugepage_pool``) are imported from there.

* ``strict`` / ``lenient``: misuse raises / is logged, for one test
  (the previous setting is restored afterwards).
* ``shm_name``: a fresh POSIX shared-memory name, unlinked afterwards if a
  test left it behind.
* ``child_env`` / ``python``: for child processes that import this kvpool.
* ``faults``: libpinmem's test faults (``pinmem_test_set_fault``) and entry
  hooks (``pinmem_test_set_entry_hook``), only in the test build loaded
  below; all switched off after the test.
* ``_fast_gc`` (session, autouse): objects alive at the start are moved out
  of the cycle collector's way, so the many ``gc.collect()`` calls of the
  leak checks stay cheap.

It also points ``$KVPOOL_LIBPINMEM`` at libpinmem's *test build*
(``libpinmem/build/testing/libpinmem.so``: the same sources compiled with
``-DPINMEM_TESTING``, which adds the fault switches the native tests use),
rebuilding it first when a source is newer -- but only when the kvpool under
test is this source tree's and the variable is not set already.  Child
processes inherit the variable.  Where the test build cannot be had (an
installed kvpool, no compiler) the fault tests skip and say why.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_BUILD = ROOT / "libpinmem" / "build" / "testing" / "libpinmem.so"


def _fresh(target: Path) -> bool:
    if not target.exists():
        return False
    sources = [*ROOT.glob("libpinmem/*.c"), *ROOT.glob("libpinmem/*.h")]
    return all(src.stat().st_mtime <= target.stat().st_mtime for src in sources)


def _use_test_build() -> None:
    if os.environ.get("KVPOOL_LIBPINMEM"):
        return
    spec = importlib.util.find_spec("kvpool")
    if spec is None or spec.origin is None:
        return
    if Path(spec.origin).resolve().parent != ROOT / "kvpool":
        return  # an installed kvpool: it loads its own library
    if not _fresh(TEST_BUILD):
        build = [sys.executable, str(ROOT / "build.py"), "--quiet", "--testing"]
        if subprocess.run(build, cwd=ROOT, check=False).returncode != 0 or not _fresh(TEST_BUILD):
            return
    os.environ["KVPOOL_LIBPINMEM"] = str(TEST_BUILD)


# Before kvpool is imported: it loads libpinmem when it is.
_use_test_build()

import kvpool  # noqa: E402
import kvpool.native  # noqa: E402


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


class Faults:
    """libpinmem's test-only fault switches (the test build's pinmem_test_set_fault)."""

    def __init__(self, setter: Any) -> None:
        self._setter = setter
        self._callbacks: list[Any] = []  # kept alive while C may call them

    def hook(self, point: str, fn: Any) -> None:
        """Have the entry calls run ``fn()`` once at ``point`` ("read_before_lock"...)."""
        ffi, lib = kvpool.native.ffi, kvpool.native.lib
        callback = ffi.callback("void(void)", fn)
        self._callbacks.append(callback)
        where = getattr(lib, f"PINMEM_HOOK_{point.upper()}")
        kvpool.native.check(lib.pinmem_test_set_entry_hook(where, callback), f"hook {point}")

    def set(self, name: str, on: bool = True) -> None:
        """Switch a fault on or off by its name in pinmem.h, e.g. "mlock_eperm"."""
        fault = getattr(kvpool.native.lib, f"PINMEM_FAULT_{name.upper()}")
        kvpool.native.check(self._setter(fault, 1 if on else 0), f"set fault {name}")

    def clear(self) -> None:
        """Switch every fault off and remove every hook."""
        lib = kvpool.native.lib
        for fault in range(lib.PINMEM_FAULT_COUNT):
            self._setter(fault, 0)
        for point in range(lib.PINMEM_HOOK_COUNT):
            lib.pinmem_test_set_entry_hook(point, kvpool.native.ffi.NULL)


@pytest.fixture
def faults() -> Iterator[Faults]:
    """Fault switches of the test build; skips where the loaded library is a production one."""
    try:
        setter = kvpool.native.lib.pinmem_test_set_fault
    except (AttributeError, kvpool.native.ffi.error):  # cffi: the symbol is not in the library
        pytest.skip(
            f"needs libpinmem's test build (loaded: {kvpool.native.library_path()}); `make lib` "
            "builds libpinmem/build/testing/libpinmem.so, which tests/conftest.py loads"
        )
    switches = Faults(setter)
    yield switches
    switches.clear()
