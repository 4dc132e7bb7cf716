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

A batch of at least :data:`SPLIT_MIN_BYTES` (a put, or a get whose layout
is given) is split into ``batch_threads`` parts that run at once, each in
a thread of its own (by default one per CPU this process may use, at most
four; :mod:`kvpool.remote.file.parts`).  A batch's files are independent,
and on tmpfs every copy is CPU work in the kernel: one thread leaves the
other CPUs idle on a quiet machine and gets one share of one CPU on a busy
one, where LMCache's own file connector runs each file in a thread of its
own.

Both keep the blocking store's zero-copy ``writev`` and one-copy
``preadv``.  The cost of the thread hop is measured by ``kvpool bench
--only remote_put_get`` (``async file get``, on the loop, next to the
blocking get; the hop measured on /dev/shm: see ``docs/measurements.md``).

Cancellation: a call on the loop has no await inside, so it completes or
never starts.  A call in a thread still finishes there (a file operation
cannot be interrupted halfway without leaving a torn state): an object a
cancelled ``get`` allocated is freed in that thread when it does, and a
cancelled ``put`` or ``batched_put`` (split or not) returns only once its
threads have stopped reading the caller's objects (``offload(...,
borrows=True)``), so memory an engine lent can be reused as soon as it
returns.
"""

from __future__ import annotations

import asyncio
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
from kvpool.remote.base import Key, check_pairs, get_request, key_list
from kvpool.remote.file.parts import (
    SPLIT_MIN_BYTES,
    batch_nbytes,
    default_batch_threads,
    split_bounds,
)
from kvpool.remote.file.store import FileStore
from kvpool.remote.header import EntryInfo
from kvpool.remote.objects import discard

__all__ = ["SPLIT_MIN_BYTES", "AsyncFileStore", "default_batch_threads", "on_tmpfs"]

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
        batch_threads: the parts a large batched put or get is split
            into, each run in a thread of its own at the same time (see
            the module notes); 1 keeps a batch in one call (on the loop
            with ``threads=0``).  None (default):
            :func:`default_batch_threads`.
        **options: the other ``FileStore`` options (``checksum``,
            ``durable``, ``reuse_files``, ``cleanup_temp_age_s``,
            ``make_parents``, ``max_bytes``, ``on_evict``, ``direct_io``).
            ``on_evict`` is called in the thread that evicted: a worker
            thread, or with ``threads=0`` the event loop's (for a call
            run on the loop); it must not block, nor call the store.

    Attributes:
        store: the underlying blocking store (its ``path``, ``cleanup_temp``...;
            its counters count each part of a split batch as a call).
        threads: as given, or chosen.
        batch_threads: as given, or chosen.

    Raises:
        InvalidArgumentError: a bad ``threads`` or ``batch_threads``.

    Otherwise it raises what ``FileStore`` raises.
    """

    # io_threads is ours to set: the threads below do the I/O.
    @takes_keywords((keywords_of(FileStore, skip=1) or frozenset()) - {"io_threads"})
    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        threads: int | None = None,
        batch_threads: int | None = None,
        **options: Any,
    ) -> None:
        if threads is not None:
            check_int("threads", threads, low=0, high=256)
        if batch_threads is not None:
            check_int("batch_threads", batch_threads, low=1, high=64)
        self.store = FileStore(directory, io_threads=1, **options)
        if threads is None:
            threads = 0 if on_tmpfs(self.store.directory) else 4
        self.threads = threads
        self.batch_threads = default_batch_threads() if batch_threads is None else batch_threads
        self._threads = (
            ThreadPoolExecutor(threads, thread_name_prefix="kvpool-AsyncFileStore")
            if threads
            else None
        )
        self._parts = (
            ThreadPoolExecutor(self.batch_threads, thread_name_prefix="kvpool-AsyncFileStore-part")
            if self.batch_threads > 1
            else None
        )

    async def _run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        on_orphan: Callable[[Any], None] | None = None,
        borrows: bool = False,
    ) -> Any:
        if self._threads is None:
            return fn(*args)
        return await offload(self._threads, fn, *args, on_orphan=on_orphan, borrows=borrows)

    @property
    def directory(self) -> str:
        """The store's directory (absolute)."""
        return self.store.directory

    async def put(self, key: Key, memory_obj: MemoryObj) -> None:
        """Store ``memory_obj`` under ``key`` (see :meth:`FileStore.put`).

        Cancelled, it returns (raising ``CancelledError``) only once the
        write stopped reading ``memory_obj``.
        """
        self._check_open()
        await self._run(self.store.put, key, memory_obj, borrows=True)

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

    async def delete_prefix(self, prefix: Key) -> int:
        """Remove every entry under ``prefix`` (see :meth:`FileStore.delete_prefix`)."""
        self._check_open()
        return await self._run(self.store.delete_prefix, prefix)  # type: ignore[no-any-return]

    async def batched_put(self, keys: Sequence[Key], memory_objs: Sequence[MemoryObj]) -> None:
        """``put`` of each pair (see :meth:`FileStore.batched_put`), large batches split.

        Every part is written even when another fails; then the error of
        the first part that failed (in the batch's order) is raised.  A
        put that is cancelled returns (raising ``CancelledError``) only
        once its parts have ended: the objects' memory is not read after
        the call returns, as when the batch runs on the loop.
        """
        self._check_open()
        pool = self._parts
        bounds: list[tuple[int, int]] = []
        if pool is not None:
            check_pairs(keys, memory_objs)  # before len(): keys may be anything
        if pool is not None and len(keys) > 1:
            nbytes = batch_nbytes(memory_objs)
            bounds = split_bounds(len(keys), nbytes, self.batch_threads)
        if pool is None or len(bounds) < 2:
            await self._run(self.store.batched_put, keys, memory_objs, borrows=True)
            return
        keys, memory_objs = list(keys), list(memory_objs)
        # The parts are one batch: none evicts the entries another writes.
        names = self.store._protect(keys)
        try:
            outcomes = await self._split(
                pool,
                self.store.batched_put,
                [(keys[a:b], memory_objs[a:b]) for a, b in bounds],
                None,
                borrows=True,
            )
        finally:
            await self._release(pool, names)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _release(self, pool: ThreadPoolExecutor, names: list[bytes]) -> None:
        """End a split put's guard in a thread of ``pool``: its renames, unlinks and ``on_evict``.

        The release runs to its end even when the awaiting task is
        cancelled (the entries would stay protected otherwise); on the loop
        only once the store was closed and ``pool`` takes no more jobs.
        """
        try:
            job = pool.submit(self.store._release, names)
        except RuntimeError:  # shut down by close
            self.store._release(names)
            return
        await asyncio.shield(asyncio.wrap_future(job))

    async def batched_get(
        self,
        keys: Sequence[Key],
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> list[MemoryObj | None]:
        """``get`` of each key (see :meth:`FileStore.batched_get`), large batches split.

        A batch is split when its layout is given and it is large enough.
        When a part fails, the objects the others read are freed and the
        error of the first part that failed is raised.
        """
        self._check_open()
        pool = self._parts
        bounds: list[tuple[int, int]] = []
        if pool is not None and len(key_list(keys)) > 1:
            count = len(keys)
            layout, _ = get_request(allocator, shapes, dtypes, fmt)
            if layout is not None:
                bounds = split_bounds(count, count * layout.nbytes, self.batch_threads)
        if pool is not None and len(bounds) >= 2:
            keys = list(keys)
            outcomes = await self._split(
                pool,
                self.store.batched_get,
                [(keys[a:b], allocator, shapes, dtypes, fmt) for a, b in bounds],
                _discard_all,
            )
            if any(isinstance(o, BaseException) for o in outcomes):
                for outcome in outcomes:
                    if not isinstance(outcome, BaseException):
                        _discard_all(outcome)
                raise next(o for o in outcomes if isinstance(o, BaseException))
            return [obj for part in outcomes for obj in part]
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

    @staticmethod
    async def _split(
        pool: ThreadPoolExecutor,
        fn: Callable[..., Any],
        parts: list[tuple[Any, ...]],
        on_orphan: Callable[[Any], None] | None,
        borrows: bool = False,
    ) -> list[Any]:
        """``fn(*args)`` for every part at once in ``pool``; results or exceptions, in order.

        When the awaiting task is cancelled, a part that had finished has
        its result given to ``on_orphan`` here, and one still running gets
        it in its thread when it finishes (:func:`offload`); with
        ``borrows`` (a put) the cancellation waits for every part to end.
        """
        jobs = [
            asyncio.ensure_future(offload(pool, fn, *args, on_orphan=on_orphan, borrows=borrows))
            for args in parts
        ]
        try:
            return await asyncio.gather(*jobs, return_exceptions=True)
        except asyncio.CancelledError:
            # gather returns only once every part is done (finished, failed
            # or cancelled): the finished ones are nobody's now.
            finished = [j for j in jobs if j.done() and not j.cancelled() and not j.exception()]
            for job in finished if on_orphan is not None else ():
                on_orphan(job.result())
            raise

    def _close(self) -> None:
        for pool in (self._threads, self._parts):
            if pool is not None:
                pool.shutdown(wait=False)
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
        pools = [p for p in (self._threads, self._parts) if p is not None]
        if not pools:
            self.store.close()
            return
        waiter = ThreadPoolExecutor(1, thread_name_prefix="kvpool-AsyncFileStore-close")
        try:
            await offload(waiter, self._drain_and_close, pools)
        finally:
            waiter.shutdown(wait=False)  # its one job still runs to the end

    def _drain_and_close(self, pools: list[ThreadPoolExecutor]) -> None:
        """Wait for the calls in ``pools`` to end, then close the blocking store."""
        for pool in pools:
            pool.shutdown(wait=True)
        self.store.close()

    def __repr__(self) -> str:
        return f"<AsyncFileStore {self.directory!r}{' closed' if self._closed else ''}>"
