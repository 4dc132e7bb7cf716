"""The LMCache remote plugin when its store goes away: a killed server, a close with puts in flight.

LMCache's real StorageManager on kvpool memory (the compat conftest ran
``install()``) with the README's plugin config, on each kind of store:

* a killed server - a private redis-server, all three masters of a
  private Redis Cluster, the storage node of a private Mooncake master +
  storage node: one WARNING naming the typed error
  (``StoreConnectionError``), LMCache keeps serving from its CPU cache,
  nothing raises through LMCache's engine; Redis and the cluster are
  started again on the same ports and the plugin stores again (the test
  Mooncake deployment cannot start a node again, so that kind stops at the
  outage).  A directory has no server: its outage is the directory
  removed under the store (puts fail as ``RemoteStoreError`` naming the
  ``FileNotFoundError``, reads miss), and made again to end it;
* ``close()`` with 32 puts in flight returns within 2 s (a liveness
  bound), logs them once as ``PoolClosedError``, and once the held puts
  end no connection or thread is left and the store is closed.  Redis and
  the cluster hold the puts at the servers (``CLIENT PAUSE WRITE``); a
  directory and Mooncake have no way to pause a write, so their blocking
  store's ``put``/``batched_put`` wait at a gate in the store's threads
  before calling the real store.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import plugin_cases as cases
import pytest


@pytest.fixture
def plugin_log() -> Iterator[cases.Collect]:
    """Every record of the plugin's logger, INFO included (the compat suite logs WARNING)."""
    logger = logging.getLogger(cases.PLUGIN_LOGGER)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with cases.collecting(cases.PLUGIN_LOGGER) as handler:
            yield handler
    finally:
        logger.setLevel(level)


def redis_clients(ports: list[int]) -> list[Any]:
    import redis

    return [redis.Redis(host="127.0.0.1", port=p) for p in ports]


def close_all(clients: list[Any]) -> None:
    for c in clients:
        c.close()


def connected(clients: list[Any]) -> int:
    """Clients connected to the servers, not counting the ones asking."""
    return sum(int(c.info("clients")["connected_clients"]) - 1 for c in clients)


# -- a killed server ----------------------------------------------------


@dataclass
class Killable:
    """A store URL whose server a test can kill (and start again where ``restart`` is set)."""

    url: str
    extra: list[str]
    kill: Callable[[], None]
    restart: Callable[[], None] | None = None
    stop: Callable[[], None] = lambda: None
    #: the typed error the outage's one WARNING names
    error: str = "StoreConnectionError"


@pytest.fixture(params=["redis", "cluster", "mooncake", "file"])
def killable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Killable]:
    """A private server (or directory) of each kind, for one test to kill."""
    kind = request.param
    timeout = "remote_storage_plugin.kvpool.timeout: 2"
    if kind == "redis":
        from conftest import start_redis_server

        server = request.getfixturevalue("own_redis_server")

        def kill() -> None:
            server.proc.kill()
            server.proc.wait(10)

        def restart() -> None:
            server.proc = start_redis_server(tmp_path, server.port).proc

        yield Killable(server.url + "/0", [timeout], kill, restart)
    elif kind == "cluster":
        from remote.cluster_servers import start_cluster

        cluster = start_cluster()

        def kill_all() -> None:
            for port in cluster.ports:
                cluster.kill(port)

        def restart_all() -> None:
            for port in cluster.ports:
                cluster.start_node(port)
            cluster.wait_ok()

        yield Killable(cluster.url, [timeout], kill_all, restart_all, cluster.stop)
        cluster.stop()
    elif kind == "mooncake":
        from remote.mooncake_servers import start_mooncake

        with pytest.MonkeyPatch.context() as env:
            env.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
            env.setenv("MC_LOG_LEVEL", "ERROR")
            deployment = start_mooncake("64 MB")
            try:
                yield Killable(deployment.url, [timeout], lambda: deployment.kill("node"))
            finally:
                deployment.stop()
    else:
        directory = tmp_path / "store"
        yield Killable(
            f"file://{directory}",
            [],
            lambda: shutil.rmtree(directory),
            directory.mkdir,
            error="RemoteStoreError",  # naming the FileNotFoundError of the put
        )


def test_a_killed_server_is_one_warning_and_lmcache_keeps_serving(
    killable: Killable, tmp_path: Path, lmc: Any, plugin_log: cases.Collect
) -> None:
    opened = cases.Opened(killable.url, tmp_path, *killable.extra)
    try:
        first = cases.write_chunks(opened.manager, 3, None, seed=30)
        cases.wait_stored(opened.backend, first["keys"])
        got = opened.backend.get_blocking(first["keys"][0])  # a hit while the server lives
        assert got is not None and cases.digest(got.byte_array) == first["digests"][0]
        got.ref_count_down()
        killable.kill()
        # Puts, lookups and gets go on: misses for the remote, hits from the CPU cache.
        second = cases.write_chunks(opened.manager, 3, None, seed=40)
        assert opened.backend.get_blocking(first["keys"][0]) is None
        assert opened.backend.contains(second["keys"][0]) is False
        assert opened.backend.batched_get_blocking(second["keys"]) == [None] * 3
        for key, digest in zip(second["keys"], second["digests"], strict=True):
            obj = opened.manager.get(key)  # LocalCPUBackend still has it
            assert obj is not None and cases.digest(obj.byte_array) == digest
            obj.ref_count_down()
        warnings = plugin_log.at(logging.WARNING)
        assert len(warnings) == 1, warnings
        assert f"({killable.error}: " in warnings[0], warnings
        assert opened.connector.report.outages == 1
        if killable.restart is not None:
            # The server comes back (empty, on the same ports): the plugin stores again.
            killable.restart()
            third = cases.write_chunks(opened.manager, 2, None, seed=50)
            cases.wait_stored(opened.backend, third["keys"])
            assert any("answers again" in m for m in plugin_log.at(logging.INFO))
            assert len(plugin_log.at(logging.WARNING)) == 1
    finally:
        opened.close()


# -- close with puts in flight ------------------------------------------


class Gate:
    """A blocking store method that waits until :attr:`opened` is set, then runs for real."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.opened = threading.Event()
        self.entered = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.entered += 1
        self.opened.wait(30)
        return self.real(*args, **kwargs)


@dataclass
class Holding:
    """How one kind of store holds 32 puts in flight, lets them go, and shows it let go."""

    url: str
    extra: list[str] = field(default_factory=list)
    #: called with the opened plugin before the puts: start holding writes
    hold: Callable[[cases.Opened], None] = lambda opened: None
    #: True once the puts are held where the store writes
    reached: Callable[[], bool] = lambda: True
    #: let the held writes go (also in the test's cleanup: idempotent)
    release: Callable[[], None] = lambda: None
    #: True once nothing the store opened is left (connections, its blocking store)
    gone: Callable[[cases.Opened], bool] = lambda opened: True
    #: free what the holding itself opened
    stop: Callable[[], None] = lambda: None


def _paused(ports: list[int], url: str) -> Holding:
    """Puts held at redis-servers paused for writes; connections counted there."""
    clients = redis_clients(ports)
    before = connected(clients)

    def hold(opened: cases.Opened) -> None:
        for c in clients:
            assert c.execute_command("CLIENT", "PAUSE", "20000", "WRITE")

    def release() -> None:
        for c in clients:
            c.execute_command("CLIENT", "UNPAUSE")

    return Holding(
        url,
        hold=hold,
        reached=lambda: connected(clients) - before >= 32,
        release=release,
        gone=lambda opened: connected(clients) <= before,  # earlier tests' may end too
        stop=lambda: close_all(clients),
    )


def _gated(url: str, *extra: str) -> Holding:
    """Puts held at a gate in the store's threads, before the real blocking store's write."""
    gates: list[Gate] = []

    def hold(opened: cases.Opened) -> None:
        blocking = opened.connector.store.store  # the asyncio store's blocking store
        for name in ("put", "batched_put"):
            gate = Gate(getattr(blocking, name))
            setattr(blocking, name, gate)
            gates.append(gate)

    def release() -> None:
        for gate in gates:
            gate.opened.set()

    return Holding(
        url,
        list(extra),
        hold=hold,
        reached=lambda: sum(g.entered for g in gates) >= 2,
        release=release,
        gone=lambda opened: opened.connector.store.store.closed,
    )


@pytest.fixture(params=["redis", "cluster", "file", "mooncake"])
def holding(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Holding]:
    """Each kind of store, with its way of holding puts in flight."""
    kind = request.param
    if kind == "redis":
        server = request.getfixturevalue("own_redis_server")
        held = _paused([server.port], server.url + "/0")
    elif kind == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        held = _paused(cluster.ports, cluster.url)
    elif kind == "file":
        # Threads even if tmp_path is on tmpfs (where a store runs calls on the loop).
        held = _gated(f"file://{tmp_path}/store", "remote_storage_plugin.kvpool.threads: 4")
    else:
        held = _gated(request.getfixturevalue("mooncake").url)
    try:
        yield held
    finally:
        held.release()
        held.stop()


def test_close_with_32_puts_in_flight_is_bounded_and_leaves_nothing(
    holding: Holding, tmp_path: Path, lmc: Any, plugin_log: cases.Collect, deadline: Any
) -> None:
    threads_before = cases.kvpool_threads()
    opened = cases.Opened(holding.url, tmp_path, *holding.extra)
    closed = False
    try:
        objs = [opened.chunk(seed=60 + i)[0] for i in range(32)]
        keys = cases.make_keys(32)
        holding.hold(opened)
        for key, obj in zip(keys, objs, strict=True):
            opened.backend.submit_put_task(key, obj)  # 32 puts, each its own call
            obj.ref_count_down()
        deadline(holding.reached, "the puts to reach the store")
        started = time.monotonic()
        opened.backend.close()  # LMCache's RemoteBackend.close: the connector's close on its loop
        elapsed = time.monotonic() - started
        closed = True
        assert elapsed <= 2.0, f"close took {elapsed:.2f} s with 32 puts in flight"
        warnings = plugin_log.at(logging.WARNING)
        held = [m for m in warnings if "32 puts still in flight" in m]
        assert len(held) == 1 and "PoolClosedError" in held[0], warnings
        # The only other warning allowed: the store's close outlived the connector's bound.
        others = [m for m in warnings if m not in held]
        assert all("did not close cleanly (TimeoutError" in m for m in others), warnings
        assert opened.connector.unfinished_puts == 32
        holding.release()
        deadline(lambda: holding.gone(opened), "the store's connections or store to close")
        deadline(lambda: cases.kvpool_threads() == threads_before, "the store's threads to end")
    finally:
        holding.release()
        if not closed:
            opened.backend.close()
        opened.manager.close()
