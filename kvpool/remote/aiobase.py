"""The asyncio store interface, and running blocking store calls off the event loop.

:class:`AsyncRemoteStore` is :class:`~kvpool.remote.base.RemoteStore` with
coroutines: the same methods, arguments, results, errors and copy rules
(``put`` copies nothing in Python, ``get`` reads once into the new object).

Cancellation: a cancelled call frees whatever it allocated - the
destination of a ``get`` is freed even when the bytes were still arriving
or the call was running in a thread - and leaves its connection either
clean in the pool or closed, never out of step.

:func:`offload` runs a blocking call in a thread (what
:class:`~kvpool.remote.file.aio.AsyncFileStore` does: files have no
readiness to wait for).  When the awaiting task is cancelled, the call
still finishes in its thread and ``on_orphan`` receives its result (to
free it).
"""

from __future__ import annotations

import abc
import asyncio
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

import torch

from kvpool.checks import RefusesUnknownKeywords
from kvpool.errors import PoolClosedError
from kvpool.formats import MemoryFormat
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.base import Key
from kvpool.remote.header import EntryInfo
from kvpool.remote.objects import let_go

__all__ = ["PUT_OPERATIONS", "AsyncRemoteStore", "lets_go", "offload"]

_T = TypeVar("_T")


async def offload(
    executor: Executor,
    fn: Callable[..., _T],
    *args: Any,
    on_orphan: Callable[[_T], None] | None = None,
) -> _T:
    """``fn(*args)`` in a thread of ``executor``, awaited.

    Args:
        executor: the threads.
        fn: the blocking call.
        *args: its arguments.
        on_orphan: called with the result of a call whose awaiting task was
            cancelled, in the thread that finished it (so even after the
            event loop is gone), e.g. to free an object nobody will receive.

    Raises:
        Whatever ``fn`` raises; CancelledError when the task is cancelled.
    """
    job = executor.submit(fn, *args)
    waiting = asyncio.wrap_future(job)
    try:
        return await asyncio.shield(waiting)
    except asyncio.CancelledError:
        # Nobody reads the job's outcome now (shield stops reading it once
        # cancelled): an error it ends with later (a connection the deadline
        # gave up on, then closed by the server) would be reported to the
        # loop as "never retrieved", although the caller got its own.
        waiting.add_done_callback(_read_outcome)
        if on_orphan is not None:

            def orphaned(done: Future[_T]) -> None:
                if not done.cancelled() and done.exception() is None:
                    on_orphan(done.result())

            job.add_done_callback(orphaned)
        raise


def _read_outcome(done: asyncio.Future[Any]) -> None:
    """Mark the outcome of a job nobody waits for as read (its error is nobody's to report)."""
    if not done.cancelled():
        done.exception()


#: The coroutines whose failures let go of what their frames hold (see
#: :func:`lets_go`): those that hold views of the caller's objects.
PUT_OPERATIONS = ("put", "batched_put")


def lets_go(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a store coroutine) whose exceptions keep no view of the caller's objects.

    The asyncio stores' boundary, as the counting wrapper is the blocking
    stores' one (:mod:`kvpool.remote.objects`, "Letting go of views"): an
    exception leaving a failed ``put`` has its finished frames cleared, so
    the caller's next ``ref_count_down`` frees the object at once.  Only the
    puts are wrapped (an await costs a few hundred nanoseconds): a ``get``
    lets go of its destinations' views where it frees them.
    """

    @functools.wraps(fn)
    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(self, *args, **kwargs)
        except BaseException as exc:
            let_go(exc)
            raise

    call._kvpool_lets_go = True  # type: ignore[attr-defined]
    return call


class AsyncRemoteStore(RefusesUnknownKeywords, metaclass=abc.ABCMeta):
    """A store of memory objects for asyncio code (see :class:`RemoteStore`).

    Use ``async with store:`` or ``await store.aclose()``.  Calls may run
    concurrently from many tasks of one event loop.  A subclass's ``put``
    and ``batched_put`` are wrapped when the class is defined (:func:`lets_go`).
    """

    _closed = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for op in PUT_OPERATIONS:
            fn = cls.__dict__.get(op)
            if (
                callable(fn)
                and not getattr(fn, "__isabstractmethod__", False)
                and not getattr(fn, "_kvpool_lets_go", False)
            ):
                setattr(cls, op, lets_go(fn))

    @abc.abstractmethod
    async def put(self, key: Key, memory_obj: MemoryObj) -> None:
        """Store ``memory_obj`` under ``key`` (see :meth:`RemoteStore.put`)."""

    @abc.abstractmethod
    async def get(
        self,
        key: Key,
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> MemoryObj | None:
        """Read ``key`` into a new object (see :meth:`RemoteStore.get`)."""

    @abc.abstractmethod
    async def exists(self, key: Key) -> bool:
        """True when ``key`` is stored (see :meth:`RemoteStore.exists`)."""

    @abc.abstractmethod
    async def delete(self, key: Key) -> bool:
        """Remove ``key`` (see :meth:`RemoteStore.delete`)."""

    @abc.abstractmethod
    async def head(self, key: Key) -> EntryInfo | None:
        """The stored header of ``key`` (see :meth:`RemoteStore.head`)."""

    @abc.abstractmethod
    async def batched_put(self, keys: Sequence[Key], memory_objs: Sequence[MemoryObj]) -> None:
        """``put`` of each pair (see :meth:`RemoteStore.batched_put`)."""

    @abc.abstractmethod
    async def batched_get(
        self,
        keys: Sequence[Key],
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> list[MemoryObj | None]:
        """``get`` of each key (see :meth:`RemoteStore.batched_get`)."""

    @abc.abstractmethod
    async def batched_exists(self, keys: Sequence[Key]) -> list[bool]:
        """``exists`` of each key."""

    @abc.abstractmethod
    async def batched_delete(self, keys: Sequence[Key]) -> int:
        """``delete`` of each key; how many existed."""

    def _close(self) -> None:
        """Release the store's own resources (called once)."""

    @property
    def closed(self) -> bool:
        """True once the store was closed."""
        return self._closed

    def close(self) -> None:
        """Release the store's resources (idempotent); calls in flight fail or finish."""
        if not self._closed:
            self._closed = True
            self._close()

    async def aclose(self) -> None:
        """:meth:`close`, awaitable (waits for threads a store runs calls in)."""
        self.close()

    async def __aenter__(self) -> AsyncRemoteStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError(f"{self!r} is closed")
