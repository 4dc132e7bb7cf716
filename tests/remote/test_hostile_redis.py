"""RedisStore against a server that lies (tests/remote/hostile_server.py).

Each test replays one attack: absurd lengths, deep nesting, wrong reply
types, a server that trickles bytes, a duplicated reply frame, a password
in a malformed URL or echoed back by the server.  Every store call runs
under :func:`bounded`, so a store that would hang fails instead.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import kvpool
from kvpool.errors import (
    CorruptEntryError,
    InvalidArgumentError,
    RemoteStoreError,
    StoreConnectionError,
    StoreTimeoutError,
)
from kvpool.remote import AsyncRedisStore, RedisClusterStore, RedisStore

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, assert_clean, fill
from .hostile_server import CLOSE, HostileServer, Trickle, bounded

KV_BYTES = KV_SHAPE.numel() * KV_DTYPE.itemsize
SECRET = "hunter2-Secret"


@pytest.fixture
def store(hostile: HostileServer) -> Iterator[RedisStore]:
    s = RedisStore(hostile.url, prefix="h:", timeout=2.0)
    yield s
    s.close()


def _put(store: RedisStore, pool: kvpool.TensorMemoryAllocator, key: str, seed: int) -> bytes:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, seed)
    bounded(lambda: store.put(key, src))
    src.ref_count_down()
    return data


def _both(server: HostileServer, fn: Callable[[list[bytes], bytes], Any]) -> None:
    """Apply ``fn`` to the value reads of both entry formats (GET; HMGET of the hash format)."""
    server.rule(b"GET", fn)
    server.rule(b"HMGET", fn)


def _gets(store: RedisStore, pool: kvpool.TensorMemoryAllocator) -> list[Callable[[], Any]]:
    return [
        lambda: store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT),
        lambda: store.get("a", pool),
        lambda: store.batched_get(["a"], pool),
    ]


def _peak_during(fn: Callable[[], Any]) -> tuple[int, BaseException | None]:
    """Peak Python-heap growth while ``fn`` runs, and the error it raised."""
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        try:
            bounded(fn)
            error = None
        except BaseException as exc:
            error = exc
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - base, error


# -- absurd lengths ----------------------------------------------------


@pytest.mark.parametrize("length", [1 << 62, 1 << 64])
def test_absurd_value_length_is_refused_before_allocating(
    hostile: HostileServer, store: RedisStore, pool: kvpool.TensorMemoryAllocator, length: int
) -> None:
    _put(store, pool, "a", 1)
    value = hostile.data[b"h:a"]
    header = value[:128] if isinstance(value, bytes) else value[b"h"]

    def lie(args: list[bytes], honest: bytes) -> bytes:
        if args[0].upper() == b"HMGET":
            return b"*2\r\n$%d\r\n%b" % (length, header)
        return b"$%d\r\n%b" % (length, header)

    _both(hostile, lie)
    for call in _gets(store, pool):
        grown, error = _peak_during(call)
        assert isinstance(error, RemoteStoreError), error
        assert grown < 8 << 20
        assert_clean(pool)


def test_64_mib_header_is_refused_before_allocating(
    hostile: HostileServer, store: RedisStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    _put(store, pool, "a", 1)
    value = hostile.data[b"h:a"]
    header = bytearray(value[:128] if isinstance(value, bytes) else value[b"h"])
    struct.pack_into("<I", header, 8, 64 << 20)  # the header's own size field

    def lie(args: list[bytes], honest: bytes) -> bytes:
        if args[0].upper() == b"HMGET":
            return b"*2\r\n$%d\r\n%b" % (64 << 20, header)
        return b"$%d\r\n%b" % ((64 << 20) + KV_BYTES, header)

    _both(hostile, lie)
    for call in _gets(store, pool):
        grown, error = _peak_during(call)
        assert isinstance(error, RemoteStoreError), error
        assert grown < 8 << 20, f"{grown} bytes allocated for a hostile length"
        assert_clean(pool)


# -- nesting and reply types -------------------------------------------


def test_5000_nested_arrays(hostile: HostileServer, store: RedisStore) -> None:
    nested = b"*1\r\n" * 5000 + b":1\r\n"
    for name in (b"EXISTS", b"GETRANGE", b"HGET", b"STRLEN", b"HSTRLEN"):
        hostile.rule(name, lambda args, honest: nested)
    with pytest.raises(RemoteStoreError):
        bounded(lambda: store.exists("a"))
    with pytest.raises(RemoteStoreError):
        bounded(lambda: store.head("a"))
    with pytest.raises(RemoteStoreError):
        bounded(lambda: store.batched_exists(["a", "b"]))


def test_null_array_as_del_reply(hostile: HostileServer, store: RedisStore) -> None:
    hostile.rule(b"DEL", lambda args, honest: b"*-1\r\n")
    with pytest.raises(RemoteStoreError, match="DEL"):
        bounded(lambda: store.batched_delete(["a", "b"]))
    with pytest.raises(RemoteStoreError, match="DEL"):
        bounded(lambda: store.delete("a"))


@pytest.mark.parametrize(
    "reply",
    [b"+OK\r\n", b":12\r\n", b"*2\r\n$1\r\nx\r\n$1\r\ny\r\n", b"$abc\r\n", b"#t\r\n", b"\x00\r\n"],
)
def test_wrong_reply_types_to_get(
    hostile: HostileServer, store: RedisStore, pool: kvpool.TensorMemoryAllocator, reply: bytes
) -> None:
    _put(store, pool, "a", 1)
    _both(hostile, lambda args, honest: reply)
    for call in _gets(store, pool):
        with pytest.raises(RemoteStoreError):
            bounded(call)
        assert_clean(pool)


# -- time --------------------------------------------------------------


def test_trickling_server_is_bounded_by_the_call_timeout(
    hostile: HostileServer, pool: kvpool.TensorMemoryAllocator
) -> None:
    store = RedisStore(hostile.url, prefix="h:", timeout=1.0)
    _put(store, pool, "a", 1)
    # One byte every 0.25 s: each read gets a byte well within the timeout,
    # but the whole reply would take over half an hour.  The server gives
    # up (and closes) after 4 s, so a per-read timeout ends in a lost
    # connection, never in a timeout.
    _both(hostile, lambda args, honest: Trickle(honest, 0.25, 4.0))
    hostile.rule(b"EXISTS", lambda args, honest: Trickle(b":" + b"1" * 30 + b"\r\n", 0.25, 4.0))
    for call in [*_gets(store, pool), lambda: store.exists("a")]:
        with pytest.raises(StoreTimeoutError, match=r"1\.0 s"):
            bounded(call, 10)
        assert_clean(pool)
    store.close()


# -- replies out of step -----------------------------------------------


def _late_duplicate(server: HostileServer) -> None:
    """The next value read is answered honestly; the one after it first gets that reply again."""
    frames: list[bytes] = []

    def rule(args: list[bytes], honest: bytes) -> bytes:
        if not frames:
            frames.append(honest)
            return honest
        server.rules.pop(b"GET", None)
        server.rules.pop(b"HMGET", None)
        return frames[0] + honest

    _both(server, rule)


def test_duplicated_reply_frame_never_shifts_later_replies(
    hostile: HostileServer, store: RedisStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    _put(store, pool, "a", 1)
    data_b = _put(store, pool, "b", 2)
    dup = lambda args, honest: honest + honest  # noqa: E731 - the rule
    hostile.once(b"GET", dup)
    hostile.once(b"HMGET", dup)
    # The copy comes where the end-of-call marker's echo is due: the call
    # cannot tell which of the two was its answer, so it fails.
    with pytest.raises(RemoteStoreError, match="out of step"):
        bounded(lambda: store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT))
    assert_clean(pool)
    for _ in range(3):  # the copy waiting on the socket is never read as b's reply
        got = bounded(lambda: store.get("b", pool, KV_SHAPE, KV_DTYPE, KV_FMT))
        assert got is not None and bytes(got.byte_array) == data_b
        got.ref_count_down()
    assert_clean(pool)


def test_late_duplicated_reply_frame_is_never_read_as_another_keys(
    hostile: HostileServer, store: RedisStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    data_a = _put(store, pool, "a", 1)
    data_b = _put(store, pool, "b", 2)
    # a's reply comes again, right before b's: after any check made before
    # b's command was sent, so only the reply itself can tell.
    _late_duplicate(hostile)
    got = bounded(lambda: store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT))
    assert got is not None and bytes(got.byte_array) == data_a
    got.ref_count_down()
    with pytest.raises(CorruptEntryError, match="another key"):
        bounded(lambda: store.get("b", pool, KV_SHAPE, KV_DTYPE, KV_FMT))
    assert_clean(pool)
    for _ in range(3):  # and every later get answers its own key
        got = bounded(lambda: store.get("b", pool, KV_SHAPE, KV_DTYPE, KV_FMT))
        assert got is not None and bytes(got.byte_array) == data_b
        got.ref_count_down()
    assert_clean(pool)


def test_duplicated_reply_frame_inside_a_batch(
    hostile: HostileServer, store: RedisStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    _put(store, pool, "a", 1)
    data_b = _put(store, pool, "b", 2)
    dup = lambda args, honest: honest + honest  # noqa: E731 - the rule
    hostile.once(b"GET", dup)
    hostile.once(b"HMGET", dup)
    # b's slot receives a's second copy: refused, never returned as b's bytes.
    with pytest.raises(CorruptEntryError, match="another key"):
        bounded(lambda: store.batched_get(["a", "b"], pool, KV_SHAPE, KV_DTYPE, KV_FMT))
    assert_clean(pool)
    got = bounded(lambda: store.get("b", pool))
    assert got is not None and bytes(got.byte_array) == data_b
    got.ref_count_down()


def test_duplicated_count_reply_fails_the_call(hostile: HostileServer, store: RedisStore) -> None:
    hostile.data[b"h:a"] = b"x"
    hostile.once(b"EXISTS", lambda args, honest: honest + honest)
    # ["a", "none"] would read [True, True]: the end-of-call marker catches it.
    with pytest.raises(RemoteStoreError, match="out of step"):
        bounded(lambda: store.batched_exists(["a", "none"]))
    assert bounded(lambda: store.batched_exists(["a", "none"])) == [True, False]


def _late_copy(server: HostileServer, name: bytes, first: Callable[[bytes], bytes]) -> None:
    """The next ``name`` is answered ``first(honest)``; the one after it gets that reply again.

    The copy arrives in front of the second command's own reply, after the
    check for unread bytes made before that command was sent: only the
    call's own reading can tell.
    """
    frames: list[bytes] = []

    def rule(args: list[bytes], honest: bytes) -> bytes:
        if not frames:
            frames.append(first(honest))
            return frames[0]
        server.rules.pop(name, None)
        return frames[0] + honest

    server.rule(name, rule)


def test_late_copy_of_an_exists_reply_is_never_the_answer(
    hostile: HostileServer, store: RedisStore
) -> None:
    hostile.data[b"h:a"] = b"x"
    _late_copy(hostile, b"EXISTS", lambda honest: honest)
    assert bounded(lambda: store.exists("a")) is True
    # ":1" (a's) comes first: read as the answer, "missing" would exist.
    with pytest.raises(RemoteStoreError, match="out of step"):
        bounded(lambda: store.exists("missing"))
    assert bounded(lambda: store.exists("missing")) is False


def test_late_copy_of_an_ok_never_reports_a_refused_put_as_stored(
    hostile: HostileServer, store: RedisStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    oom = b"-OOM command not allowed when used memory > 'maxmemory'.\r\n"
    _put(store, pool, "a", 1)
    _late_copy(hostile, b"SET", lambda honest: honest)
    _put(store, pool, "b", 2)
    hostile.once(b"SET", lambda args, honest: b"+OK\r\n" + oom)  # a copy, then the refusal
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 3)
    with pytest.raises(RemoteStoreError, match="OOM"):
        bounded(lambda: store.put("c", src))
    src.ref_count_down()
    assert_clean(pool)


def test_late_copy_of_a_miss_is_never_the_answer(
    hostile: HostileServer, store: RedisStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    data = _put(store, pool, "a", 1)
    _late_copy(hostile, b"GET", lambda honest: honest)
    assert bounded(lambda: store.get("missing", pool, KV_SHAPE, KV_DTYPE, KV_FMT)) is None
    # "$-1" (the miss) comes first: read as the answer, "a" would be missing.
    for call in (
        lambda: store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT),
        lambda: store.get("a", pool),
    ):
        hostile.once(b"GET", lambda args, honest: b"$-1\r\n" + honest)
        with pytest.raises(RemoteStoreError, match="out of step"):
            bounded(call)
        assert_clean(pool)
    got = bounded(lambda: store.get("a", pool))
    assert got is not None and bytes(got.byte_array) == data
    got.ref_count_down()


def _miss_copy_before_reply(server: HostileServer, nth: int) -> None:
    """The ``nth`` GET from now (1: the next) gets a copy of a miss (``$-1``) in front."""
    seen: list[int] = []

    def rule(args: list[bytes], honest: bytes) -> bytes:
        seen.append(1)
        return b"$-1\r\n" + honest if len(seen) == nth else honest

    server.rule(b"GET", rule)


def test_late_copy_of_a_miss_in_a_batch_is_never_the_answer(
    hostile: HostileServer, store: RedisStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    _put(store, pool, "a", 1)
    data_b = _put(store, pool, "b", 2)
    # The copy comes in front of the last key's reply: read as b's answer, b would
    # be missing; b's own reply then stands where the end-of-call marker is due.
    for keys, layout in itertools.product((["b"], ["a", "b"]), ((KV_SHAPE, KV_DTYPE, KV_FMT), ())):
        _miss_copy_before_reply(hostile, len(keys))
        with pytest.raises(RemoteStoreError, match="out of step"):
            bounded(lambda: store.batched_get(keys, pool, *layout))  # noqa: B023
        assert_clean(pool)
    hostile.rules.clear()
    (got,) = bounded(lambda: store.batched_get(["b"], pool))
    assert got is not None and bytes(got.byte_array) == data_b
    got.ref_count_down()


def test_late_copy_of_a_delete_reply_is_never_the_answer(
    hostile: HostileServer, store: RedisStore
) -> None:
    hostile.data[b"h:a"] = b"x"
    _late_copy(hostile, b"DEL", lambda honest: honest)
    assert bounded(lambda: store.delete("a")) is True
    with pytest.raises(RemoteStoreError, match="out of step"):
        bounded(lambda: store.delete("missing"))


def test_late_copies_with_the_async_store(
    hostile: HostileServer, pool: kvpool.TensorMemoryAllocator
) -> None:
    hostile.data[b"h:a"] = b"x"

    async def scenario() -> None:
        store = AsyncRedisStore(hostile.url, prefix="h:", timeout=2.0)
        _late_copy(hostile, b"EXISTS", lambda honest: honest)
        assert await store.exists("a") is True
        with pytest.raises(RemoteStoreError, match="out of step"):
            await store.exists("missing")
        assert await store.exists("missing") is False
        src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        fill(src, 1)
        await store.put("b", src)
        hostile.once(b"SET", lambda args, honest: b"+OK\r\n-OOM out of memory\r\n")
        with pytest.raises(RemoteStoreError, match="OOM"):
            await store.put("c", src)
        hostile.once(b"GET", lambda args, honest: b"$-1\r\n" + honest)
        with pytest.raises(RemoteStoreError, match="out of step"):
            await store.get("b", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        src.ref_count_down()
        await store.aclose()

    bounded(lambda: asyncio.run(scenario()), 30)
    assert_clean(pool)


def test_late_copy_with_the_cluster_store(hostile: HostileServer) -> None:
    store = RedisClusterStore(f"redis-cluster://127.0.0.1:{hostile.port}", prefix="h:")
    hostile.data[b"h:a"] = b"x"
    _late_copy(hostile, b"EXISTS", lambda honest: honest)
    assert bounded(lambda: store.exists("a")) is True
    with pytest.raises(RemoteStoreError, match="out of step"):
        bounded(lambda: store.exists("missing"))
    assert bounded(lambda: store.exists("missing")) is False
    store.close()


def test_error_drops_the_connection_and_the_next_call_works(
    hostile: HostileServer, store: RedisStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    data = _put(store, pool, "a", 1)
    opened = hostile.connections
    flip = lambda args, honest: honest[:20] + b"\xff" + honest[21:]  # noqa: E731 - the rule
    hostile.once(b"GET", flip)
    hostile.once(b"HMGET", flip)
    with pytest.raises(CorruptEntryError):
        bounded(lambda: store.get("a", pool))
    got = bounded(lambda: store.get("a", pool))
    assert got is not None and bytes(got.byte_array) == data
    got.ref_count_down()
    assert hostile.connections == opened + 1  # the failed call's connection was not reused


def test_server_closing_mid_reply(
    hostile: HostileServer, store: RedisStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    _put(store, pool, "a", 1)
    hostile.once(b"GET", lambda args, honest: CLOSE)
    hostile.once(b"HMGET", lambda args, honest: CLOSE)
    with pytest.raises(StoreConnectionError):
        bounded(lambda: store.get("a", pool))
    assert_clean(pool)


# -- secrets -----------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        f"redis://user:{SECRET}@127.0.0.1:notaport/0",
        f"redis://:{SECRET}@[::1/0",
        f"redis://user:{SECRET}@127.0.0.1:99999/0",
        f"redis://127.0.0.1/0?password={SECRET}&socket_timeout=abc",
        f"http://user:{SECRET}@127.0.0.1/0",
    ],
)
def test_malformed_url_keeps_its_password_out_of_the_message(url: str) -> None:
    pytest.importorskip("redis")
    with pytest.raises(InvalidArgumentError) as info:
        RedisStore(url)
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)
    assert "***" in str(info.value) or "http" in str(info.value)


def test_password_echoed_by_the_server_stays_out_of_the_message(
    hostile: HostileServer,
) -> None:
    hostile.rule(
        b"AUTH",
        lambda args, honest: b"-WRONGPASS invalid password '%b'\r\n" % args[-1],
    )
    url = f"redis://user:{SECRET}@127.0.0.1:{hostile.port}/0"
    with pytest.raises(RemoteStoreError) as info:
        bounded(lambda: RedisStore(url, timeout=2.0))
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)
    store = RedisStore(url, timeout=2.0, ping=False)
    assert SECRET not in repr(store) and SECRET not in str(vars(store).get("server"))
    store.close()
