"""Calls in flight on an event loop, and a close that returns within a bound.

Both integrations run their store calls as asyncio tasks: LMCache on its
storage manager's loop, SGLang (whose threads call synchronously) on a
:class:`LoopThread` of its own.  :class:`InFlight` tracks those tasks so
that closing never waits on the store for long:

1. new calls are refused (they return what a miss returns);
2. the calls in flight get ``CLOSE_GRACE`` seconds to finish;
3. the rest are cancelled - the stores free what a cancelled call
   allocated and drop its connection - and get ``CANCEL_WAIT`` seconds
   to unwind;
4. the store is closed, waiting at most what is left of the grace (and
   never less than ``CLOSE_STORE_WAIT``).

So a close returns within ``CLOSE_GRACE + CANCEL_WAIT + CLOSE_STORE_WAIT``
(1.8 s) whatever a server does.  A put cancelled that way may or may not be
stored (a command already sent may still be applied by the server), and its
task ends - handing the engine its memory back - only once the store stopped
reading it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from kvpool.errors import InvalidArgumentError, PoolClosedError, StoreTimeoutError

__all__ = ["CANCEL_WAIT", "CLOSE_GRACE", "CLOSE_STORE_WAIT", "InFlight", "LoopThread"]

#: Seconds a close lets the calls in flight finish before cancelling them.
CLOSE_GRACE = 1.0
#: Most seconds a close waits for the store itself to close (beyond the grace left).
CLOSE_STORE_WAIT = 0.5
#: Most seconds a close waits for cancelled calls to unwind.
CANCEL_WAIT = 0.3

_T = TypeVar("_T")
_perf = time.perf_counter


class InFlight:
    """The calls of one integration instance running on its event loop.

    Each call does ``task = calls.enter()`` first (None once closing: the
    call returns its miss value), ``calls.leave(task)`` in a ``finally``,
    and, catching ``CancelledError``, ``calls.by_close(task)`` to tell a
    cancellation by :meth:`close` (finish quietly) from any other (re-raise).

    Attributes:
        closing: True once :meth:`close` started.
        cancelled: calls :meth:`close` cancelled (over the instance's life).
    """

    def __init__(self) -> None:
        self._calls: set[asyncio.Task[Any]] = set()
        self._cancelled: set[asyncio.Task[Any]] = set()
        self.closing = False
        self.cancelled = 0

    def enter(self) -> asyncio.Task[Any] | None:
        """Track the calling task; None once closing (the call must not start)."""
        if self.closing:
            return None
        task = asyncio.current_task()
        if task is not None:
            self._calls.add(task)
        return task

    def leave(self, task: asyncio.Task[Any] | None) -> None:
        """Stop tracking ``task`` (its call ended)."""
        if task is not None:
            self._calls.discard(task)
            self._cancelled.discard(task)

    def by_close(self, task: asyncio.Task[Any] | None) -> bool:
        """True when ``task`` was cancelled by :meth:`close` (it may then finish quietly)."""
        if task is None or task not in self._cancelled:
            return False
        uncancel = getattr(task, "uncancel", None)
        if uncancel is not None:
            uncancel()
        return True

    async def close(
        self,
        store: Any,
        warn: Callable[[str], None],
        on_cancel: Callable[[asyncio.Task[Any]], None] | None = None,
    ) -> None:
        """Finish or cancel the calls in flight, then close ``store`` (see the module).

        A call it cancels may end after it returns (a put whose store still
        reads the caller's memory): :meth:`by_close` knows it until it leaves.

        Args:
            store: the asyncio store (its ``aclose()`` is awaited, bounded).
            warn: called with a message when the store did not close cleanly.
            on_cancel: called with each task it cancels, before cancelling it.
        """
        if self.closing:
            return
        self.closing = True
        deadline = _perf() + CLOSE_GRACE
        calls = {t for t in self._calls if not t.done()}
        if calls:
            _, late = await asyncio.wait(calls, timeout=CLOSE_GRACE)
            if late:
                self._cancelled.update(late)
                self.cancelled += len(late)
                for t in late:
                    if on_cancel is not None:
                        on_cancel(t)
                    t.cancel()
                await asyncio.wait(late, timeout=CANCEL_WAIT)
        try:
            await asyncio.wait_for(store.aclose(), max(deadline - _perf(), CLOSE_STORE_WAIT))
        except Exception as exc:
            warn(f"the store did not close cleanly ({type(exc).__name__}: {exc})")


class LoopThread:
    """An event loop in a daemon thread, for an engine whose threads call synchronously.

    Args:
        name: the thread's name.

    Attributes:
        loop: the loop (running until :meth:`stop`).
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._stopped = False
        # Done once the loop is told to stop: a lending call stops waiting then.
        self._halted: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float, *, borrows: bool = False) -> _T:
        """Run ``coro`` on the loop and wait for it, at most ``timeout`` seconds.

        Args:
            coro: the call.
            timeout: seconds to wait for it.
            borrows: ``coro`` reads memory the caller lends (a put of an
                engine's pages): past ``timeout`` it is cancelled as
                usual, but this returns only once it has ended - the
                stores' cancelled puts stop reading first (Redis at once,
                Mooncake by its own deadline, a file put when its write
                ends) - or once the loop is stopped.

        Raises:
            StoreTimeoutError: no result within ``timeout`` (the call is
                cancelled: the stores free what it allocated).
            PoolClosedError: the loop was stopped.
            InvalidArgumentError: called on the loop's own thread (it would
                wait for itself).
            Whatever ``coro`` raises.
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise InvalidArgumentError(
                "a blocking call was made on the integration's own event loop thread"
            )
        if self._stopped:
            coro.close()
            raise PoolClosedError("the integration's event loop was stopped")
        started: list[Any] = []  # the task running it, once it runs
        future = asyncio.run_coroutine_threadsafe(_noting_task(coro, started), self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            if not borrows:
                future.cancel()
            else:
                # Cancel the task itself (cancelling ``future`` would end it
                # at once), then wait until the coroutine is over.
                self.loop.call_soon_threadsafe(_cancel, started)
                concurrent.futures.wait(
                    (future, self._halted), return_when=concurrent.futures.FIRST_COMPLETED
                )
                if future.done() and not future.cancelled() and future.exception() is None:
                    return future.result()  # it finished before the cancellation arrived
            raise StoreTimeoutError(f"no answer within {timeout:g} s") from None

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the loop and join its thread (at most ``timeout`` seconds); idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._halted.set_result(None)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


async def _noting_task(coro: Coroutine[Any, Any, _T], started: list[Any]) -> _T:
    """``await coro``, having put the task running it in ``started`` (unless too late)."""
    if started:  # the call ran out of time before it began (see _cancel): it never runs
        coro.close()
        raise asyncio.CancelledError
    started.append(asyncio.current_task())
    return await coro


def _cancel(started: list[Any]) -> None:
    """On the loop: cancel the task of a call that ran out of time."""
    if started:
        started[0].cancel()
    else:  # its task has not taken a step yet: it will find this and stop
        started.append(None)
