"""A bounded FileStore (max_bytes): least recently used entries evicted, reported, never lost.

Real files in a real directory: the index built at open from the files'
times, the hits that keep an entry, evictions reported to ``on_evict`` and
counted, entries larger than the bound refused, a batch's own entries
protected, an evicted file still read whole by a reader that opened it,
another process's newer entry never evicted, and the index checked
(``bound.problems()``) after random operations from several threads.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import random
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvpool
from kvpool.errors import ArgumentTypeError, InvalidArgumentError
from kvpool.remote import AsyncFileStore, FileStore, open_store
from kvpool.remote.file.io import open_entry

from .conftest import KV_DTYPE, KV_FMT, KV_SHAPE, fill

KV_BYTES = KV_SHAPE.numel() * KV_DTYPE.itemsize


def _entry_size(tmp_path: Path, pool: kvpool.TensorMemoryAllocator) -> int:
    """The file size of one KV_SHAPE entry (header included)."""
    with FileStore(tmp_path / "size") as store:
        obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        store.put("x", obj)
        obj.ref_count_down()
        return os.path.getsize(store.path("x"))


def _put(
    store: FileStore,
    pool: kvpool.TensorMemoryAllocator,
    *keys: str,
    seed: int = 0,
    shape: torch.Size = KV_SHAPE,
) -> None:
    """Put one object per key (one put, or one batched put), each filled with its seed."""
    objs = []
    for i in range(len(keys)):
        obj = pool.allocate(shape, KV_DTYPE, KV_FMT)
        assert obj is not None
        obj.byte_array[:] = bytes([(seed + i) % 251]) * obj.get_size()
        objs.append(obj)
    try:
        if len(keys) == 1:
            store.put(keys[0], objs[0])
        else:
            store.batched_put(list(keys), objs)
    finally:
        for obj in objs:
            obj.ref_count_down()


def _stored(store: FileStore) -> set[str]:
    return {n[1:] for n in os.listdir(store.directory) if n.startswith("k")}


@pytest.fixture
def size(tmp_path: Path, pool: kvpool.TensorMemoryAllocator) -> int:
    return _entry_size(tmp_path, pool)


def test_puts_evict_the_least_recently_used_and_report_them(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int
) -> None:
    evicted: list[list[bytes]] = []
    with FileStore(tmp_path / "s", max_bytes=3 * size, on_evict=evicted.append) as store:
        for key in "abc":
            _put(store, pool, key)
        assert evicted == [] and store.bound.used == 3 * size
        _put(store, pool, "d")
        assert evicted == [[b"a"]]
        assert _stored(store) == {"b", "c", "d"}
        _put(store, pool, "e", "f")  # one batch: one report of both
        assert evicted[1:] == [[b"b", b"c"]]
        assert _stored(store) == {"d", "e", "f"} and len(store.bound) == 3
        evict = store.counters.snapshot()["evict"]
        assert (evict.entries, evict.nbytes, evict.misses) == (3, 3 * size, 0)
        assert store.bound.problems() == []


def _touch_get(store: FileStore, pool: Any, key: str) -> None:
    got = store.get(key, pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert got is not None
    got.ref_count_down()


def _touch_batched_get(store: FileStore, pool: Any, key: str) -> None:
    got = store.batched_get([key, "absent"], pool, KV_SHAPE, KV_DTYPE, KV_FMT)
    assert got[0] is not None and got[1] is None
    got[0].ref_count_down()


def _touch_get_stored_layout(store: FileStore, pool: Any, key: str) -> None:
    got = store.get(key, pool)
    assert got is not None
    got.ref_count_down()


@pytest.mark.parametrize(
    "touch",
    [
        _touch_get,
        _touch_batched_get,
        _touch_get_stored_layout,
        lambda store, pool, key: store.exists(key),
        lambda store, pool, key: store.batched_exists(["absent", key]),
    ],
    ids=["get", "batched_get", "get-stored-layout", "exists", "batched_exists"],
)
def test_hits_keep_an_entry(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int, touch: Any
) -> None:
    with FileStore(tmp_path / "s", max_bytes=3 * size) as store:
        for key in "abc":
            _put(store, pool, key)
        touch(store, pool, "a")  # "a" becomes the most recently used
        _put(store, pool, "d")
        assert _stored(store) == {"a", "c", "d"}
        assert store.bound.problems() == []


def test_deletes_leave_the_index_and_vanished_entries_leave_at_eviction(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int
) -> None:
    evicted: list[list[bytes]] = []
    with FileStore(tmp_path / "s", max_bytes=4 * size, on_evict=evicted.append) as store:
        _put(store, pool, "p-1", "p-2", "q", "r")
        assert store.delete("q") and store.bound.used == 3 * size
        assert store.delete_prefix("p-") == 2 and store.bound.used == size
        _put(store, pool, "a", "b", "c")
        assert evicted == [] and _stored(store) == {"r", "a", "b", "c"}
        # Removed behind the store's back: still counted (the bound errs on
        # the safe side) until its eviction finds it gone.
        os.unlink(store.path("r"))
        assert not store.exists("r") and store.bound.used == 4 * size
        _put(store, pool, "d")
        assert evicted == [[b"r"]] and _stored(store) == {"a", "b", "c", "d"}
        evict = store.counters.snapshot()["evict"]
        assert (evict.entries, evict.misses) == (0, 1)
        assert store.bound.problems() == [] and store.bound.used == 4 * size


def test_the_index_is_built_at_open_from_the_files_times(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int
) -> None:
    directory = tmp_path / "s"
    with FileStore(directory) as plain:
        _put(plain, pool, "old", "new", "mid")
        for key, age in (("old", 300), ("mid", 200), ("new", 100)):
            when = os.path.getmtime(plain.path(key)) - age
            os.utime(plain.path(key), (when, when))
    evicted: list[list[bytes]] = []
    with FileStore(directory, max_bytes=3 * size, on_evict=evicted.append) as store:
        assert len(store.bound) == 3 and store.bound.used == 3 * size
        _put(store, pool, "x")
        _put(store, pool, "y")
        assert evicted == [[b"old"], [b"mid"]]
        assert _stored(store) == {"new", "x", "y"}


def test_a_directory_over_the_bound_is_trimmed_by_the_next_put_not_at_open(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int
) -> None:
    directory = tmp_path / "s"
    with FileStore(directory) as plain:
        _put(plain, pool, *"abcde")
    with FileStore(directory, max_bytes=2 * size) as store:
        got = store.get("a", pool, KV_SHAPE, KV_DTYPE, KV_FMT)  # a reader removes nothing
        assert got is not None
        got.ref_count_down()
        assert _stored(store) == set("abcde")
        _put(store, pool, "f")
        assert _stored(store) == {"a", "f"}  # "a" was read last
        assert store.bound.problems() == []


def test_an_entry_larger_than_the_bound_is_refused(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int
) -> None:
    with FileStore(tmp_path / "s", max_bytes=size - 1) as store:
        with pytest.raises(InvalidArgumentError, match=r"max_bytes of .*raise max_bytes"):
            _put(store, pool, "big")
        with pytest.raises(InvalidArgumentError, match="max_bytes"):
            _put(store, pool, "b1", "b2")
        assert _stored(store) == set() and store.bound.used == 0
    # The others of a batch are still stored.
    small = torch.Size([2, 4, 16, 16])
    with FileStore(tmp_path / "t", max_bytes=size - 1) as store:
        big = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        little = pool.allocate(small, KV_DTYPE, KV_FMT)
        with pytest.raises(InvalidArgumentError):
            store.batched_put(["big", "little"], [big, little])
        assert _stored(store) == {"little"}
        big.ref_count_down()
        little.ref_count_down()


def test_a_batch_never_evicts_what_it_writes(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int, faults: Any
) -> None:
    evicted: list[list[bytes]] = []
    with FileStore(tmp_path / "s", max_bytes=3 * size, on_evict=evicted.append) as store:
        _put(store, pool, "x", "y", "z")  # x is now the least recently used
        during: list[set[str]] = []

        def other_writer() -> None:
            # While the batch below writes its first entry, other puts fill
            # the store three times over: they evict all but the batch's keys.
            for key in ("o1", "o2", "o3"):
                _put(store, pool, key)
            during.append(_stored(store))

        faults.hook("write_before_data", other_writer)
        _put(store, pool, "x", "w")
        assert during == [{"x", "o2", "o3"}], during
        assert {"x", "w"} <= _stored(store)
        assert len(_stored(store)) == 3 and store.bound.used == 3 * size
        assert [b"x"] not in evicted and all(b"x" not in e and b"w" not in e for e in evicted)
        assert store.bound.problems() == []


def test_a_batch_larger_than_the_bound_keeps_its_last_entries(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int
) -> None:
    evicted: list[list[bytes]] = []
    with FileStore(tmp_path / "s", max_bytes=2 * size, on_evict=evicted.append) as store:
        _put(store, pool, *"abcd")
        # Nothing of the batch was evicted while it ran: the bound is kept
        # when it ends, by the least recently used of its entries.
        assert evicted == [[b"a", b"b"]]
        assert _stored(store) == {"c", "d"} and store.bound.problems() == []


def test_an_evicted_file_is_read_whole_by_a_reader_that_opened_it(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int
) -> None:
    with FileStore(tmp_path / "s", max_bytes=size) as store:
        src = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        data = fill(src, 7)
        store.put("a", src)
        src.ref_count_down()
        fd = open_entry(store.path("a"), lambda: "test")  # a reader holds it (LOCK_SH)
        assert fd is not None
        try:
            for i in range(3):  # evicts "a"; its file is a spare no put may rewrite
                _put(store, pool, f"n{i}", seed=100 + i)
            assert "a" not in _stored(store)
            assert os.pread(fd, size, 0)[-KV_BYTES:] == data
        finally:
            os.close(fd)


def _rewrite(directory: str, key: str, seed: int) -> None:
    """In another process: put ``key`` with an unbounded store."""
    pool = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
    with FileStore(directory) as store:
        obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        fill(obj, seed)
        store.put(key, obj)
        obj.ref_count_down()


def test_an_entry_another_process_rewrote_is_not_evicted(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int
) -> None:
    evicted: list[list[bytes]] = []
    with FileStore(tmp_path / "s", max_bytes=2 * size, on_evict=evicted.append) as store:
        _put(store, pool, "a", "b")
        # Another process rewrites "a" (least recently used here) after this
        # store recorded it: "a" holds that process's newer entry now.
        child = multiprocessing.get_context("fork").Process(
            target=_rewrite, args=(store.directory, "a", 9)
        )
        child.start()
        child.join(60)
        assert child.exitcode == 0
        newer = Path(store.path("a")).read_bytes()
        _put(store, pool, "c")
        assert Path(store.path("a")).read_bytes() == newer  # not lost
        assert evicted == []  # not reported: it is still stored
        assert store.counters.snapshot()["evict"].misses == 1
        assert len(store.bound) == 2 and store.bound.problems() == []
        _put(store, pool, "d")  # this store's own least recently used goes
        assert evicted == [[b"b"]] and _stored(store) == {"a", "c", "d"}


def _writer(directory: str, max_bytes: int, tag: str, count: int, opened: Any, out: Any) -> None:
    pool = kvpool.TensorMemoryAllocator(torch.empty(1 << 20, dtype=torch.uint8))
    with FileStore(directory, max_bytes=max_bytes) as store:
        opened.wait(60)  # both indexes start empty: neither knows the other's entries
        for i in range(count):
            _put(store, pool, f"{tag}{i}", seed=i)
        out.put((tag, store.bound.used, store.bound.problems()))


def test_processes_on_one_directory_each_keep_their_bound(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int
) -> None:
    directory = str(tmp_path / "shared")
    FileStore(directory).close()
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    opened = ctx.Barrier(2)
    procs = [
        ctx.Process(target=_writer, args=(directory, 5 * size, tag, 40, opened, results))
        for tag in "pq"
    ]
    for proc in procs:
        proc.start()
    out = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert all(used <= 5 * size and problems == [] for _, used, problems in out), out
    names = [n for n in os.listdir(directory) if n.startswith("k")]
    # Each process kept its own last five: the directory holds the sum of the bounds.
    assert sorted(names) == sorted(f"k{t}{i}" for t in "pq" for i in range(35, 40))


def _spares(store: FileStore) -> list[str]:
    return [n for n in os.listdir(store.directory) if n.startswith(".tmp-")]


def test_evicted_files_are_reused_by_the_next_puts(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int
) -> None:
    # On tmpfs a new file allocates its pages: an evicted file kept as a
    # spare saves that (2.5x faster puts of new keys on /dev/shm).
    with FileStore(tmp_path / "s", max_bytes=2 * size) as store:
        _put(store, pool, "a", "b")
        a_inode, b_inode = (os.stat(store.path(k)).st_ino for k in "ab")
        _put(store, pool, "c")  # evicts "a": its file becomes a spare ...
        spares = _spares(store)
        assert len(spares) == 1 and os.stat(Path(store.directory) / spares[0]).st_ino == a_inode
        _put(store, pool, "d")  # ... which this put overwrites (and "b" is the next spare)
        assert os.stat(store.path("d")).st_ino == a_inode
        spares = _spares(store)
        assert len(spares) == 1 and os.stat(Path(store.directory) / spares[0]).st_ino == b_inode
    with FileStore(tmp_path / "t", max_bytes=2 * size, reuse_files=False) as store:
        _put(store, pool, "a", "b")
        _put(store, pool, "c")
        assert _spares(store) == [] and _stored(store) == {"b", "c"}


def test_a_failing_on_evict_fails_no_put(
    tmp_path: Path,
    pool: kvpool.TensorMemoryAllocator,
    size: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(keys: list[bytes]) -> None:
        raise RuntimeError("listener is broken")

    with (
        caplog.at_level(logging.WARNING, logger="kvpool"),
        FileStore(tmp_path / "s", max_bytes=size, on_evict=broken) as store,
    ):
        for key in "abc":
            _put(store, pool, key)
        assert _stored(store) == {"c"}
        assert store.counters.snapshot()["on_evict"].errors == {"RuntimeError": 2}
    logged = [r for r in caplog.records if "on_evict raised" in r.getMessage()]
    assert len(logged) == 1 and "listener is broken" in logged[0].getMessage()


def test_deleting_an_entry_removed_behind_the_stores_back_drops_its_record(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int
) -> None:
    with FileStore(tmp_path / "s", max_bytes=4 * size) as store:
        _put(store, pool, "a", "b")
        os.unlink(store.path("a"))
        assert not store.delete("a") and store.bound.used == size
        assert store.delete_prefix("a") == 0 and store.bound.problems() == []


def test_an_eviction_that_fails_fails_no_put_and_is_tried_again(
    tmp_path: Path,
    pool: kvpool.TensorMemoryAllocator,
    size: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from kvpool.remote.file import evict

    real = evict.entry_calls.evict_entry
    refusals = [PermissionError(13, "Permission denied")]

    def refusing(*args: Any) -> int:
        if refusals:
            raise refusals.pop()
        return real(*args)

    monkeypatch.setattr(evict.entry_calls, "evict_entry", refusing)
    evicted: list[list[bytes]] = []
    with (
        caplog.at_level(logging.WARNING, logger="kvpool"),
        FileStore(tmp_path / "s", max_bytes=2 * size, on_evict=evicted.append) as store,
    ):
        _put(store, pool, "a", "b")
        _put(store, pool, "c")  # "a" cannot be removed: stored all the same
        assert _stored(store) == {"a", "b", "c"} and store.bound.used == 3 * size
        assert store.counters.snapshot()["evict"].errors == {"PermissionError": 1}
        # The one broken invariant, while the file cannot be removed: over the bound.
        assert evicted == [] and store.bound.problems() == [
            f"{3 * size} bytes recorded with no put in flight, over the bound of {2 * size}"
        ]
        _put(store, pool, "d")  # "a" (still the least recently used) and "b" go now
        assert _stored(store) == {"c", "d"} and evicted == [[b"a", b"b"]]
        assert store.bound.problems() == []
    assert any("evicting b'ka' failed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"max_bytes": 0}, InvalidArgumentError, "max_bytes must be greater than 0"),
        ({"max_bytes": -5}, InvalidArgumentError, "max_bytes"),
        ({"max_bytes": "1G"}, ArgumentTypeError, "max_bytes must be an int"),
        ({"max_bytes": True}, ArgumentTypeError, "max_bytes"),
        ({"max_bytes": 1.5e9}, ArgumentTypeError, "max_bytes"),
        ({"max_bytes": 100, "on_evict": "print"}, ArgumentTypeError, "on_evict must be callable"),
        ({"on_evict": print}, InvalidArgumentError, "give max_bytes too"),
    ],
)
def test_bound_options_are_checked(
    tmp_path: Path, options: dict[str, Any], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        FileStore(tmp_path / "s", **options)
    assert not (tmp_path / "s").exists()  # refused before anything was made


def test_the_bound_through_open_store(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int
) -> None:
    evicted: list[list[bytes]] = []
    with open_store(str(tmp_path / "s"), max_bytes=2 * size, on_evict=evicted.append) as store:
        assert isinstance(store, FileStore) and store.bound.max_bytes == 2 * size
        _put(store, pool, *"abc")
        assert evicted == [[b"a"]]


def test_an_asyncio_batch_split_in_parts_is_one_batch(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int
) -> None:
    big = torch.Size([2, 4, 128, 128])  # 256 KiB: a batch of two is split in two parts
    entry = size - KV_BYTES + big.numel() * KV_DTYPE.itemsize
    evicted: list[list[bytes]] = []

    async def main() -> None:
        store = AsyncFileStore(
            tmp_path / "s",
            max_bytes=2 * entry,
            on_evict=evicted.append,
            threads=2,
            batch_threads=2,
        )
        objs = [pool.allocate(big, KV_DTYPE, KV_FMT) for _ in range(4)]
        try:
            await store.batched_put(["a"], objs[:1])
            await store.batched_put(["x"], objs[1:2])  # "a" is the least recently used
            real = store.store.batched_put
            second_done = threading.Event()

            def in_order(keys: list[Any], objects: list[Any]) -> None:
                # The part that rewrites "a" waits for the part that adds "b":
                # "b" then takes the store over its bound while "a" is written.
                if keys == ["a"]:
                    assert second_done.wait(30)
                    real(keys, objects)
                else:
                    real(keys, objects)
                    second_done.set()

            store.store.batched_put = in_order  # type: ignore[method-assign]
            await store.batched_put(["a", "b"], objs[2:])
            assert second_done.is_set()
            assert os.path.getsize(store.store.path("b")) == entry
        finally:
            for obj in objs:
                obj.ref_count_down()
            await store.aclose()

    asyncio.run(main())
    # Not "a" (being written by the batch's other part), but "x".
    assert evicted == [[b"x"]]


# -- the index under random operations ----------------------------------


def _apply(
    store: FileStore,
    pool: Any,
    rng: random.Random,
    keys: list[str],
    shape: torch.Size = KV_SHAPE,
) -> None:
    """One random store call on ``keys`` (what a cache's users do)."""
    op = rng.randrange(8)
    key = rng.choice(keys)
    if op <= 2:
        batch = rng.sample(keys, rng.randint(1, 3))
        _put(store, pool, *batch, seed=rng.randrange(100), shape=shape)
    elif op == 3:
        got = store.batched_get(rng.sample(keys, 2), pool, shape, KV_DTYPE, KV_FMT)
        for obj in got:
            if obj is not None:
                obj.ref_count_down()
    elif op == 4:
        got = store.get(key, pool, shape, KV_DTYPE, KV_FMT)
        if got is not None:
            got.ref_count_down()
    elif op == 5:
        store.batched_exists(rng.sample(keys, 3))
    elif op == 6:
        store.delete(key)
    else:
        store.delete_prefix(key[:2])


def _no_drift(store: FileStore) -> None:
    """The index holds exactly the directory's entries, with their sizes."""
    assert store.bound.problems() == []
    on_disk = {
        n: os.path.getsize(os.path.join(store.directory, n))
        for n in os.listdir(store.directory)
        if n.startswith("k")
    }
    assert store.bound.used == sum(on_disk.values())
    assert len(store.bound) == len(on_disk)
    assert store.bound.used <= store.bound.max_bytes


@pytest.mark.parametrize("seed", range(6))
def test_random_calls_keep_the_index_exact(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int, seed: int
) -> None:
    rng = random.Random(seed)
    keys = [f"{a}{b}" for a in "xyz" for b in "0123"]
    with FileStore(tmp_path / "s", max_bytes=5 * size, io_threads=rng.choice([1, 2])) as store:
        for _ in range(120):
            _apply(store, pool, rng, keys)
            _no_drift(store)


@pytest.mark.parametrize("seed", range(3))
def test_threads_keep_the_index_exact(tmp_path: Path, size: int, seed: int) -> None:
    # Four threads on six keys: puts, deletes and evictions of one key meet
    # all the time.  Without the per-key locks the index drifts from the
    # directory (a file counted twice, or not at all) in most runs.
    big_pool = kvpool.TensorMemoryAllocator(torch.empty(32 << 20, dtype=torch.uint8))
    big = torch.Size([2, 4, 128, 128])  # 256 KiB: long copies, the GIL released meanwhile
    entry = size - KV_BYTES + big.numel() * KV_DTYPE.itemsize
    keys = [f"{a}{b}" for a in "xy" for b in "012"]
    errors: list[BaseException] = []
    with FileStore(tmp_path / "s", max_bytes=4 * entry) as store:

        def worker(worker_seed: int) -> None:
            rng = random.Random(worker_seed)
            try:
                for _ in range(300):
                    _apply(store, big_pool, rng, keys, big)
                    problems = store.bound.problems()
                    assert problems == [], problems
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(seed * 10 + i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        _no_drift(store)
    big_pool.close()


def test_a_delete_racing_a_put_of_its_key_leaves_no_drift(
    tmp_path: Path, pool: kvpool.TensorMemoryAllocator, size: int, faults: Any
) -> None:
    # The interleaving that drifts without the key's lock: the delete
    # unlinks the old file, the put renames its new file and records it,
    # then the delete drops the record - leaving a file nobody counts.
    with FileStore(tmp_path / "s", max_bytes=4 * size) as store:
        _put(store, pool, "x")
        bound = store.bound
        unlinked, recorded = threading.Event(), threading.Event()
        real_forget, real_stored = bound.forget, bound.stored

        def slow_forget(names: Any) -> None:
            unlinked.set()
            assert recorded.wait(10)
            real_forget(names)

        def stored(*args: Any) -> Any:
            try:
                return real_stored(*args)
            finally:
                recorded.set()

        bound.forget, bound.stored = slow_forget, stored  # type: ignore[method-assign]
        deleter = threading.Thread(target=store.delete, args=("x",))

        def start_the_delete() -> None:
            deleter.start()
            unlinked.wait(0.5)  # never set while this put holds the key's lock

        faults.hook("write_before_data", start_the_delete)
        _put(store, pool, "x", seed=5)
        deleter.join(10)
        bound.forget, bound.stored = real_forget, real_stored  # type: ignore[method-assign]
        _no_drift(store)


class _LRUModel:
    """What a bound of ``slots`` entries of one size keeps: the reference for the store."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.keys: OrderedDict[str, None] = OrderedDict()

    def _evict(self, spare: set[str]) -> None:
        for key in list(self.keys):
            if len(self.keys) <= self.slots:
                return
            if key not in spare:
                del self.keys[key]

    def put(self, batch: list[str]) -> None:
        protected = set(batch) if len(batch) > 1 else set()
        for key in batch:
            if key in self.keys and protected:
                self.keys.move_to_end(key)
        for key in batch:
            self.keys.pop(key, None)
            self.keys[key] = None
            self._evict(protected | {key})
        self._evict(set())

    def hit(self, key: str) -> None:
        if key in self.keys:
            self.keys.move_to_end(key)

    def delete(self, key: str) -> None:
        self.keys.pop(key, None)


_KEYS = st.sampled_from(["a", "b", "c", "d", "e", "f"])
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.lists(_KEYS, min_size=1, max_size=4, unique=True)),
        st.tuples(st.sampled_from(["get", "exists", "delete"]), _KEYS),
    ),
    max_size=30,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=_OPS, slots=st.integers(1, 4))
def test_the_store_keeps_what_an_lru_keeps(
    pool: kvpool.TensorMemoryAllocator, size: int, ops: list[Any], slots: int
) -> None:
    model = _LRUModel(slots)
    with (
        tempfile.TemporaryDirectory() as directory,
        FileStore(directory, max_bytes=slots * size) as store,
    ):
        for op, arg in ops:
            if op == "put":
                _put(store, pool, *arg)
                model.put(arg)
            elif op == "get":
                got = store.get(arg, pool, KV_SHAPE, KV_DTYPE, KV_FMT)
                assert (got is not None) == (arg in model.keys)
                if got is not None:
                    got.ref_count_down()
                model.hit(arg)
            elif op == "exists":
                assert store.exists(arg) == (arg in model.keys)
                model.hit(arg)
            else:
                store.delete(arg)
                model.delete(arg)
            assert _stored(store) == set(model.keys), (op, arg)
            _no_drift(store)
