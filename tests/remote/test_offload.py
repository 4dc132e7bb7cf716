"""kvpool.remote.aiobase.offload: a job whose caller stopped waiting ends quietly; a job
that reads the caller's memory (``borrows``) outlasts every cancellation.

An asyncio store runs blocking work in threads and awaits it; a caller
that stops waiting (a timeout, a cancelled task) leaves the job running.
When that job then fails - a connection the deadline gave up on, closed
by the server a moment later - nobody is left to read its error, and
asyncio would report it to the loop's exception handler ("Future
exception was never retrieved", an ERROR record of the ``asyncio``
logger) although the caller already got its own typed error.  A closed
peer is a normal event: nothing may be reported.

A put's job reads the caller's objects, which an engine reuses as soon
as the call returns: with ``borrows=True`` a cancelled call returns only
once its job ended (however often it is cancelled meanwhile), drops a job
still queued, and waits no longer than its ``deadline``.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from kvpool.remote.aiobase import offload

from .conftest import until


def _fails_later(started: threading.Event, go: threading.Event) -> None:
    started.set()
    go.wait(10)
    raise ConnectionError("the server closed the connection")


def _returns_later(started: threading.Event, go: threading.Event) -> str:
    started.set()
    go.wait(10)
    return "late"


@pytest.mark.parametrize("job", [_fails_later, _returns_later])
def test_a_job_nobody_waits_for_any_more_reports_nothing(job: Any) -> None:
    reported: list[dict[str, Any]] = []
    orphans: list[Any] = []
    started, go = threading.Event(), threading.Event()

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))
        with ThreadPoolExecutor(1) as threads:
            waiting = offload(threads, job, started, go, on_orphan=orphans.append)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(waiting, 0.05)
            assert started.is_set()
            go.set()  # the job ends now, after its caller gave up
        # The executor is shut down: the job ended.  The loop delivers its end
        # (and on_orphan's call), then drops its futures.
        await until(lambda: job is _fails_later or orphans)
        for _ in range(5):
            await asyncio.sleep(0.01)
        gc.collect()
        await asyncio.sleep(0.01)

    asyncio.run(scenario())
    gc.collect()
    assert reported == [], [ctx.get("message") for ctx in reported]
    assert orphans == ([] if job is _fails_later else ["late"])


def _held(started: threading.Event, go: threading.Event, ended: threading.Event) -> str:
    started.set()
    go.wait(10)
    ended.set()
    return "done"


def test_a_borrowing_call_returns_only_once_its_job_ended() -> None:
    started, go, ended = threading.Event(), threading.Event(), threading.Event()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as threads:
            task = asyncio.create_task(offload(threads, _held, started, go, ended, borrows=True))
            await until(started.is_set)
            for _ in range(3):  # every cancellation is absorbed while the job runs
                task.cancel()
                await asyncio.sleep(0.05)
                assert not task.done()
            loop.call_later(0.05, go.set)
            with pytest.raises(asyncio.CancelledError):
                await task
            assert ended.is_set()

    asyncio.run(scenario())


def test_a_borrowing_call_drops_its_job_when_still_queued() -> None:
    started, go, ended = threading.Event(), threading.Event(), threading.Event()
    ran: list[int] = []

    async def scenario() -> None:
        with ThreadPoolExecutor(1) as threads:
            busy = asyncio.create_task(offload(threads, _held, started, go, ended))
            await until(started.is_set)
            queued = asyncio.create_task(offload(threads, ran.append, 1, borrows=True))
            await asyncio.sleep(0.01)
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued  # at once: the job had not started
            go.set()
            assert await busy == "done"
        assert ran == []  # it never ran

    asyncio.run(scenario())


@pytest.mark.parametrize("borrows", [False, True])
def test_a_deadline_bounds_the_call(borrows: bool) -> None:
    started, go, ended = threading.Event(), threading.Event(), threading.Event()
    orphans: list[Any] = []

    async def scenario() -> None:
        with ThreadPoolExecutor(1) as threads:
            begin = time.monotonic()
            call = offload(
                threads, _held, started, go, ended,
                on_orphan=orphans.append, borrows=borrows, deadline=begin + 0.3,
            )  # fmt: skip
            task = asyncio.create_task(call)
            await until(started.is_set)
            task.cancel()  # a borrowing call waits for its job, until the deadline
            with pytest.raises(asyncio.CancelledError):
                await task
            took = time.monotonic() - begin
            assert (0.25 < took < 2.0) if borrows else took < 0.25
            assert not ended.is_set()  # the job goes on past the deadline
            # Not cancelled: past the deadline the call raises TimeoutError.
            with pytest.raises(TimeoutError):
                await offload(threads, time.sleep, 0.5, deadline=time.monotonic() + 0.05)
            go.set()
        await until(lambda: orphans == ["done"])

    asyncio.run(scenario())
