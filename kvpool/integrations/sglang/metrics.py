"""SGLang's storage metrics (``get_stats``): pages and bandwidth of each get and set.

With SGLang's metrics on (``--enable-metrics``, which sets
``HiCacheStorageConfig.enable_storage_metrics``), SGLang 0.5.23's cache
asks the backend for ``get_stats()`` at each of its HiCache checks (every
scheduler step) and feeds every value of the ``StorageMetrics`` it returns
into four Prometheus histograms (``sglang:prefetch_pgs``,
``sglang:backup_pgs``, ``sglang:prefetch_bandwidth``,
``sglang:backup_bandwidth``).  So the lists
hold one value per backend call *since the last* ``get_stats()``, as
SGLang's own backends fill them:

==================  ====================================================
``prefetch_pgs``    pages asked for by each ``batch_get_v1``
``prefetch_bandwidth``  GiB/s of each ``batch_get_v1``: bytes read into
                    SGLang's pages / the call's seconds (a call that read
                    nothing adds no value)
``backup_pgs``      pages of each ``batch_set_v1`` that called the store
``backup_bandwidth``  GiB/s of each successful ``batch_set_v1``: bytes
                    written / the call's seconds
==================  ====================================================

GiB/s (bytes / 2^30 / s) is what SGLang's own backends compute (their
``gb_per_page`` is a page's bytes / 2^30).  A call that failed as a whole
(an outage) adds its pages but no bandwidth.  Between two ``get_stats()``
each list keeps at most :data:`MAX_VALUES` values (a server that never asks
does not grow them), later ones are dropped.  With storage metrics off
nothing is recorded and ``get_stats()`` returns ``None`` (SGLang does not
call it then).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["MAX_VALUES", "PageMetrics"]

#: Most values each list keeps between two ``get_stats()``.
MAX_VALUES = 10_000
_GIB = float(1 << 30)


class PageMetrics:
    """The values of SGLang's ``StorageMetrics`` since the last :meth:`take` (see the module).

    Args:
        enabled: record (SGLang's ``enable_storage_metrics``).

    Thread safety: SGLang's prefetch and backup threads record, its
    scheduler takes; a lock keeps the lists whole.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._lists: dict[str, list[float]] = {
            "prefetch_pgs": [],
            "prefetch_bandwidth": [],
            "backup_pgs": [],
            "backup_bandwidth": [],
        }

    def record(self, op: str, pages: int, nbytes: int, seconds: float) -> None:
        """One call: ``op`` is ``"prefetch"`` (a get) or ``"backup"`` (a set).

        Args:
            op: which pair of lists.
            pages: pages the call asked for.
            nbytes: bytes it moved (0: no bandwidth value).
            seconds: how long it took.
        """
        if not self.enabled:
            return
        with self._lock:
            counts = self._lists[op + "_pgs"]
            if len(counts) < MAX_VALUES:
                counts.append(pages)
            rates = self._lists[op + "_bandwidth"]
            if nbytes > 0 and seconds > 0 and len(rates) < MAX_VALUES:
                rates.append(nbytes / _GIB / seconds)

    def take(self) -> Any:
        """SGLang's ``StorageMetrics`` of the calls since the last take (the lists emptied).

        Returns:
            The ``StorageMetrics``, or None when disabled or when SGLang's
            metrics module cannot be imported.
        """
        if not self.enabled:
            return None
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except ImportError:
            return None
        with self._lock:
            taken = self._lists
            self._lists = {name: [] for name in taken}
        metrics = StorageMetrics()
        metrics.prefetch_pgs.extend(int(v) for v in taken["prefetch_pgs"])
        metrics.backup_pgs.extend(int(v) for v in taken["backup_pgs"])
        metrics.prefetch_bandwidth.extend(taken["prefetch_bandwidth"])
        metrics.backup_bandwidth.extend(taken["backup_bandwidth"])
        return metrics
