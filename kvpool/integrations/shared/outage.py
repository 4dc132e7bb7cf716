"""A store that stopped answering is asked again once a second, not by every call.

An engine that must never wait (vLLM's scheduler) hands its calls to the
integration's threads; during an outage each of those calls would still
wait for the store's deadline before failing, so lookups would answer
"retry" for seconds and queued jobs would end one timeout apart.
:class:`OutageGate` makes an outage cheap: once a call failed for the
store's sake (unreachable, timing out, refusing), the next calls fail at
once, without the store, except one probe every ``retry_after`` seconds;
the first call that reaches the store again opens the gate for all.

The gate only decides; what is logged is :class:`~kvpool.integrations.shared.report.Reporter`'s.
"""

from __future__ import annotations

import threading
import time

__all__ = ["OutageGate"]


class OutageGate:
    """Whether a call may go to the store now (see the module docstring).

    Args:
        retry_after: seconds between probes while the store is down.

    Attributes:
        retry_after: as given.

    Thread safety: any thread may call any method.
    """

    def __init__(self, retry_after: float = 1.0) -> None:
        self.retry_after = retry_after
        self._lock = threading.Lock()
        self._down = False
        self._next_probe = 0.0

    @property
    def down(self) -> bool:
        """True from a failure until a call reaches the store again."""
        return self._down

    def allow(self) -> bool:
        """True when a call may go to the store: it is up, or this call is the next probe.

        Complexity: O(1); no waiting.
        """
        if not self._down:
            return True
        with self._lock:
            now = time.monotonic()
            if now < self._next_probe:
                return False
            self._next_probe = now + self.retry_after
            return True

    def failed(self) -> None:
        """A call failed for the store's sake: calls fail at once until the next probe."""
        with self._lock:
            self._down = True
            self._next_probe = time.monotonic() + self.retry_after

    def ok(self) -> None:
        """A call reached the store: every call may go to it again."""
        if self._down:
            with self._lock:
                self._down = False
