"""FileStore ranges in flight: the memory a call uses stays its own, and a good entry is read once.

A call holds the registered ranges it reads or writes until it returns, so
neither ``unregister_memory`` nor ``close`` from another thread lets the
caller unmap a buffer under it; and an entry written with a CRC is taken
from the one C read, not read again in Python.
"""

from __future__ import annotations

import gc
import mmap
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from kvpool.errors import CorruptEntryError, FeatureUnavailableError
from kvpool.native import entry as entry_calls
from kvpool.pool.borrowed import BorrowedMemory
from kvpool.remote import FileStore
from kvpool.remote.file import direct

ROW = 64 << 10


def _address(buffer: mmap.mmap) -> int:
    """The buffer's address, with no export of it left behind."""
    lender = BorrowedMemory(buffer)
    try:
        return lender.address
    finally:
        del lender
        gc.collect()


@pytest.mark.parametrize("let_go", ["unregister_memory", "close"])
def test_a_get_in_flight_keeps_its_buffer_mapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, let_go: str
) -> None:
    src, dst = mmap.mmap(-1, ROW), mmap.mmap(-1, ROW)
    src[:] = b"\x07" * ROW
    store = FileStore(str(tmp_path / "s"))
    store.register_memory(src)
    store.put_ranges(["k"], [_address(src)], [ROW])
    store.register_memory(dst)
    address = _address(dst)
    entered, go = threading.Event(), threading.Event()
    real = entry_calls.read_entry

    def paused_read(*args: Any) -> Any:
        entered.set()
        go.wait()
        if dst.closed:  # the old fault: the read would write into unmapped memory
            return entry_calls.MISSING, 0
        return real(*args)

    monkeypatch.setattr(entry_calls, "read_entry", paused_read)
    found: list[Any] = []
    reader = threading.Thread(
        target=lambda: found.extend(store.get_ranges(["k"], [address], [ROW]))
    )
    reader.start()
    try:
        entered.wait()
        if let_go == "close":
            store.close()
        else:
            store.unregister_memory(address)
        gc.collect()
        with pytest.raises(BufferError):
            dst.close()
    finally:
        go.set()
        reader.join()
    assert found == [True]
    assert dst[:] == src[:]
    gc.collect()
    dst.close()  # the call returned: the buffer is the caller's again
    store.close()


@pytest.mark.parametrize("checksum", [False, True])
@pytest.mark.parametrize("direct_io", [False, True])
def test_a_good_entry_is_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checksum: bool, direct_io: bool
) -> None:
    path = tmp_path / "s"
    path.mkdir()
    if direct_io:
        try:
            direct.probe(str(path))
        except FeatureUnavailableError as exc:
            pytest.skip(f"the file system of {tmp_path} has no O_DIRECT: {exc}")
    careful: list[bytes] = []
    real = FileStore._read_range_careful

    def counted_careful(store: FileStore, kb: bytes, address: int, nbytes: int) -> bool:
        careful.append(kb)
        return real(store, kb, address, nbytes)

    monkeypatch.setattr(FileStore, "_read_range_careful", counted_careful)
    src, dst = mmap.mmap(-1, ROW), mmap.mmap(-1, ROW)
    src[:] = b"\x05" * ROW
    with FileStore(str(path), checksum=checksum, direct_io=direct_io) as store:
        store.register_memory(src)
        store.register_memory(dst)
        store.put_ranges(["k"], [_address(src)], [ROW])
        assert store.get_ranges(["k"], [_address(dst)], [ROW]) == [True]
        assert dst[:] == src[:] and careful == []
        if checksum:  # a damaged payload still fails the fast check, and the careful read names it
            with open(store.path("k"), "r+b") as f:
                f.seek(-1, os.SEEK_END)
                f.write(b"\x06")
            with pytest.raises(CorruptEntryError, match="CRC"):
                store.get_ranges(["k"], [_address(dst)], [ROW])
            assert careful == [b"k"]
