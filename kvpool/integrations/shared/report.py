"""Store errors as an engine sees them: misses, one warning per outage, every event counted.

An engine treats a failed store call as a miss (a get) or a page not
stored (a put); no store error reaches it.  What is logged, on the
integration's logger (which the engine's log settings govern):

==============================  =============================================
event                           log
==============================  =============================================
miss; full cache; closing       nothing above DEBUG (normal events)
corrupt or foreign entry        one WARNING per entry read, naming the key
store unreachable, timing out,  one WARNING when it starts failing, naming
refusing (an outage)            the error's type; one INFO when a call
                                succeeds again; DEBUG in between
anything else (a bug)           a WARNING with its type, rate-limited as an outage
==============================  =============================================

Every call is counted in a :class:`~kvpool.remote.counters.StoreCounters`
(errors by type); :attr:`Reporter.corrupt` and :attr:`Reporter.outages`
count those events.
"""

from __future__ import annotations

import logging
import threading
import time

from kvpool.errors import InvalidHandleError, OutOfMemoryError, RemoteStoreError
from kvpool.remote.counters import StoreCounters

__all__ = ["Reporter", "is_quiet"]


def is_quiet(exc: BaseException) -> bool:
    """True for the normal events: a full cache, a closed store or pool, a freed object."""
    return isinstance(exc, (OutOfMemoryError, InvalidHandleError))


class Reporter:
    """Turns store outcomes into log lines and counts for one integration instance.

    Args:
        logger: where to log.
        label: names the instance in messages (no secrets), e.g.
            ``kvpool plugin 'name' (url)``.
        counters: the instance's counters.
        consequence: what the engine gets during an outage, for the
            warning (``"LMCache gets misses from this backend"``).

    Attributes:
        corrupt: corrupt or foreign entries read (each was a miss).
        outages: times the store started failing.

    Thread safety: any thread may call it; the outage state has a lock.
    """

    def __init__(
        self,
        logger: logging.Logger,
        label: str,
        counters: StoreCounters,
        consequence: str = "the engine gets misses",
    ) -> None:
        self.logger = logger
        self.label = label
        self.counters = counters
        self.consequence = consequence
        self.corrupt = 0
        self.outages = 0
        self._failing = 0  # failed calls in the current outage (0: healthy)
        self._lock = threading.Lock()

    def ok(self) -> None:
        """A call reached the store: end an outage (one INFO line)."""
        if not self._failing:
            return
        with self._lock:
            failed, self._failing = self._failing, 0
        if failed:
            self.logger.info(
                "%s: the store answers again (after %d failed calls)", self.label, failed
            )

    def failed(self, op: str, started: float, exc: BaseException, count: bool = True) -> None:
        """A call failed as a whole (its keys are misses, its puts not stored).

        Args:
            op: the operation (``get``, ``batched_put``...).
            started: its ``time.perf_counter()`` start, for the counters.
            exc: what the store raised.
            count: record it in the counters (False when already recorded).
        """
        if count:
            self.counters.observe(op, time.perf_counter() - started, error=exc)
        if is_quiet(exc):
            self.logger.debug("%s: %s: %s", self.label, op, exc)
            return
        with self._lock:
            first = self._failing == 0
            self._failing += 1
            if first:
                self.outages += 1
        if not first:
            self.logger.debug("%s: %s failed: %s: %s", self.label, op, type(exc).__name__, exc)
        elif isinstance(exc, RemoteStoreError):
            self.logger.warning(
                "%s: %s failed (%s: %s); %s until the store answers again",
                self.label,
                op,
                type(exc).__name__,
                exc,
                self.consequence,
            )
        else:
            self.logger.warning(
                "%s: %s failed with an unexpected %s: %s; treated as a miss",
                self.label,
                op,
                type(exc).__name__,
                exc,
            )

    def bad_entry(self, key: str, exc: BaseException) -> None:
        """An entry that cannot be the engine's: a miss and one WARNING naming the key."""
        self.corrupt += 1
        self.counters.observe("unusable_entry", 0.0, error=exc)
        self.logger.warning(
            "%s: entry %r is unusable, read as a miss (%s: %s); %d unusable entries so far",
            self.label,
            key,
            type(exc).__name__,
            exc,
            self.corrupt,
        )
