"""Stores in a local directory: one file per entry (FileStore and its asyncio form).

``store`` holds the store (its read side in ``reads``), ``io`` the
file-system primitives it stands on, ``aio`` the asyncio wrapper;
``bound`` and ``evict`` the index and the evictions of a bounded store
(``max_bytes``), ``direct`` its ``O_DIRECT`` mode, ``ranges`` its calls
on registered rows by address.
"""

from kvpool.remote.file.aio import AsyncFileStore
from kvpool.remote.file.store import FileStore

__all__ = ["AsyncFileStore", "FileStore"]
