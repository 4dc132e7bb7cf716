"""clear() drops this configuration's pages and nothing else; get_stats() feeds SGLang's metrics.

clear() is what SGLang calls to drop its L3 cache (``HiCacheController
.clear_storage_backend``).  On every store: the pages of the backend's
configuration go; the same page hashes stored by another configuration
(another TP rank) stay, and so do another user's entries in the same
directory or server namespace, and entries under another store prefix
that start like the backend's keys.  get_stats() returns SGLang's own
``StorageMetrics``, which SGLang's ``StorageMetricsCollector`` takes.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import torch

from .conftest import mha_pool, storage_config
from .test_backend import PAGE, _fill, _keys, _pages

SIZE = 256


def _entry() -> Any:
    from kvpool.pool.borrowed import borrow

    return borrow(torch.full((SIZE,), 7, dtype=torch.uint8))


def _other_users(store_url: str, backend: Any) -> list[tuple[Any, str]]:
    """Stores of other users of the same server or folder, each with a key it wrote there."""
    from kvpool.remote import MooncakeStore, open_store, store_kind

    kind = store_kind(store_url)
    if kind == "mooncake":
        client = backend.store.client
        same = MooncakeStore(client=client, prefix="kvpool:")
        other = MooncakeStore(client=client, prefix="someone-else:")
    else:
        same = open_store(store_url)  # the backend's own namespace (kvpool:), another key
        other = None if kind == "file" else open_store(store_url, prefix="someone-else:")
    found = [(same, f"not-a-page-{uuid.uuid4().hex}")]
    if other is not None:  # a key that starts like the backend's, under another store prefix
        found.append((other, backend.pages.space.prefix + "x"))
    for store, key in found:
        obj = _entry()
        store.put(key, obj)
        obj.ref_count_down()
    return found


def test_clear_removes_this_configurations_pages_and_nothing_else(store_url, backends) -> None:
    model = uuid.uuid4().hex
    pool_a, pool_b = mha_pool("page_first"), mha_pool("page_first")
    mine = backends(storage_config(store_url, model=model, tp=(0, 2)), pool_a)
    theirs = backends(storage_config(store_url, model=model, tp=(1, 2)), pool_b)
    keys = _keys(3)
    src_a, _ = _fill(pool_a, 3, seed=11)
    src_b, wrote_b = _fill(pool_b, 3, seed=12)
    assert mine.batch_set_v1(keys, src_a) == [True] * 3
    assert theirs.batch_set_v1(keys, src_b) == [True] * 3  # the same page hashes, another tag
    others = _other_users(store_url, mine)
    try:
        mine.clear()
        assert mine.batch_exists(keys) == 0
        assert mine.batch_get_v1(keys, pool_a.alloc(3 * PAGE)) == [False] * 3
        assert theirs.batch_exists(keys) == 3
        dst = pool_b.alloc(3 * PAGE)
        assert theirs.batch_get_v1(keys, dst) == [True] * 3
        assert all(torch.equal(a, b) for a, b in zip(wrote_b, _pages(pool_b, dst), strict=True))
        for store, key in others:
            assert store.exists(key), key
        snap = mine.counters.snapshot()["clear"]
        assert snap.calls == 1 and snap.entries == 6  # 3 pages of 2 ranges (K, V)
        assert mine.batch_set_v1(keys, src_a) == [True] * 3  # the backend goes on
        assert mine.batch_exists(keys) == 3
    finally:
        for store, key in others:
            store.delete(key)
            store.close()


def test_clear_in_an_outage_raises_a_typed_error_for_sglang_to_report(backends) -> None:
    from kvpool.errors import StoreConnectionError

    from .conftest import RedisServer

    server = RedisServer()
    pool = mha_pool("page_first")
    backend = backends(storage_config(server.url, model=uuid.uuid4().hex), pool)
    src, _ = _fill(pool, 1, seed=13)
    assert backend.batch_set_v1(_keys(1), src) == [True]
    server.stop()
    with pytest.raises(StoreConnectionError, match="delete_prefix"):
        backend.clear()  # SGLang's attachment logs it and reports the clear as failed
    assert backend.counters.snapshot()["clear"].errors == {"StoreConnectionError": 1}


def test_get_stats_feeds_sglangs_storage_metrics(tmp_path, backends) -> None:
    from prometheus_client import REGISTRY
    from sglang.srt.observability.metrics_collector import StorageMetrics, StorageMetricsCollector

    pool = mha_pool("page_first")
    backend = backends(storage_config(f"file://{tmp_path}", metrics=True), pool)
    src, _ = _fill(pool, 3, seed=14)
    keys = _keys(3)
    assert backend.batch_set_v1(keys, src) == [True] * 3
    assert backend.batch_get_v1([*keys, _keys(1)[0]], pool.alloc(4 * PAGE)) == [True] * 3 + [False]
    stats = backend.get_stats()
    assert isinstance(stats, StorageMetrics)
    assert stats.backup_pgs == [3] and stats.prefetch_pgs == [4]
    assert len(stats.backup_bandwidth) == 1 and stats.backup_bandwidth[0] > 0
    assert len(stats.prefetch_bandwidth) == 1 and stats.prefetch_bandwidth[0] > 0
    empty = backend.get_stats()  # the calls since the last get_stats: none
    assert (empty.backup_pgs, empty.prefetch_pgs, empty.prefetch_bandwidth) == ([], [], [])
    labels = {"storage_backend": "kvpool-test-" + uuid.uuid4().hex[:6], "tp_rank": "0"}
    StorageMetricsCollector(labels=labels).log_storage_metrics(stats)  # SGLang takes it
    assert REGISTRY.get_sample_value("sglang:backup_pgs_sum", labels) == 3
    assert REGISTRY.get_sample_value("sglang:prefetch_pgs_sum", labels) == 4
    off = backends(storage_config(f"file://{tmp_path}"), mha_pool("page_first"))
    assert off.batch_set_v1(keys, src) == [True] * 3 and off.get_stats() is None
