"""AsyncFileStore: FileStore for asyncio code, run on the loop (tmpfs) or in a few threads.

Files have no readiness an event loop could wait for (a read of a regular
file never returns "try again"), so each call of the underlying
:class:`~kvpool.remote.file.store.FileStore` either

* runs *on the loop* (``threads=0``, the default for a directory on
  tmpfs such as /dev/shm): a call there is a memory copy that never waits
  for a device, as short as the ``recv_into`` AsyncRedisStore runs on the
  loop; or
* runs in a small thread pool (``threads=N``, the default elsewhere,
  where a disk may stall the loop), through
  :func:`~kvpool.remote.aiobase.offload`.

Both keep the blocking store's zero-copy ``writev`` and one-copy
``preadv``.  The cost of the thread hop is measured by ``kvpool bench
--only remote_put_get`` (``async file get``, on the loop, next to the
blocking get; the hop measured on /dev/shm: see ``docs/measurements.md``).

Cancellation: a call on the loop has no await inside, so it completes or
never starts.  A call in a thread still finishes there (a file operation
cannot be interrupted halfway without leaving a torn state), and an
object a cancelled ``get`` allocated is freed in that thread when it does.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from kvpool.checks import check_int, keywords_of, takes_keywords
from kvpool.formats import MemoryFormat
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.aiobase import AsyncRemoteStore, offload
from kvpool.remote.base import Key
from kvpool.remote.file.store import FileStore
from kvpool.remote.header import EntryInfo
from kvpool.remote.objects import discard

__all__ = ["AsyncFileStore", "on_tmpfs"]

_TMPFS_MAGIC = 0x01021994


def on_tmpfs(path: str) -> bool:
    """True when ``path`` is on tmpfs (``statfs`` type), False when not or unknown."""
    try:
        statfs = ctypes.CDLL(None, use_errno=True).statfs
    except (OSError, AttributeError):
        return False
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first word
    if statfs(os.fsencode(path), buf) != 0:
        return False
    return ctypes.c_long.from_buffer(buf).value == _TMPFS_MAGIC


def _discard_all(objs: list[MemoryObj | None]) -> None:
    for obj in objs:
        discard(obj)


class AsyncFileStore(AsyncRemoteStore):
    """A :class:`FileStore` whose calls are awaited.

    Args:
        directory: as for ``FileStore``.
        threads: threads running the calls (calls beyond that wait their
            turn); 0 runs them on the event loop; None (default): 0 on
            tmpfs, 4 elsewhere.
        **options: the other ``FileStore`` options (``checksum``,
            ``durable``, ``reuse_files``, ``cleanup_temp_age_s``).

    Attributes:
        store: the underlying blocking store (its ``path``, ``cleanup_temp``...).

    Raises:
        InvalidArgumentError: a bad ``threads``.

    Otherwise it raises what ``FileStore`` raises.
    """

    # io_threads is ours to set: the threads below do the I/O.
    @takes_keywords((keywords_of(FileStore, skip=1) or frozenset()) - {"io_threads"})
    def __init__(
        self, directory: str | os.PathLike[str], *, threads: int | None = None, **options: Any
    ) -> None:
        if threads is not None:
            check_int("threads", threads, low=0, high=256)
        self.store = FileStore(directory, io_threads=1, **options)
        if threads is None:
            threads = 0 if on_tmpfs(self.store.directory) else 4
        self.threads = threads
        self._threads = (
            ThreadPoolExecutor(threads, thread_name_prefix="kvpool-AsyncFileStore")
            if threads
            else None
        )

    async def _run(
        self, fn: Callable[..., Any], *args: Any, on_orphan: Callable[[Any], None] | None = None
    ) -> Any:
        if self._threads is None:
            return fn(*args)
        return await offload(self._threads, fn, *args, on_orphan=on_orphan)

    @property
    def directory(self) -> str:
        """The store's directory (absolute)."""
        return self.store.directory

    async def put(self, key: Key, memory_obj: MemoryObj) -> None:
        """Store ``memory_obj`` under ``key`` (see :meth:`FileStore.put`)."""
        self._check_open()
        await self._run(self.store.put, key, memory_obj)

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
        return await self._run(
            self.store.get, key, allocator, shapes, dtypes, fmt, on_orphan=discard
        )

    async def exists(self, key: Key) -> bool:
        """True when ``key`` is stored."""
        self._check_open()
        return await self._run(self.store.exists, key)

    async def delete(self, key: Key) -> bool:
        """Remove ``key``."""
        self._check_open()
        return await self._run(self.store.delete, key)

    async def head(self, key: Key) -> EntryInfo | None:
        """The stored header of ``key``."""
        self._check_open()
        return await self._run(self.store.head, key)

    async def batched_put(self, keys: Sequence[Key], memory_objs: Sequence[MemoryObj]) -> None:
        """``put`` of each pair, in one thread hop (see :meth:`FileStore.batched_put`)."""
        self._check_open()
        await self._run(self.store.batched_put, keys, memory_objs)

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
        return await self._run(
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
        return await self._run(self.store.batched_exists, keys)

    async def batched_delete(self, keys: Sequence[Key]) -> int:
        """``delete`` of each key; how many existed."""
        self._check_open()
        return await self._run(self.store.batched_delete, keys)

    def _close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False)
        self.store.close()

    async def aclose(self) -> None:
        """Close, after the calls still running in the threads have finished.

        The close completes even when the awaiting task is cancelled (a
        caller that stops waiting after a bound): waiting for the threads
        and closing the store are one job in a thread of its own, which a
        cancellation stops awaiting but does not stop.
        """
        if self._closed:
            return
        self._closed = True
        if self._threads is None:
            self.store.close()
            return
        waiter = ThreadPoolExecutor(1, thread_name_prefix="kvpool-AsyncFileStore-close")
        try:
            await offload(waiter, self._drain_and_close, self._threads)
        finally:
            waiter.shutdown(wait=False)  # its one job still runs to the end

    def _drain_and_close(self, threads: ThreadPoolExecutor) -> None:
        """Wait for the calls in ``threads`` to end, then close the blocking store."""
        threads.shutdown(wait=True)
        self.store.close()

    def __repr__(self) -> str:
        return f"<AsyncFileStore {self.directory!r}{' closed' if self._closed else ''}>"
