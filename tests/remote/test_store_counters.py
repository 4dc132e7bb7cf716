"""Store counters (kvpool.remote.counters): every store counts its calls once, by itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kvpool
from kvpool.remote import CorruptEntryError, FileStore, RemoteStore
from kvpool.remote.base import live_stores
from kvpool.remote.counters import LATENCY_BUCKETS, OPERATIONS, StoreCounters

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, fill

NBYTES = KV_SHAPE.numel() * KV_DTYPE.itemsize


def _objs(pool: kvpool.TensorMemoryAllocator, n: int) -> list[kvpool.MemoryObj]:
    objs = [pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT) for _ in range(n)]
    for i, obj in enumerate(objs):
        fill(obj, i)
    return objs


def _free(objs: list[kvpool.MemoryObj | None]) -> None:
    for obj in objs:
        if obj is not None:
            obj.ref_count_down()


def test_every_store_counts_each_entry_once(
    store: RemoteStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    objs = _objs(pool, 4)
    store.put("k0", objs[0])
    store.batched_put(["k1", "k2", "k3"], objs[1:])
    got = [store.get("k0", pool), store.get("absent", pool)]
    got += store.batched_get(["k1", "k2", "absent"], pool)
    assert store.batched_exists(["k0", "absent"]) == [True, False]
    assert store.head("k0") is not None
    assert store.delete("k0")
    snap = store.counters.snapshot()
    assert snap["put"].entries == 1 and snap["put"].nbytes == NBYTES
    assert snap["batched_put"].calls == 1
    assert snap["batched_put"].entries == 3 and snap["batched_put"].nbytes == 3 * NBYTES
    assert snap["get"].calls == 2 and snap["get"].misses == 1 and snap["get"].nbytes == NBYTES
    assert snap["batched_get"].entries == 3 and snap["batched_get"].misses == 1
    assert snap["batched_get"].nbytes == 2 * NBYTES
    assert snap["batched_exists"].entries == 2
    assert snap["head"].calls == 1 and snap["delete"].calls == 1
    # The batched forms did not count their keys a second time as single calls.
    assert "exists" not in snap
    for counts in snap.values():
        assert sum(counts.buckets) == counts.calls
        assert counts.seconds > 0
        assert not counts.errors
    _free(objs + got)


def test_threaded_batches_count_once(tmp_path: Path, pool: kvpool.TensorMemoryAllocator) -> None:
    with FileStore(tmp_path, io_threads=4) as store:
        objs = _objs(pool, 8)
        store.batched_put([f"k{i}" for i in range(8)], objs)
        got = store.batched_get([f"k{i}" for i in range(8)], pool)
        snap = store.counters.snapshot()
        assert set(snap) == {"batched_put", "batched_get"}, snap
        assert snap["batched_put"].entries == 8 and snap["batched_put"].calls == 1
        assert snap["batched_get"].entries == 8 and snap["batched_get"].nbytes == 8 * NBYTES
        _free(objs + got)


def test_errors_are_counted_by_type(tmp_path: Path, pool: kvpool.TensorMemoryAllocator) -> None:
    with FileStore(tmp_path) as store:
        obj = _objs(pool, 1)[0]
        store.put("k", obj)
        with pytest.raises(kvpool.InvalidArgumentError):
            store.get("k", pool, torch.Size([3]), torch.uint8)  # layout mismatch
        with pytest.raises(kvpool.InvalidArgumentError):
            store.put(12, obj)  # type: ignore[arg-type]
        next(p for p in tmp_path.rglob("*") if p.is_file()).write_bytes(b"junk")
        with pytest.raises(CorruptEntryError):
            store.get("k", pool)
        snap = store.counters.snapshot()
        assert snap["get"].errors == {"InvalidArgumentError": 1, "CorruptEntryError": 1}
        assert snap["get"].entries == 0 and snap["get"].nbytes == 0
        assert snap["put"].errors == {"InvalidArgumentError": 1}
        assert snap["put"].calls == 2 and snap["put"].entries == 1
        obj.ref_count_down()


def test_every_store_counts_a_refused_keyword_once_on_each_call(
    store: RemoteStore, pool: kvpool.TensorMemoryAllocator
) -> None:
    obj = _objs(pool, 1)[0]
    calls = {
        "put": ("k", obj),
        "get": ("k", pool),
        "exists": ("k",),
        "delete": ("k",),
        "head": ("k",),
        "batched_put": (["k"], [obj]),
        "batched_get": (["k"], pool),
        "batched_exists": (["k"],),
        "batched_delete": (["k"],),
        "delete_prefix": ("k",),
    }
    assert set(calls) == set(OPERATIONS)
    try:
        for name, args in calls.items():
            with pytest.raises(kvpool.ArgumentTypeError, match="unexpected keyword"):
                getattr(store, name)(*args, bogus=1)
    finally:
        obj.ref_count_down()
    snap = store.counters.snapshot()
    assert {name: snap[name].errors for name in calls} == {
        name: {"ArgumentTypeError": 1} for name in calls
    }


def test_a_subclass_calling_super_counts_once(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    class Traced(FileStore):
        def put(self, key: object, memory_obj: kvpool.MemoryObj) -> None:  # type: ignore[override]
            super().put(key, memory_obj)  # type: ignore[arg-type]

    with Traced(tmp_path) as store:
        obj = _objs(pool, 1)[0]
        store.put("k", obj)
        store.batched_put(["a", "b"], [obj, obj])
        snap = store.counters.snapshot()
        assert snap["put"].calls == 1 and snap["put"].entries == 1
        assert snap["batched_put"].entries == 2 and "exists" not in snap
        assert store.counters.kind == "Traced"
        obj.ref_count_down()


def test_open_stores_are_listed_until_closed(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    assert store in live_stores()
    store.close()
    assert store not in live_stores()


def test_counters_observe_and_snapshot() -> None:
    c = StoreCounters("X")
    assert c.kind == "X" and c.name.startswith("X-")
    assert StoreCounters("X").name != c.name
    c.observe("get", 0.0, entries=1, nbytes=10)
    c.observe("get", LATENCY_BUCKETS[-1] * 2, entries=1, misses=1)
    c.observe("get", LATENCY_BUCKETS[3], error=ValueError("x"))
    snap = c.snapshot()["get"]
    assert (snap.calls, snap.entries, snap.nbytes, snap.misses) == (3, 2, 10, 1)
    assert snap.errors == {"ValueError": 1}
    assert snap.buckets[0] == 1 and snap.buckets[-1] == 1 and snap.buckets[3] == 1
    snap.calls = 99  # a copy
    assert c.snapshot()["get"].calls == 3
    assert "put" in OPERATIONS and "batched_get" in OPERATIONS
