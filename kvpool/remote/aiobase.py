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

A put never reads the caller's objects after it returns, cancelled or
not: an engine that lends its own memory (the LMCache plugin, SGLang's
host pool, :mod:`kvpool.pool.borrowed`) reuses those bytes as soon as the
call ends, and a write still reading them would store another chunk's
bytes under the key.  A store that sends from the loop sends nothing
after a cancellation (the kernel copies what ``sendmsg`` took); one that
puts in a thread runs the job with ``offload(..., borrows=True)``, whose
cancellation waits for the job to end (bounded by the call's deadline).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

import torch

from kvpool.checks import RefusesUnknownKeywords
from kvpool.errors import PoolClosedError
from kvpool.formats import MemoryFormat
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.base import Key, unsupported_prefix
from kvpool.remote.header import EntryInfo
from kvpool.remote.objects import let_go

__all__ = ["PUT_OPERATIONS", "AsyncRemoteStore", "lets_go", "offload"]

_T = TypeVar("_T")


async def offload(
    executor: Executor,
    fn: Callable[..., _T],
    *args: Any,
    on_orphan: Callable[[_T], None] | None = None,
    borrows: bool = False,
    deadline: float | None = None,
) -> _T:
    """``fn(*args)`` in a thread of ``executor``, awaited.

    Args:
        executor: the threads.
        fn: the blocking call.
        *args: its arguments.
        on_orphan: called with the result of a call whose awaiting task was
            cancelled, in the thread that finished it (so even after the
            event loop is gone), e.g. to free an object nobody will receive.
        borrows: the job reads memory its caller lent (a put's objects).
            A cancellation - any number of them - then does not end the
            call while the job may still read: a job not started yet is
            dropped (it never runs), a running one is waited for, until
            ``deadline`` when one is given; then ``CancelledError`` is
            raised.  Past the deadline a running job goes on in its thread
            (a caller that cannot afford that must undo what it writes:
            see :class:`~kvpool.remote.mooncake.aio.AsyncMooncakeStore`).
        deadline: a ``time.monotonic()`` instant: when the job has not
            ended by then the call raises ``TimeoutError`` (the job goes
            on in its thread, or never starts when ``borrows`` and it was
            still queued).  None: no bound.

    Raises:
        Whatever ``fn`` raises; CancelledError when the task is cancelled;
        TimeoutError past ``deadline``.
    """
    job = executor.submit(fn, *args)
    waiting = asyncio.wrap_future(job)
    try:
        if deadline is None:
            return await asyncio.shield(waiting)
        # wait() leaves ``waiting`` as it is when the deadline passes or the task is cancelled.
        await asyncio.wait((waiting,), timeout=max(0.0, deadline - time.monotonic()))
    except asyncio.CancelledError:
        if borrows:
            await _until_ended(job, waiting, deadline)
        _give_up(job, waiting, on_orphan)
        raise
    if job.done():  # ``waiting`` may learn it a loop turn later
        waiting.add_done_callback(_read_outcome)
        return job.result()
    if borrows:
        job.cancel()  # still queued: it never starts
    _give_up(job, waiting, on_orphan)
    raise TimeoutError("the call's deadline passed while its job ran in a thread")


async def _until_ended(
    job: Future[Any], waiting: asyncio.Future[Any], deadline: float | None
) -> None:
    """Wait, through any cancellations, until ``job`` ended or was dropped, or ``deadline``."""
    if job.cancel():  # not started: it never will
        return
    while not job.done():
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            return
        # A cancellation while the job still reads the caller's memory must
        # not end the call: the CancelledError already caught is re-raised
        # by the caller once the job is over.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait((waiting,), timeout=timeout)


def _give_up(
    job: Future[_T], waiting: asyncio.Future[_T], on_orphan: Callable[[_T], None] | None
) -> None:
    """Nobody receives ``job``'s outcome: read it quietly, hand a result to ``on_orphan``."""
    # Nobody reads the job's outcome now: an error it ends with later (a
    # connection the deadline gave up on, then closed by the server) would
    # be reported to the loop as "never retrieved", although the caller got
    # its own.
    waiting.add_done_callback(_read_outcome)
    if on_orphan is not None:

        def orphaned(done: Future[_T]) -> None:
            if not done.cancelled() and done.exception() is None:
                on_orphan(done.result())

        job.add_done_callback(orphaned)


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

    async def delete_prefix(self, prefix: Key) -> int:
        """Remove every entry under ``prefix`` (see :meth:`RemoteStore.delete_prefix`).

        Raises:
            FeatureUnavailableError: the store cannot list its keys.
        """
        raise unsupported_prefix(self)

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
