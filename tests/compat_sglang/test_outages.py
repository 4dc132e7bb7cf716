"""An outage costs SGLang a bounded wait and one typed warning; close() returns within 2 s."""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid

import pytest

from .conftest import RedisServer, mha_pool, storage_config
from .test_backend import PAGE, _fill, _keys

LOGGER = "kvpool.integrations.sglang"


def test_a_dead_server_gives_misses_and_one_warning_then_recovers(backends, caplog) -> None:
    server = RedisServer()
    port = server.port
    pool = mha_pool("page_first")
    config = storage_config(server.url, model=uuid.uuid4().hex, connect_timeout=1.0)
    backend = backends(config, pool)
    src, _ = _fill(pool, 2, seed=9)
    keys = _keys(2)
    assert backend.batch_set_v1(keys, src) == [True, True]
    server.stop()
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    dst = pool.alloc(2 * PAGE)
    for _ in range(3):  # each call returns its miss value; no exception reaches SGLang
        assert backend.batch_exists(keys) == 0
        assert backend.batch_get_v1(keys, dst) == [False, False]
        assert backend.batch_set_v1(keys, src) == [False, False]
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "StoreConnectionError" in warnings[0].getMessage()
    assert backend.report.outages == 1
    again = RedisServer(port)  # the same address, empty
    try:
        assert backend.batch_set_v1(keys, src) == [True, True]
        assert backend.batch_exists(keys) == 2
        assert any("answers again" in r.getMessage() for r in caplog.records if r.name == LOGGER)
    finally:
        again.stop()


def test_a_silent_server_costs_at_most_call_timeout(backends, caplog) -> None:
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        pool = mha_pool("page_first")
        backend = backends(storage_config(url, call_timeout=0.5, timeout=30.0), pool)
        started = time.monotonic()
        assert backend.batch_exists(_keys(2)) == 0
        assert time.monotonic() - started < 5  # liveness: bounded by call_timeout, not 30 s
        records = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
        assert records and "StoreTimeoutError" in records[0].getMessage()


def test_close_returns_within_two_seconds_with_calls_in_flight(backends) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        pool = mha_pool("page_first")
        backend = backends(storage_config(url, call_timeout=60.0, timeout=60.0), pool)
        results: list[object] = []
        callers = [
            threading.Thread(target=lambda: results.append(backend.batch_exists(_keys(3))))
            for _ in range(3)
        ]
        for t in callers:
            t.start()
        deadline = time.monotonic() + 10
        while len(backend._calls._calls) < 3:  # all three are waiting on the server
            assert time.monotonic() < deadline, "the calls never started"
            time.sleep(0.01)
        started = time.monotonic()
        backend.close()
        assert time.monotonic() - started < 2.0
        for t in callers:
            t.join(5)
            assert not t.is_alive()
        assert results == [0, 0, 0]
        assert backend.batch_exists(_keys(1)) == 0  # after close: a miss, no exception
        backend.close()  # idempotent


@pytest.mark.parametrize("layout", ["page_first"])
def test_misuse_of_the_pages_is_a_false_not_an_exception(tmp_path, backends, layout) -> None:
    pool = mha_pool(layout)
    backend = backends(storage_config(f"file://{tmp_path}"), pool)
    src, _ = _fill(pool, 2, seed=4)
    assert backend.batch_set_v1(_keys(3), src) == [False, False, False]  # 3 keys, 2 pages
