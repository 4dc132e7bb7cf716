"""An outage costs SGLang a bounded wait and one typed warning; close() returns within 2 s.

Each call runs the blocking store in SGLang's thread, bounded by the
store's ``timeout``, and returns only once the store is done with SGLang's
pages.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid

import pytest
import torch

from .conftest import RedisServer, mha_pool, storage_config
from .test_backend import PAGE, _fill, _keys, _pages

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


def test_a_silent_server_costs_at_most_the_store_timeout(backends, caplog) -> None:
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        pool = mha_pool("page_first")
        backend = backends(storage_config(url, timeout=0.5), pool)
        started = time.monotonic()
        assert backend.batch_exists(_keys(2)) == 0
        assert backend.batch_set_v1(_keys(2), pool.alloc(2 * PAGE)) == [False, False]
        assert time.monotonic() - started < 3  # two calls, each bounded by timeout
        records = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
        assert len(records) == 1 and "StoreTimeoutError" in records[0].getMessage()


def test_close_returns_within_two_seconds_with_calls_in_flight(backends) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        pool = mha_pool("page_first")
        backend = backends(storage_config(url, timeout=4.0), pool)
        results: list[object] = []
        callers = [
            threading.Thread(target=lambda: results.append(backend.batch_exists(_keys(3))))
            for _ in range(3)
        ]
        for t in callers:
            t.start()
        deadline = time.monotonic() + 10
        while backend._calls.running < 3:  # all three are waiting on the server
            assert time.monotonic() < deadline, "the calls never started"
            time.sleep(0.01)
        started = time.monotonic()
        backend.close()
        assert time.monotonic() - started < 2.0
        assert backend.batch_exists(_keys(1)) == 0  # after close: a miss, no exception
        assert not backend.store.closed  # never closed under the calls still running
        for t in callers:  # each ends by its own deadline, with its miss value
            t.join(10)
            assert not t.is_alive()
        assert results == [0, 0, 0]
        deadline = time.monotonic() + 5
        while not backend.store.closed:  # the last call out closed it
            assert time.monotonic() < deadline
            time.sleep(0.01)
        backend.close()  # idempotent


@pytest.mark.parametrize("layout", ["page_first"])
def test_misuse_of_the_pages_is_a_false_not_an_exception(tmp_path, backends, layout) -> None:
    pool = mha_pool(layout)
    backend = backends(storage_config(f"file://{tmp_path}"), pool)
    src, _ = _fill(pool, 2, seed=4)
    assert backend.batch_set_v1(_keys(3), src) == [False, False, False]  # 3 keys, 2 pages


def test_a_set_returns_only_once_the_store_stopped_reading_the_pages(tmp_path, backends) -> None:
    # A file store's write is held: batch_set_v1 must not hand SGLang its
    # pages back while the write still reads them.
    pool = mha_pool("page_first")
    backend = backends(storage_config(f"file://{tmp_path}"), pool)
    src, wrote = _fill(pool, 2, seed=21)
    keys = _keys(2)
    real = backend.store.batched_put
    entered, gate, left = threading.Event(), threading.Event(), threading.Event()

    def held(*args: object) -> object:
        entered.set()
        gate.wait(10)
        try:
            return real(*args)
        finally:
            left.set()

    backend.store.batched_put = held
    opener = threading.Timer(0.8, gate.set)
    opener.start()
    started = time.monotonic()
    try:
        assert backend.batch_set_v1(keys, src) == [True, True]
        returned_after_the_write = left.is_set()
        took = time.monotonic() - started
        flat = pool.kv_buffer.view(-1).view(torch.uint8)
        flat.fill_(0x5A)  # SGLang reuses the pages as soon as the call returns
    finally:
        gate.set()
        opener.join()
    assert entered.is_set()
    backend.store.batched_put = real
    dst = pool.alloc(2 * PAGE)
    assert backend.batch_get_v1(keys, dst) == [True, True]
    for before, after in zip(wrote, _pages(pool, dst), strict=True):
        assert torch.equal(before, after)  # the whole original pages, not the reused bytes
    assert returned_after_the_write and 0.7 < took < 5
