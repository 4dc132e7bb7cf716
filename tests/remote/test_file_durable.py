"""A durable, bounded FileStore whose directory fsync fails: the entry written is still counted.

The entry's file is renamed into place before the directory is synced, so
a failed sync fails the put but leaves the file; the bound records it
first, or the directory would hold bytes ``max_bytes`` never counts.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import pytest

from kvpool.errors import RemoteStoreError
from kvpool.pool.borrowed import BorrowedMemory
from kvpool.remote import FileStore

ROW = 4 << 10


def test_a_failed_directory_fsync_leaves_the_entry_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = mmap.mmap(-1, ROW)
    row[:] = b"\x03" * ROW
    with FileStore(str(tmp_path / "s"), durable=True, max_bytes=1 << 20) as store:
        lender = BorrowedMemory(row)
        store.register_memory(row)

        def failing_fsync(fd: int) -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        monkeypatch.setattr(os, "fsync", failing_fsync)
        with pytest.raises(RemoteStoreError, match="directory fsync"):
            store.put_ranges(["k"], [lender.address], [ROW])
        monkeypatch.undo()
        assert os.path.exists(store.path("k"))  # renamed before the sync failed
        assert store.bound is not None and len(store.bound) == 1
        assert store.bound.used == os.path.getsize(store.path("k"))
        assert store.bound.problems() == []
