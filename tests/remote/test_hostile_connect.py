"""Every call of the Redis stores ends within its timeout, connecting included.

Against the lying server of :mod:`.hostile_server`: a server that trickles
its answer to the connection's handshake (``AUTH``, ``SELECT``,
``CLIENT SETNAME``), to ``CLUSTER SLOTS`` or in place of a TLS hello, one
byte at a time; a server that accepts and never answers; one that closes
in the middle of a reply.  Each call must end within its ``timeout`` plus
:data:`MARGIN` (thread scheduling on a loaded machine) with the typed
error: :class:`~kvpool.errors.StoreTimeoutError` when the deadline passed,
:class:`~kvpool.errors.StoreConnectionError` (at once) when the server
closed.  RedisStore, AsyncRedisStore, RedisClusterStore and
AsyncRedisClusterStore (the hostile server answers ``CLUSTER SLOTS`` with
itself as the only master).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

import kvpool
from kvpool.errors import StoreConnectionError, StoreTimeoutError
from kvpool.remote import AsyncRedisClusterStore, AsyncRedisStore, RedisClusterStore, RedisStore

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, assert_clean, fill
from .hostile_server import Cut, HostileServer, Trickle, bounded

#: Slack on top of a call's timeout: scheduling, not the store's waiting.
MARGIN = 0.75

#: A handshake answer that would take 8 s: each byte well within any
#: per-receive timeout, the whole far past the call's.
SLOW_OK = Trickle(b"+" + b"O" * 40 + b"K\r\n", interval=0.2, max_seconds=8.0)

#: The URL that makes a store send each handshake command.
HANDSHAKES = {
    b"AUTH": "redis://:hostile-pw@127.0.0.1:{port}/0",
    b"SELECT": "redis://127.0.0.1:{port}/2",
    b"CLIENT": "redis://127.0.0.1:{port}/0?client_name=kvpool-test",
}


def _trickle(_args: list[bytes], _honest: bytes) -> Trickle:
    return Trickle(SLOW_OK.data, SLOW_OK.interval, SLOW_OK.max_seconds)


def _silent(_args: list[bytes], _honest: bytes) -> bytes:
    return b""  # accepted, never answered


def _timed(fn: Callable[[], Any], bound: float = 20.0) -> tuple[float, BaseException | None]:
    """Seconds ``fn()`` took (run under :func:`bounded`) and what it raised."""
    t0 = time.monotonic()
    try:
        bounded(fn, bound)
    except BaseException as exc:
        return time.monotonic() - t0, exc
    return time.monotonic() - t0, None


def _assert_timed_out(took: float, error: BaseException | None, timeout: float) -> None:
    assert isinstance(error, StoreTimeoutError), repr(error)
    assert took < timeout + MARGIN, f"the call took {took:.2f} s with timeout={timeout}"


def _calls(store: Any, pool: kvpool.TensorMemoryAllocator, src: Any) -> dict[str, Callable]:
    """One of each call of a blocking store (RedisStore or RedisClusterStore)."""
    return {
        "put": lambda: store.put("a", src),
        "batched_put": lambda: store.batched_put(["a", "b"], [src, src]),
        "get": lambda: store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT),
        "get_stored_layout": lambda: store.get("a", pool),
        "batched_get": lambda: store.batched_get(["a", "b"], pool, KV_SHAPE, KV_DTYPE, KV_FMT),
        "exists": lambda: store.exists("a"),
        "batched_exists": lambda: store.batched_exists(["a", "b"]),
        "delete": lambda: store.delete("a"),
        "batched_delete": lambda: store.batched_delete(["a", "b"]),
        "head": lambda: store.head("a"),
    }


def _async_calls(store: Any, pool: kvpool.TensorMemoryAllocator, src: Any) -> dict[str, Callable]:
    """One of each call of an asyncio store: ``name -> () -> awaitable``."""
    return {
        "ping": store.ping,
        "put": lambda: store.put("a", src),
        "batched_put": lambda: store.batched_put(["a", "b"], [src, src]),
        "get": lambda: store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT),
        "get_stored_layout": lambda: store.get("a", pool),
        "batched_get": lambda: store.batched_get(["a", "b"], pool, KV_SHAPE, KV_DTYPE, KV_FMT),
        "exists": lambda: store.exists("a"),
        "batched_exists": lambda: store.batched_exists(["a", "b"]),
        "delete": lambda: store.delete("a"),
        "batched_delete": lambda: store.batched_delete(["a", "b"]),
        "head": lambda: store.head("a"),
    }


async def _atimed(make: Callable[[], Any]) -> tuple[float, BaseException | None]:
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(make(), 20)  # a hang fails the test, not the run
    except BaseException as exc:
        return time.monotonic() - t0, exc
    return time.monotonic() - t0, None


# -- the handshake -------------------------------------------------------


@pytest.mark.parametrize("command", list(HANDSHAKES))
def test_trickled_handshake_bounds_the_constructor(hostile: HostileServer, command: bytes) -> None:
    hostile.rule(command, _trickle)
    url = HANDSHAKES[command].format(port=hostile.port)
    took, error = _timed(lambda: RedisStore(url, timeout=1.0))
    _assert_timed_out(took, error, 1.0)
    assert "1.0 s" in str(error)
    assert any(c[0].upper() == command for c in hostile.log)  # the handshake was under way


@pytest.mark.parametrize("call", ["put", "get", "batched_get", "exists"])
def test_trickled_handshake_bounds_a_call_that_reconnects(
    hostile: HostileServer, pool: kvpool.TensorMemoryAllocator, call: str
) -> None:
    store = RedisStore(HANDSHAKES[b"AUTH"].format(port=hostile.port), prefix="h:", timeout=1.0)
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 1)
    store.put("a", src)
    hostile.rule(b"AUTH", _trickle)
    hostile.drop_clients()  # the pooled connection is gone: the call must open one
    took, error = _timed(_calls(store, pool, src)[call])
    _assert_timed_out(took, error, 1.0)
    src.ref_count_down()
    assert_clean(pool)
    store.close()


def test_connect_timeout_bounds_connecting_alone(hostile: HostileServer) -> None:
    hostile.rule(b"AUTH", _trickle)
    url = HANDSHAKES[b"AUTH"].format(port=hostile.port)
    took, error = _timed(lambda: RedisStore(url, timeout=5.0, connect_timeout=0.5))
    _assert_timed_out(took, error, 0.5)


def test_trickled_tls_handshake_is_bounded(hostile: HostileServer) -> None:
    # A TLS record header announcing a 16 KiB server hello, then its bytes
    # one at a time: the client's handshake waits for the whole record.
    hostile.greeting = Trickle(b"\x16\x03\x03\x40\x00" + b"\x02" * 100, 0.2, 8.0)
    url = f"rediss://127.0.0.1:{hostile.port}/0?ssl_cert_reqs=none"
    took, error = _timed(lambda: RedisStore(url, timeout=1.0))
    _assert_timed_out(took, error, 1.0)


def test_async_store_trickled_handshake(
    hostile: HostileServer, pool: kvpool.TensorMemoryAllocator
) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 1)
    url = HANDSHAKES[b"AUTH"].format(port=hostile.port)

    async def scenario() -> None:
        store = AsyncRedisStore(url, prefix="h:", timeout=1.0)
        hostile.rule(b"AUTH", _trickle)
        _assert_timed_out(*await _atimed(store.ping), 1.0)
        del hostile.rules[b"AUTH"]
        await store.put("a", src)
        hostile.rule(b"AUTH", _trickle)
        for call in ("get", "put"):
            hostile.drop_clients()
            _assert_timed_out(*await _atimed(_async_calls(store, pool, src)[call]), 1.0)
        await store.aclose()

    bounded(lambda: asyncio.run(scenario()), 30)
    src.ref_count_down()
    assert_clean(pool)


def test_cluster_store_trickled_handshake_and_slot_map(
    hostile: HostileServer, pool: kvpool.TensorMemoryAllocator
) -> None:
    url = f"redis-cluster://:hostile-pw@127.0.0.1:{hostile.port}"
    for command in (b"AUTH", b"CLUSTER"):  # the node's handshake; the slot map's discovery
        hostile.rule(command, _trickle)
        took, error = _timed(lambda: RedisClusterStore(url, timeout=1.0))
        _assert_timed_out(took, error, 1.0)
        del hostile.rules[command]
    store = RedisClusterStore(url, prefix="h:", timeout=1.0)
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 1)
    store.put("a", src)
    hostile.rule(b"AUTH", _trickle)
    for call in ("get", "put"):
        hostile.drop_clients()
        took, error = _timed(_calls(store, pool, src)[call])
        _assert_timed_out(took, error, 1.0)
    src.ref_count_down()
    assert_clean(pool)
    store.close()

    async def scenario() -> None:
        hostile.rule(b"CLUSTER", _trickle)
        store = AsyncRedisClusterStore(url, prefix="h:", timeout=1.0)
        _assert_timed_out(*await _atimed(store.ping), 1.0)
        await store.aclose()

    bounded(lambda: asyncio.run(scenario()), 30)


def test_async_cluster_store_calls_that_reconnect_are_bounded_and_quiet(
    hostile: HostileServer, pool: kvpool.TensorMemoryAllocator
) -> None:
    """Each call that must open a connection ends by its timeout; what it gave up on is silent.

    The connection a timed-out call stopped waiting for fails a moment
    later (the server closes it): that error is nobody's, so nothing may
    reach the loop's exception handler ("Future exception was never
    retrieved", logged by asyncio at ERROR).
    """
    url = f"redis-cluster://:hostile-pw@127.0.0.1:{hostile.port}"
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 1)
    reported: list[dict[str, Any]] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))
        store = AsyncRedisClusterStore(url, prefix="h:", timeout=1.0)
        await store.put("a", src)
        hostile.rule(b"AUTH", _trickle)
        calls = _async_calls(store, pool, src)
        for name in ("get", "get_stored_layout", "put", "batched_get", "exists", "head"):
            hostile.drop_clients()  # the abandoned connection of the call before closes
            _assert_timed_out(*await _atimed(calls[name]), 1.0)
        del hostile.rules[b"AUTH"]
        hostile.drop_clients()
        await asyncio.sleep(0.2)  # the last abandoned connection's end reaches the loop
        await store.aclose()

    bounded(lambda: asyncio.run(scenario()), 60)
    import gc

    gc.collect()
    src.ref_count_down()
    assert_clean(pool)
    assert reported == [], [ctx.get("message") for ctx in reported]


# -- a server that never answers -------------------------------------------

#: The timeout of the stores that meet a silent server (every call waits it out).
SILENT_TIMEOUT = 0.2


@pytest.mark.parametrize("url", [HANDSHAKES[b"AUTH"], "redis://127.0.0.1:{port}/0"])
def test_silent_server_every_call_ends_within_timeout(
    hostile: HostileServer, pool: kvpool.TensorMemoryAllocator, url: str
) -> None:
    hostile.fallback = _silent
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    address = url.format(port=hostile.port)
    took, error = _timed(lambda: RedisStore(address, timeout=SILENT_TIMEOUT))
    _assert_timed_out(took, error, SILENT_TIMEOUT)
    store = RedisStore(address, timeout=SILENT_TIMEOUT, ping=False)
    for name, call in _calls(store, pool, src).items():
        took, error = _timed(call)
        assert isinstance(error, StoreTimeoutError), (name, error)
        assert took < SILENT_TIMEOUT + MARGIN, (name, took)
    store.close()

    async def scenario() -> None:
        store = AsyncRedisStore(address, timeout=SILENT_TIMEOUT)
        for name, make in _async_calls(store, pool, src).items():
            took, error = await _atimed(make)
            assert isinstance(error, StoreTimeoutError), (name, error)
            assert took < SILENT_TIMEOUT + MARGIN, (name, took)
        await store.aclose()

    bounded(lambda: asyncio.run(scenario()), 60)
    src.ref_count_down()
    assert_clean(pool)


def test_silent_cluster_node_every_call_ends_within_timeout(
    hostile: HostileServer, pool: kvpool.TensorMemoryAllocator
) -> None:
    url = f"redis-cluster://127.0.0.1:{hostile.port}"
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    hostile.fallback = _silent
    took, error = _timed(lambda: RedisClusterStore(url, timeout=SILENT_TIMEOUT))
    _assert_timed_out(took, error, SILENT_TIMEOUT)
    store = RedisClusterStore(url, timeout=SILENT_TIMEOUT, ping=False)
    for name, call in _calls(store, pool, src).items():
        took, error = _timed(call)
        assert isinstance(error, StoreTimeoutError), (name, error)
        assert took < SILENT_TIMEOUT + MARGIN, (name, took)
    store.close()
    # Now with the slot map known: the node answers it, then nothing else.
    hostile.fallback = None
    store = RedisClusterStore(url, timeout=SILENT_TIMEOUT)
    hostile.fallback = _silent
    hostile.drop_clients()
    for name, call in _calls(store, pool, src).items():
        took, error = _timed(call)
        assert isinstance(error, StoreTimeoutError), (name, error)
        assert took < SILENT_TIMEOUT + MARGIN, (name, took)
    store.close()
    src.ref_count_down()
    assert_clean(pool)


# -- a server that closes in the middle of a reply -------------------------


def _cut_half(_args: list[bytes], honest: bytes) -> Cut:
    return Cut(honest[: max(1, len(honest) // 2)])


#: The command whose reply is cut, per call.
_CUT = {
    "put": b"SET",
    "batched_put": b"SET",
    "get": b"GET",
    "get_stored_layout": b"GET",
    "batched_get": b"GET",
    "exists": b"EXISTS",
    "batched_exists": b"EXISTS",
    "delete": b"DEL",
    "batched_delete": b"DEL",
    "head": b"GETRANGE",
}


@pytest.mark.parametrize("kind", ["redis", "cluster"])
def test_server_closing_mid_reply_fails_at_once(
    hostile: HostileServer, pool: kvpool.TensorMemoryAllocator, kind: str, strict: None
) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 1)
    if kind == "redis":
        store: Any = RedisStore(HANDSHAKES[b"AUTH"].format(port=hostile.port), timeout=5.0)
    else:
        store = RedisClusterStore(f"redis-cluster://127.0.0.1:{hostile.port}", timeout=5.0)
    store.put("a", src)
    for name, call in _calls(store, pool, src).items():
        hostile.rules.clear()
        hostile.rule(_CUT[name], _cut_half)
        took, error = _timed(call)
        assert isinstance(error, StoreConnectionError), (name, error)
        assert took < 2.0, (name, took)  # not a wait for the 5 s timeout
        assert_clean_but_src(pool)
    hostile.rules.clear()
    if kind == "redis":  # the handshake of a new connection, cut
        hostile.rule(b"AUTH", lambda args, honest: Cut(b"+O"))
        hostile.drop_clients()
        took, error = _timed(lambda: store.exists("a"))
        assert isinstance(error, StoreConnectionError) and took < 2.0, (error, took)
    store.close()
    src.ref_count_down()
    assert_clean(pool)


@pytest.mark.parametrize("kind", ["async-redis", "async-cluster"])
def test_async_store_server_closing_mid_reply(
    hostile: HostileServer, pool: kvpool.TensorMemoryAllocator, kind: str, strict: None
) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 1)
    url = HANDSHAKES[b"AUTH"].format(port=hostile.port)

    async def scenario() -> None:
        if kind == "async-redis":
            store: Any = AsyncRedisStore(url, timeout=5.0)
        else:
            store = AsyncRedisClusterStore(url.replace("redis://", "redis-cluster://"), timeout=5.0)
        await store.put("a", src)
        calls = _async_calls(store, pool, src)
        for name, command in _CUT.items():
            hostile.rules.clear()
            hostile.rule(command, _cut_half)
            took, error = await _atimed(calls[name])
            assert isinstance(error, StoreConnectionError), (name, error)
            assert took < 2.0, (name, took)
            assert_clean_but_src(pool)
        hostile.rules.clear()
        hostile.rule(b"AUTH", lambda args, honest: Cut(b"+O"))
        hostile.drop_clients()
        took, error = await _atimed(calls["exists"])
        assert isinstance(error, StoreConnectionError) and took < 2.0, (error, took)
        await store.aclose()

    bounded(lambda: asyncio.run(scenario()), 60)
    src.ref_count_down()
    assert_clean(pool)


def assert_clean_but_src(pool: kvpool.TensorMemoryAllocator) -> None:
    """Only the test's source object is alive in ``pool``, and no view holds other bytes.

    No garbage collection first: the failed call's destination went back to
    the pool before the call returned, while its caller holds the error.
    """
    stats = pool.stats()
    assert pool.memcheck() and stats.active_objects == 1, stats
    assert stats.used_bytes == KV_SHAPE.numel() * KV_DTYPE.itemsize, stats
    assert stats.held_by_views_bytes == 0, stats
