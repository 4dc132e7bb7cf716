"""BlockingCalls: an engine's threads call a blocking store; close() returns within a bound.

SGLang's threads call the backend synchronously and the backend calls the
blocking store in them.  A blocking call cannot be cancelled, so a close
refuses new calls, gives those in flight ``CLOSE_GRACE`` seconds, and
closes the store - itself when they ended, else through the last of them
to end: a store is never closed under a running call, and the close
returns within ``CLOSE_GRACE + CLOSE_STORE_WAIT`` whatever they or the
store do.
"""

from __future__ import annotations

import threading
import time

from kvpool.integrations.shared.calls import CLOSE_GRACE, CLOSE_STORE_WAIT, BlockingCalls


class Store:
    """A store whose close is recorded (and can be held)."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        self.closed = threading.Event()
        self.hold = hold
        self.closed_while_running: list[int] = []

    def close(self, calls: BlockingCalls) -> None:
        if self.hold is not None:
            self.hold.wait(10)
        self.closed_while_running.append(calls.running)
        self.closed.set()


def _call(calls: BlockingCalls, gate: threading.Event, results: list[bool]) -> None:
    if not calls.enter():
        results.append(False)
        return
    try:
        gate.wait(10)  # the store call
        results.append(True)
    finally:
        calls.leave()


def test_a_close_waits_for_calls_that_end_within_the_grace() -> None:
    calls, store = BlockingCalls(), Store()
    gate, results = threading.Event(), []
    caller = threading.Thread(target=_call, args=(calls, gate, results))
    caller.start()
    while calls.running < 1:
        time.sleep(0.001)
    threading.Timer(0.2, gate.set).start()
    started = time.monotonic()
    assert calls.close(lambda: store.close(calls)) == 0
    assert 0.15 < time.monotonic() - started < CLOSE_GRACE
    assert store.closed.is_set() and store.closed_while_running == [0]
    caller.join(5)
    assert results == [True]
    assert not calls.enter()  # closed: a new call must not start
    assert calls.close(lambda: store.close(calls)) == 0  # idempotent
    assert store.closed_while_running == [0]


def test_a_late_call_closes_the_store_when_it_ends_and_close_does_not_wait() -> None:
    calls, store = BlockingCalls(), Store()
    gate, results = threading.Event(), []
    caller = threading.Thread(target=_call, args=(calls, gate, results))
    caller.start()
    while calls.running < 1:
        time.sleep(0.001)
    started = time.monotonic()
    assert calls.close(lambda: store.close(calls)) == 1
    assert time.monotonic() - started < CLOSE_GRACE + 0.5
    assert not store.closed.is_set()  # never under a running call
    gate.set()
    caller.join(5)
    assert store.closed.wait(5) and store.closed_while_running == [0]
    assert results == [True]


def test_a_store_slow_to_close_does_not_hold_the_close() -> None:
    hold = threading.Event()
    calls, store = BlockingCalls(), Store(hold)
    started = time.monotonic()
    assert calls.close(lambda: store.close(calls)) == 0
    assert time.monotonic() - started < CLOSE_STORE_WAIT + 0.5
    assert not store.closed.is_set()  # goes on in its thread
    hold.set()
    assert store.closed.wait(5)
