"""The tier's record of what its store holds: the known chunks and vLLM's KV events, in one order.

A job learns that its chunks are in the store when its call returns; a
bounded directory evicts entries during a put (the job's own or another
job's) and reports them at once, from the thread that evicted.  Both
change the same two things - the chunks the tier knows
(:class:`~kvpool.integrations.vllm.known.KnownChunks`) and the KV events
vLLM takes - so both go through :class:`ChunkLedger`, under one lock:

* a chunk removed while a job ran is neither reported as stored by that
  job nor learned as known: its removal is already in the stream, and a
  later "stored" would contradict it;
* the stream's stored and removed events are in the order they happened.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kvpool.integrations.vllm.known import KnownChunks

__all__ = ["ChunkLedger"]


class ChunkLedger:
    """The known chunks and the KV events of one tier, changed in one order.

    Args:
        known: the chunks the tier knows are stored.
        events: where KV events go, or None when vLLM has events off.
        event: ``(keys, removed) -> OffloadingEvent``.

    Thread safety: any thread may call any method.
    """

    def __init__(
        self,
        known: KnownChunks,
        events: deque[Any] | None,
        event: Callable[[list[bytes], bool], Any],
    ) -> None:
        self.known = known
        self.events = events
        self._event = event
        self._lock = threading.Lock()
        self._watches: dict[int, set[bytes]] = {}

    @contextmanager
    def watch(self) -> Iterator[set[bytes]]:
        """Collect the chunks removed while a job runs (the set yielded) until the block ends."""
        removed: set[bytes] = set()
        with self._lock:
            self._watches[id(removed)] = removed
        try:
            yield removed
        finally:
            with self._lock:
                del self._watches[id(removed)]

    def learn(self, keys: list[bytes], removed: set[bytes], stored: bool) -> list[bytes]:
        """A job found ``keys`` in the store: know them, and report them stored if it put them.

        Args:
            keys: the job's chunks now in the store.
            removed: the set :meth:`watch` yielded to the job.
            stored: a store job (its chunks are reported as stored events).

        Returns:
            The chunks learned: ``keys`` less those removed while the job ran.
        """
        with self._lock:
            kept = [k for k in keys if k not in removed]
            self.known.add(kept)
            if stored and kept and self.events is not None:
                self.events.append(self._event(kept, False))
        return kept

    def removed(self, keys: list[bytes]) -> None:
        """The store removed ``keys`` (evicted, or unusable): forget them, report the removal."""
        if not keys:
            return
        with self._lock:
            self.known.discard(keys)
            for watch in self._watches.values():
                watch.update(keys)
            if self.events is not None:
                self.events.append(self._event(keys, True))
