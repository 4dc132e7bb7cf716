"""KVPoolHiCacheStorage under SGLang 0.5.23's own factory, host pools and storage config.

Every layout of SGLang's MHA and MLA host pools round-trips byte for byte
through a directory, a redis-server, a 3-master Redis Cluster and a local
Mooncake master; batch_exists counts the leading run; misses, other ranks
and other dtypes are misses; config errors stop the attach with the fix.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import torch
from store_url_cases import BAD_IDS, BAD_SPECS, created_anything, missing_parent, unmakeable

from .conftest import load_backend, mha_pool, mla_pool, storage_config

LAYOUTS = [("mha", lay) for lay in ("page_first", "page_first_direct", "page_head", "layer_first")]
LAYOUTS += [("mla", lay) for lay in ("page_first", "page_first_direct", "layer_first")]
PAGE = 4


def _pool(kind: str, layout: str, **kw: Any) -> Any:
    return mha_pool(layout, **kw) if kind == "mha" else mla_pool(layout, **kw)


def _fill(pool: Any, pages: int, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Allocate ``pages`` pages, fill each with random bytes; the indices and each page's bytes."""
    idx = pool.alloc(pages * PAGE)
    gen = torch.Generator().manual_seed(seed)
    flat = pool.kv_buffer.view(-1).view(torch.uint8)
    ptrs, sizes = pool.get_page_buffer_meta(idx)
    base = pool.kv_buffer.data_ptr()
    for ptr, size in zip(ptrs, sizes, strict=True):
        flat[ptr - base : ptr - base + size] = torch.randint(0, 256, (size,), dtype=torch.uint8,
                                                            generator=gen)  # fmt: skip
    return idx, _pages(pool, idx)


def _pages(pool: Any, idx: torch.Tensor) -> list[torch.Tensor]:
    """Each page's bytes, range by range (a copy)."""
    flat = pool.kv_buffer.view(-1).view(torch.uint8)
    base = pool.kv_buffer.data_ptr()
    ptrs, sizes = pool.get_page_buffer_meta(idx)
    per = len(ptrs) // (len(idx) // PAGE)
    out = []
    for p in range(len(idx) // PAGE):
        parts = [flat[ptrs[i] - base : ptrs[i] - base + sizes[i]].clone()
                 for i in range(p * per, (p + 1) * per)]  # fmt: skip
        out.append(torch.cat(parts))
    return out


def _keys(n: int) -> list[str]:
    return [uuid.uuid4().hex * 2 for _ in range(n)]


@pytest.mark.parametrize(("kind", "layout"), LAYOUTS, ids=[f"{k}-{lay}" for k, lay in LAYOUTS])
def test_pages_round_trip_in_every_layout(store_url: str, kind: str, layout: str, backends) -> None:
    pool = _pool(kind, layout)
    backend = backends(storage_config(store_url, mla=kind == "mla"), pool)
    src, wrote = _fill(pool, 3, seed=7)
    keys = _keys(3)
    assert backend.batch_set_v1(keys, src) == [True, True, True]
    assert backend.batch_exists(keys) == 3
    dst = pool.alloc(3 * PAGE)
    assert backend.batch_get_v1(keys, dst) == [True, True, True]
    for before, after in zip(wrote, _pages(pool, dst), strict=True):
        assert torch.equal(before, after)


def test_exists_counts_the_leading_run_and_misses_are_false(redis_server, backends) -> None:
    pool = mha_pool("page_first")
    backend = backends(storage_config(redis_server.url, model=uuid.uuid4().hex), pool)
    src, wrote = _fill(pool, 3, seed=1)
    a, b, c = _keys(3)
    missing = _keys(1)[0]
    assert backend.batch_set_v1([a, b, c], src) == [True, True, True]
    assert backend.batch_exists([a, b, missing, c]) == 2
    assert backend.batch_exists([missing, a]) == 0
    assert backend.exists(c) and not backend.exists(missing)
    dst = pool.alloc(3 * PAGE)
    before = _pages(pool, dst)
    assert backend.batch_get_v1([a, missing, c], dst) == [True, False, True]
    after = _pages(pool, dst)
    assert torch.equal(after[0], wrote[0]) and torch.equal(after[2], wrote[2])
    assert torch.equal(after[1], before[1])  # a miss leaves its page as it was
    assert backend.batch_set_v1([], src[:0]) == [] and backend.batch_exists([]) == 0


def test_ranks_models_and_dtypes_are_kept_apart(redis_server, backends) -> None:
    model = uuid.uuid4().hex
    pool = mha_pool("page_first")
    writer = backends(storage_config(redis_server.url, model=model, tp=(0, 2)), pool)
    src, _ = _fill(pool, 2, seed=3)
    keys = _keys(2)
    assert writer.batch_set_v1(keys, src) == [True, True]
    same = backends(
        storage_config(redis_server.url, model=model, tp=(0, 2)), mha_pool("page_first")
    )
    assert same.batch_exists(keys) == 2  # another process of the same rank shares the pages
    others = [
        (storage_config(redis_server.url, model=model, tp=(1, 2)), mha_pool("page_first")),
        (storage_config(redis_server.url, model="other", tp=(0, 2)), mha_pool("page_first")),
        (storage_config(redis_server.url, model=model, tp=(0, 2)),
         mha_pool("page_first", dtype=torch.float16)),  # sglang #33268
        (storage_config(redis_server.url, model=model, tp=(0, 2)), mha_pool("page_head")),
    ]  # fmt: skip
    for config, other_pool in others:
        other = backends(config, other_pool)
        assert other.batch_exists(keys) == 0
        dst = other_pool.alloc(2 * PAGE)
        assert other.batch_get_v1(keys, dst) == [False, False]


def test_mla_pages_are_written_by_one_rank_and_shared(redis_server, backends) -> None:
    model = uuid.uuid4().hex
    pool1 = mla_pool("page_first")
    reader = backends(storage_config(redis_server.url, mla=True, tp=(1, 2), model=model), pool1)
    src1, _ = _fill(pool1, 2, seed=5)
    keys = _keys(2)
    assert not reader.storage_config.is_storage_writer
    assert reader.batch_set_v1(keys, src1) == [True, True]  # the writer rank stores them
    assert reader.batch_exists(keys) == 0
    pool0 = mla_pool("page_first")
    writer = backends(storage_config(redis_server.url, mla=True, tp=(0, 2), model=model), pool0)
    src0, wrote = _fill(pool0, 2, seed=6)
    assert writer.batch_set_v1(keys, src0) == [True, True]
    assert reader.batch_exists(keys) == 2
    dst = pool1.alloc(2 * PAGE)
    assert reader.batch_get_v1(keys, dst) == [True, True]
    assert all(torch.equal(a, b) for a, b in zip(wrote, _pages(pool1, dst), strict=True))


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"url": None}, "has no url"),
        ({"interface_v1": 0}, 'add "interface_v1": 1'),
        ({"chekcsum": True}, "did you mean checksum"),
        ({"url": "ftp://h/x"}, "url is refused"),
        ({"url": "redis://u:hunter2@127.0.0.1:1/0", "ttl": "soon"}, "refused its settings"),
        ({"url": "redis://127.0.0.1:1/0", "timeout": -1}, "refused its settings: timeout"),
        ({"threads": 2}, "unknown option threads"),  # an asyncio store's option
    ],
    ids=["no-url", "no-v1", "misspelt", "bad-url", "bad-value", "bad-timeout", "async-option"],
)
def test_config_errors_stop_the_attach_with_the_fix(tmp_path, extra, match) -> None:
    from kvpool.integrations.sglang import HiCacheConfigError

    config = storage_config(f"file://{tmp_path}")
    config.extra_config.update(extra)
    if extra.get("url", "") is None:
        del config.extra_config["url"]
    with pytest.raises(HiCacheConfigError, match=match) as info:
        load_backend(config, mha_pool("page_first"))
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(("url", "fix"), BAD_SPECS, ids=BAD_IDS)
def test_a_mistyped_url_stops_the_attach_and_creates_nothing(
    tmp_path, monkeypatch, url: str, fix: str
) -> None:
    from kvpool.integrations.sglang import HiCacheConfigError

    monkeypatch.chdir(tmp_path)
    config = storage_config(url)
    with pytest.raises(HiCacheConfigError) as info:
        load_backend(config, mha_pool("page_first"))
    assert fix in str(info.value)
    assert created_anything(tmp_path) == []


def test_a_directory_with_a_missing_parent_stops_the_attach(tmp_path) -> None:
    from kvpool.integrations.sglang import HiCacheConfigError

    url, fix = missing_parent(tmp_path)
    with pytest.raises(HiCacheConfigError) as info:
        load_backend(storage_config(url), mha_pool("page_first"))
    assert fix in str(info.value) and "make_parents" in str(info.value)
    assert created_anything(tmp_path) == []


def test_a_directory_that_cannot_be_made_stops_the_attach(tmp_path) -> None:
    from kvpool.integrations.sglang import HiCacheConfigError

    url, fix = unmakeable(tmp_path)
    with pytest.raises(HiCacheConfigError, match=fix):
        load_backend(storage_config(url), mha_pool("page_first"))


def test_a_layout_kvpool_cannot_address_is_refused_at_registration(tmp_path) -> None:
    from kvpool.integrations.sglang import HiCacheConfigError

    config = storage_config(f"file://{tmp_path}")
    with pytest.raises(HiCacheConfigError, match="--hicache-mem-layout page_first"):
        load_backend(config, mha_pool("page_unified"))


def test_mooncake_pages_are_stored_headerless_unless_told_and_the_kinds_never_meet(
    mooncake, backends
) -> None:
    model = uuid.uuid4().hex
    pool = mha_pool("page_first")
    raw = backends(storage_config(mooncake.url, model=model), pool)
    assert raw.store.headerless  # as SGLang's own Mooncake backend: the bytes alone
    assert raw.store.replace is False  # a page's key names its content
    src, wrote = _fill(pool, 2, seed=8)
    keys = _keys(2)
    assert raw.batch_set_v1(keys, src) == [True, True]
    _, sizes = pool.get_page_buffer_meta(src[:PAGE])
    client = raw.store.client
    name = raw.store.object_key(raw.pages.names(keys[:1])[0])
    assert client.get_size(name) == sizes[0]  # no header in front of the range
    headed = [  # told in the URL's query, told in the extra config
        backends(
            storage_config(mooncake.url + "&headerless=0", model=model), mha_pool("page_first")
        ),
        backends(
            storage_config(mooncake.url, model=model, headerless=False), mha_pool("page_first")
        ),
    ]
    for other in headed:
        assert not other.store.headerless
        assert other.pages.space.tag != raw.pages.space.tag
        assert other.batch_exists(keys) == 0  # the other kind's entries are other keys
    assert headed[0].pages.space.tag == headed[1].pages.space.tag
    other_pool = headed[0].pages.pool
    src2, wrote2 = _fill(other_pool, 2, seed=9)
    assert headed[0].batch_set_v1(keys, src2) == [True, True]
    assert raw.batch_exists(keys) == 2 and headed[1].batch_exists(keys) == 2
    again, _ = _fill(pool, 2, seed=10)  # other bytes under the same page keys
    assert raw.batch_set_v1(keys, again) == [True, True]  # stored already: left as it is
    dst = pool.alloc(2 * PAGE)
    assert raw.batch_get_v1(keys, dst) == [True, True]
    assert all(torch.equal(a, b) for a, b in zip(wrote, _pages(pool, dst), strict=True))
    reader_pool = headed[1].pages.pool  # another process with headers reads them
    dst2 = reader_pool.alloc(2 * PAGE)
    assert headed[1].batch_get_v1(keys, dst2) == [True, True]
    assert all(torch.equal(a, b) for a, b in zip(wrote2, _pages(reader_pool, dst2), strict=True))


def test_mooncake_pages_move_as_ranges_and_an_odd_entry_is_named(mooncake, backends, caplog):
    import logging

    pool = mha_pool("page_first")
    raw = backends(storage_config(mooncake.url, model=uuid.uuid4().hex), pool)
    assert raw.direct  # headerless over the registered host pool: no memory object per range
    headed = backends(
        storage_config(mooncake.url, model=uuid.uuid4().hex, headerless=False),
        mha_pool("page_first"),
    )
    assert not headed.direct
    src, wrote = _fill(pool, 3, seed=15)
    keys = _keys(3)
    ptrs, _ = pool.get_page_buffer_meta(src)
    odd = raw.pages.names(keys)[2]  # page 1's K range, stored first with 100 bytes
    raw.store.put_ranges([odd], [int(ptrs[2])], [100])
    assert raw.batch_set_v1(keys, src) == [True] * 3  # a page stored already is left as it is
    assert raw.store.counters.snapshot()["put_ranges"].calls == 2
    caplog.set_level(logging.WARNING, logger="kvpool.integrations.sglang")
    dst = pool.alloc(3 * PAGE)
    got = raw.batch_get_v1(keys, dst)
    assert got[:2] == [True, False]  # the good page loads; the odd one is a miss, named
    assert torch.equal(_pages(pool, dst)[0], wrote[0])
    assert raw.report.corrupt == 1
    assert any(odd in r.getMessage() and "CorruptEntryError" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    again = pool.alloc(PAGE)
    assert raw.batch_get_v1(keys[2:], again) == [True]  # the others still read as ranges
    assert torch.equal(_pages(pool, again)[0], wrote[2])
