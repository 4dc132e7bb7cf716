"""Each kind of store as the view tests drive it: calls, and its raw entries behind its back.

A :class:`Target` wraps one store, blocking or asyncio, so a test calls
either the same way (:meth:`Target.call`), and reads or overwrites the raw
bytes of an entry without the store (:meth:`Target.read_raw`,
:meth:`Target.write_raw`): a file in the store's directory, a Redis value,
a Mooncake object.  :func:`make_target` builds one per kind on the
servers of :mod:`.conftest` (a Redis kind skips or fails as those do).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvpool.remote import AsyncFileStore, AsyncRedisStore, FileStore, RedisStore

#: The kinds of store: blocking ones, then the asyncio ones.
KINDS = [
    "file",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("cluster", marks=pytest.mark.redis),
    pytest.param("mooncake", marks=pytest.mark.mooncake),
    "async-file",
    "async-file-threads",
    pytest.param("async-redis", marks=pytest.mark.redis),
    pytest.param("async-cluster", marks=pytest.mark.redis),
    pytest.param("async-mooncake", marks=pytest.mark.mooncake),
]

#: Mooncake stores that keep an object's bytes alone (no header: no layout to
#: read back, no CRC); their read forms differ, so they are not in KINDS.
HEADERLESS_KINDS = [
    pytest.param("mooncake-headerless", marks=pytest.mark.mooncake),
    pytest.param("async-mooncake-headerless", marks=pytest.mark.mooncake),
]


@dataclass
class Target:
    """One store under test.

    Attributes:
        kind: its kind (one of :data:`KINDS`).
        store: the store.
        read_raw: ``key -> bytes`` of the stored entry, read without the store.
        write_raw: ``(key, bytes)``: replace the entry's bytes behind the store's back.
        loop: the event loop an asyncio store runs on (None: a blocking store).
    """

    kind: str
    store: Any
    read_raw: Callable[[str], bytes]
    write_raw: Callable[[str, bytes], None]
    loop: asyncio.AbstractEventLoop | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)

    def call(self, method: str, *args: Any) -> Any:
        """``store.method(*args)``, awaited on the target's loop for an asyncio store."""
        result = getattr(self.store, method)(*args)
        if self.loop is not None:
            return self.loop.run_until_complete(result)
        return result

    def close(self) -> None:
        """Close the store (and the loop and clients the target made)."""
        if self.loop is not None:
            self.loop.run_until_complete(self.store.aclose())
        else:
            self.store.close()
        for close in self.closers:
            close()
        if self.loop is not None:
            self.loop.close()


def _file_target(kind: str, directory: Path) -> Target:
    loop = None
    if kind == "file":
        store: Any = FileStore(directory, checksum=True)
        blocking = store
    else:
        loop = asyncio.new_event_loop()
        threads = 2 if kind == "async-file-threads" else 0
        store = AsyncFileStore(directory, checksum=True, threads=threads)
        blocking = store.store

    def read_raw(key: str) -> bytes:
        return Path(blocking.path(key)).read_bytes()

    def write_raw(key: str, data: bytes) -> None:
        Path(blocking.path(key)).write_bytes(data)

    return Target(kind, store, read_raw, write_raw, loop)


def _redis_target(kind: str, url: str) -> Target:
    import redis

    prefix = f"v-{uuid.uuid4().hex[:12]}:"
    raw = redis.Redis.from_url(url)
    loop = None
    if kind == "redis":
        store: Any = RedisStore(url, prefix=prefix, checksum=True)
    else:
        loop = asyncio.new_event_loop()
        store = AsyncRedisStore(url, prefix=prefix, checksum=True)
    target = Target(
        kind,
        store,
        lambda key: bytes(raw.get(prefix + key)),
        lambda key, data: raw.set(prefix + key, data),
        loop,
    )
    target.closers.append(raw.close)
    return target


def _cluster_target(kind: str, ports: list[int], url: str) -> Target:
    import redis
    from redis.cluster import ClusterNode

    from kvpool.remote.cluster.store import RedisClusterStore

    prefix = f"v-{uuid.uuid4().hex[:12]}:"
    raw = redis.cluster.RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", ports[0])])
    loop = None
    if kind == "cluster":
        store: Any = RedisClusterStore(url, prefix=prefix, checksum=True)
    else:
        from kvpool.remote import AsyncRedisClusterStore

        loop = asyncio.new_event_loop()
        store = AsyncRedisClusterStore(url, prefix=prefix, checksum=True)
    target = Target(
        kind,
        store,
        lambda key: bytes(raw.get(prefix + key)),
        lambda key, data: raw.set(prefix + key, data),
        loop,
    )
    target.closers.append(raw.close)
    return target


def _mooncake_target(kind: str, client: Any) -> Target:
    from kvpool.remote.mooncake.store import MooncakeStore

    prefix = f"v-{uuid.uuid4().hex[:12]}:"
    # A headerless store refuses a checksum (there is no header to hold it).
    options = {"headerless": True} if kind.endswith("-headerless") else {"checksum": True}
    loop = None
    if not kind.startswith("async"):
        store: Any = MooncakeStore(client=client, prefix=prefix, **options)
        blocking = store
    else:
        from kvpool.remote import AsyncMooncakeStore

        loop = asyncio.new_event_loop()
        store = AsyncMooncakeStore(client=client, prefix=prefix, **options)
        blocking = store.store

    def read_raw(key: str) -> bytes:
        mkey = blocking.object_key(key)
        size = client.get_size(mkey)
        raw = np.zeros(size, dtype=np.uint8)
        assert client.get_into(mkey, raw.ctypes.data, size) == size
        return raw.tobytes()

    def write_raw(key: str, data: bytes) -> None:
        assert client.upsert_parts(blocking.object_key(key), data) == 0

    return Target(kind, store, read_raw, write_raw, loop)


def make_target(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> Iterator[Target]:
    """A target of ``kind`` on the test servers, closed after the test."""
    if kind in ("file", "async-file", "async-file-threads"):
        target = _file_target(kind, tmp_path / "store")
    elif kind in ("redis", "async-redis"):
        target = _redis_target(kind, request.getfixturevalue("redis_server").url)
    elif kind in ("cluster", "async-cluster"):
        cluster = request.getfixturevalue("redis_cluster")
        target = _cluster_target(kind, cluster.ports, cluster.url)
    elif "mooncake" in kind:
        target = _mooncake_target(kind, request.getfixturevalue("mooncake_client"))
    else:
        raise ValueError(f"unknown kind {kind!r}")
    try:
        yield target
    finally:
        target.close()
