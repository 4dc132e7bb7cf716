"""A refused password is said to be refused, and how to fix it, by every Redis store.

Against a real ``redis-server --requirepass`` on loopback: a wrong
password, a wrong user name, no password at all, and a password given
to a server that has none must each fail with
:class:`~kvpool.errors.StoreConnectionError` saying the server refused
the connection's credentials and naming the fix (the user name and
password in the URL) - not "connection failed or lost" - and never
showing a password, right or wrong.  RedisStore, AsyncRedisStore,
RedisClusterStore and AsyncRedisClusterStore (a cluster store's first
node refuses the handshake before it is asked for the slot map).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kvpool.errors import StoreConnectionError
from kvpool.remote import AsyncRedisClusterStore, AsyncRedisStore, RedisClusterStore, RedisStore

from .conftest import RedisServer, need_redis, start_redis

pytestmark = pytest.mark.redis

SECRET = "s3cret-Auth-Passw0rd"
WRONG = "wr0ng-Auth-Passw0rd"
FIX = "check the user name and password in the URL"


@pytest.fixture(scope="module")
def locked_server() -> Iterator[RedisServer]:
    """A redis-server that asks for ``SECRET`` (the default user's password)."""
    server = start_redis(need_redis(), "--requirepass", SECRET)
    yield server
    server.stop()


def _refusal(make: Callable[[], Any]) -> StoreConnectionError:
    with pytest.raises(StoreConnectionError) as info:
        make()
    error = info.value
    text = f"{error} {error!r}"
    assert SECRET not in text and WRONG not in text, text
    assert "refused the connection's credentials" in str(error), str(error)
    assert FIX in str(error), str(error)
    assert "failed or lost" not in str(error), str(error)
    return error


def _urls(port: int, scheme: str = "redis") -> dict[str, str]:
    tail = "/0" if scheme == "redis" else ""
    return {
        "wrong password": f"{scheme}://:{WRONG}@127.0.0.1:{port}{tail}",
        "wrong user": f"{scheme}://nobody:{SECRET}@127.0.0.1:{port}{tail}",
        "no password": f"{scheme}://127.0.0.1:{port}{tail}",
    }


@pytest.mark.parametrize("case", ["wrong password", "wrong user", "no password"])
def test_blocking_store(locked_server: RedisServer, case: str) -> None:
    url = _urls(locked_server.port)[case]
    error = _refusal(lambda: RedisStore(url, timeout=5.0))
    assert f"127.0.0.1:{locked_server.port}" in str(error)
    store = RedisStore(url, timeout=5.0, ping=False)  # on first use, as well
    _refusal(lambda: store.exists("k"))
    store.close()


@pytest.mark.parametrize("case", ["wrong password", "wrong user", "no password"])
def test_async_store(locked_server: RedisServer, case: str) -> None:
    url = _urls(locked_server.port)[case]

    async def scenario() -> None:
        store = AsyncRedisStore(url, timeout=5.0)
        try:
            await store.ping()
        finally:
            await store.aclose()

    _refusal(lambda: asyncio.run(scenario()))


@pytest.mark.parametrize("case", ["wrong password", "no password"])
def test_cluster_stores(locked_server: RedisServer, case: str) -> None:
    url = _urls(locked_server.port, "redis-cluster")[case]
    _refusal(lambda: RedisClusterStore(url, timeout=5.0))

    async def scenario() -> None:
        store = AsyncRedisClusterStore(url, timeout=5.0)
        try:
            await store.ping()
        finally:
            await store.aclose()

    _refusal(lambda: asyncio.run(scenario()))


def test_password_for_a_server_without_one(redis_server: RedisServer) -> None:
    url = f"redis://:{WRONG}@127.0.0.1:{redis_server.port}/0"
    _refusal(lambda: RedisStore(url, timeout=5.0))


def test_right_password_still_works(locked_server: RedisServer) -> None:
    with RedisStore(f"redis://:{SECRET}@127.0.0.1:{locked_server.port}/0", prefix="auth:") as s:
        assert not s.exists("k")
    with RedisStore(f"redis://default:{SECRET}@127.0.0.1:{locked_server.port}/0") as s:
        assert not s.exists("k")
