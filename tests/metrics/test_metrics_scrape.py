"""kvpool.metrics: a real /metrics endpoint on loopback, scraped and checked against stats()."""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import prometheus_client  # in the test extra: CI runs these tests for real
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

import kvpool
import kvpool.metrics as metrics
from kvpool import MemoryFormat
from kvpool.remote import FileStore

SHAPE = torch.Size([2, 4, 16, 8])  # 2048 bytes of float16
DTYPE = torch.float16
FMT = MemoryFormat.KV_2LTD
NBYTES = SHAPE.numel() * DTYPE.itemsize

POOL_GAUGES = {
    "kvpool_pool_total_bytes": "total_bytes",
    "kvpool_pool_used_bytes": "used_bytes",
    "kvpool_pool_free_bytes": "free_bytes",
    "kvpool_pool_objects": "active_objects",
    "kvpool_pool_pinned_objects": "pinned_objects",
    "kvpool_pool_largest_free_block_bytes": "largest_free_block",
    "kvpool_pool_fragmentation_ratio": "fragmentation",
}


@pytest.fixture
def server() -> Iterator[metrics.MetricsServer]:
    srv = metrics.start_http_server(0)  # the system picks a free port
    try:
        yield srv
    finally:
        srv.close()


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """GET the endpoint; {sample name: [(labels, value), ...]}."""
    with urllib.request.urlopen(url, timeout=30) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def value(samples: dict, metric: str, /, **labels: str) -> float:
    """The one sample of ``metric`` whose labels include ``labels``."""
    found = [v for lab, v in samples.get(metric, []) if labels.items() <= lab.items()]
    assert len(found) == 1, f"{metric} {labels}: {found}"
    return found[0]


def absent(samples: dict, metric: str, /, **labels: str) -> bool:
    """True when no sample of ``metric`` has ``labels``."""
    return not [v for lab, v in samples.get(metric, []) if labels.items() <= lab.items()]


def test_server_listens_on_loopback_by_default(server: metrics.MetricsServer) -> None:
    assert server.addr == "127.0.0.1"
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}/metrics"


def test_scraped_pool_gauges_equal_stats(server: metrics.MetricsServer) -> None:
    shm_name = f"/kvpool-metrics-{uuid.uuid4().hex[:12]}"
    extent = kvpool.MixedMemoryAllocator(4 << 20)
    shared = kvpool.MixedMemoryAllocator(1 << 20, shm_name=shm_name)
    paged = kvpool.MixedMemoryAllocator(
        1 << 20, use_paging=True, shapes=[SHAPE], dtypes=[DTYPE], fmt=FMT
    )
    try:
        objs = [extent.allocate(SHAPE, DTYPE, FMT) for _ in range(5)]
        objs[1].ref_count_down()  # two holes: fragmentation above zero
        objs[3].ref_count_down()
        objs[4].pin()
        pages = [paged.allocate(SHAPE, DTYPE, FMT) for _ in range(3)]
        pages[0].pin()
        one = shared.allocate(torch.Size([100]), torch.uint8, FMT)

        samples = scrape(server.url)
        for pool in (extent, shared, paged):
            labels = metrics.pool_labels(pool)
            stats = pool.stats()
            for name, field in POOL_GAUGES.items():
                got = value(samples, name, **labels)
                assert got == pytest.approx(getattr(stats, field)), (name, labels, stats)
            held = stats.held_by_views_bytes
            assert value(samples, "kvpool_pool_view_held_bytes", **labels) == held
        assert metrics.pool_labels(shared)["name"] == shm_name
        assert metrics.pool_labels(extent)["policy"] == "extent"
        assert metrics.pool_labels(paged)["policy"] == "paged"
        assert metrics.pool_labels(extent)["pool"] == "MixedMemoryAllocator"
        assert value(samples, "kvpool_pool_fragmentation_ratio", **metrics.pool_labels(extent)) > 0
        assert value(samples, "kvpool_pool_pinned_objects", **metrics.pool_labels(paged)) == 1
        assert value(samples, "kvpool_pools") >= 3

        # Freeing changes the next scrape; closing removes the pool from it.
        extent_labels = metrics.pool_labels(extent)
        objs[4].unpin()
        for obj in (objs[0], objs[2], objs[4]):
            obj.ref_count_down()
        samples = scrape(server.url)
        assert value(samples, "kvpool_pool_objects", **extent_labels) == 0
        assert value(samples, "kvpool_pool_used_bytes", **extent_labels) == 0
        assert value(samples, "kvpool_pool_pinned_objects", **extent_labels) == 0
        extent.close()
        samples = scrape(server.url)
        assert absent(samples, "kvpool_pool_total_bytes", **extent_labels)
        assert not absent(samples, "kvpool_pool_total_bytes", **metrics.pool_labels(paged))
        pages[0].unpin()
        for obj in (*pages, one):
            obj.ref_count_down()
    finally:
        for pool in (extent, shared, paged):
            pool.close()


def test_scraped_store_counters(server: metrics.MetricsServer, tmp_path: Path) -> None:
    with kvpool.MixedMemoryAllocator(1 << 20) as pool, FileStore(tmp_path) as store:
        objs = [pool.allocate(SHAPE, DTYPE, FMT) for _ in range(5)]
        store.put("a", objs[0])
        store.put("b", objs[1])
        store.batched_put(["c", "d", "e"], objs[2:])
        got = [store.get("a", pool), store.get("missing", pool)]
        got += store.batched_get(["b", "c", "nope"], pool)
        with pytest.raises(kvpool.InvalidArgumentError):  # a layout mismatch
            store.get("a", pool, torch.Size([3]), torch.uint8)
        assert store.exists("a")
        assert store.batched_delete(["a", "b", "zzz"]) == 2

        samples = scrape(server.url)
        labels = {"store": "FileStore", "name": store.counters.name}
        assert value(samples, "kvpool_store_puts_total", **labels) == 5
        assert value(samples, "kvpool_store_gets_total", **labels) == 5
        assert value(samples, "kvpool_store_get_misses_total", **labels) == 2
        assert value(samples, "kvpool_store_put_bytes_total", **labels) == 5 * NBYTES
        assert value(samples, "kvpool_store_get_bytes_total", **labels) == 3 * NBYTES
        ops = {
            "put": 2,
            "batched_put": 3,
            "get": 2,
            "batched_get": 3,
            "exists": 1,
            "batched_delete": 3,
        }
        for op, n in ops.items():
            assert value(samples, "kvpool_store_operations_total", op=op, **labels) == n
        assert (
            value(
                samples,
                "kvpool_store_errors_total",
                op="get",
                type="InvalidArgumentError",
                **labels,
            )
            == 1
        )
        # One latency sample per call: three gets (the failed one too), two puts.
        calls = {"get": 3, "put": 2, "batched_put": 1, "batched_get": 1}
        for op, n in calls.items():
            assert value(samples, "kvpool_store_latency_seconds_count", op=op, **labels) == n
            assert (
                value(samples, "kvpool_store_latency_seconds_bucket", op=op, le="+Inf", **labels)
                == n
            )
            assert value(samples, "kvpool_store_latency_seconds_sum", op=op, **labels) > 0
        buckets = sorted(
            (float(lab["le"]), v)
            for lab, v in samples["kvpool_store_latency_seconds_bucket"]
            if lab.get("name") == store.counters.name and lab["op"] == "get"
        )
        counts = [v for _, v in buckets]
        assert counts == sorted(counts)  # cumulative

        for obj in objs + [g for g in got if g is not None]:
            obj.ref_count_down()
    samples = scrape(server.url)
    assert absent(samples, "kvpool_store_puts_total", name=store.counters.name)


def test_install_adds_the_collector_to_a_registry_once() -> None:
    registry = prometheus_client.CollectorRegistry()
    assert metrics.install(registry) is registry
    metrics.install(registry)  # a second call does not register a duplicate
    with kvpool.MixedMemoryAllocator(1 << 20) as pool:
        text = prometheus_client.generate_latest(registry).decode()
        labels = metrics.pool_labels(pool)
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
        }
        key = ("kvpool_pool_total_bytes", tuple(sorted(labels.items())))
        assert samples[key] == pool.stats().total_bytes


@pytest.mark.parametrize("port", [-1, 65536, 1.5, "9400", True, None])
def test_bad_port_is_a_typed_error(port: object) -> None:
    with pytest.raises(kvpool.InvalidArgumentError, match="port"):
        metrics.start_http_server(port)  # type: ignore[arg-type]


def test_a_port_in_use_is_an_os_error(server: metrics.MetricsServer) -> None:
    with pytest.raises(OSError):
        metrics.start_http_server(server.port)
