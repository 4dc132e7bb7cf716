"""Calls in flight, and a close that returns within a bound whatever they do.

Two kinds of engines call the stores:

* one with an event loop (LMCache) runs its store calls as asyncio tasks:
  :class:`InFlight` tracks them;
* one whose own threads call synchronously (SGLang's prefetch and backup
  threads) calls a blocking store in those threads: :class:`BlockingCalls`
  tracks them.

:class:`InFlight` - closing never waits on the store for long:

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

:class:`BlockingCalls` - a blocking call cannot be cancelled; each is
bounded by its store's own deadline (``timeout``), and it returns - handing
the engine its pages back - only once the store is done with them.  So:

1. new calls are refused (they return what a miss returns);
2. the calls in flight get ``CLOSE_GRACE`` seconds to finish;
3. if they did, the store is closed (waiting at most ``CLOSE_STORE_WAIT``,
   the rest of its close goes on in a thread); if not, the last of them to
   end closes it - a store is never closed under a running call.

So a close returns within ``CLOSE_GRACE + CLOSE_STORE_WAIT`` (1.5 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["CANCEL_WAIT", "CLOSE_GRACE", "CLOSE_STORE_WAIT", "BlockingCalls", "InFlight"]

#: Seconds a close lets the calls in flight finish before cancelling them.
CLOSE_GRACE = 1.0
#: Most seconds a close waits for the store itself to close (beyond the grace left).
CLOSE_STORE_WAIT = 0.5
#: Most seconds a close waits for cancelled calls to unwind.
CANCEL_WAIT = 0.3

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


class BlockingCalls:
    """The calls an engine's own threads make on a blocking store (see the module docstring).

    Each call does ``if not calls.enter(): return <miss>``, then the store
    call, then ``calls.leave()`` in a ``finally``.

    Attributes:
        closing: True once :meth:`close` started.

    Thread safety: any thread may call any method.
    """

    def __init__(self) -> None:
        self._done = threading.Condition()
        self._running = 0
        self._close_store: Callable[[], None] | None = None  # for the last call to leave
        self.closing = False

    @property
    def running(self) -> int:
        """Calls in flight now."""
        return self._running

    def enter(self) -> bool:
        """Count a call in; False once closing (the call must not start)."""
        with self._done:
            if self.closing:
                return False
            self._running += 1
            return True

    def leave(self) -> None:
        """Count a call out; the last one out after a late close closes the store."""
        with self._done:
            self._running -= 1
            if self._running:
                return
            self._done.notify_all()
            close, self._close_store = self._close_store, None
        if close is not None:
            _in_a_thread(close, "kvpool-close-after-calls")

    def close(self, close_store: Callable[[], None], grace: float = CLOSE_GRACE) -> int:
        """Refuse new calls, give those in flight ``grace`` s, then close the store.

        Args:
            close_store: closes the store (run once, never under a call).
            grace: most seconds to wait for the calls in flight (default
                ``CLOSE_GRACE``; an engine with a tighter bound of its own passes
                what is left of it).

        Returns:
            The calls still in flight after the grace (their last one closes
            the store when it ends); 0 on a second close.
        """
        with self._done:
            if self.closing:
                return 0
            self.closing = True
            self._done.wait_for(lambda: not self._running, max(grace, 0.0))
            late = self._running
            if late:
                self._close_store = close_store
                return late
        _in_a_thread(close_store, "kvpool-close").join(CLOSE_STORE_WAIT)
        return 0


def _in_a_thread(fn: Callable[[], None], name: str) -> threading.Thread:
    """``fn()`` in a daemon thread of its own (its errors are nobody's to report)."""

    def run() -> None:
        with contextlib.suppress(Exception):  # a store that fails to close: nothing left to do
            fn()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
