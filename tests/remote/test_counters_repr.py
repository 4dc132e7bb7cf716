"""``repr(store.counters)`` shows the counts (one clause per operation called)."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvpool
from kvpool.errors import CorruptEntryError
from kvpool.remote import FileStore

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, fill

NBYTES = KV_SHAPE.numel() * KV_DTYPE.itemsize


def test_repr_shows_calls_entries_misses_errors_and_bytes(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    with FileStore(tmp_path / "store") as store:
        assert repr(store.counters) == f"<StoreCounters {store.counters.name}: no calls>"
        for key in ("a", "b"):
            src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
            fill(src, 1)
            store.put(key, src)
            src.ref_count_down()
        got = store.get("a", pool)
        assert got is not None
        got.ref_count_down()
        assert store.get("absent", pool) is None
        Path(store.path("bad")).write_bytes(b"not an entry")
        with pytest.raises(CorruptEntryError):
            store.get("bad", pool)
        assert store.exists("a")
        text = repr(store.counters)
    assert text == (
        f"<StoreCounters {store.counters.name}: "
        f"put calls=2 entries=2 bytes={2 * NBYTES}; "
        f"get calls=3 entries=2 misses=1 bytes={NBYTES} errors=CorruptEntryError:1; "
        "exists calls=1 entries=1>"
    )


def test_snapshot_is_documented() -> None:
    doc = kvpool.remote.counters.StoreCounters.snapshot.__doc__ or ""
    assert "OpCounts" in doc and "copies" in doc
