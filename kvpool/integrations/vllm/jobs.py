"""The tier's I/O threads: jobs queued by vLLM's scheduler, run here, their results polled.

vLLM's scheduler calls the tier under its manager lock and must never wait:
``submit_store``/``submit_load`` only queue a job here, and
``get_finished_jobs`` takes what has ended.  :class:`JobRunner` owns the
threads that run the jobs:

* loads first: a load (a promotion) is a request waiting for its prefix, a
  store (a cascade) only fills the tier, so every idle thread takes the oldest
  load before any store;
* a job never raises into the runner: its ``run`` returns its result, and a
  ``run`` that raises anyway ends as its ``fail`` result;
* :meth:`JobRunner.drain` waits until every job queued has ended (none is
  aborted mid-way); :meth:`JobRunner.stop` ends the queued ones as failed at
  once and gives the running ones a bounded grace.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["JobRunner"]

_R = TypeVar("_R")
_log = logging.getLogger("kvpool.integrations.vllm")


class JobRunner(Generic[_R]):
    """Threads that run queued jobs, loads before stores (see the module docstring).

    Args:
        threads: how many threads.
        name: their name's prefix.

    Thread safety: any thread may submit and poll; one job runs in one thread.
    """

    def __init__(self, threads: int, name: str) -> None:
        self._cond = threading.Condition()
        self._loads: deque[tuple[Callable[[], _R], Callable[[], _R]]] = deque()
        self._stores: deque[tuple[Callable[[], _R], Callable[[], _R]]] = deque()
        self._finished: deque[_R] = deque()
        self._running = 0
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, run: Callable[[], _R], fail: Callable[[], _R], load: bool) -> None:
        """Queue a job; it returns at once.

        Args:
            run: does the job, returns its result (called in a runner thread).
            fail: the job's result when it cannot run (stopped, or ``run`` raised).
            load: a load (taken before every store) or a store.
        """
        with self._cond:
            if self._stopping:
                self._finished.append(fail())
                return
            (self._loads if load else self._stores).append((run, fail))
            self._cond.notify()

    def finished(self) -> list[_R]:
        """The results of the jobs that ended since the last call, oldest first.

        Complexity: O(results); no waiting.
        """
        out = []
        pop = self._finished.popleft
        while self._finished:
            out.append(pop())
        return out

    @property
    def busy(self) -> bool:
        """True while a job is queued or running, or a result waits to be taken.

        Read under the lock: a job moves from its queue to running, and from
        running to finished, in one step each, so no moment reads as idle.
        """
        with self._cond:
            return bool(self._loads or self._stores or self._running or self._finished)

    def drain(self) -> None:
        """Wait until every queued job has ended (their results wait in :meth:`finished`)."""
        with self._cond:
            self._cond.wait_for(lambda: not (self._loads or self._stores or self._running))

    def stop(self, grace: float) -> int:
        """End queued jobs as failed, give running ones ``grace`` seconds, stop the threads.

        Args:
            grace: most seconds to wait for the running jobs.

        Returns:
            Jobs still running after the grace (they end on their own; their
            results are dropped with the runner).
        """
        with self._cond:
            self._stopping = True
            for queue in (self._loads, self._stores):
                while queue:
                    _, fail = queue.popleft()
                    self._finished.append(fail())
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._running, grace)
            return self._running

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._loads or self._stores)
                if self._loads:
                    run, fail = self._loads.popleft()
                elif self._stores:
                    run, fail = self._stores.popleft()
                else:
                    return  # stopping, nothing queued
                self._running += 1
            try:
                result = run()
            except Exception:  # a job's own errors are its result; this is a bug, logged once
                _log.exception("kvpool vLLM tier: a job raised; it ends as failed")
                result = fail()
            with self._cond:
                self._finished.append(result)  # before it stops counting as running
                self._running -= 1
                self._cond.notify_all()
