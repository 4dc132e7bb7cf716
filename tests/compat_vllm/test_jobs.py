"""The tier's job threads (kvpool.integrations.vllm.jobs): what vLLM's has_pending_work reads."""

from __future__ import annotations

import threading
from collections import deque

from kvpool.integrations.vllm.jobs import JobRunner


def test_a_runner_is_busy_until_the_result_is_taken_at_every_step() -> None:
    """``busy`` read as a job's result is handed over: never idle with a result pending."""
    runner: JobRunner[str] = JobRunner(1, "kvpool-test-jobs")
    seen: list[bool] = []
    handed = threading.Event()

    class Finished(deque[str]):
        def append(self, item: str) -> None:
            seen.append(runner.busy)  # the moment the result is handed over
            super().append(item)
            handed.set()

    runner._finished = Finished()
    try:
        runner.submit(lambda: "done", lambda: "failed", load=True)
        assert handed.wait(30)
        runner.drain()
        assert seen == [True]
        assert runner.busy  # the result waits to be taken
        assert runner.finished() == ["done"]
        assert not runner.busy
    finally:
        runner.stop(0.0)
