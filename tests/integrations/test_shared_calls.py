"""LoopThread.run for an engine's threads: a put past its timeout hands the memory back last.

SGLang's threads call the backend synchronously; each call runs on the
backend's loop (:class:`~kvpool.integrations.shared.calls.LoopThread`) and
is waited for at most ``call_timeout``.  A put reads the engine's pages,
which the engine reuses as soon as the call returns: with ``borrows=True``
a call past its timeout is cancelled and returns only once the cancelled
coroutine ended - here a real ``offload(..., borrows=True)`` whose job is
held in a thread - or once the loop is stopped.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvpool.errors import StoreTimeoutError
from kvpool.integrations.shared.calls import LoopThread
from kvpool.remote.aiobase import offload


def _held(gate: threading.Event, left: threading.Event) -> str:
    gate.wait(10)
    left.set()
    return "written"


@pytest.mark.parametrize("borrows", [False, True])
def test_a_lending_call_past_its_timeout_returns_once_its_job_ended(borrows: bool) -> None:
    loop = LoopThread("kvpool-test-loop")
    gate, left = threading.Event(), threading.Event()
    try:
        with ThreadPoolExecutor(1) as threads:
            opener = threading.Timer(0.5, gate.set)
            opener.start()
            started = time.monotonic()
            with pytest.raises(StoreTimeoutError, match=r"0\.2 s"):
                loop.run(offload(threads, _held, gate, left, borrows=borrows), 0.2, borrows=borrows)
            took = time.monotonic() - started
            assert left.is_set() is borrows  # without borrows it returned at the timeout
            assert (0.45 < took < 5) if borrows else took < 0.45
            opener.join()
    finally:
        loop.stop()


def test_a_lending_call_stops_waiting_when_the_loop_stops() -> None:
    loop = LoopThread("kvpool-test-loop")
    gate, left = threading.Event(), threading.Event()
    threads = ThreadPoolExecutor(1)
    stopper = threading.Timer(0.5, loop.stop)
    stopper.start()
    started = time.monotonic()
    try:
        with pytest.raises(StoreTimeoutError):
            loop.run(offload(threads, _held, gate, left, borrows=True), 0.1, borrows=True)
        assert 0.45 < time.monotonic() - started < 5  # released by stop(), not by the job
        assert not left.is_set()
    finally:
        gate.set()
        stopper.join()
        threads.shutdown(wait=True)
