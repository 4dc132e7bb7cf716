"""KVPoolHiCacheStorage: SGLang's HiCache L3 storage backend on a kvpool store.

SGLang's cache controller calls the backend from its prefetch and backup
threads, synchronously.  Each call becomes one batched store call on the
backend's own event loop (:class:`~kvpool.integrations.shared.calls.LoopThread`),
waited for at most ``call_timeout`` seconds:

* ``batch_set_v1`` puts every range of every page (lent in place from
  SGLang's host pool) in one ``batched_put``; a page is stored when all
  its ranges are.
* ``batch_get_v1`` reads every range into its place in the host pool
  (:class:`~kvpool.remote.placement.Placement`) in one ``batched_get``.
* ``batch_exists`` asks for every range at once and counts the leading
  pages whose ranges are all there.

A ``batch_set_v1`` past ``call_timeout`` is cancelled and returns once the
store stopped reading SGLang's pages (Redis at once, Mooncake by its own
``timeout``, a file put when its write ends): SGLang may reuse a page as
soon as the call returns.

A miss, a refusal, an outage or a timeout is a ``False`` (or a shorter
count) for SGLang, never an exception; outages are reported once
(:class:`~kvpool.integrations.shared.report.Reporter`).  ``close()``
returns within 2 s whatever is in flight
(:class:`~kvpool.integrations.shared.calls.InFlight`).
"""

from __future__ import annotations

import asyncio
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
)
from kvpool.formats import MemoryFormat
from kvpool.integrations.sglang.config import HiCacheConfigError, read_config
from kvpool.integrations.sglang.pages import PageMap, Segment
from kvpool.integrations.shared.calls import (
    CANCEL_WAIT,
    CLOSE_GRACE,
    CLOSE_STORE_WAIT,
    InFlight,
    LoopThread,
)
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
            an unknown option (named with the closest accepted one), a bad
            ``call_timeout``; from ``register_mem_pool_host``, a host pool
            whose layout kvpool cannot address.
        RemoteStoreError: (``mooncake://``) the master does not answer.

    Attributes:
        store: the asyncio store.
        counters: every call the backend made (exported by ``kvpool.metrics``).
        report: outages and unusable entries.
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        self.storage_config = storage_config
        self.settings, self.call_timeout = read_config(storage_config.extra_config)
        self.label = f"{self.settings.instance} ({self.settings.shown_url})"
        self.logger = logging.getLogger(LOGGER_NAME)
        self.store = open_settings_store(self.settings, self.settings.instance, HiCacheConfigError)
        self.counters = StoreCounters("KVPoolHiCacheStorage", "sglang")
        self.report = Reporter(
            self.logger,
            self.label,
            self.counters,
            "SGLang gets misses and its pages are not stored",
        )
        self.is_writer = bool(storage_config.is_storage_writer)
        self.pages: PageMap | None = None
        self._calls = InFlight()
        self._loop = LoopThread("kvpool-hicache")
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
        if register is not None:
            for lender in self.pages.lenders:
                try:
                    register(lender.memory)
                except KVPoolError as exc:  # each call then registers its ranges itself
                    self.logger.info("%s: host pool stays registered per call: %s", self.label, exc)
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
        return self._run(
            "batch_set_v1", self._set(keys, host_indices), [False] * len(keys), borrows=True
        )

    def batch_get_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None
    ) -> list[bool]:
        """Read the pages ``keys`` into ``host_indices`` in place; True for each page read."""
        if not keys:
            return []
        return self._run("batch_get_v1", self._get(keys, host_indices), [False] * len(keys))

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many of ``keys``, from the first, are stored whole (every range of the page)."""
        if not keys:
            return 0
        return int(self._run("batch_exists", self._exists(keys), 0))

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

    def clear(self) -> None:
        """Nothing: kvpool's stores do not enumerate their entries (expire them with ``ttl``)."""
        self.logger.info("%s: clear() does nothing (kvpool's stores do not list keys)", self.label)

    def get_stats(self) -> None:
        """None: the backend's figures are in ``counters`` (exported by ``kvpool.metrics``)."""
        return None

    def close(self) -> None:
        """Finish or cancel the calls in flight and close the store, within 2 s; idempotent."""
        if self._calls.closing:
            return
        bound = CLOSE_GRACE + CANCEL_WAIT + CLOSE_STORE_WAIT + 0.1
        try:
            self._loop.run(self._calls.close(self.store, self._warn), bound)
        except Exception as exc:
            self._warn(f"closing took longer than {bound:g} s ({type(exc).__name__})")
        self._loop.stop(0.1)
        if self._calls.cancelled:
            self.logger.warning(
                "%s: closed with %d calls still in flight after %.1f s: cancelled; pages they "
                "were writing may or may not be stored",
                self.label,
                self._calls.cancelled,
                CLOSE_GRACE,
            )
        self.logger.info("%s: closed", self.label)

    def _warn(self, text: str) -> None:
        self.logger.warning("%s: %s", self.label, text)

    # -- the calls, on the loop ---------------------------------------------

    def _run(self, op: str, coro: Any, default: Any, borrows: bool = False) -> Any:
        """Run ``coro`` on the loop, bounded; any failure is ``default`` (reported).

        ``borrows``: ``coro`` reads SGLang's pages (a put): past the bound
        it returns only once the cancelled put stopped reading them.
        """
        started = _perf()
        try:
            return self._loop.run(coro, self.call_timeout, borrows=borrows)
        except PoolClosedError:
            return default
        except Exception as exc:
            self.report.failed(op, started, exc)
            return default

    def _map(self) -> PageMap:
        if self.pages is None:
            raise PoolClosedError("SGLang registered no host pool yet")
        return self.pages

    async def _set(self, keys: list[str], host_indices: torch.Tensor) -> list[bool]:
        task = self._calls.enter()
        if task is None:
            return [False] * len(keys)
        started = _perf()
        pages = self._map()
        names = pages.names(keys)
        objs: list[Any] = []
        try:
            for lender, address, nbytes, shapes, dtypes in pages.segments(keys, host_indices):
                objs.append(lender.lend(address, nbytes, shapes, dtypes, _FMT))
            try:
                await self.store.batched_put(names, objs)
            except asyncio.CancelledError:
                if not self._calls.by_close(task):
                    raise
                return [False] * len(keys)
            except Exception as exc:
                self.report.failed("batch_set_v1", started, exc)
                try:
                    stored = await self._found(names)  # what did make it
                except Exception:
                    return [False] * len(keys)
                return self._whole(stored, len(keys))
            self.counters.observe(
                "batch_set_v1", _perf() - started, entries=len(names), nbytes=_bytes(objs)
            )
            self.report.ok()
            return [True] * len(keys)
        finally:
            for obj in objs:
                discard(obj)
            self._calls.leave(task)

    async def _get(self, keys: list[str], host_indices: torch.Tensor) -> list[bool]:
        task = self._calls.enter()
        if task is None:
            return [False] * len(keys)
        started = _perf()
        pages = self._map()
        names = pages.names(keys)
        segments = pages.segments(keys, host_indices)
        try:
            got = await self._read(names, segments, started)
        except asyncio.CancelledError:
            if not self._calls.by_close(task):
                raise
            return [False] * len(keys)
        finally:
            self._calls.leave(task)
        return self._whole(got, len(keys))

    async def _read(self, names: list[str], segments: list[Segment], started: float) -> list[bool]:
        """Read every range in place: one batched get per range size (usually one)."""
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
                objs = await self.store.batched_get(wanted, place, list(shapes), list(dtypes), _FMT)
            except asyncio.CancelledError:
                raise
            except (CorruptEntryError, InvalidArgumentError, OutOfMemoryError) as exc:
                # One entry fails the whole batch: read them one by one, so the
                # good ones still load and the bad one is named.
                self.counters.observe("batch_get_v1", _perf() - started, error=exc)
                objs = await self._read_one_by_one(wanted, place, list(shapes), list(dtypes))
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
        return found

    async def _read_one_by_one(
        self, names: list[str], place: Placement, shapes: list[Any], dtypes: list[Any]
    ) -> list[Any]:
        """After a failed batch: each range alone, stopping at the first that fails."""
        out: list[Any] = [None] * len(names)
        for i, name in enumerate(names):
            try:
                out[i] = await self.store.get(name, place, shapes, dtypes, _FMT)
            except asyncio.CancelledError:
                raise
            except (CorruptEntryError, InvalidArgumentError) as exc:
                self.report.bad_entry(name, exc)
                break
            except Exception as exc:
                self.report.failed("get", _perf(), exc)
                break
            if out[i] is None:
                break
        return out

    async def _exists(self, keys: list[str]) -> int:
        task = self._calls.enter()
        if task is None:
            return 0
        started = _perf()
        try:
            found = await self._found(self._map().names(keys))
        except asyncio.CancelledError:
            if not self._calls.by_close(task):
                raise
            return 0
        finally:
            self._calls.leave(task)
        self.counters.observe("batch_exists", _perf() - started, entries=len(found))
        self.report.ok()
        whole = self._whole(found, len(keys))
        return whole.index(False) if False in whole else len(whole)

    async def _found(self, names: list[str]) -> list[bool]:
        return list(await self.store.batched_exists(names))

    def _whole(self, found: Sequence[bool], pages: int) -> list[bool]:
        """Per page: True when every one of its ranges is."""
        per = len(found) // pages if pages else 0
        return [all(found[p * per : (p + 1) * per]) for p in range(pages)]

    def __repr__(self) -> str:
        return f"<KVPoolHiCacheStorage {self.label}>"


def _bytes(objs: Sequence[Any]) -> int:
    return sum(o.get_size() for o in objs)
