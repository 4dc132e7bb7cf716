"""How kvpool reports misuse that it can survive (strict mode).

Some mistakes cannot corrupt anything because kvpool refuses to act on
them: a ``ref_count_down`` on an object whose memory already went back to
the pool, an ``unpin`` below zero, a second free.  By default such an event
is logged as a warning on the ``kvpool`` logger and the call does nothing.
In *strict mode* it raises instead (:class:`~kvpool.errors.RefCountError`
for counting errors, :class:`~kvpool.errors.InvalidHandleError` for dead
handles), which is what test suites want.

Some events are not misuse at all outside strict mode, only worth
finding for those who look: an object freed while views of its bytes are
alive is safe (the bytes wait for the last view) and common in correct
asynchronous code.  Such an event is counted by its owner, logged at
DEBUG (:func:`notice`), and raises only in strict mode.

Strict mode is on when the environment variable ``KVPOOL_STRICT`` is set
to ``1`` (or ``true``/``yes``/``on``) at import time, and can be switched
at run time with :func:`set_strict_mode`.
"""

from __future__ import annotations

import logging
import os

from kvpool.checks import check_bool

__all__ = ["STRICT_ENV", "ReportOnce", "notice", "report", "set_strict_mode", "strict_mode"]

#: Environment variable that switches strict mode on at import time.
STRICT_ENV = "KVPOOL_STRICT"

logger = logging.getLogger("kvpool")

_strict = os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def strict_mode() -> bool:
    """Return True when misuse raises instead of logging a warning."""
    return _strict


def set_strict_mode(enabled: bool) -> bool:
    """Switch strict mode on or off for the whole process.

    Args:
        enabled: True to raise on misuse, False to log a warning.

    Returns:
        The previous setting, so callers can restore it.

    Raises:
        InvalidArgumentError: ``enabled`` is not a bool (numpy bools pass).
    """
    global _strict
    enabled = check_bool("enabled", enabled)
    previous = _strict
    _strict = enabled
    return previous


def report(error: type[Exception], message: str) -> None:
    """Raise ``error(message)`` in strict mode, else log it as a warning."""
    if _strict:
        raise error(message)
    logger.warning("%s", message)


def notice(error: type[Exception], message: str) -> None:
    """Raise ``error(message)`` in strict mode, else log it at DEBUG.

    For events that are safe outside strict mode (the caller counts them)
    but that strict mode is there to find.
    """
    if _strict:
        raise error(message)
    logger.debug("%s", message)


class ReportOnce:
    """:func:`report` for one owner that warns once (strict mode raises every time).

    A pool or allocator keeps one per kind of misuse, so a caller that
    repeats a hopeless request is told without flooding the log.
    """

    __slots__ = ("said",)

    def __init__(self) -> None:
        self.said = False

    def __call__(self, error: type[Exception], message: str) -> None:
        """Report ``message`` if this owner has not yet (always in strict mode)."""
        if _strict or not self.said:
            self.said = True
            report(error, message)
