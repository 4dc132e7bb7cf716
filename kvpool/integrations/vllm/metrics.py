"""The tier's own metrics, beside the ones vLLM's tiering manager keeps for every tier.

vLLM's manager already counts, per tier, the bytes and seconds of every
finished job (``vllm:kv_offload_tiering_read_bytes``, ``..._write_bytes``,
``..._read_time``, ``..._write_time``, from each ``JobResult``) and the chunk
lookups and hits (``..._chunk_queries``, ``..._chunk_hits``).  The tier adds
what only it sees (:data:`TIER_METRICS`), labelled by the store's kind:

* ``kvpool:vllm_tier_chunks_skipped`` - chunks a store job found in the store already;
* ``kvpool:vllm_tier_chunks_evicted`` - chunks a bounded directory removed;
* ``kvpool:vllm_tier_unusable_entries`` - entries that could not be a chunk (removed);
* ``kvpool:vllm_tier_outages`` - times the store stopped answering;
* ``kvpool:vllm_tier_jobs_failed_fast`` - jobs ended at once during an outage.

Every store call is also in the tier's :class:`~kvpool.remote.counters.StoreCounters`,
exported with the stores' by :mod:`kvpool.metrics`.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["STORE_LABEL", "TIER_METRICS", "TierTally"]

#: The label every tier metric carries: the store's kind.
STORE_LABEL = "kvpool_store"

#: Metric name -> what it counts.
TIER_METRICS = {
    "kvpool:vllm_tier_chunks_skipped": "Chunks a store job found in the kvpool tier already.",
    "kvpool:vllm_tier_chunks_evicted": "Chunks a bounded kvpool directory tier removed.",
    "kvpool:vllm_tier_unusable_entries": (
        "Entries of the kvpool tier that could not be a chunk (corrupt, truncated); removed."
    ),
    "kvpool:vllm_tier_outages": "Times the kvpool tier's store stopped answering.",
    "kvpool:vllm_tier_jobs_failed_fast": "Jobs the kvpool tier ended at once during an outage.",
}


def definitions() -> dict[str, Any]:
    """vLLM's metric metadata of :data:`TIER_METRICS` (for ``build_metric_definitions``)."""
    from vllm.v1.kv_offload.base import OffloadingCounterMetadata

    return {
        name: OffloadingCounterMetadata(documentation=doc, labelnames=(STORE_LABEL,))
        for name, doc in TIER_METRICS.items()
    }


class TierTally:
    """Counts of :data:`TIER_METRICS` since the last :meth:`take`.

    Args:
        kind: the store's kind (the label value).

    Thread safety: any thread may :meth:`add`; :meth:`take` from the scheduler.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self.totals: dict[str, int] = dict.fromkeys(TIER_METRICS, 0)

    def add(self, name: str, count: int = 1) -> None:
        """Count ``count`` more of metric ``name``."""
        if count <= 0:
            return
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + count
            self.totals[name] += count

    def take(self) -> Any:
        """vLLM's stats payload of the counts since the last call, or None when there are none."""
        with self._lock:
            counts, self._counts = self._counts, {}
        if not counts:
            return None
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )

        stats = OffloadingConnectorStats()
        for name, value in counts.items():
            stats.increase_counter(name, value, (self.kind,))
        return stats
