"""kvpool.remote.aiobase.offload: a job whose caller stopped waiting ends quietly.

An asyncio store runs blocking work in threads and awaits it; a caller
that stops waiting (a timeout, a cancelled task) leaves the job running.
When that job then fails - a connection the deadline gave up on, closed
by the server a moment later - nobody is left to read its error, and
asyncio would report it to the loop's exception handler ("Future
exception was never retrieved", an ERROR record of the ``asyncio``
logger) although the caller already got its own typed error.  A closed
peer is a normal event: nothing may be reported.
"""

from __future__ import annotations

import asyncio
import gc
import threading
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
