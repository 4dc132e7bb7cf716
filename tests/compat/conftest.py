"""LMCache's own code on kvpool memory: the compatibility suite's setup.

This folder runs in an environment that has ``lmcache==0.5.6`` (``make
compat`` builds and caches one, see ``make_venv.py``).  Importing this
conftest calls :func:`kvpool.integrations.lmcache.install` before any test
module imports LMCache, so every LMCache module the tests use sees kvpool's
memory management.  Where LMCache is not installed the folder is not
collected (``make test`` runs it through ``make compat``);
``KVPOOL_REQUIRE_LMCACHE=1`` (set by ``make compat``) makes that an error.

Fixtures:

* ``lmc`` - LMCache's config and metadata builders and its monitors, reset
  around every test (LMCache's singletons are process-wide);
* ``redis_server`` - a real ``redis-server`` on a free loopback port,
  without persistence, for the session (skipped without the binary unless
  ``KVPOOL_REQUIRE_REDIS=1``); ``own_redis_server`` one for a single test
  (:func:`start_redis_server` starts one, again on a given port);
* ``redis_cluster`` / ``mooncake`` - tests/remote's real three-master Redis
  Cluster and Mooncake master + storage node, for the session;
* ``deadline`` - polls a condition with a liveness deadline (no sleeps as
  synchronization, no assertion on durations).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REQUIRE_LMCACHE = os.environ.get("KVPOOL_REQUIRE_LMCACHE", "").strip().lower() in (
    "1",
    "true",
    "yes",
)
REQUIRE_REDIS = os.environ.get("KVPOOL_REQUIRE_REDIS", "").strip().lower() in ("1", "true", "yes")
LIVENESS = 30.0

# LMCache's telemetry off and its INFO chatter down, before it is imported.
os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")

try:
    LMCACHE_VERSION: str | None = importlib.metadata.version("lmcache")
except importlib.metadata.PackageNotFoundError:
    LMCACHE_VERSION = None

if LMCACHE_VERSION is None:
    if REQUIRE_LMCACHE:
        raise pytest.UsageError(
            "KVPOOL_REQUIRE_LMCACHE is set but lmcache is not installed in "
            "this interpreter; run `make compat`"
        )
    collect_ignore_glob = ["*"]
else:
    import kvpool
    import kvpool.integrations.lmcache as kv_lmcache

    if REPO not in Path(kvpool.__file__).resolve().parents:
        raise pytest.UsageError(
            f"kvpool was imported from {kvpool.__file__}, not from the checkout under test "
            f"({REPO}); run pytest from the repository root with `python -m pytest`"
        )
    # The tests' child processes (examples, plugin children) run from other
    # folders: the checkout goes first on their path too, whatever kvpool this
    # environment has installed (another checkout's editable install, a
    # regular install in a venv), and one such child proves it.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    _child = subprocess.run(
        [sys.executable, "-c", "import kvpool; print(kvpool.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tempfile.gettempdir(),
    )
    if _child.returncode != 0 or REPO not in Path(_child.stdout.strip()).resolve().parents:
        raise pytest.UsageError(
            f"a child process imports kvpool from {_child.stdout.strip() or _child.stderr}, "
            f"not from the checkout under test ({REPO})"
        )
    kv_lmcache.install()


def wait_until(check: Callable[[], bool], what: str, timeout: float = LIVENESS) -> None:
    """Poll ``check`` until it is true; fail after ``timeout`` s (a liveness bound)."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def deadline() -> Callable[..., None]:
    """:func:`wait_until`, as a fixture."""
    return wait_until


# -- LMCache's singletons ---------------------------------------------


@dataclass
class LMC:
    """LMCache's builders and monitors, as the tests use them."""

    def config(self, **overrides: object):
        """``LMCacheEngineConfig.from_defaults`` with test-sized defaults."""
        from lmcache.v1.config import LMCacheEngineConfig

        values: dict[str, object] = {
            "chunk_size": 16,
            "local_cpu": True,
            "max_local_cpu_size": 0.0625,  # GB: 64 MiB
            "lmcache_instance_id": "kvpool-compat",
        }
        values.update(overrides)
        return LMCacheEngineConfig.from_defaults(**values)

    def metadata(self, chunk_size: int = 16, **overrides: object):
        """Engine metadata of a small model: 2 layers, 4 heads of 32 (fp16)."""
        import torch
        from lmcache.v1.metadata import LMCacheMetadata

        values: dict[str, object] = {
            "model_name": "kvpool/compat",
            "world_size": 1,
            "local_world_size": 1,
            "worker_id": 0,
            "local_worker_id": 0,
            "kv_dtype": torch.float16,
            "kv_shape": (2, 2, chunk_size, 4, 32),
            "chunk_size": chunk_size,
        }
        values.update(overrides)
        return LMCacheMetadata(**values)

    @property
    def stats(self):
        """LMCache's process-wide ``LMCStatsMonitor``."""
        from lmcache.observability import LMCStatsMonitor

        return LMCStatsMonitor.GetOrCreate()

    def pin_monitor(self, **overrides: object):
        """LMCache's ``PinMonitor``, made from a config as its engine does."""
        from lmcache.v1.pin_monitor import PinMonitor

        return PinMonitor.GetOrCreate(self.config(**overrides))


def _reset_lmcache_singletons() -> None:
    from lmcache.observability import LMCStatsMonitor
    from lmcache.v1.pin_monitor import PinMonitor

    PinMonitor.DestroyInstance()
    LMCStatsMonitor.DestroyInstance()


@pytest.fixture
def lmc() -> Iterator[LMC]:
    """LMCache's builders and monitors; its singletons are fresh for the test."""
    _reset_lmcache_singletons()
    yield LMC()
    _reset_lmcache_singletons()


# -- redis ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RedisServer:
    """A redis-server started for the tests."""

    proc: subprocess.Popen[bytes]
    host: str
    port: int

    @property
    def url(self) -> str:
        """``redis://host:port`` for LMCache's remote_url."""
        return f"redis://{self.host}:{self.port}"

    def ping(self) -> bool:
        """True when the server answers PING."""
        try:
            with socket.create_connection((self.host, self.port), timeout=1.0) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def command(self, *words: str) -> bytes:
        """Send one inline command; return the first line of the reply."""
        with socket.create_connection((self.host, self.port), timeout=5.0) as s:
            s.sendall(" ".join(words).encode() + b"\r\n")
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = s.recv(64)
                if not chunk:
                    break
                reply += chunk
        return reply.strip()

    def flush(self) -> None:
        """Delete every key (between tests)."""
        assert self.command("FLUSHALL") == b"+OK"

    def dbsize(self) -> int:
        """Number of keys stored."""
        return int(self.command("DBSIZE").lstrip(b":"))

    def stop(self) -> None:
        """Terminate the server (idempotent)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait(10)


def start_redis_server(workdir: Path, port: int | None = None) -> RedisServer:
    """Start a real redis-server on loopback (a free port unless given); it answers PING.

    Skips without a binary (fails with ``KVPOOL_REQUIRE_REDIS=1``).  The
    caller stops it (``stop()``); ``port`` restarts a killed one in place.
    """
    binary = shutil.which("redis-server") or shutil.which("valkey-server")
    if binary is None:
        reason = "no redis-server or valkey-server on PATH (apt-get install redis-server)"
        if REQUIRE_REDIS:
            pytest.fail(f"KVPOOL_REQUIRE_REDIS is set but there is {reason}")
        pytest.skip(reason)
    port = _free_port() if port is None else port
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = RedisServer(proc, "127.0.0.1", port)
    wait_until(lambda: server.ping() or proc.poll() is not None, "redis-server to start")
    if proc.poll() is not None:
        pytest.fail(f"redis-server exited with status {proc.returncode} at start")
    return server


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server on loopback, stopped after the session."""
    server = start_redis_server(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server for one test (which may kill or pause it)."""
    server = start_redis_server(tmp_path)
    try:
        yield server
    finally:
        server.stop()


# -- Redis Cluster and Mooncake (tests/remote's servers) -----------------


@pytest.fixture(scope="session")
def redis_cluster():
    """A real three-master Redis Cluster for the session (tests/remote's ``start_cluster``)."""
    from remote.cluster_servers import start_cluster

    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def mooncake():
    """A real Mooncake master and storage node for the session (tests/remote's ``start_mooncake``).

    Clients made in this process bind to loopback (``MC_TCP_BIND_ADDRESS``).
    """
    from remote.mooncake_servers import start_mooncake

    with pytest.MonkeyPatch.context() as env:
        env.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        if "MC_LOG_LEVEL" not in os.environ:
            env.setenv("MC_LOG_LEVEL", "ERROR")
        deployment = start_mooncake()
        try:
            yield deployment
        finally:
            deployment.stop()
