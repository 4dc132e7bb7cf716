"""FileStore(direct_io=True): O_DIRECT puts and gets of aligned rows, entries every store reads.

On a real file system: the page cache is bypassed (checked with
``mincore`` on a disk directory), unaligned memory goes buffered and is
counted, the padded header keeps entries readable by stores opened
without ``direct_io`` and the other way round, damaged entries are still
named, and a file system without O_DIRECT is refused at open (faked).
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import mmap
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import kvpool
from kvpool.errors import CorruptEntryError, FeatureUnavailableError
from kvpool.pool.borrowed import BorrowedMemory
from kvpool.remote import AsyncFileStore, FileStore
from kvpool.remote.file import direct
from kvpool.remote.file.aio import on_tmpfs
from kvpool.remote.placement import Placement

ROW = 64 << 10  # a page-aligned row of 64 KiB
ROWS = 8
SHAPE = [torch.Size([ROW])]
DTYPES = [torch.uint8]
FMT = kvpool.MemoryFormat.UNDEFINED


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    """A directory whose file system takes O_DIRECT (skips with the reason where it does not)."""
    path = tmp_path / "direct"
    path.mkdir()
    try:
        direct.probe(str(path))
    except FeatureUnavailableError as exc:
        pytest.skip(f"the file system of {tmp_path} has no O_DIRECT: {exc}")
    return path


class Rows:
    """Page-aligned rows (an anonymous mapping), lent as memory objects or placed for gets."""

    def __init__(self, seed: int = 0) -> None:
        self.buffer = mmap.mmap(-1, ROWS * ROW)
        self.lender = BorrowedMemory(self.buffer)
        for i in range(ROWS):
            self.buffer[i * ROW : (i + 1) * ROW] = bytes([(seed + i) % 251 + 1]) * ROW

    def address(self, i: int, offset: int = 0) -> int:
        return self.lender.address + i * ROW + offset

    def lend(self, i: int, offset: int = 0, nbytes: int = ROW) -> Any:
        return self.lender.lend(self.address(i, offset), nbytes)

    def row(self, i: int) -> bytes:
        return self.buffer[i * ROW : (i + 1) * ROW]

    def placement(self, keys: list[str], offset: int = 0, nbytes: int = ROW) -> Placement:
        place = Placement()
        for i, key in enumerate(keys):
            place.add(key, self.lender, self.address(i, offset), nbytes)
        return place


def _put_rows(store: FileStore, rows: Rows, keys: list[str]) -> None:
    objs = [rows.lend(i) for i in range(len(keys))]
    try:
        store.batched_put(keys, objs)
    finally:
        for obj in objs:
            obj.ref_count_down()


def _get_rows(store: Any, keys: list[str], into: Rows) -> list[bool]:
    got = store.batched_get(keys, into.placement(keys), SHAPE, DTYPES, FMT)
    for obj in got:
        if obj is not None:
            obj.ref_count_down()
    return [obj is not None for obj in got]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def cached_pages(path: str) -> int:
    """How many pages of the file ``path`` are in the page cache (mincore; none are touched)."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        pages = -(-size // mmap.PAGESIZE)
        vec = ctypes.create_string_buffer(pages)
        try:
            assert _libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw)


def _drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_aligned_rows_move_with_o_direct(directory: Path) -> None:
    rows, back = Rows(1), Rows(100)
    keys = [f"row-{i}" for i in range(ROWS)]
    with FileStore(directory, direct_io=True) as store:
        _put_rows(store, rows, keys)
        assert _get_rows(store, keys, back) == [True] * ROWS
        assert bytes(back.buffer) == bytes(rows.buffer)
        counts = store.counters.snapshot()
        assert "put_buffered" not in counts and "get_buffered" not in counts
        # The payload starts at a page boundary: a 4 KiB header.
        assert os.path.getsize(store.path("row-0")) == direct.ALIGN + ROW


@pytest.mark.skipif(
    on_tmpfs(os.environ.get("TMPDIR", "/tmp")),
    reason="the temporary directory is on tmpfs, which is page cache itself",
)
def test_the_page_cache_is_bypassed_on_a_disk(directory: Path) -> None:
    rows, back = Rows(1), Rows(100)
    with FileStore(directory, direct_io=True) as fast, FileStore(directory) as plain:
        _put_rows(fast, rows, ["d"])
        _put_rows(plain, rows, ["b"])
        assert cached_pages(fast.path("d")) == 0
        assert cached_pages(plain.path("b")) > 0  # the check sees a buffered write
        _drop_cache(plain.path("b"))
        assert _get_rows(fast, ["b", "d"], back) == [True, True]
        assert cached_pages(fast.path("d")) == 0
        assert _get_rows(plain, ["d"], back) == [True]
        assert cached_pages(fast.path("d")) > 0  # ... and a buffered read


def test_unaligned_memory_goes_buffered_and_is_counted(directory: Path) -> None:
    rows, back = Rows(3), Rows(0)
    with FileStore(directory, direct_io=True) as store:
        objs = [rows.lend(0, offset=64, nbytes=ROW - 64), rows.lend(1, nbytes=ROW - 512)]
        store.batched_put(["shifted", "short"], objs)
        for obj in objs:
            obj.ref_count_down()
        counts = store.counters.snapshot()
        assert counts["put_buffered"].nbytes == 2 * ROW - 576
        place = back.placement(["shifted"], offset=64, nbytes=ROW - 64)
        got = store.get("shifted", place, [torch.Size([ROW - 64])], DTYPES, FMT)
        assert got is not None
        got.ref_count_down()
        assert back.buffer[64:ROW] == rows.buffer[64:ROW]
        assert store.counters.snapshot()["get_buffered"].nbytes == ROW - 64
        got = store.get("shifted", place)  # without the layout: the careful path, buffered
        assert got is not None
        got.ref_count_down()
        assert store.counters.snapshot()["get_buffered"].nbytes == 2 * (ROW - 64)


def test_entries_are_read_by_stores_with_and_without_direct_io(
    directory: Path, pool: kvpool.TensorMemoryAllocator
) -> None:
    rows, back = Rows(5), Rows(0)
    with FileStore(directory, direct_io=True) as fast, FileStore(directory) as plain:
        _put_rows(fast, rows, ["from-direct"])
        _put_rows(plain, rows, ["from-plain"])
        for reader in (fast, plain):
            for key in ("from-direct", "from-plain"):
                back.buffer[:ROW] = bytes(ROW)
                assert _get_rows(reader, [key, "absent"], back) == [True, False]
                assert back.row(0) == rows.row(0), (reader, key)
                got = reader.get(key, back.placement([key]))  # the layout as stored
                assert got is not None and got.get_size() == ROW
                got.ref_count_down()
                info = reader.head(key)
                assert info is not None and info.size == ROW and info.fmt is FMT
        assert fast.head("from-direct").header_size == direct.ALIGN
        assert plain.head("from-plain").header_size < direct.ALIGN


def test_checksums_and_damage_with_direct_io(directory: Path) -> None:
    rows, back = Rows(7), Rows(0)
    with FileStore(directory, direct_io=True, checksum=True) as store:
        _put_rows(store, rows, ["a", "b", "c"])
        assert _get_rows(store, ["a"], back) == [True] and back.row(0) == rows.row(0)
        path = store.path("b")
        with open(path, "r+b") as f:  # one payload byte flipped
            f.seek(direct.ALIGN + 100)
            byte = f.read(1)
            f.seek(direct.ALIGN + 100)
            f.write(bytes([byte[0] ^ 0xFF]))
        with pytest.raises(CorruptEntryError, match="CRC"):
            _get_rows(store, ["b"], back)
        os.truncate(store.path("c"), direct.ALIGN + ROW - 4096)
        with pytest.raises(CorruptEntryError, match="truncated"):
            _get_rows(store, ["c"], back)


def test_a_bounded_direct_store_counts_the_padded_entries(directory: Path) -> None:
    rows = Rows(2)
    evicted: list[list[bytes]] = []
    entry = direct.ALIGN + ROW
    with FileStore(
        directory, direct_io=True, max_bytes=3 * entry, on_evict=evicted.append
    ) as store:
        _put_rows(store, rows, [f"k{i}" for i in range(5)])
        assert store.bound.used == 3 * entry and evicted == [[b"k0", b"k1"]]


def test_the_asyncio_store_takes_direct_io(directory: Path) -> None:
    rows, back = Rows(9), Rows(0)
    keys = [f"r{i}" for i in range(ROWS)]

    async def main() -> list[bool]:
        store = AsyncFileStore(directory, direct_io=True, threads=2)
        try:
            objs = [rows.lend(i) for i in range(ROWS)]
            try:
                await store.batched_put(keys, objs)
            finally:
                for obj in objs:
                    obj.ref_count_down()
            got = await store.batched_get(keys, back.placement(keys), SHAPE, DTYPES, FMT)
            for obj in got:
                if obj is not None:
                    obj.ref_count_down()
            assert "put_buffered" not in store.store.counters.snapshot()
            return [obj is not None for obj in got]
        finally:
            await store.aclose()

    assert asyncio.run(main()) == [True] * ROWS
    assert bytes(back.buffer) == bytes(rows.buffer)


def test_a_platform_without_o_direct_is_refused_at_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(direct, "_O_DIRECT", 0)
    with pytest.raises(FeatureUnavailableError, match="without direct_io") as info:
        FileStore(tmp_path / "s", direct_io=True)
    assert str(tmp_path / "s") in str(info.value)
    FileStore(tmp_path / "s").close()  # without direct_io it opens


def test_a_file_system_refusing_o_direct_is_refused_at_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def no_direct(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_DIRECT:  # as overlayfs or an old tmpfs answer
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_direct)
    with pytest.raises(FeatureUnavailableError, match=r"refuses O_DIRECT .*Invalid argument") as e:
        FileStore(tmp_path / "s", direct_io=True)
    assert e.value.errno == errno.EINVAL
    assert not any(n.startswith(".tmp-") for n in os.listdir(tmp_path / "s"))


def test_checksummed_headers_leave_the_padded_cache_to_the_shared_ones(directory: Path) -> None:
    # Each checksummed header is one entry's own: cached, it would only push the
    # headers every put shares out of the cache.
    rows = Rows()
    direct._padded.clear()
    with FileStore(directory, direct_io=True, checksum=True) as store:
        _put_rows(store, rows, [f"k{i}" for i in range(ROWS)])
        assert _get_rows(store, [f"k{i}" for i in range(ROWS)], Rows(seed=9)) == [True] * ROWS
    assert not [h for h in direct._padded if h[6] & 1], "a payload-CRC header was cached"
