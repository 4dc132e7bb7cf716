"""The rest of LMCache 0.5.6's RemoteConnector surface, called as LMCache's own code calls it.

The round trip (``test_remote_plugin.py``) covers ``batched_put``, ``exists``,
``get``, ``batched_get`` and ``remove_sync``.  Here, on LMCache's real
StorageManager with the README's plugin config and a real redis-server (a
directory where the store kind matters), the other entry points LMCache
0.5.6 uses, each through the LMCache code that calls it:

* ``RemoteBackend.batched_contains`` -> ``batched_contains`` (from the
  caller's thread), ``RemoteBackend.batched_async_contains`` ->
  ``batched_async_contains`` and ``RemoteBackend.batched_get_non_blocking``
  -> ``batched_get_non_blocking`` (on LMCache's loop, as its
  ``async_lookup_and_prefetch`` runs them): the longest stored prefix;
* ``RemoteBackend.contains`` with ``use_exists_sync`` -> ``exists_sync``;
* LMCache's ``RemoteBackendHealthCheck`` -> ``support_ping`` / ``ping``,
  with the server up and killed (LMCache's error codes);
* ``list`` (a documented refusal) and the ``support_*`` flags;
* a blocking form called on the loop's own thread is refused, typed;
* a put held by the server leaves the loop free: a get is served meanwhile;
* a call of no keys keeps nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import plugin_cases as cases
import pytest

from kvpool.errors import FeatureUnavailableError, InvalidArgumentError


@pytest.fixture
def plugin_log() -> Iterator[cases.Collect]:
    """Warnings and errors of the plugin's logger."""
    with cases.collecting(cases.PLUGIN_LOGGER, level=logging.WARNING) as handler:
        yield handler


def open_manager(url: str, folder: Path, *extra: str) -> Any:
    """LMCache's StorageManager on the README's config for ``url``."""
    return cases.make_manager(cases.load_config(cases.config_text(url, *extra), folder))


def on_loop(manager: Any, coro: Any) -> Any:
    """Run ``coro`` on LMCache's storage loop, as its StorageManager does; wait for it."""
    return asyncio.run_coroutine_threadsafe(coro, manager.loop).result(cases.LIVENESS)


def test_prefix_lookups_and_the_non_blocking_get(redis_server, tmp_path, lmc, plugin_log):
    manager = open_manager(redis_server.url + "/0", tmp_path)
    try:
        backend = manager.storage_backends[cases.BACKEND]
        allocator = manager.allocator_backend.memory_allocator
        written = cases.write_chunks(manager, 4, None, seed=80)
        keys = written["keys"]
        cases.wait_stored(backend, keys)
        gap = cases.make_keys(1)[0]
        asked = [*keys[:2], gap, *keys[2:]]  # two stored, a miss, two stored
        assert backend.batched_contains(asked) == 2
        assert backend.batched_contains(keys) == 4
        assert backend.batched_contains([gap, *keys]) == 0
        assert on_loop(manager, backend.batched_async_contains("lookup", asked)) == 2
        assert on_loop(manager, backend.batched_async_contains("lookup", keys, True)) == 4
        before = allocator.stats().active_objects
        got = on_loop(manager, backend.batched_get_non_blocking("lookup", asked))
        # The prefix before the miss; the chunks read after it were freed.
        assert [cases.describe(o)["digest"] for o in got] == written["digests"][:2]
        assert allocator.stats().active_objects == before
        assert on_loop(manager, backend.batched_get_non_blocking("lookup", [gap])) == []
        counts = backend.connection.getWrappedConnector().counters.snapshot()
        assert counts["batched_exists"].entries == 5 + 4 + 5 + 4 + 5
    finally:
        manager.close()
    assert not plugin_log.records, plugin_log.messages()


def test_contains_through_exists_sync(redis_server, tmp_path, lmc, plugin_log):
    # LMCache's RemoteBackend.contains calls exists_sync when use_exists_sync is set.
    manager = open_manager(redis_server.url + "/0", tmp_path, "use_exists_sync: true")
    try:
        backend = manager.storage_backends[cases.BACKEND]
        assert backend.config.extra_config["use_exists_sync"] is True
        written = cases.write_chunks(manager, 2, None, seed=90)
        cases.wait_stored(backend, written["keys"])
        assert backend.contains(cases.make_keys(1)[0]) is False
        connector = backend.connection.getWrappedConnector()
        assert connector.counters.snapshot()["exists"].entries >= 3
    finally:
        manager.close()
    assert not plugin_log.records, plugin_log.messages()


def test_a_blocking_form_on_the_loop_thread_is_refused(redis_server, tmp_path, lmc):
    manager = open_manager(redis_server.url + "/0", tmp_path)
    try:
        connector = manager.storage_backends[cases.BACKEND].connection.getWrappedConnector()
        key = cases.make_keys(1)[0]

        async def blocking_on_the_loop() -> None:
            connector.exists_sync(key)

        with pytest.raises(InvalidArgumentError, match="await the coroutine instead"):
            on_loop(manager, blocking_on_the_loop())
        assert connector.exists_sync(key) is False  # from another thread: fine
    finally:
        manager.close()


def test_ping_through_lmcaches_health_check(own_redis_server, tmp_path, lmc, plugin_log):
    from lmcache.v1.health_monitor.checks.remote_backend_check import (
        RemoteBackendHealthCheck,
    )

    manager = open_manager(
        own_redis_server.url + "/0", tmp_path, "remote_storage_plugin.kvpool.timeout: 2"
    )
    try:
        backend = manager.storage_backends[cases.BACKEND]
        check = RemoteBackendHealthCheck(backend)
        assert backend.connection.support_ping() is True
        assert check.check() is True
        assert on_loop(manager, backend.connection.ping()) == 0
        own_redis_server.proc.kill()
        own_redis_server.proc.wait(10)
        assert on_loop(manager, backend.connection.ping()) == -2  # LMCache's generic failure
        assert check.check() is False
        warnings = plugin_log.messages()
        assert len(warnings) == 1 and "StoreConnectionError" in warnings[0], warnings
    finally:
        manager.close()


def test_list_is_refused_and_the_flags_are_lmcaches(redis_server, tmp_path, lmc):
    for url, pings in ((redis_server.url + "/0", True), (f"file://{tmp_path}/store", False)):
        manager = open_manager(url, tmp_path)
        try:
            connection = manager.storage_backends[cases.BACKEND].connection
            flags = {
                name: getattr(connection, name)()
                for name in (
                    "support_batched_put",
                    "support_batched_get",
                    "support_batched_async_contains",
                    "support_batched_get_non_blocking",
                    "support_batched_contains",
                    "support_ping",
                )
            }
            assert flags == {**dict.fromkeys(flags, True), "support_ping": pings}, url
            with pytest.raises(FeatureUnavailableError, match="cannot list keys"):
                on_loop(manager, connection.list())
        finally:
            manager.close()


def test_an_empty_call_leaves_nothing_behind(redis_server, tmp_path, lmc, deadline):
    # A call of no keys answers at once and keeps no reference to the task that made it.
    import gc
    import weakref

    manager = open_manager(redis_server.url + "/0", tmp_path)
    try:
        backend = manager.storage_backends[cases.BACKEND]

        async def empty_calls() -> tuple[Any, list[Any]]:
            task = asyncio.current_task()
            assert task is not None
            answers = [
                await backend.batched_async_contains("lookup", []),
                await backend.batched_get_non_blocking("lookup", []),
                await backend.connection.batched_get([]),
            ]
            return weakref.ref(task), answers

        ref, answers = on_loop(manager, empty_calls())
        assert answers == [0, [], []]

        def task_freed() -> bool:
            gc.collect()
            return ref() is None

        deadline(task_freed, "the empty calls' task to be freed")
    finally:
        manager.close()


def test_a_put_held_by_the_server_does_not_hold_the_loop(own_redis_server, tmp_path, lmc):
    # LMCache runs every connector call on one event loop: while a put waits for the
    # server, a get of another key is served (a blocking store would serve it after).
    from lmcache.v1.memory_management import MemoryFormat

    manager = open_manager(own_redis_server.url + "/0", tmp_path)
    try:
        backend = manager.storage_backends[cases.BACKEND]
        written = cases.write_chunks(manager, 1, None, seed=100)
        cases.wait_stored(backend, written["keys"])
        held = manager.allocate(cases.CHUNK_SHAPE, cases.DTYPE, MemoryFormat.KV_2LTD)
        cases.fill(held, 101)
        assert own_redis_server.command("CLIENT", "PAUSE", "5000", "WRITE") == b"+OK"
        put = backend.submit_put_task(cases.make_keys(1)[0], held)
        held.ref_count_down()  # the backend holds its own reference
        got = backend.get_blocking(written["keys"][0])
        assert not put.done()  # the put is still at the server...
        assert cases.describe(got)["digest"] == written["digests"][0]  # ...and the get was served
        assert own_redis_server.command("CLIENT", "UNPAUSE") == b"+OK"
        put.result(cases.LIVENESS)
    finally:
        own_redis_server.command("CLIENT", "UNPAUSE")
        manager.close()
