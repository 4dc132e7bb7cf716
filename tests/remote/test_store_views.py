"""A miss is not misuse: no store call leaves a view of pool memory behind it.

For every store, blocking and asyncio (:mod:`.store_targets`), and every
read form - ``get`` with and without a layout, ``batched_get`` with and
without, ``head`` - a miss returns None, a damaged entry or a layout
mismatch raises its typed error, and in every case the pool's stats are
exactly what they were before the call *while the caller still holds the
exception* (its traceback included): the destination's bytes went back to
the pool before the call returned.  Nothing is logged above DEBUG, and
strict mode changes none of it.  A put that fails leaves its object as it
was: the caller's ``ref_count_down`` frees it at once, in strict mode too.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import (
    CorruptEntryError,
    InvalidArgumentError,
    RemoteStoreError,
    StoreConnectionError,
)
from kvpool.remote import AsyncFileStore, AsyncRedisStore, FileStore, RedisStore
from kvpool.remote.header import EntryInfo

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, fill
from .store_targets import HEADERLESS_KINDS, KINDS, Target, make_target

OTHER_SHAPE = torch.Size([4, 512])  # another layout of the same 8 KiB


@pytest.fixture(params=KINDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    yield from make_target(request, request.param, tmp_path)


@pytest.fixture(params=[True, False], ids=["strict", "lenient"])
def strictness(request: pytest.FixtureRequest) -> Iterator[bool]:
    previous = kvpool.set_strict_mode(request.param)
    yield request.param
    kvpool.set_strict_mode(previous)


@pytest.fixture
def quiet(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fail the test if kvpool logs anything above DEBUG."""
    with caplog.at_level(logging.DEBUG, logger="kvpool"):
        yield
    records = caplog.get_records("call")  # caplog.records: this teardown's only
    loud = [r for r in records if r.name.startswith("kvpool") and r.levelno > logging.DEBUG]
    assert not loud, [r.getMessage() for r in loud]


def _free(result: Any) -> None:
    for obj in result if isinstance(result, list) else [result]:
        if isinstance(obj, kvpool.MemoryObj):
            obj.ref_count_down()


# The read forms: (name, method, args after the pool).
FORMS: list[tuple[str, str, Callable[[str], tuple[Any, ...]]]] = [
    ("get+layout", "get", lambda k: (k, "POOL", KV_SHAPE, KV_DTYPE, KV_FMT)),
    ("get", "get", lambda k: (k, "POOL")),
    (
        "batched_get+layout",
        "batched_get",
        lambda k: (["good", k, "none"], "POOL", KV_SHAPE, KV_DTYPE, KV_FMT),
    ),
    ("batched_get", "batched_get", lambda k: (["good", k, "none"], "POOL")),
    ("head", "head", lambda k: (k,)),
]


def _args(form: Callable[[str], tuple[Any, ...]], key: str, pool: Any) -> tuple[Any, ...]:
    return tuple(pool if a == "POOL" else a for a in form(key))


def test_a_miss_returns_none_quietly_and_leaves_the_stats_as_they_were(
    target: Target, pool: kvpool.TensorMemoryAllocator, strictness: bool, quiet: None
) -> None:
    for name, method, form in FORMS:
        before = pool.stats()
        args = _args(form, "missing", pool)
        if method == "batched_get":
            args = (["missing", "none"], *args[1:])
        got = target.call(method, *args)
        assert got == ([None, None] if method == "batched_get" else None), name
        assert pool.stats() == before, name


# Damaged entries, made from a good one: (good header+payload, header size) -> bytes.
DAMAGE: dict[str, Callable[[bytes, int], bytes]] = {
    "truncated": lambda e, h: e[:-10],
    "header-only": lambda e, h: e[:h],
    "trailing": lambda e, h: e + b"xy",
    "payload-flip": lambda e, h: e[:-100] + bytes([e[-100] ^ 0x10]) + e[-99:],
    "header-flip": lambda e, h: e[:40] + bytes([e[40] ^ 1]) + e[41:],
    "foreign": lambda e, h: b"not a kvpool entry, only bytes " * 40,
}


def _expected(damage: str, name: str) -> type[Exception] | None:
    """What a form raises on a damaged entry (None: it reads it anyway)."""
    if damage == "payload-flip" and name == "head":
        return None  # head reads the header only; the CRC covers the payload
    return CorruptEntryError


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_entry_raises_its_typed_error_and_leaves_the_stats_exact(
    target: Target,
    pool: kvpool.TensorMemoryAllocator,
    strictness: bool,
    quiet: None,
    damage: str,
) -> None:
    _check_damaged(target, pool, damage, DAMAGE[damage])


# Mooncake keeps no empty object (writing one leaves no object at all).
_VALUE_KINDS = [k for k in KINDS if "mooncake" not in str(getattr(k, "values", [k])[0])]


@pytest.fixture(params=_VALUE_KINDS)
def value_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    yield from make_target(request, request.param, tmp_path)


def test_an_empty_value_is_a_damaged_entry_too(
    value_target: Target, pool: kvpool.TensorMemoryAllocator, strictness: bool, quiet: None
) -> None:
    _check_damaged(value_target, pool, "empty", lambda e, h: b"")


def _check_damaged(
    target: Target, pool: Any, damage: str, make: Callable[[bytes, int], bytes]
) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 7)
    target.call("put", "good", src)
    target.call("put", "bad", src)
    src.ref_count_down()
    entry = target.read_raw("bad")
    target.write_raw("bad", make(entry, len(entry) - KV_SHAPE.numel() * KV_DTYPE.itemsize))
    for name, method, form in FORMS:
        before = pool.stats()
        expected = _expected(damage, name)
        if expected is None:
            assert isinstance(target.call(method, *_args(form, "bad", pool)), EntryInfo)
        else:
            with pytest.raises(expected) as caught:
                target.call(method, *_args(form, "bad", pool))
            # The caller still holds the exception and its traceback.
            assert caught.value.__traceback__ is not None
        assert pool.stats() == before, name


def test_a_layout_mismatch_raises_its_own_error_and_leaves_the_stats_exact(
    target: Target, pool: kvpool.TensorMemoryAllocator, strictness: bool, quiet: None
) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 8)
    target.call("put", "good", src)
    src.ref_count_down()
    other = pool.allocate(OTHER_SHAPE, torch.float32, KV_FMT)
    fill(other, 9)
    target.call("put", "other", other)
    other.ref_count_down()
    for name, method, form in FORMS:
        before = pool.stats()
        if name in ("get+layout", "batched_get+layout"):
            with pytest.raises(InvalidArgumentError, match="layout mismatch") as caught:
                target.call(method, *_args(form, "other", pool))
            assert caught.value.__traceback__ is not None
        else:  # the stored layout is allocated
            _free(target.call(method, *_args(form, "other", pool)))
        assert pool.stats() == before, name


def test_a_miss_in_a_full_pool_is_still_a_quiet_none(
    target: Target, strictness: bool, quiet: None
) -> None:
    one = KV_SHAPE.numel() * KV_DTYPE.itemsize
    small = kvpool.TensorMemoryAllocator(torch.empty(one, dtype=torch.uint8))
    taken = small.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    before = small.stats()
    assert target.call("get", "missing", small, KV_SHAPE, KV_DTYPE, KV_FMT) is None
    assert target.call("batched_get", ["missing"], small, KV_SHAPE, KV_DTYPE, KV_FMT) == [None]
    assert small.stats() == before
    taken.ref_count_down()
    small.close()


def test_the_store_leaves_an_exception_its_caller_was_handling_alone(
    target: Target, pool: kvpool.TensorMemoryAllocator
) -> None:
    # Letting go of a failed call's frames never reaches up the stack: the
    # caller's own exception, and its frames' locals, are the caller's.
    def fail() -> None:
        mine = ["the caller's"]
        raise KeyError(mine)

    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 3)
    target.call("put", "bad", src)
    src.ref_count_down()
    target.write_raw("bad", b"not an entry" * 20)
    try:
        fail()
    except KeyError as handled:
        assert target.call("get", "missing", pool, KV_SHAPE, KV_DTYPE, KV_FMT) is None
        with pytest.raises(CorruptEntryError) as caught:
            target.call("get", "bad", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert caught.value.__context__ is handled
        assert handled.__traceback__.tb_next.tb_frame.f_locals["mine"] == ["the caller's"]


@pytest.fixture(params=HEADERLESS_KINDS)
def headerless(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    yield from make_target(request, request.param, tmp_path)


def test_a_headerless_store_misses_quietly_and_refuses_with_the_stats_exact(
    headerless: Target, pool: kvpool.TensorMemoryAllocator, strictness: bool, quiet: None
) -> None:
    """Headerless Mooncake: its size mismatches and refusals leave no destination behind."""
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 5)
    headerless.call("put", "k", src)
    smaller, larger = torch.Size([2, 4, 16, 16]), torch.Size([2, 4, 16, 64])
    layout = (KV_DTYPE, KV_FMT)
    cases: list[tuple[str, tuple[Any, ...], Any]] = [
        ("get", ("none", pool, KV_SHAPE, *layout), None),
        ("batched_get", (["none", "gone"], pool, KV_SHAPE, *layout), [None, None]),
        ("get", ("k", pool, smaller, *layout), CorruptEntryError),
        ("get", ("k", pool, larger, *layout), CorruptEntryError),
        ("batched_get", (["k", "none"], pool, smaller, *layout), CorruptEntryError),
        ("batched_get", (["none", "k"], pool, larger, *layout), CorruptEntryError),
        ("get", ("k", pool), InvalidArgumentError),  # no layout to learn it from
        ("batched_get", (["k"], pool), InvalidArgumentError),
        ("head", ("k",), InvalidArgumentError),  # no header to read
    ]
    for method, args, expected in cases:
        before = pool.stats()
        if isinstance(expected, type):
            with pytest.raises(expected) as caught:
                headerless.call(method, *args)
            # The caller still holds the exception and its traceback.
            assert caught.value.__traceback__ is not None
        else:
            assert headerless.call(method, *args) == expected, (method, args)
        assert pool.stats() == before, (method, args)
    headerless.call("delete", "k")
    src.ref_count_down()


# -- puts that fail --------------------------------------------------------


def _failing_file(tmp_path: Path, asynchronous: bool, threads: int = 0) -> Any:
    directory = tmp_path / "gone"
    store = AsyncFileStore(directory, threads=threads) if asynchronous else FileStore(directory)
    shutil.rmtree(directory)  # every write now fails (ENOENT)
    return store


FAILING = [
    ("file", lambda tmp, req: _failing_file(tmp, False), RemoteStoreError),
    ("async-file", lambda tmp, req: _failing_file(tmp, True), RemoteStoreError),
    ("async-file-threads", lambda tmp, req: _failing_file(tmp, True, 2), RemoteStoreError),
    pytest.param(
        "redis",
        lambda tmp, req: RedisStore("redis://127.0.0.1:1/0", ping=False),
        StoreConnectionError,
        marks=pytest.mark.redis,
    ),
    pytest.param(
        "async-redis",
        lambda tmp, req: AsyncRedisStore("redis://127.0.0.1:1/0"),
        StoreConnectionError,
        marks=pytest.mark.redis,
    ),
    pytest.param(
        "cluster",
        lambda tmp, req: _closed_cluster(),
        StoreConnectionError,
        marks=pytest.mark.redis,
    ),
    pytest.param(
        "async-cluster",
        lambda tmp, req: _closed_cluster(asynchronous=True),
        StoreConnectionError,
        marks=pytest.mark.redis,
    ),
    pytest.param(
        "mooncake",
        lambda tmp, req: _small_buffer_mooncake(req),
        RemoteStoreError,
        marks=pytest.mark.mooncake,
    ),
    pytest.param(
        "async-mooncake",
        lambda tmp, req: _small_buffer_mooncake(req, asynchronous=True),
        RemoteStoreError,
        marks=pytest.mark.mooncake,
    ),
]


def _closed_cluster(asynchronous: bool = False) -> Any:
    from kvpool.remote import AsyncRedisClusterStore
    from kvpool.remote.cluster.store import RedisClusterStore

    url = "redis-cluster://127.0.0.1:1"
    if asynchronous:  # connects at its first call
        return AsyncRedisClusterStore(url, timeout=2.0)
    return RedisClusterStore(url, ping=False, timeout=2.0)


def _small_buffer_mooncake(request: pytest.FixtureRequest, asynchronous: bool = False) -> Any:
    # Replacing an entry copies it through the client's local buffer: with a
    # buffer smaller than the entry, the second put of a key fails.
    import uuid

    from kvpool.remote import AsyncMooncakeStore
    from kvpool.remote.mooncake.store import MooncakeStore

    return (AsyncMooncakeStore if asynchronous else MooncakeStore)(
        client=request.getfixturevalue("mooncake_client"),
        prefix=f"p-{uuid.uuid4().hex[:12]}:",
        local_buffer_size=4096,
    )


@pytest.mark.parametrize(("kind", "make", "error"), FAILING)
def test_a_failed_put_leaves_its_object_exactly_as_it_was(
    kind: str,
    make: Callable[[Path, pytest.FixtureRequest], Any],
    error: type[Exception],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    strict: None,
    quiet: None,
) -> None:
    import asyncio

    store = make(tmp_path, request)
    loop = asyncio.new_event_loop() if kind.startswith("async") else None

    def call(method: str, *args: Any) -> Any:
        result = getattr(store, method)(*args)
        return loop.run_until_complete(result) if loop is not None else result

    pool = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
    try:
        for method in ("put", "batched_put"):
            a = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
            b = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
            fill(a, 1)
            fill(b, 2)
            keys = [f"{method}-a", f"{method}-b"]
            if kind.endswith("mooncake"):  # the first put of a key fits; replacing it does not
                call("batched_put", keys, [a, b])
            with pytest.raises(error) as caught:
                if method == "put":
                    call("put", keys[0], a)
                else:
                    call("batched_put", keys, [a, b])
            # The caller keeps the exception; its objects are still exactly theirs.
            assert caught.value.__traceback__ is not None
            assert a.get_ref_count() == b.get_ref_count() == 1
            a.ref_count_down()  # strict mode: raises if a view of the put outlived it
            b.ref_count_down()
            stats = pool.stats()
            assert (stats.used_bytes, stats.held_by_views_bytes) == (0, 0), (method, stats)
    finally:
        if loop is not None:
            loop.run_until_complete(store.aclose())
            loop.close()
        else:
            store.close()
        pool.close()
