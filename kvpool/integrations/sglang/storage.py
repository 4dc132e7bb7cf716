"""KVPoolHiCacheStorage: SGLang's HiCache L3 storage backend on a kvpool store.

SGLang's cache controller calls the backend from its prefetch and backup
threads, synchronously.  Each call is one batched call of the *blocking*
store, made in SGLang's own thread (no event loop, no thread hand-off):

* ``batch_set_v1`` puts every range of every page (lent in place from
  SGLang's host pool) in one ``batched_put``; a page is stored when all
  its ranges are.
* ``batch_get_v1`` reads every range into its place in the host pool
  (:class:`~kvpool.remote.placement.Placement`) in one ``batched_get``.
* ``batch_exists`` asks for every range at once and counts the leading
  pages whose ranges are all there.

A call returns only once the store is done with SGLang's pages - a put no
longer reads them, a get no longer writes them - so SGLang may reuse a page
as soon as it returns.  Each call is bounded by the store's own deadline
(``timeout``: the whole call on Redis and a cluster; Mooncake's RPC and
transfer timeouts; a directory is local I/O).

A miss, a refusal, an outage or a timeout is a ``False`` (or a shorter
count) for SGLang, never an exception; outages are reported once
(:class:`~kvpool.integrations.shared.report.Reporter`).  ``close()``
returns within 1.5 s whatever is in flight
(:class:`~kvpool.integrations.shared.calls.BlockingCalls`).  ``clear()``
removes the entries of this configuration's key tag and nothing else
(the store's ``delete_prefix``); ``get_stats()`` gives SGLang's storage
metrics (:mod:`kvpool.integrations.sglang.metrics`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

from kvpool.errors import (
    CorruptEntryError,
    FeatureUnavailableError,
    InvalidArgumentError,
    KVPoolError,
    OutOfMemoryError,
    PoolClosedError,
    StoreConnectionError,
    StoreTimeoutError,
)
from kvpool.formats import MemoryFormat
from kvpool.integrations.sglang.config import HiCacheConfigError, read_config
from kvpool.integrations.sglang.metrics import PageMetrics
from kvpool.integrations.sglang.pages import PageMap, Segment
from kvpool.integrations.shared.calls import CLOSE_GRACE, BlockingCalls
from kvpool.integrations.shared.report import Reporter
from kvpool.integrations.shared.settings import open_settings_store
from kvpool.remote.counters import StoreCounters
from kvpool.remote.objects import discard
from kvpool.remote.placement import Placement

__all__ = ["LOGGER_NAME", "KVPoolHiCacheStorage"]

#: The backend's logger (SGLang's logging settings govern it).
LOGGER_NAME = "kvpool.integrations.sglang"

_perf = time.perf_counter
_FMT = MemoryFormat.UNDEFINED
# A failed put whose store still answers may have stored some pages; during
# an outage asking would cost another timeout.
_OUTAGE = (StoreConnectionError, StoreTimeoutError)


class KVPoolHiCacheStorage(HiCacheStorage):
    """SGLang's HiCache storage backend over any store kvpool opens (see the module docstring).

    SGLang makes it from ``--hicache-storage-backend dynamic`` with
    ``module_path: kvpool.integrations.sglang`` and ``class_name:
    KVPoolHiCacheStorage`` (:mod:`kvpool.integrations.sglang` shows the
    whole flag), then registers its host pool.

    Args:
        storage_config: SGLang's ``HiCacheStorageConfig`` (ranks, model,
            ``extra_config`` with ``url`` and options).
        kwargs: what SGLang's factory passes besides (unused).

    Raises:
        HiCacheConfigError: a missing or bad ``url``, no ``interface_v1: 1``,
            an unknown option (named with the closest accepted one); from
            ``register_mem_pool_host``, a host pool whose layout kvpool
            cannot address.
        RemoteStoreError: (``mooncake://``) the master does not answer.

    Attributes:
        store: the blocking store.
        counters: every call the backend made (exported by ``kvpool.metrics``).
        report: outages and unusable entries.
        metrics: the values of SGLang's storage metrics until ``get_stats()``.
        direct: pages move as address ranges (``put_ranges``/``get_ranges``
            of a headerless Mooncake store over the registered host pool),
            with no memory object per range; set by ``register_mem_pool_host``.
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        self.storage_config = storage_config
        self.settings = read_config(storage_config.extra_config)
        self.label = f"{self.settings.instance} ({self.settings.shown_url})"
        self.logger = logging.getLogger(LOGGER_NAME)
        self.store = open_settings_store(
            self.settings, self.settings.instance, HiCacheConfigError, asyncio=False
        )
        self.counters = StoreCounters("KVPoolHiCacheStorage", "sglang")
        self.report = Reporter(
            self.logger,
            self.label,
            self.counters,
            "SGLang gets misses and its pages are not stored",
        )
        self.metrics = PageMetrics(bool(getattr(storage_config, "enable_storage_metrics", False)))
        self.is_writer = bool(storage_config.is_storage_writer)
        self.pages: PageMap | None = None
        self.direct = False
        self._calls = BlockingCalls()
        self.logger.info(
            "kvpool HiCache backend: %s at %s", type(self.store).__name__, self.settings.describe()
        )

    # -- SGLang's registration -------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Learn where SGLang's host pages are; register them with Mooncake once.

        Raises:
            HiCacheConfigError: a pool layout kvpool cannot address (SGLang
                then fails to attach the backend, naming the fix).
        """
        super().register_mem_pool_host(mem_pool_host)
        headerless = bool(getattr(self.store, "headerless", False))
        self.pages = PageMap(mem_pool_host, self.storage_config, self.label, headerless)
        register = getattr(self.store, "register_memory", None)
        registered = register is not None
        if register is not None:
            for lender in self.pages.lenders:
                try:
                    register(lender.memory)
                except KVPoolError as exc:  # each call then registers its ranges itself
                    registered = False
                    self.logger.info("%s: host pool stays registered per call: %s", self.label, exc)
        # A headerless store over the registered pool takes the page ranges as
        # they are: no memory object per range (~15 us of Python each).
        self.direct = registered and headerless and hasattr(self.store, "put_ranges")
        self.logger.info(
            "%s: %d store entries a page, keys tagged %s (%s)",
            self.label,
            self.pages.per_page,
            self.pages.space.tag,
            self.pages.space.text,
        )

    # -- the v1 interface --------------------------------------------------

    def batch_set_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None
    ) -> list[bool]:
        """Store the pages at ``host_indices`` under ``keys``; True for each page stored.

        A rank that is not the storage writer (MLA: one rank writes the
        pages every rank shares) stores nothing and reports success.
        """
        if not keys:
            return []
        if not self.is_writer:
            return [True] * len(keys)
        if not self._calls.enter():
            return [False] * len(keys)
        try:
            return self._set(keys, host_indices)
        finally:
            self._calls.leave()

    def batch_get_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None
    ) -> list[bool]:
        """Read the pages ``keys`` into ``host_indices`` in place; True for each page read."""
        if not keys:
            return []
        if not self._calls.enter():
            return [False] * len(keys)
        try:
            return self._get(keys, host_indices)
        finally:
            self._calls.leave()

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many of ``keys``, from the first, are stored whole (every range of the page)."""
        if not keys or not self._calls.enter():
            return 0
        started = _perf()
        try:
            found = self.store.batched_exists(self._map().names(keys))
        except Exception as exc:
            self.report.failed("batch_exists", started, exc)
            return 0
        finally:
            self._calls.leave()
        self.counters.observe("batch_exists", _perf() - started, entries=len(found))
        self.report.ok()
        whole = self._whole(found, len(keys))
        return whole.index(False) if False in whole else len(whole)

    def exists(self, key: str) -> bool:
        """True when page ``key`` is stored whole."""
        return self.batch_exists([key]) == 1

    # -- the legacy interface: refused -------------------------------------

    def _legacy(self, name: str) -> FeatureUnavailableError:
        return FeatureUnavailableError(
            f"{self.label}: {name} copies pages through staging tensors; the kvpool backend "
            'serves the zero-copy interface only (set "interface_v1": 1)'
        )

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """Refused: SGLang calls it only without ``interface_v1``, which start-up refuses.

        Raises:
            FeatureUnavailableError: always.
        """
        raise self._legacy("get")

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> Any:
        """Refused (see :meth:`get`).

        Raises:
            FeatureUnavailableError: always.
        """
        raise self._legacy("batch_get")

    def set(
        self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None
    ) -> bool:
        """Refused (see :meth:`get`).

        Raises:
            FeatureUnavailableError: always.
        """
        raise self._legacy("set")

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """Refused (see :meth:`get`).

        Raises:
            FeatureUnavailableError: always.
        """
        raise self._legacy("batch_set")

    # -- clear, stats, close -------------------------------------------------

    def clear(self) -> None:
        """Remove every page this configuration stored: the entries under its key tag.

        SGLang calls it to drop its L3 cache (the ``/clear_hicache_storage_backend``
        endpoint, a role switch).  Only this backend's entries go: the keys
        that start with its tag (:attr:`PageMap.space`), which every key of
        this configuration - model, ranks, dtype, layout - carries, through
        the store's ``delete_prefix``.  Other configurations, other users'
        keys on a shared server or directory, stay.  Servers of the same
        configuration share these pages: theirs go too.  Mooncake keeps an
        entry a reader holds a lease on (read or checked in its last lease
        period, 10 s by default); pages stored while it runs may stay.

        Raises:
            PoolClosedError: closed, or no host pool registered yet.
            RemoteStoreError: the store failed or timed out (SGLang logs it
                and reports the clear as failed); what was removed stays removed.
        """
        pages = self._map()
        if not self._calls.enter():
            raise PoolClosedError(f"{self.label} is closed")
        started = _perf()
        try:
            removed = self.store.delete_prefix(pages.space.prefix)
        except Exception as exc:
            self.counters.observe("clear", _perf() - started, error=exc)
            raise
        finally:
            self._calls.leave()
        self.counters.observe("clear", _perf() - started, entries=removed)
        self.logger.info(
            "%s: clear() removed %d store entries tagged %s", self.label, removed, pages.space.tag
        )

    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics`` of the calls since the last call (see ``metrics``).

        Returns:
            ``StorageMetrics`` (pages and GiB/s of each get and set), or None
            when SGLang's storage metrics are off.
        """
        return self.metrics.take()

    def close(self) -> None:
        """Refuse new calls, let those in flight end for 1 s, close the store; idempotent.

        Returns within 1.5 s.  A call still running then keeps the store
        until it ends (within the store's own ``timeout``), and the last
        one closes it.
        """
        late = self._calls.close(self.store.close)
        if late:
            self.logger.warning(
                "%s: closed with %d calls still in flight after %.1f s; the store closes when "
                "the last one ends (within its timeout)",
                self.label,
                late,
                CLOSE_GRACE,
            )
        self.logger.info("%s: closed", self.label)

    # -- the calls ------------------------------------------------------------

    def _map(self) -> PageMap:
        if self.pages is None:
            raise PoolClosedError("SGLang registered no host pool yet")
        return self.pages

    def _set(self, keys: list[str], host_indices: torch.Tensor) -> list[bool]:
        started = _perf()
        objs: list[Any] = []
        try:
            pages = self._map()
            names = pages.names(keys)
            if self.direct:
                ptrs, sizes = pages.ranges(keys, host_indices)
                nbytes = sum(sizes)
            else:
                nbytes = 0
                for lender, address, size, shapes, dtypes in pages.segments(keys, host_indices):
                    objs.append(lender.lend(address, size, shapes, dtypes, _FMT))
                    nbytes += size
            try:
                if self.direct:
                    self.store.put_ranges(names, ptrs, sizes)
                else:
                    self.store.batched_put(names, objs)
            except Exception as exc:
                self.report.failed("batch_set_v1", started, exc)
                self.metrics.record("backup", len(keys), 0, 0.0)
                if isinstance(exc, _OUTAGE):
                    return [False] * len(keys)
                try:
                    stored = self.store.batched_exists(names)  # what did make it
                except Exception:
                    return [False] * len(keys)
                return self._whole(stored, len(keys))
        except Exception as exc:  # the pages could not be lent (bad indices): not stored
            self.report.failed("batch_set_v1", started, exc)
            return [False] * len(keys)
        finally:
            for obj in objs:
                discard(obj)
        seconds = _perf() - started
        self.counters.observe("batch_set_v1", seconds, entries=len(names), nbytes=nbytes)
        self.metrics.record("backup", len(keys), nbytes, seconds)
        self.report.ok()
        return [True] * len(keys)

    def _get(self, keys: list[str], host_indices: torch.Tensor) -> list[bool]:
        started = _perf()
        try:
            pages = self._map()
            names = pages.names(keys)
            read = None
            if self.direct:
                ptrs, sizes = pages.ranges(keys, host_indices)
                read = self._read_direct(names, ptrs, sizes, started)
            if read is None:
                read = self._read(names, pages.segments(keys, host_indices), started)
        except Exception as exc:
            self.report.failed("batch_get_v1", started, exc)
            return [False] * len(keys)
        found, total = read
        seconds = _perf() - started
        self.metrics.record("prefetch", len(keys), total, seconds)
        return self._whole(found, len(keys))

    def _read_direct(
        self, names: list[str], ptrs: list[int], sizes: list[int], started: float
    ) -> tuple[list[bool], int] | None:
        """Read every range in place with the store's ``get_ranges`` (see ``direct``).

        Returns:
            As :meth:`_read`; None when an entry is unusable (the caller then
            reads through memory objects, one by one, naming it).
        """
        try:
            found = self.store.get_ranges(names, ptrs, sizes)
        except (CorruptEntryError, InvalidArgumentError) as exc:
            self.counters.observe("batch_get_v1", _perf() - started, error=exc)
            return None
        except Exception as exc:  # the store is unreachable or failing: all misses
            self.report.failed("batch_get_v1", started, exc)
            return [False] * len(names), 0
        total = sum(n for n, ok in zip(sizes, found, strict=True) if ok)
        misses = found.count(False)
        self.counters.observe(
            "batch_get_v1", _perf() - started, entries=len(names), nbytes=total, misses=misses
        )
        self.report.ok()
        return found, total

    def _read(
        self, names: list[str], segments: list[Segment], started: float
    ) -> tuple[list[bool], int]:
        """Read every range in place: one batched get per range size (usually one).

        Returns:
            Per range whether it was read, and the bytes read.
        """
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, (_, _, nbytes, shapes, dtypes) in enumerate(segments):
            groups.setdefault((nbytes, tuple(shapes), tuple(dtypes)), []).append(i)
        found = [False] * len(names)
        total = 0
        healthy = True
        for (_, shapes, dtypes), idx in groups.items():
            place = Placement()
            for i in idx:
                lender, address, nbytes, _, _ = segments[i]
                place.add(names[i], lender, address, nbytes)
            wanted = [names[i] for i in idx]
            try:
                objs = self.store.batched_get(wanted, place, list(shapes), list(dtypes), _FMT)
            except (CorruptEntryError, InvalidArgumentError, OutOfMemoryError) as exc:
                # One entry fails the whole batch: read them one by one, so the
                # good ones still load and the bad one is named.
                self.counters.observe("batch_get_v1", _perf() - started, error=exc)
                objs = self._read_one_by_one(wanted, place, list(shapes), list(dtypes))
            except Exception as exc:  # the store is unreachable or failing: all misses
                self.report.failed("batch_get_v1", started, exc)
                healthy = False
                continue
            for i, obj in zip(idx, objs, strict=True):
                if obj is not None:
                    found[i] = True
                    total += obj.get_size()
                    obj.ref_count_down()
        self.counters.observe(
            "batch_get_v1",
            _perf() - started,
            entries=len(names),
            nbytes=total,
            misses=found.count(False),
        )
        if healthy:
            self.report.ok()
        return found, total

    def _read_one_by_one(
        self, names: list[str], place: Placement, shapes: list[Any], dtypes: list[Any]
    ) -> list[Any]:
        """After a failed batch: each range alone, stopping at the first that fails."""
        out: list[Any] = [None] * len(names)
        for i, name in enumerate(names):
            try:
                out[i] = self.store.get(name, place, shapes, dtypes, _FMT)
            except (CorruptEntryError, InvalidArgumentError) as exc:
                self.report.bad_entry(name, exc)
                break
            except Exception as exc:
                self.report.failed("get", _perf(), exc)
                break
            if out[i] is None:
                break
        return out

    def _whole(self, found: Sequence[bool], pages: int) -> list[bool]:
        """Per page: True when every one of its ranges is."""
        per = len(found) // pages if pages else 0
        return [all(found[p * per : (p + 1) * per]) for p in range(pages)]

    def __repr__(self) -> str:
        return f"<KVPoolHiCacheStorage {self.label}>"
