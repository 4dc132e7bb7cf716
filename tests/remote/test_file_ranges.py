"""FileStore.put_ranges / get_ranges: registered host rows moved with no memory objects.

Real files: rows of an mmap'd buffer (as vLLM's /dev/shm tier is) go to
entries every get reads (a range's entry is a lent row's), ranges outside
registered memory are refused before any I/O, damaged and mis-sized entries
are named, the store lets go of registered memory at close, and the bound,
``direct_io`` and ``io_threads`` parts apply as to batched calls.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest
import torch

import kvpool
from kvpool.errors import (
    ArgumentTypeError,
    CorruptEntryError,
    InvalidArgumentError,
    PoolClosedError,
)
from kvpool.pool.borrowed import BorrowedMemory
from kvpool.remote import FileStore
from kvpool.remote.file import direct
from kvpool.remote.file.parts import SPLIT_MIN_BYTES
from kvpool.remote.placement import Placement

ROW = 16 << 10
FMT = kvpool.MemoryFormat.UNDEFINED


class Rows:
    """``count`` rows of ``size`` bytes in one anonymous mapping, each filled from ``seed``."""

    def __init__(self, count: int, seed: int = 1, size: int = ROW) -> None:
        self.size = size
        self.count = count
        self.buffer = mmap.mmap(-1, count * size)
        self.lender = BorrowedMemory(self.buffer)
        self.base = self.lender.address
        for i in range(count):
            self.buffer[i * size : (i + 1) * size] = bytes([(seed + i) % 251]) * size

    def addresses(self) -> list[int]:
        return [self.base + i * self.size for i in range(self.count)]

    def row(self, i: int) -> bytes:
        return self.buffer[i * self.size : (i + 1) * self.size]


def test_ranges_round_trip(tmp_path: Path) -> None:
    rows, back = Rows(4, seed=1), Rows(5, seed=0)
    keys = ["r0", "r1", "r2", "r3"]
    with FileStore(tmp_path / "s") as store:
        store.register_memory(rows.buffer)
        store.register_memory(back.buffer)
        store.put_ranges(keys, rows.addresses(), [ROW] * 4)
        untouched = back.row(4)
        found = store.get_ranges([*keys, "absent"], back.addresses(), [ROW] * 5)
        assert found == [True, True, True, True, False]
        assert [back.row(i) for i in range(4)] == [rows.row(i) for i in range(4)]
        assert back.row(4) == untouched  # a miss leaves its range as it was
        counts = store.counters.snapshot()
        put, get = counts["put_ranges"], counts["get_ranges"]
        assert (put.calls, put.entries, put.nbytes) == (1, 4, 4 * ROW)
        assert (get.entries, get.nbytes, get.misses) == (5, 4 * ROW, 1)


def test_a_ranges_entry_is_a_lent_rows_entry(tmp_path: Path) -> None:
    rows, back = Rows(2, seed=3), Rows(2, seed=0)
    shape, dtypes = [torch.Size([ROW])], [torch.uint8]
    with FileStore(tmp_path / "s") as store:
        store.register_memory(rows.buffer)
        store.register_memory(back.buffer)
        store.put_ranges(["by-range"], rows.addresses()[:1], [ROW])
        lent = rows.lender.lend(rows.base + ROW, ROW)
        store.put("by-object", lent)
        lent.ref_count_down()
        assert (
            Path(store.path("by-range")).read_bytes()[:64]
            == (Path(store.path("by-object")).read_bytes()[:64])
        )
        place = Placement()
        place.add("by-range", back.lender, back.base, ROW)
        got = store.get("by-range", place, shape, dtypes, FMT)
        assert got is not None and bytes(back.row(0)) == rows.row(0)
        got.ref_count_down()
        assert store.get_ranges(["by-object"], back.addresses()[1:], [ROW]) == [True]
        assert back.row(1) == rows.row(1)


def test_any_entry_of_the_ranges_size_is_read(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    # A KV-shaped entry of 8 KiB is 8 KiB of bytes to a range.
    back = Rows(1, seed=0, size=8192)
    with FileStore(tmp_path / "s", checksum=True) as store:
        store.register_memory(back.buffer)
        obj = pool.allocate(torch.Size([2, 4, 16, 32]), torch.float16, kvpool.MemoryFormat.KV_2LTD)
        obj.byte_array[:] = bytes(range(256)) * 32
        store.put("kv", obj)
        obj.ref_count_down()
        assert store.get_ranges(["kv"], back.addresses(), [8192]) == [True]
        assert back.row(0) == bytes(range(256)) * 32


def test_unregistered_or_bad_ranges_are_refused_before_any_io(tmp_path: Path) -> None:
    rows, other = Rows(2), Rows(1)
    with FileStore(tmp_path / "s") as store:
        store.register_memory(rows.buffer)
        bad: list[tuple[list, list, list, type, str]] = [
            (["a"], [other.base], [ROW], InvalidArgumentError, "not inside memory registered"),
            (["a"], [rows.base + ROW], [ROW + 1], InvalidArgumentError, "register_memory"),
            (["a", "b"], [rows.base], [ROW], InvalidArgumentError, "2 keys, 1 addresses"),
            (["a"], [rows.base], [0], InvalidArgumentError, "a size must be >= 1"),
            (["a"], [float(rows.base)], [ROW], ArgumentTypeError, "an address must be an int"),
            (["a"], [rows.base], [True], ArgumentTypeError, "a size must be an int"),
            ("a", [rows.base], [ROW], ArgumentTypeError, "keys must be a list"),
        ]
        for keys, addresses, sizes, error, match in bad:
            with pytest.raises(error, match=match):
                store.put_ranges(keys, addresses, sizes)
            with pytest.raises(error, match=match):
                store.get_ranges(keys, addresses, sizes)
        assert [n for n in os.listdir(store.directory) if not n.startswith(".")] == []
        store.put_ranges([], [], [])
        assert store.get_ranges([], [], []) == []


def test_mis_sized_and_damaged_entries_are_named(tmp_path: Path) -> None:
    rows, back = Rows(3, seed=5), Rows(3, seed=0)
    with FileStore(tmp_path / "s", checksum=True) as store:
        store.register_memory(rows.buffer)
        store.register_memory(back.buffer)
        store.put_ranges(["a", "b", "c"], rows.addresses(), [ROW] * 3)
        with pytest.raises(CorruptEntryError, match=rf"holds {ROW} bytes, its range {ROW - 8}"):
            store.get_ranges(["a"], back.addresses()[:1], [ROW - 8])
        with open(store.path("b"), "r+b") as f:  # a payload byte flipped
            f.seek(-100, os.SEEK_END)
            byte = f.read(1)
            f.seek(-100, os.SEEK_END)
            f.write(bytes([byte[0] ^ 1]))
        with pytest.raises(CorruptEntryError, match="CRC mismatch"):
            store.get_ranges(["b"], back.addresses()[1:2], [ROW])
        os.truncate(store.path("c"), os.path.getsize(store.path("c")) - 1)
        with pytest.raises(CorruptEntryError, match="truncated"):
            store.get_ranges(["c"], back.addresses()[2:], [ROW])
        errors = store.counters.snapshot()["get_ranges"].errors
        assert errors == {"CorruptEntryError": 3}


def test_registration(tmp_path: Path) -> None:
    rows = Rows(4)
    with FileStore(tmp_path / "s") as store:
        assert store.register_memory(rows.buffer) == (rows.base, 4 * ROW)
        with pytest.raises(InvalidArgumentError, match="overlap"):
            store.register_memory(rows.base + ROW, ROW)
        with pytest.raises(InvalidArgumentError, match="nbytes is required"):
            store.register_memory(rows.base + 8 * ROW)
        with pytest.raises(ArgumentTypeError, match="memory must be"):
            store.register_memory("not memory")
        with pytest.raises(InvalidArgumentError, match="read-only"):
            store.register_memory(b"read only bytes")
        store.unregister_memory(rows.buffer)
        with pytest.raises(InvalidArgumentError, match="no range registered"):
            store.unregister_memory(rows.buffer)
        with pytest.raises(InvalidArgumentError, match="not inside memory registered"):
            store.put_ranges(["a"], [rows.base], [ROW])
        assert store.register_memory(rows.base, 2 * ROW) == (rows.base, 2 * ROW)
        store.put_ranges(["a"], [rows.base + ROW], [ROW])
        store.unregister_memory(rows.base)
        tensor = torch.zeros(ROW, dtype=torch.uint8)
        assert store.register_memory(tensor, 100) == (tensor.data_ptr(), 100)
    with pytest.raises(PoolClosedError):
        store.register_memory(rows.buffer)


def test_close_lets_go_of_registered_memory(tmp_path: Path) -> None:
    # vLLM unmaps its /dev/shm region at shutdown: a store still holding a
    # view of it would keep it exported ("cannot close exported pointers").
    region = mmap.mmap(-1, 2 * ROW)
    store = FileStore(tmp_path / "s")
    store.register_memory(memoryview(region))
    with pytest.raises(BufferError):
        region.close()
    store.close()
    region.close()


def test_a_bounded_store_evicts_and_touches_through_ranges(tmp_path: Path) -> None:
    rows, back = Rows(4, seed=2), Rows(1)
    evicted: list[list[bytes]] = []
    entry = 64 + ROW  # a one-group uint8 header is 64 bytes
    with FileStore(tmp_path / "s", max_bytes=3 * entry, on_evict=evicted.append) as store:
        store.register_memory(rows.buffer)
        store.register_memory(back.buffer)
        addrs = rows.addresses()
        store.put_ranges(["a", "b", "c"], addrs[:3], [ROW] * 3)
        assert store.bound.used == 3 * entry
        assert store.get_ranges(["a"], back.addresses(), [ROW]) == [True]  # "a" is kept
        store.put_ranges(["d"], addrs[3:], [ROW])
        assert evicted == [[b"b"]] and store.bound.problems() == []
        with pytest.raises(InvalidArgumentError, match="max_bytes"):
            store.put_ranges(["big"], [rows.base], [4 * ROW])


def test_direct_io_ranges(tmp_path: Path) -> None:
    path = tmp_path / "d"
    path.mkdir()
    try:
        direct.probe(str(path))
    except kvpool.errors.FeatureUnavailableError as exc:
        pytest.skip(f"the file system of {tmp_path} has no O_DIRECT: {exc}")
    rows, back = Rows(3, seed=4), Rows(3)
    with FileStore(path, direct_io=True) as fast, FileStore(path) as plain:
        for store in (fast, plain):
            store.register_memory(rows.buffer)
            store.register_memory(back.buffer)
        fast.put_ranges(["f0", "f1"], rows.addresses()[:2], [ROW] * 2)
        plain.put_ranges(["p"], rows.addresses()[2:], [ROW])
        assert os.path.getsize(fast.path("f0")) == direct.ALIGN + ROW
        assert fast.get_ranges(["f0", "p"], back.addresses()[:2], [ROW] * 2) == [True, True]
        assert plain.get_ranges(["f1"], back.addresses()[2:], [ROW]) == [True]
        assert [back.row(i) for i in range(3)] == [rows.row(0), rows.row(2), rows.row(1)]
        counts = fast.counters.snapshot()
        assert "put_buffered" not in counts
        assert counts["get_buffered"].nbytes == ROW  # "p" has a 64-byte header: read carefully
        fast.put_ranges(["odd"], [rows.base + 512], [ROW])  # an unaligned row goes buffered
        assert fast.counters.snapshot()["put_buffered"].nbytes == ROW


def test_large_calls_run_in_parts(tmp_path: Path) -> None:
    size = SPLIT_MIN_BYTES
    rows, back = Rows(4, seed=6, size=size), Rows(4, size=size)
    keys = [f"big{i}" for i in range(4)]
    with FileStore(tmp_path / "s", io_threads=2) as store:
        store.register_memory(rows.buffer)
        store.register_memory(back.buffer)
        store.put_ranges(keys, rows.addresses(), [size] * 4)
        assert store.get_ranges(keys, back.addresses(), [size] * 4) == [True] * 4
        assert bytes(back.buffer) == bytes(rows.buffer)
        counts = store.counters.snapshot()
        assert counts["put_ranges"].calls == 1 and counts["get_ranges"].entries == 4


def test_a_refused_keyword_is_counted_as_every_calls_error(tmp_path: Path) -> None:
    with FileStore(tmp_path / "s") as store:
        calls = {"get": ("k",), "put_ranges": ([], [], []), "get_ranges": ([], [], [])}
        for name, args in calls.items():
            with pytest.raises(ArgumentTypeError, match="unexpected keyword"):
                getattr(store, name)(*args, bogus=1)
        snap = store.counters.snapshot()
        assert {name: snap[name].errors for name in calls} == {
            name: {"ArgumentTypeError": 1} for name in calls
        }
