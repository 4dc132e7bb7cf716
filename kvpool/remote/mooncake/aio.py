"""AsyncMooncakeStore: MooncakeStore for asyncio code, its calls run in a few threads.

Mooncake's client is a blocking C++ binding with no readiness an event
loop could wait for, so each call of the underlying
:class:`~kvpool.remote.mooncake.store.MooncakeStore` runs in a small
thread pool (``threads``, 4 by default) through
:func:`~kvpool.remote.aiobase.offload`; the client releases the GIL while
it moves bytes, so the loop keeps running.  The bytes path is the blocking
store's: the object's memory registered once per pool, batched calls
(``batch_put_from_multi_buffers``, ``batch_get_into_multi_buffers``, or
``batch_put_from`` / ``batch_get_into`` with ``headerless=True``) moving
them in place, one thread hop per call however many keys it has.

Deadlines: ``timeout`` bounds each call as its caller sees it, waiting
for a free thread included; past it the call raises
:class:`~kvpool.errors.StoreTimeoutError`.  A Mooncake call cannot be
interrupted: one that already started finishes in its thread (an entry it
writes is whole or absent; an object it reads is freed there), one still
queued never starts.

Cancellation: a queued call is dropped; a ``get`` whose caller is gone
frees the objects it allocated in the thread that finishes it.  A
cancelled ``put`` or ``batched_put`` returns only once Mooncake stopped
reading the caller's objects (``offload(..., borrows=True)``) - at the
latest at the call's deadline, ``timeout`` seconds after it began.  A put
that outlives its deadline (cancelled or timed out) may read memory its
caller reuses by then, so when it ends it removes the entries it wrote:
a later ``get`` misses rather than read another chunk's bytes.  That
removal waits out readers' leases (an ``exists`` takes one too) for up to
:data:`UNDO_SECONDS`, past the call's own ``timeout``: it runs in the
late call's thread, and giving up at the deadline would keep torn bytes
whenever a reader looked at the key meanwhile.

Closing: :meth:`~AsyncMooncakeStore.aclose` refuses new calls, waits for
the calls in their threads (at most ``timeout`` seconds), closes the
blocking store in a thread and stops the threads.  Calls still running
past that keep the Mooncake client until the last one ends, which then
closes it (a client is never closed under a running call).  The blocking
:meth:`~AsyncMooncakeStore.close` does the same without waiting, closing
the client in the calling thread when no call runs (about a second for a
client the store made: prefer ``aclose`` on an event loop).

Making the store connects, as ``MooncakeStore`` does (the master must
answer): make it before the loop runs, or in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from kvpool.checks import check_int, keywords_of, takes_keywords
from kvpool.errors import PoolClosedError, StoreTimeoutError
from kvpool.formats import MemoryFormat
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.aiobase import AsyncRemoteStore, offload
from kvpool.remote.base import Key
from kvpool.remote.header import EntryInfo
from kvpool.remote.mooncake.removal import remove_keys
from kvpool.remote.mooncake.store import MooncakeStore
from kvpool.remote.objects import discard

__all__ = ["UNDO_SECONDS", "AsyncMooncakeStore"]

#: Threads of a store unless told otherwise.
DEFAULT_THREADS = 4

#: Seconds a late put's removal of what it wrote waits out readers' leases:
#: a few of the master's default lease (``--default_kv_lease_ttl``, 10 s).
UNDO_SECONDS = 30.0


class _Dropped(Exception):
    """A queued call whose caller gave up (timed out or cancelled): it never ran."""


def _discard_all(objs: list[MemoryObj | None]) -> None:
    for obj in objs:
        discard(obj)


class AsyncMooncakeStore(AsyncRemoteStore):
    """A :class:`MooncakeStore` whose calls are awaited (see the module docstring).

    Args:
        master: the master's RPC address, ``host:port``.
        threads: threads running the calls (1 to 256); calls beyond that
            wait their turn, within their ``timeout``.
        **options: the other ``MooncakeStore`` options (``metadata``,
            ``protocol``, ``device``, ``local_hostname``, ``replicas``,
            ``segment_size``, ``local_buffer_size``, ``prefix``,
            ``checksum``, ``timeout``, ``client``, ``headerless``).

    Attributes:
        store: the underlying blocking store (``object_key``,
            ``mount_segment``, ``registered_regions``...).
        timeout: seconds one call may take as its caller sees it.
        threads: the number of threads.

    Raises:
        ArgumentTypeError: an option ``MooncakeStore`` does not take.
        InvalidArgumentError: a bad ``threads`` or option.
        FeatureUnavailableError / StoreConnectionError: as ``MooncakeStore``.
    """

    @takes_keywords(keywords_of(MooncakeStore, skip=1) or ())
    def __init__(
        self, master: str = "127.0.0.1:50051", *, threads: int = DEFAULT_THREADS, **options: Any
    ) -> None:
        check_int("threads", threads, low=1, high=256)
        self._start(MooncakeStore(master, **options), threads)

    @classmethod
    @takes_keywords(keywords_of(MooncakeStore, skip=1) or ())
    def from_url(
        cls, url: str, *, threads: int = DEFAULT_THREADS, **options: Any
    ) -> AsyncMooncakeStore:
        """A store from ``mooncake://MASTER:PORT?...`` (see :meth:`MooncakeStore.from_url`).

        Raises:
            InvalidArgumentError: a malformed URL, an option given twice, a bad ``threads``.

        Otherwise it raises what the constructor raises.
        """
        check_int("threads", threads, low=1, high=256)
        self = cls.__new__(cls)
        self._start(MooncakeStore.from_url(url, **options), threads)
        return self

    def _start(self, store: MooncakeStore, threads: int) -> None:
        self.store = store
        self.timeout = store.timeout
        self.threads = threads
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="kvpool-AsyncMooncakeStore")
        # Guards the three fields below, read and written by the threads too.
        self._lock = threading.Lock()
        self._running = 0  # calls inside the blocking store now
        self._shut = False  # no call may start any more
        self._store_closed = False
        self._drained: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    @property
    def server(self) -> str:
        """The master as messages name it (``mooncake://host:port``)."""
        return self.store.server

    @property
    def headerless(self) -> bool:
        """True when entries are stored without kvpool's header (see ``MooncakeStore``)."""
        return self.store.headerless

    def register_memory(self, memory: Any, nbytes: int | None = None) -> tuple[int, int]:
        """Register a long-lived host range once (see :meth:`MooncakeStore.register_memory`).

        Not awaited: one quick Mooncake call.  Closing the store deregisters it.

        Returns:
            ``(address, nbytes)`` registered.

        Raises:
            ArgumentTypeError / InvalidArgumentError: a bad ``memory`` or
                ``nbytes``, or a range overlapping one registered already.
            PoolClosedError: the store was closed.
            RemoteStoreError: Mooncake refused the registration.
        """
        if self._closed:
            raise PoolClosedError(f"register_memory on {self.server}: the store was closed")
        return self.store.register_memory(memory, nbytes)

    def unregister_memory(self, memory: Any) -> None:
        """Deregister a range :meth:`register_memory` registered (its tensor or address).

        Call it only once no call in flight uses objects inside the range.

        Raises:
            ArgumentTypeError / InvalidArgumentError: a bad ``memory``, or no such range.
        """
        self.store.unregister_memory(memory)

    # -- running the blocking calls -------------------------------------

    async def _run(
        self,
        action: str,
        fn: Callable[..., Any],
        *args: Any,
        on_orphan: Callable[[Any], None] | None = None,
        writes: Sequence[Key] | None = None,
    ) -> Any:
        """``fn(*args)`` in a thread, awaited within the timeout.

        ``writes``: the keys of a put, whose objects the job reads: a
        cancellation waits for it (until the deadline), and a job that
        ends after its caller gave up removes those keys.
        """
        self._check_open()
        gone = False  # the caller stopped waiting (a queued job then never runs)

        def job() -> Any:
            with self._lock:
                if gone:
                    raise _Dropped
                if self._shut:
                    raise PoolClosedError(f"{self!r} is closed")
                self._running += 1
            try:
                return fn(*args)
            finally:
                if gone and writes is not None:
                    self._undo(writes)
                self._ended()

        try:
            return await offload(
                self._threads,
                job,
                on_orphan=on_orphan,
                borrows=writes is not None,
                deadline=time.monotonic() + self.timeout,
            )
        except StoreTimeoutError:  # the blocking store's own
            raise
        except TimeoutError:
            gone = True
            raise StoreTimeoutError(
                f"{action} on {self.server}: no answer within {self.timeout} s (a call that "
                "started finishes in its thread: a get frees what it read, a put removes "
                "what it wrote)"
            ) from None
        except asyncio.CancelledError:
            gone = True
            raise
        except RuntimeError as exc:  # the threads were shut down meanwhile
            if self._closed:
                raise PoolClosedError(f"{self!r} is closed") from None
            raise exc

    def _undo(self, keys: Sequence[Key]) -> None:
        """Remove what a put wrote after its caller gave up (its bytes may be torn).

        Leased keys are retried for :data:`UNDO_SECONDS` rather than the
        store's ``timeout``: a reader's lease outlasts a short timeout,
        and the torn entry would stay.
        """
        store = self.store
        mkeys = [store.object_key(k) for k in keys]
        with contextlib.suppress(Exception):  # nobody to report to; a miss either way
            remove_keys(store.client, mkeys, max(self.timeout, UNDO_SECONDS), lambda i: mkeys[i])

    def _ended(self) -> None:
        """A call left the blocking store: the last one after a close closes it."""
        with self._lock:
            self._running -= 1
            last = self._shut and not self._running
            close_store = last and not self._store_closed
            if close_store:
                self._store_closed = True
            drained = self._drained if last else None
        if close_store:
            self.store.close()
        if drained is not None:
            loop, fut = drained
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                loop.call_soon_threadsafe(_set_done, fut)

    # -- the calls ------------------------------------------------------

    async def put(self, key: Key, memory_obj: MemoryObj) -> None:
        """Store ``memory_obj`` under ``key`` (see :meth:`MooncakeStore.put`).

        Cancelled, it returns once Mooncake stopped reading ``memory_obj``
        (at the latest at the deadline: see the module notes).
        """
        await self._run("put", self.store.put, key, memory_obj, writes=(key,))

    async def batched_put(self, keys: Sequence[Key], memory_objs: Sequence[MemoryObj]) -> None:
        """Store each object: one thread hop, one Mooncake batch (see ``MooncakeStore``).

        Cancelled, it returns as :meth:`put` does.
        """
        await self._run("batched_put", self.store.batched_put, keys, memory_objs, writes=keys)

    async def get(
        self,
        key: Key,
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> MemoryObj | None:
        """Read ``key`` into a new object (see :meth:`MooncakeStore.get`)."""
        return await self._run(  # type: ignore[no-any-return]
            "get", self.store.get, key, allocator, shapes, dtypes, fmt, on_orphan=discard
        )

    async def batched_get(
        self,
        keys: Sequence[Key],
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> list[MemoryObj | None]:
        """``get`` of each key: one thread hop, one Mooncake batch (see ``MooncakeStore``)."""
        return await self._run(  # type: ignore[no-any-return]
            "batched_get",
            self.store.batched_get,
            keys,
            allocator,
            shapes,
            dtypes,
            fmt,
            on_orphan=_discard_all,
        )

    async def exists(self, key: Key) -> bool:
        """True when ``key`` is stored."""
        return await self._run("exists", self.store.exists, key)  # type: ignore[no-any-return]

    async def batched_exists(self, keys: Sequence[Key]) -> list[bool]:
        """``exists`` of each key, in one Mooncake call."""
        return await self._run("batched_exists", self.store.batched_exists, keys)  # type: ignore[no-any-return]

    async def delete(self, key: Key) -> bool:
        """Remove ``key`` (a reader's lease is waited out, see :meth:`MooncakeStore.delete`)."""
        return await self._run("delete", self.store.delete, key)  # type: ignore[no-any-return]

    async def batched_delete(self, keys: Sequence[Key]) -> int:
        """``delete`` of each key; how many existed."""
        return await self._run("batched_delete", self.store.batched_delete, keys)  # type: ignore[no-any-return]

    async def delete_prefix(self, prefix: Key) -> int:
        """Remove every entry under ``prefix`` (see :meth:`MooncakeStore.delete_prefix`)."""
        return await self._run("delete_prefix", self.store.delete_prefix, prefix)  # type: ignore[no-any-return]

    async def head(self, key: Key) -> EntryInfo | None:
        """The stored header of ``key`` (see :meth:`MooncakeStore.head`)."""
        return await self._run("head", self.store.head, key)  # type: ignore[no-any-return]

    # -- closing --------------------------------------------------------

    def _close(self) -> None:
        with self._lock:
            self._shut = True
            close_store = not self._running and not self._store_closed
            if close_store:
                self._store_closed = True
        self._threads.shutdown(wait=False)
        if close_store:  # else the last running call closes it
            self.store.close()

    async def aclose(self) -> None:
        """Close after the calls in their threads have ended (waiting at most ``timeout`` s).

        The blocking store is closed in a thread; a call still running past
        the wait keeps it until it ends (then it closes it).  Cancelled while
        it waits, it still completes the close as :meth:`close` does.
        """
        if self._closed:
            return
        self._closed = True
        try:
            stuck = await self._drain()
        except asyncio.CancelledError:
            # The awaiting task gave up (a caller's bound): finish the close
            # without waiting, as close() does; a call still running closes
            # the store when it ends, and the idle threads end now.
            self._close()
            raise
        # With nothing running the threads are idle and end at once.
        self._threads.shutdown(wait=not stuck)

    async def _drain(self) -> bool:
        """Wait for the running calls (at most ``timeout`` s), then close the store if none is left.

        Returns:
            True when a call is still running (it closes the store when it ends).
        """
        loop = asyncio.get_running_loop()
        drained: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._shut = True
            busy = self._running > 0
            if busy:
                self._drained = (loop, drained)
        if busy:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(drained, self.timeout)
        with self._lock:
            stuck = self._running > 0
            close_store = not stuck and not self._store_closed
            if close_store:
                self._store_closed = True
        if close_store:
            await offload(self._threads, self.store.close)
        return stuck

    def __repr__(self) -> str:
        return f"<AsyncMooncakeStore {self.server}{' closed' if self._closed else ''}>"


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
