"""Fixtures every test folder shares; folder conftests add only their own.

Its presence puts ``tests/`` on ``sys.path``, so test helpers that more
than one folder needs (``hugepage_pool``) are imported from there.

* ``strict`` / ``lenient``: misuse raises / is logged, for one test
  (the previous setting is restored afterwards).
* ``shm_name``: a fresh POSIX shared-memory name, unlinked afterwards if a
  test left it behind.
* ``child_env`` / ``python``: for child processes that import this kvpool.
* ``fake_cudart`` / ``fake_cuda``: the fake CUDA runtime's path, and the
  runtime loaded as libpinmem's CUDA with its books (``tests/fake_cuda.py``).
* ``cuda_device``: for ``gpu`` tests: a real device or a skip, and no CUDA
  error pending before or after the test (``tests/cuda_runtime.py``).
* ``faults``: libpinmem's test faults (``pinmem_test_set_fault``) and entry
  hooks (``pinmem_test_set_entry_hook``), only in the test build loaded
  below; all switched off after the test.
* ``_fast_gc`` (session, autouse): objects alive at the start are moved out
  of the cycle collector's way, so the many ``gc.collect()`` calls of the
  leak checks stay cheap.
* ``pytest -m gpu`` (the mark expression exactly ``gpu``) collects only the
  test files that hold a ``gpu`` mark: a GPU machine lent for minutes needs
  no test extra (hypothesis, redis, pyelftools...) and spends no time
  importing what it would deselect.  The gpu tests' own files import only
  torch, numpy, cffi and pytest.

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

from cuda_runtime import CudaRuntime  # noqa: E402
from fake_cuda import FakeCuda, build_fake_cudart  # noqa: E402

import kvpool  # noqa: E402
import kvpool.native  # noqa: E402


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m gpu``, skip importing test files without a ``gpu`` mark (see above)."""
    if config.getoption("markexpr", "") != "gpu":
        return None
    name = collection_path.name
    if collection_path.is_file() and name.startswith("test_") and name.endswith(".py"):
        return "mark.gpu" not in collection_path.read_text(errors="replace") or None
    return None


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


@pytest.fixture(scope="session")
def fake_cudart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of the fake libcudart (libpinmem/tests/fake_cudart.c), built if missing."""
    path = build_fake_cudart(tmp_path_factory.mktemp("fakecuda"))
    if path is None:
        pytest.skip("the fake CUDA runtime is not built and there is no C compiler")
    return path


@pytest.fixture
def fake_cuda(fake_cudart: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    """The fake runtime loaded as libpinmem's CUDA (its knobs cleared, books reset).

    Restores the register options and CUDA discovery afterwards (the test
    closes its pools first: a reload is refused while CUDA memory is live).
    """
    for knob in ("FAIL_REGISTER_N", "MAX_REGISTER_BYTES", "DEVICES", "REGISTER_DELAY_MS"):
        monkeypatch.delenv(f"KVPOOL_FAKE_CUDA_{knob}", raising=False)
    # A failed test's traceback (kept for post-mortem) may hold its pools.
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        with contextlib.suppress(AttributeError):
            delattr(sys, name)
    gc.collect()
    saved = {name: kvpool.native.option_get(name) for name in kvpool.native.OPTIONS}
    kvpool.native.cuda_reload(str(fake_cudart))
    books = FakeCuda(fake_cudart)
    books.reset()
    yield books
    gc.collect()
    for name, value in saved.items():
        kvpool.native.option_set(name, value)
    with contextlib.suppress(kvpool.NativeError):
        kvpool.native.cuda_reload(None)


@pytest.fixture
def cuda_device() -> Iterator[CudaRuntime]:
    """A real CUDA device (else a skip), and no CUDA error pending before or after the test.

    Any error an earlier test left pending is cleared first, so no test
    depends on the ones before it; one this test leaves behind fails it
    (a refused CUDA call must be followed by clearing the error).  Yields
    the runtime libpinmem uses (torch's).
    """
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    torch.cuda.init()  # torch's libcudart is loaded: libpinmem finds it with RTLD_NOLOAD
    with contextlib.suppress(kvpool.NativeError):  # refused while CUDA memory is live
        kvpool.native.cuda_reload(None)
    caps = kvpool.capabilities()
    if not caps.cuda_available or not caps.cuda_runtime_path:
        pytest.fail(f"torch sees a GPU but libpinmem does not: {caps.cuda_error}")
    runtime = CudaRuntime(caps.cuda_runtime_path)
    runtime.take()
    torch.cuda.synchronize()
    yield runtime
    torch.cuda.synchronize()
    left = runtime.take()
    assert left == 0, f"the test left {runtime.name(left)} pending for the next CUDA call"


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
