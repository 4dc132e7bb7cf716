"""Existence checks on the tier's own thread: vLLM's lookup contract, answered by a batched check.

vLLM's ``AsyncLookupManager`` (``vllm/v1/kv_offload/tiering/async_lookup.py``)
is how a tier answers ``lookup`` without waiting: the keys looked up during a
scheduler step are posted as one batch at the step's end, a background thread
checks them, and until the answer arrives the key is ``RETRY``; a verdict is
kept while a request still asks for it.  :class:`StoreLookups` is that manager
with the check supplied by the tier - one ``batched_exists`` of the store per
request's batch, which the tier makes a miss-for-all during an outage - and a
shutdown that never waits longer than it is told to.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager

__all__ = ["StoreLookups"]


class StoreLookups(AsyncLookupManager):
    """vLLM's asynchronous lookups over the tier's existence check.

    Args:
        tier_type: the tier's type (names the lookup thread).
        check: ``OffloadKey`` s -> whether each is in the store; never raises
            (the tier answers all-missing when the store fails).
    """

    def __init__(self, tier_type: str, check: Callable[[list[bytes]], list[bool]]) -> None:
        self._check = check
        super().__init__(tier_type=tier_type)

    def batch_lookup(self, keys: list[Any], req_context: Any) -> Iterable[bool]:
        """Whether each key is in the store (run on the lookup thread)."""
        return self._check(list(keys))

    def stop(self, wait: float) -> None:
        """Stop the lookup thread, waiting at most ``wait`` seconds for a check in flight.

        A check still running after ``wait`` ends on its own, bounded by the
        store's deadline.
        """
        done = threading.Thread(target=self.shutdown, name="kvpool-vllm-lookup-stop", daemon=True)
        done.start()
        done.join(wait)
