"""delete_prefix: every store removes the entries under a key prefix, and nothing else.

Each kind of store, blocking and asyncio, on real servers: the entries
whose key starts with the prefix go (more of them than one SCAN step or
one UNLINK takes), keys that merely contain it or start like it stay;
glob and regex characters in a prefix match only themselves; another
store prefix on the same server (another user) is never touched; an empty
prefix is refused; a keyspace too large to walk within the store's timeout
costs that timeout and says how far it got.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kvpool.errors import InvalidArgumentError, StoreTimeoutError
from kvpool.formats import MemoryFormat
from kvpool.pool.borrowed import BorrowedMemory

from .mooncake_servers import LEASE_MS
from .store_targets import HEADERLESS_KINDS, KINDS, Target, make_target

SIZE = 64
SHAPE, DTYPE, FMT = [torch.Size([SIZE])], [torch.uint8], MemoryFormat.UNDEFINED


@pytest.fixture(params=KINDS + HEADERLESS_KINDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    yield from make_target(request, request.param, tmp_path)


def _put(target: Target, keys: list[str]) -> None:
    """Store a small entry under each key (its bytes are the key's index)."""
    source = torch.arange(len(keys) * SIZE, dtype=torch.int64).to(torch.uint8)
    lender = BorrowedMemory(source)
    objs = [lender.lend(lender.address + i * SIZE, SIZE, SHAPE, DTYPE, FMT)
            for i in range(len(keys))]  # fmt: skip
    register = getattr(target.store, "register_memory", None)
    if register is not None:  # Mooncake: the buffer once, as an engine's host pool
        register(source)
    try:
        for i in range(0, len(keys), 500):  # one Mooncake batch of 1204 failed here, of 1000 not
            target.call("batched_put", keys[i : i + 500], objs[i : i + 500])
    finally:
        for obj in objs:
            obj.ref_count_down()
        if register is not None:
            target.store.unregister_memory(source)


def _present(target: Target, keys: list[str]) -> list[bool]:
    return list(target.call("batched_exists", keys))


def test_the_entries_under_the_prefix_go_and_the_others_stay(target: Target) -> None:
    tag = uuid.uuid4().hex[:8]
    mine = [f"{tag}.{i:04d}" for i in range(1200)]  # > one SCAN step, > one UNLINK
    others = [f"{tag}X.1", f"x{tag}.1", f"{tag[:-1]}.1", f"{uuid.uuid4().hex[:8]}.1"]
    _put(target, mine + others)
    assert target.call("delete_prefix", f"{tag}.") == len(mine)
    assert not any(_present(target, mine))
    assert all(_present(target, others))
    assert target.call("delete_prefix", f"{tag}.") == 0  # nothing left to remove
    counted = getattr(target.store, "counters", None)
    if counted is not None:  # the blocking stores count it: the entries removed
        assert counted.snapshot()["delete_prefix"].entries == len(mine)


# Each prefix with a key a glob or regex reading of it would match as well.
SPECIAL = [
    ("a*", "abc"),
    ("b?", "bz"),
    ("c[x]", "cx"),
    ("d\\*", "d*z"),
    ("e.", "ez"),
    ("f+", "fff"),
    ("(g)|", "g"),
    ("^h$", "h"),
    ("\u00e9", "e"),
]


def test_pattern_characters_in_a_prefix_match_only_themselves(target: Target) -> None:
    run = uuid.uuid4().hex[:6]
    for prefix, decoy in SPECIAL:
        exact, near = f"{run}{prefix}1", f"{run}{decoy}1"
        _put(target, [exact, near])
        assert target.call("delete_prefix", f"{run}{prefix}") == 1, prefix
        assert _present(target, [exact, near]) == [False, True], prefix


def test_an_empty_or_bad_prefix_is_refused(target: Target) -> None:
    with pytest.raises(InvalidArgumentError, match="non-empty prefix"):
        target.call("delete_prefix", "")
    with pytest.raises(InvalidArgumentError, match="str or bytes"):
        target.call("delete_prefix", 7)


def _two_stores(kind: str, request: pytest.FixtureRequest) -> tuple[object, object]:
    from kvpool.remote import MooncakeStore, RedisClusterStore, RedisStore

    a, b = (f"user-{uuid.uuid4().hex[:8]}:" for _ in range(2))
    if kind == "redis":
        url = request.getfixturevalue("redis_server").url
        return RedisStore(url, prefix=a), RedisStore(url, prefix=b)
    if kind == "cluster":
        url = request.getfixturevalue("redis_cluster").url
        return RedisClusterStore(url, prefix=a), RedisClusterStore(url, prefix=b)
    client = request.getfixturevalue("mooncake_client")
    return MooncakeStore(client=client, prefix=a), MooncakeStore(client=client, prefix=b)


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.redis),
        pytest.param("mooncake", marks=pytest.mark.mooncake),
    ],
)
def test_another_store_prefix_on_the_same_server_is_never_touched(
    kind: str, request: pytest.FixtureRequest
) -> None:
    mine, theirs = _two_stores(kind, request)
    try:
        keys = [f"page.{i}" for i in range(20)]
        for store in (mine, theirs):
            _put(Target(kind, store, str, lambda k, d: None), keys)
        assert mine.delete_prefix("page.") == 20
        assert not any(mine.batched_exists(keys))
        assert all(theirs.batched_exists(keys))  # the other user's entries, same keys
        if kind == "mooncake":
            time.sleep(3 * LEASE_MS / 1000)  # the check above took leases
        assert theirs.delete_prefix("page.") == 20
    finally:
        mine.close()
        theirs.close()


@pytest.mark.redis
def test_a_keyspace_too_large_to_walk_costs_the_timeout_and_says_how_far_it_got(
    own_redis_server,
) -> None:
    import redis

    from kvpool.remote import RedisStore

    with redis.Redis.from_url(own_redis_server.url) as raw:  # another user's 300k keys
        raw.eval("for i=1,ARGV[1] do redis.call('SET', 'other:'..i, 'x') end", 0, 300_000)
    with RedisStore(own_redis_server.url, prefix="kvpool:", timeout=0.01) as store:
        started = time.monotonic()
        with pytest.raises(StoreTimeoutError, match="0 entries were removed by then"):
            store.delete_prefix("page.")
        assert time.monotonic() - started < 2  # liveness: the timeout, not the keyspace
    with RedisStore(own_redis_server.url, prefix="kvpool:", timeout=30) as store:
        _put(Target("redis", store, str, lambda k, d: None), ["page.1", "page.2"])
        assert store.delete_prefix("page.") == 2
    with redis.Redis.from_url(own_redis_server.url) as raw:
        assert raw.dbsize() == 300_000  # every other key kept


@pytest.mark.mooncake
def test_mooncake_keeps_an_entry_a_reader_holds_a_lease_on_until_it_ends(
    mooncake_client,
) -> None:
    from kvpool.remote import MooncakeStore

    with MooncakeStore(client=mooncake_client, prefix=f"t-{uuid.uuid4().hex[:8]}:") as store:
        target = Target("mooncake", store, str, lambda k, d: None)
        _put(target, ["page.read", "page.idle"])
        assert store.exists("page.read")  # a check takes a lease, as a read does
        assert store.delete_prefix("page.") == 1  # the leased one stays (documented)
        assert store.batched_exists(["page.read", "page.idle"]) == [True, False]
        time.sleep(3 * LEASE_MS / 1000)
        assert store.delete_prefix("page.") == 1


def test_a_file_store_leaves_digest_names_and_directories_alone(tmp_path: Path) -> None:
    from kvpool.remote import FileStore

    with FileStore(tmp_path / "store") as store:
        target = Target("file", store, str, lambda k, d: None)
        long_key = "page." + "x" * 300  # stored under its digest: no prefix to match
        _put(target, ["page.1", long_key])
        Path(store.path("page.dir")).mkdir()  # not an entry
        assert store.delete_prefix("page.") == 1
        assert store.exists(long_key) and Path(store.path("page.dir")).is_dir()
