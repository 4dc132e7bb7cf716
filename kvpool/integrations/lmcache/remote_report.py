"""What the plugin says about store errors: misses for LMCache, few log lines, every event counted.

LMCache treats a remote error as a miss, and so does the connector: no
store error reaches LMCache's engine.  What gets logged (on the plugin's
logger, which LMCache's log settings govern):

==============================  =============================================
event                           log
==============================  =============================================
miss; full LMCache cache        nothing above DEBUG (normal events)
closing; a freed object         nothing above DEBUG
corrupt or foreign entry        one WARNING per entry read, naming the key
store unreachable, timing out,  one WARNING when it starts failing, one INFO
refusing (an outage)            when a call succeeds again; DEBUG in between
anything else (a bug)           a WARNING with its type, rate-limited as an outage
==============================  =============================================

Every call the connector makes is counted in its
:class:`~kvpool.remote.counters.StoreCounters` (errors by type), and
:attr:`Reporter.corrupt` / :attr:`Reporter.outages` count those events.
"""

from __future__ import annotations

import logging
import threading
import time

from kvpool.errors import (
    InvalidHandleError,
    OutOfMemoryError,
    RemoteStoreError,
)
from kvpool.remote.counters import StoreCounters

__all__ = ["LOGGER_NAME", "Reporter", "is_quiet", "plugin_logger"]

#: The plugin's logger: the module users name in LMCache's config.
LOGGER_NAME = "kvpool.integrations.lmcache.remote"


def plugin_logger() -> logging.Logger:
    """The plugin's logger, set up by LMCache's ``init_logger`` on first use.

    It then prints with LMCache's format at ``LMCACHE_LOG_LEVEL`` (INFO by
    default), next to LMCache's own lines, and does not propagate (as
    LMCache's loggers).
    """
    logger = logging.getLogger(LOGGER_NAME)
    if not logger.handlers:
        from lmcache.logging import init_logger

        logger = init_logger(LOGGER_NAME)
    return logger


def is_quiet(exc: BaseException) -> bool:
    """True for the normal events: a full LMCache cache, a closed store or pool, a freed object."""
    return isinstance(exc, (OutOfMemoryError, InvalidHandleError))


class Reporter:
    """Turns store outcomes into log lines and counts for one plugin instance.

    Args:
        logger: where to log.
        label: ``kvpool plugin 'name' (url)`` for the messages (no secrets).
        counters: the connector's counters.

    Attributes:
        corrupt: corrupt or foreign entries read (each was a miss).
        outages: times the store started failing.

    Thread safety: used from the event loop and from the threads of
    LMCache's synchronous calls; the outage state has a lock.
    """

    def __init__(self, logger: logging.Logger, label: str, counters: StoreCounters) -> None:
        self.logger = logger
        self.label = label
        self.counters = counters
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
                "%s: %s failed (%s: %s); LMCache gets misses from this backend until the "
                "store answers again",
                self.label,
                op,
                type(exc).__name__,
                exc,
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
        """An entry that cannot be this engine's chunk: a miss and one WARNING naming the key."""
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
