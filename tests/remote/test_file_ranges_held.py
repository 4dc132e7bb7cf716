"""FileStore ranges in flight: the memory a call uses stays its own, and a good entry is read once.

A call holds the registered ranges it reads or writes until it returns, so
neither ``unregister_memory`` nor ``close`` from another thread lets the
caller unmap a buffer under it; and an entry written with a CRC is taken
from the one C read, not read again in Python.
"""

from __future__ import annotations

import gc
import mmap
import threading
from pathlib import Path
from typing import Any

import pytest

from kvpool.native import entry as entry_calls
from kvpool.pool.borrowed import BorrowedMemory
from kvpool.remote import FileStore

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
