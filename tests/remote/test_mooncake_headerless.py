"""MooncakeStore(headerless=True) against a real Mooncake master and storage node.

A headerless entry is the object's bytes alone (one Mooncake buffer):
written and read byte for byte, replaced, missed; what it refuses (a get
without the layout, ``head``, a CRC, a narrowed object) and what it
detects (only a size that differs, as CorruptEntryError), also across the
two kinds of entries; the ``headerless=1`` URL option, for the blocking
and the asyncio store.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import CorruptEntryError, InvalidArgumentError
from kvpool.remote import AsyncMooncakeStore, MooncakeStore, open_async_store, open_store

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, assert_clean, fill
from .mooncake_servers import MooncakeDeployment
from .test_async_stores import run

pytestmark = pytest.mark.mooncake

KV_BYTES = KV_SHAPE.numel() * KV_DTYPE.itemsize


@pytest.fixture
def other_pool() -> Iterator[kvpool.TensorMemoryAllocator]:
    """A second pool, for a second store on the session's client (a pool's memory is
    registered once per client: two stores on one client each register their own pools)."""
    p = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
    yield p
    if not p.closed:
        assert_clean(p)
    p.close()


def _prefix() -> str:
    return f"h-{uuid.uuid4().hex[:12]}:"


def test_round_trip_replace_and_miss(
    mooncake_client: Any, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs = pool.batched_allocate(KV_SHAPE, KV_DTYPE, 6, KV_FMT)
    assert objs is not None
    datas = [fill(o, 40 + i) for i, o in enumerate(objs)]
    keys = [f"k{i}" for i in range(5)]
    with MooncakeStore(client=mooncake_client, prefix=_prefix(), headerless=True) as store:
        assert store.headerless
        store.batched_put(keys, objs[:5])
        # The entry is the object's bytes and nothing else.
        raw = mooncake_client.get(store.object_key("k1"))  # type: ignore[attr-defined]
        assert raw == datas[1]
        got = store.batched_get([*keys, "none", "k0"], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert got[5] is None
        assert [bytes(g.byte_array) for g in (*got[:5], got[6])] == [*datas[:5], datas[0]]  # type: ignore[union-attr]
        pool.batched_free([g for g in got if g is not None])
        store.put("k0", objs[5])  # replaces (the key exists)
        back = store.get("k0", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
        assert back is not None and bytes(back.byte_array) == datas[5]
        back.ref_count_down()
        assert store.get("none", pool, KV_SHAPE, KV_DTYPE, KV_FMT) is None
        assert store.batched_exists(["k1", "none"]) == [True, False]
        assert store.batched_delete([*keys, "none"]) == 5
    pool.batched_free(objs)
    assert_clean(pool)


def test_what_a_headerless_store_refuses(
    mooncake_client: Any, pool: kvpool.TensorMemoryAllocator
) -> None:
    with pytest.raises(InvalidArgumentError, match="checksum"):
        MooncakeStore(client=mooncake_client, headerless=True, checksum=True)
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(src, 1)
    with MooncakeStore(client=mooncake_client, prefix=_prefix(), headerless=True) as store:
        store.put("k", src)
        with pytest.raises(InvalidArgumentError, match="shapes, dtypes and fmt"):
            store.get("k", pool)  # no layout: nothing to learn it from
        with pytest.raises(InvalidArgumentError, match="no header"):
            store.head("k")
        # Another layout of another size: detected by the size alone.
        half = torch.Size([2, 4, 16, 16])
        with pytest.raises(CorruptEntryError, match=f"holds {KV_BYTES} bytes.*{KV_BYTES // 2}"):
            store.get("k", pool, half, KV_DTYPE, KV_FMT)
        with pytest.raises(CorruptEntryError, match=f"holds {KV_BYTES} bytes.*{KV_BYTES * 2}"):
            store.get("k", pool, torch.Size([2, 4, 16, 64]), KV_DTYPE, KV_FMT)
        assert_clean_but(pool, 1)  # the destinations were freed
        # Another layout of the same size is read as asked: nothing says otherwise.
        same = store.get("k", pool, torch.Size([2, 4, 32, 16]), KV_DTYPE, KV_FMT)
        assert same is not None and bytes(same.byte_array) == bytes(src.byte_array)
        same.ref_count_down()
        narrow = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        narrow.set_used_size(KV_BYTES // 2)
        with pytest.raises(InvalidArgumentError, match="narrowed"):
            store.put("n", narrow)
        narrow.ref_count_down()
        assert not store.exists("n")
        store.delete("k")
    src.ref_count_down()


def assert_clean_but(pool: kvpool.TensorMemoryAllocator, live: int) -> None:
    import gc

    gc.collect()
    assert pool.stats().active_objects == live


def test_headerless_and_headed_entries_refuse_each_other(
    mooncake_client: Any,
    pool: kvpool.TensorMemoryAllocator,
    other_pool: kvpool.TensorMemoryAllocator,
) -> None:
    prefix = _prefix()
    raw_store = MooncakeStore(client=mooncake_client, prefix=prefix, headerless=True)
    headed = MooncakeStore(client=mooncake_client, prefix=prefix)
    a = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    b = other_pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    fill(a, 2)
    fill(b, 3)
    raw_store.put("raw", a)
    headed.put("headed", b)
    with pytest.raises(CorruptEntryError, match="not a kvpool entry"):
        headed.get("raw", other_pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    with pytest.raises(CorruptEntryError, match="holds"):
        raw_store.get("headed", pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert raw_store.batched_delete(["raw", "headed"]) == 2
    a.ref_count_down()
    b.ref_count_down()
    raw_store.close()
    headed.close()
    assert_clean(pool)
    assert_clean(other_pool)


def test_headerless_url_option(
    mooncake: MooncakeDeployment,
    pool: kvpool.TensorMemoryAllocator,
    other_pool: kvpool.TensorMemoryAllocator,
) -> None:
    src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    data = fill(src, 4)
    url = f"{mooncake.url}&headerless=1&prefix={_prefix()}"
    with open_store(url) as store:
        assert isinstance(store, MooncakeStore) and store.headerless
        store.put("k", src)
        assert mooncake_len(store, "k") == KV_BYTES

        async def main() -> None:
            # The same client (a client registers a pool once: this store reads into another).
            astore = open_async_store(url, client=store.client, threads=2)
            assert isinstance(astore, AsyncMooncakeStore) and astore.headerless
            assert astore.threads == 2
            got = await astore.get("k", other_pool, KV_SHAPE, KV_DTYPE, KV_FMT)
            assert got is not None and bytes(got.byte_array) == data
            with pytest.raises(InvalidArgumentError):
                await astore.get("k", other_pool)
            await astore.batched_put(["a", "b"], [got, got])
            got.ref_count_down()
            back = await astore.batched_get(
                ["a", "b", "none"], other_pool, KV_SHAPE, KV_DTYPE, KV_FMT
            )
            assert [bytes(x.byte_array) for x in back[:2]] == [data, data]  # type: ignore[union-attr]
            assert back[2] is None
            other_pool.batched_free(back[:2])  # type: ignore[arg-type]
            assert await astore.batched_delete(["k", "a", "b"]) == 3
            await astore.aclose()

        run(main())
    src.ref_count_down()
    with pytest.raises(InvalidArgumentError, match="headerless"):
        open_store(f"{mooncake.url}&headerless=maybe")


def mooncake_len(store: MooncakeStore, key: str) -> int:
    """The size Mooncake records for an entry."""
    return int(store.client.get_size(store.object_key(key)))
