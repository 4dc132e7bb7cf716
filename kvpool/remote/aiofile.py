"""AsyncFileStore: FileStore for asyncio code, its calls run in a few threads.

Files have no readiness an event loop could wait for (a read of a regular
file never returns "try again"), so each call of the underlying
:class:`~kvpool.remote.filestore.FileStore` runs in a small thread pool
(:func:`~kvpool.remote.aiobase.offload`): the same zero-copy ``writev``
and one-copy ``preadv`` as the blocking store, off the loop.  The cost of
the hop (submitting to a thread and waking the loop) is measured by
``kvpool bench --only remote_put_get`` (``async file get`` next to the
blocking get).

Cancellation: the call still finishes in its thread (a file operation
cannot be interrupted halfway without leaving a torn state), and an
object a cancelled ``get`` allocated is freed there when it does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from kvpool.checks import check_int
from kvpool.formats import MemoryFormat
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.aiobase import AsyncRemoteStore, offload
from kvpool.remote.base import Key, discard
from kvpool.remote.filestore import FileStore
from kvpool.remote.header import EntryInfo

__all__ = ["AsyncFileStore"]


def _discard_all(objs: list[MemoryObj | None]) -> None:
    for obj in objs:
        discard(obj)


class AsyncFileStore(AsyncRemoteStore):
    """A :class:`FileStore` whose calls are awaited (run in ``threads`` threads).

    Args:
        directory: as for ``FileStore``.
        threads: threads running the calls (calls beyond that wait their turn).
        **options: the other ``FileStore`` options (``checksum``,
            ``durable``, ``reuse_files``, ``cleanup_temp_age_s``).

    Attributes:
        store: the underlying blocking store (its ``path``, ``cleanup_temp``...).

    Raises:
        As ``FileStore``; InvalidArgumentError for a bad ``threads``.
    """

    def __init__(
        self, directory: str | os.PathLike[str], *, threads: int = 4, **options: Any
    ) -> None:
        check_int("threads", threads, low=1, high=256)
        self.store = FileStore(directory, io_threads=1, **options)
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="kvpool-AsyncFileStore")

    @property
    def directory(self) -> str:
        """The store's directory (absolute)."""
        return self.store.directory

    async def put(self, key: Key, memory_obj: MemoryObj) -> None:
        """Store ``memory_obj`` under ``key`` (see :meth:`FileStore.put`)."""
        self._check_open()
        await offload(self._threads, self.store.put, key, memory_obj)

    async def get(
        self,
        key: Key,
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> MemoryObj | None:
        """Read ``key`` into a new object (see :meth:`FileStore.get`)."""
        self._check_open()
        return await offload(
            self._threads, self.store.get, key, allocator, shapes, dtypes, fmt, on_orphan=discard
        )

    async def exists(self, key: Key) -> bool:
        """True when ``key`` is stored."""
        self._check_open()
        return await offload(self._threads, self.store.exists, key)

    async def delete(self, key: Key) -> bool:
        """Remove ``key``."""
        self._check_open()
        return await offload(self._threads, self.store.delete, key)

    async def head(self, key: Key) -> EntryInfo | None:
        """The stored header of ``key``."""
        self._check_open()
        return await offload(self._threads, self.store.head, key)

    async def batched_put(self, keys: Sequence[Key], memory_objs: Sequence[MemoryObj]) -> None:
        """``put`` of each pair, in one thread hop (see :meth:`FileStore.batched_put`)."""
        self._check_open()
        await offload(self._threads, self.store.batched_put, keys, memory_objs)

    async def batched_get(
        self,
        keys: Sequence[Key],
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> list[MemoryObj | None]:
        """``get`` of each key, in one thread hop (see :meth:`FileStore.batched_get`)."""
        self._check_open()
        return await offload(
            self._threads,
            self.store.batched_get,
            keys,
            allocator,
            shapes,
            dtypes,
            fmt,
            on_orphan=_discard_all,
        )

    async def batched_exists(self, keys: Sequence[Key]) -> list[bool]:
        """``exists`` of each key."""
        self._check_open()
        return await offload(self._threads, self.store.batched_exists, keys)

    async def batched_delete(self, keys: Sequence[Key]) -> int:
        """``delete`` of each key; how many existed."""
        self._check_open()
        return await offload(self._threads, self.store.batched_delete, keys)

    def _close(self) -> None:
        self._threads.shutdown(wait=False)
        self.store.close()

    async def aclose(self) -> None:
        """Close, after the calls still running in the threads have finished."""
        if self._closed:
            return
        self._closed = True
        threads = ThreadPoolExecutor(1)
        try:
            await offload(threads, self._threads.shutdown, True)
        finally:
            threads.shutdown(wait=False)
        self.store.close()

    def __repr__(self) -> str:
        return f"<AsyncFileStore {self.directory!r}{' closed' if self._closed else ''}>"
