"""The connection options kvpool's opener honours, against a real redis-server.

kvpool opens its Redis connections itself (:mod:`kvpool.remote.redis.opener`)
from the options the ``redis`` client reads in a URL or a client: a UNIX
socket with a database and a client name, an ACL user, a credential
provider.  Each is checked here on a server started for the test (the
``redis`` client itself checks where the entries went).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvpool
from kvpool.remote import AsyncRedisStore, RedisStore

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, RedisServer, fill, need_redis, start_redis

pytestmark = pytest.mark.redis

SECRET = "s3cret-Connect-Passw0rd"


@pytest.fixture
def unix_server(tmp_path: Path) -> Iterator[tuple[RedisServer, Path]]:
    """A redis-server that also listens on a UNIX socket; yields (server, socket path)."""
    path = tmp_path / "redis.sock"
    server = start_redis(need_redis(), "--unixsocket", str(path), "--unixsocketperm", "700")
    yield server, path
    server.stop()


def test_unix_socket_with_a_database_and_a_client_name(
    unix_server: tuple[RedisServer, Path], pool: kvpool.TensorMemoryAllocator
) -> None:
    import redis

    _server, path = unix_server
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, 1)
    url = f"unix://{path}?db=2&client_name=kvpool-unix"
    check = redis.Redis(unix_socket_path=str(path), db=2)
    with RedisStore(url, prefix="u:") as store:
        assert store.server == f"unix:{path}/2"
        store.put("k", src)
        got = store.get("k", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert got is not None and bytes(got.byte_array) == data
        got.ref_count_down()
        assert check.exists(b"u:k") == 1  # in db 2
        names = [c.get("name") for c in check.client_list()]
        assert "kvpool-unix" in names  # the store's pooled connection, named

    async def scenario() -> None:
        async with AsyncRedisStore(url, prefix="u:") as store:
            got = await store.get("k", pool)
            assert got is not None and bytes(got.byte_array) == data
            got.ref_count_down()

    asyncio.run(scenario())
    check.close()
    src.ref_count_down()


@pytest.fixture(scope="module")
def locked_server() -> Iterator[RedisServer]:
    """A redis-server whose default user's password is ``SECRET``, and an ACL user ``alice``."""
    import redis

    server = start_redis(need_redis(), "--requirepass", SECRET)
    admin = redis.Redis(port=server.port, password=SECRET)
    admin.acl_setuser("alice", enabled=True, passwords=[f"+{SECRET}-alice"], keys=["*"],
                      commands=["+@all"])  # fmt: skip
    admin.close()
    yield server
    server.stop()


def test_acl_user_and_credential_provider(
    locked_server: RedisServer, pool: kvpool.TensorMemoryAllocator
) -> None:
    import redis
    from redis.credentials import UsernamePasswordCredentialProvider

    port = locked_server.port
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 1)
    provider = UsernamePasswordCredentialProvider("alice", f"{SECRET}-alice")
    client = redis.Redis(port=port, credential_provider=provider)
    for given in (f"redis://alice:{SECRET}-alice@127.0.0.1:{port}/1", client):
        with RedisStore(given, prefix="acl:") as store:
            store.put("k", src)
            assert store.exists("k")
            assert store.delete("k")
    assert client.acl_whoami() == "alice"  # the given client still works
    client.close()
    src.ref_count_down()
