"""KVPoolTier: a secondary tier of vLLM's native KV offloading on any store kvpool opens.

vLLM's tiering manager calls a secondary tier from its scheduler, under its
lock, and the calls must never wait.  So:

* ``submit_store`` / ``submit_load`` queue a job on the tier's own I/O threads
  (:class:`~kvpool.integrations.vllm.jobs.JobRunner`, loads first) and return;
  a job moves its rows through the *blocking* store in place
  (:class:`~kvpool.integrations.vllm.transfers.RowTransfers`: rows lent from
  vLLM's primary tier, no staging copy; chunks already stored are not written
  again), and ``get_finished_jobs`` hands vLLM the ``JobResult`` s with the bytes
  moved and the seconds it took;
* ``lookup`` answers ``HIT`` at once for a chunk the tier knows is stored
  (:class:`~kvpool.integrations.vllm.known.KnownChunks`), ``MISS`` at once while
  the store is down, and otherwise starts a batched existence check on the
  tier's lookup thread (vLLM's own asynchronous lookup contract,
  :class:`~kvpool.integrations.vllm.lookup.StoreLookups`), answering ``RETRY``
  until it returns;
* what the tier knows its store holds, and the KV events of its stores and
  evictions, change in one order
  (:class:`~kvpool.integrations.vllm.ledger.ChunkLedger`): a chunk a bounded
  directory evicted while a job ran is not that job's "stored";
* an outage is one warning (:class:`~kvpool.integrations.shared.report.Reporter`);
  during it lookups end in ``MISS`` and jobs end with ``success=False`` at once,
  with one probe of the store a second
  (:class:`~kvpool.integrations.shared.outage.OutageGate`); nothing is raised
  into vLLM's scheduler.  A store that is down at start-up is a warning, not a
  failed start;
* ``drain_jobs`` returns once every submitted job has ended (none is cut short);
  ``shutdown`` ends the queued jobs as failed, gives the running ones a second,
  closes the store once no call runs and drops the tier's hold on vLLM's
  primary region, returning within :data:`SHUTDOWN_BOUND` seconds.

Keys: :mod:`kvpool.integrations.vllm.keys`.  Settings: :mod:`kvpool.integrations.vllm.config`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvpool.errors import KVPoolError, RemoteStoreError
from kvpool.integrations.shared.calls import CLOSE_STORE_WAIT, BlockingCalls
from kvpool.integrations.shared.outage import OutageGate
from kvpool.integrations.shared.report import Reporter, is_quiet
from kvpool.integrations.shared.settings import StoreSettings, open_settings_store
from kvpool.integrations.vllm.config import TierConfigError, read_tier_config
from kvpool.integrations.vllm.jobs import JobRunner
from kvpool.integrations.vllm.keys import chunk_key_space, offload_key_of
from kvpool.integrations.vllm.known import KnownChunks
from kvpool.integrations.vllm.ledger import ChunkLedger
from kvpool.integrations.vllm.lookup import StoreLookups
from kvpool.integrations.vllm.metrics import TierTally, definitions
from kvpool.integrations.vllm.rows import PrimaryRows
from kvpool.integrations.vllm.transfers import RowTransfers
from kvpool.metrics import watch
from kvpool.remote import store_options
from kvpool.remote.counters import StoreCounters
from kvpool.remote.file.aio import on_tmpfs
from kvpool.remote.file.ranges import bytes_header
from kvpool.remote.header import layout_for

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

__all__ = ["LOGGER_NAME", "SHUTDOWN_BOUND", "KVPoolTier"]

#: The tier's logger (vLLM's logging settings govern it).
LOGGER_NAME = "kvpool.integrations.vllm"
#: Most seconds ``shutdown`` takes, whatever is in flight.
SHUTDOWN_BOUND = 2.0
#: Seconds between probes of a store that is down.
RETRY_AFTER = 1.0
# How long shutdown waits for the jobs running, then for the lookup thread's check in
# flight; what is left of SHUTDOWN_BOUND after them, less the store's own close
# (CLOSE_STORE_WAIT) and a margin for the work between the waits, goes to the store
# calls still running.  Every wait is cut to what is left, so even each one taken in
# full ends the shutdown within SHUTDOWN_BOUND - _SHUTDOWN_MARGIN.
_JOB_GRACE = 1.2
_LOOKUP_STOP_WAIT = 0.3
_SHUTDOWN_MARGIN = 0.1
# Most bytes of a Redis value (the server's proto-max-bulk-len default).
_REDIS_MAX_VALUE = 512 << 20

_perf = time.perf_counter


@dataclass
class _Done:
    """A job's end, handed from an I/O thread to the scheduler's ``get_finished_jobs``."""

    result: JobResult
    failed_loads: list[bytes] = field(default_factory=list)


class KVPoolTier(SecondaryTierManager):
    """vLLM's secondary tier on a kvpool store (see the module docstring).

    vLLM builds it from a ``secondary_tiers`` entry of ``TieringOffloadingSpec``::

        {"type": "KVPoolTier", "module_path": "kvpool.integrations.vllm",
         "url": "redis://host:6379/0"}

    Args:
        offloading_spec: vLLM's offloading spec (its ``config`` names the model,
            dtype and layout).
        primary_kv_view: the primary tier's rows, ``(num_chunks, row_bytes)``.
        tier_type: the entry's ``type``.
        backpressure_detector: vLLM's detector for this tier, if configured.
        **config: the entry's other keys: ``url``, the tier's options and the
            store's (:mod:`kvpool.integrations.vllm.config`).

    Raises:
        TierConfigError: no or a bad ``url``, an unknown option (named with the
            closest), a layout the store cannot serve.

    Attributes:
        settings: the store's settings (``shown_url`` has no password).
        options: the tier's own options.
        store: the blocking store (None while a store that must connect to open
            - Mooncake - is unreachable).
        space: the key space of this configuration.
        counters: the tier's store calls (exported by :mod:`kvpool.metrics`).
        report: outages and unusable entries.
        known: the chunks the tier knows are stored.
    """

    medium: ClassVar[Medium | None] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        **config: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.logger = logging.getLogger(LOGGER_NAME)
        name = f"kvpool vLLM tier {tier_type!r}"
        self.settings, self.options = read_tier_config(config, name)
        self.label = f"{name} ({self.settings.shown_url})"
        self.rows = PrimaryRows(primary_kv_view)
        try:
            self._start(offloading_spec, tier_type, name)
        except BaseException:
            # vLLM unmaps its region when a tier fails to start: hold no view of it.
            self.rows.release()
            if self.store is not None:
                self.store.close()
            raise

    def _start(self, offloading_spec: OffloadingSpec, tier_type: str, name: str) -> None:
        """The rest of the constructor: keys, checks, the store, the threads."""
        self.store: Any = None
        spec_config = offloading_spec.config
        self.space = chunk_key_space(spec_config, self.rows.row_bytes)
        self._check_layout()
        self.locality = Locality(self.options.locality)
        self.counters = StoreCounters("KVPoolTier", f"vllm-{tier_type}")
        self.report = Reporter(
            self.logger,
            self.label,
            self.counters,
            "vLLM gets misses from this tier and its chunks are not stored",
        )
        self.tally = TierTally(self.options.kind)
        self.gate = OutageGate(RETRY_AFTER)
        self.known = KnownChunks()
        self.closed = False
        self._calls = BlockingCalls()
        self._events: deque[OffloadingEvent] | None = None
        if self.options.enable_kv_events and spec_config.enable_kv_cache_events:
            self._events = deque()
        self.ledger = ChunkLedger(self.known, self._events, self._event)
        self._store_lock = threading.Lock()
        self._registered: tuple[int, int] | None = None
        self.transfers = RowTransfers(self.rows)
        self._open_store(at_start=True)
        self._set_medium()
        self._jobs: JobRunner[_Done] = JobRunner(self.options.threads, "kvpool-vllm-io")
        self._lookups = StoreLookups(tier_type, self._exists)
        watch(self)
        self.logger.info(
            "%s: %d I/O threads, %s, keys tagged %s (%s)",
            name,
            self.options.threads,
            self.settings.describe(),
            self.space.tag,
            self.space.text,
        )
        if self.store is not None and self.options.kind != "file":
            threading.Thread(target=self._probe, name="kvpool-vllm-probe", daemon=True).start()

    # -- start-up -------------------------------------------------------------

    def _check_layout(self) -> None:
        """Refuse a row layout the store cannot serve, naming the fix."""
        row, kind, options = self.rows.row_bytes, self.options.kind, self.settings.options
        if kind in ("redis", "redis-cluster"):
            value = row + layout_for([torch.Size([row])], [torch.uint8]).tagged_header_size
            if value > _REDIS_MAX_VALUE:
                raise TierConfigError(
                    f"{self.label}: a row of {row} bytes is a Redis value of {value} bytes "
                    f"(kvpool's header included), more than a Redis value may be "
                    f"({_REDIS_MAX_VALUE} bytes); lower the offload block size, or use a "
                    "directory or Mooncake"
                )
        direct = bool(options.get("direct_io"))
        if direct and row % 4096:
            raise TierConfigError(
                f"{self.label}: direct_io needs rows of a multiple of 4096 bytes, got {row}; "
                "drop direct_io"
            )
        bound = options.get("max_bytes")
        if kind == "file" and isinstance(bound, int) and not isinstance(bound, bool):
            entry = row + len(bytes_header(row, direct))
            if bound < entry:
                raise TierConfigError(
                    f"{self.label}: max_bytes={bound} holds no chunk: one entry takes {entry} "
                    f"bytes (a row of {row} and kvpool's header); give max_bytes of at least "
                    f"{entry} (room for many chunks), or leave it out"
                )

    def _set_medium(self) -> None:
        """What vLLM is told the tier keeps chunks in: memory (a server, tmpfs) or storage."""
        medium = Medium.CPU
        if self.options.kind == "file":
            directory = getattr(self.store, "directory", None)
            medium = Medium.CPU if directory and on_tmpfs(directory) else Medium.STORAGE
        self.medium = medium
        self.cache_hit_source = CacheHitSource.HOST if medium is Medium.CPU else CacheHitSource.DISK

    def _store_settings(self) -> StoreSettings:
        """The settings the store opens with: the tier's, and ``on_evict`` for a bounded store.

        A store bounded by ``max_bytes`` that takes an eviction callback reports
        its evictions to the tier (:meth:`_evicted`).
        """
        settings = self.settings
        accepted = store_options(settings.url, asyncio=False)
        if "on_evict" not in accepted or not settings.options.get("max_bytes"):
            return settings
        options = {**settings.options, "on_evict": self._evicted}
        return dataclasses.replace(settings, options=options)

    def _open_store(self, at_start: bool = False) -> Any:
        """Open the store (once); an unreachable store is a warning at start-up, not an error.

        Raises:
            TierConfigError: the store refused its settings.
            RemoteStoreError: (not at start-up) it is still unreachable.
        """
        with self._store_lock:
            if self.store is not None:
                return self.store
            started = _perf()
            settings = self._store_settings()
            try:
                store = open_settings_store(settings, self.label, TierConfigError, asyncio=False)
            except RemoteStoreError as exc:
                if not at_start:
                    raise
                self._outage()
                self.report.failed("open", started, exc)
                return None
            try:
                self._adopt(store)
            except BaseException:
                store.close()  # nobody else holds it yet
                raise
            self.store = store
            return store

    def _adopt(self, store: Any) -> None:
        """Set the transfers up for ``store``: address ranges where it takes them."""
        # A directory's ranges keep kvpool's header (any store reads them);
        # Mooncake's are the bare bytes, so only a headerless store takes them.
        takes = self.options.kind == "file" or bool(getattr(store, "headerless", False))
        ranges = False
        register = getattr(store, "register_memory", None)
        if takes and register is not None and hasattr(store, "put_ranges"):
            try:
                # The region's tensor, not its address: the store holds it (and so the
                # export that keeps vLLM from unmapping the region) until _close_store
                # unregisters it, after the last call - ranges lend no objects that would.
                self._registered = register(self.rows.region())
                ranges = True
            except KVPoolError as exc:  # rows then move as lent objects
                self.logger.info("%s: rows stay unregistered: %s", self.label, exc)
        skips = self.options.kind == "mooncake" and not bool(getattr(store, "replace", True))
        self.transfers = RowTransfers(self.rows, ranges=ranges, skips_existing=skips)

    def _probe(self) -> None:
        """At start-up: one call, so a server that is down is a warning now, not at first use."""
        self._run_call("probe", lambda store: store.exists(self.space.key("0" * 8)), None)

    # -- one store call -------------------------------------------------------

    def _run_call(self, op: str, fn: Any, failed: Any, job: bool = False) -> Any:
        """``fn(store)`` under the outage gate and the close rules; ``failed`` when it cannot run.

        A store error is reported (one warning per outage) and returns ``failed``.
        A job's call (``job``) that the gate refuses is a job failed fast; the
        one whose own failure starts an outage is not.
        """
        if not self.gate.allow():
            if job:
                self.tally.add("kvpool:vllm_tier_jobs_failed_fast")
            return failed
        if not self._calls.enter():
            return failed
        started = _perf()
        try:
            store = self.store if self.store is not None else self._open_store()
            value = fn(store)
        except Exception as exc:
            # The Reporter's rule: every failure that is not a normal event starts (or
            # continues) an outage - counted, and gated, exactly when it warns of one.
            if not is_quiet(exc):
                self._outage()
            self.report.failed(op, started, exc)
            return failed
        finally:
            self._calls.leave()
        self.gate.ok()
        self.report.ok()
        return value

    def _outage(self) -> None:
        """A call failed (not a normal event): close the gate, count a new outage."""
        if not self.gate.down:
            self.tally.add("kvpool:vllm_tier_outages")
        self.gate.failed()

    # -- vLLM's interface ------------------------------------------------------

    def lookup(self, key: Any, req_context: Any) -> LookupResult:
        """MISS during an outage, HIT for a chunk known to be stored, else RETRY until checked.

        Light and non-blocking: a dictionary lookup, or a key added to the
        step's batch of existence checks.
        """
        # The gate first: during an outage a known chunk cannot be loaded either, and a
        # HIT would have vLLM promote it, fail, and look it up again, step after step.
        if self.gate.down:
            return LookupResult.MISS
        if self.known.touch(key):
            return LookupResult.HIT
        verdict = self._lookups.lookup(key, req_context)
        if verdict is None:
            return LookupResult.RETRY
        if verdict:
            self.known.add((key,))
            return LookupResult.HIT
        return LookupResult.MISS

    def _names(self, keys: Iterable[bytes]) -> list[str]:
        """The store keys of ``OffloadKey`` s."""
        return [self.space.key(k.hex()) for k in keys]

    def _exists(self, keys: list[bytes]) -> list[bool]:
        """The lookup thread's check: one ``batched_exists``; all missing when it fails."""
        missing = [False] * len(keys)
        names = self._names(keys)
        found = self._run_call("lookup", lambda store: store.batched_exists(names), missing)
        return list(found)

    def submit_store(self, job_metadata: TransferJob) -> None:
        """Queue a job copying rows ``chunk_ids`` to the store (returns at once)."""
        job = job_metadata
        keys = list(job.keys)
        chunk_ids = [int(c) for c in job.chunk_ids]
        self._jobs.submit(
            lambda: self._store_job(job.job_id, keys, chunk_ids),
            lambda: _Done(JobResult(job.job_id, False)),
            load=False,
        )

    def submit_load(self, job_metadata: TransferJob) -> None:
        """Queue a job reading chunks into rows ``chunk_ids`` (returns at once)."""
        job = job_metadata
        keys = list(job.keys)
        chunk_ids = [int(c) for c in job.chunk_ids]
        self._jobs.submit(
            lambda: self._load_job(job.job_id, keys, chunk_ids),
            lambda: _Done(JobResult(job.job_id, False), failed_loads=keys),
            load=True,
        )

    def _store_job(self, job_id: int, keys: list[bytes], chunk_ids: list[int]) -> _Done:
        started = _perf()
        fresh = [i for i, key in enumerate(keys) if not self.known.touch(key)]
        with self.ledger.watch() as evicted:  # a bounded directory may evict during the put
            moved = 0
            if fresh:
                addresses = self.rows.addresses([chunk_ids[i] for i in fresh])
                names = self._names([keys[i] for i in fresh])
                moved = self._run_call(
                    "store", lambda store: self.transfers.store(store, names, addresses), None, True
                )
                if moved is None:
                    return _Done(JobResult(job_id, False))
                self.counters.observe(
                    "batched_put", _perf() - started, entries=len(keys), nbytes=moved
                )
            self.tally.add(
                "kvpool:vllm_tier_chunks_skipped", len(keys) - moved // self.rows.row_bytes
            )
            self.ledger.learn(keys, evicted, stored=True)
        return _Done(JobResult(job_id, True, None, _perf() - started, moved))

    def _load_job(self, job_id: int, keys: list[bytes], chunk_ids: list[int]) -> _Done:
        started = _perf()
        addresses = self.rows.addresses(chunk_ids)
        names = self._names(keys)

        def remove(name: str) -> None:
            key = offload_key_of(name, self.space)
            try:
                self.store.delete(name)
            except KVPoolError as exc:  # it stays a miss; the next load finds it again
                self.logger.debug("%s: could not remove %r: %s", self.label, name, exc)
            if key is not None:
                self.ledger.removed([key])

        with self.ledger.watch() as evicted:
            outcome = self._run_call(
                "load",
                lambda store: self.transfers.load(store, names, addresses, remove),
                None,
                True,
            )
            if outcome is None:
                return _Done(JobResult(job_id, False), failed_loads=keys)
            loaded = [k for k, hit in zip(keys, outcome.found, strict=True) if hit]
            self.ledger.learn(loaded, evicted, stored=False)
        for i, exc in outcome.unusable:
            self.report.bad_entry(names[i], exc)
        self.tally.add("kvpool:vllm_tier_unusable_entries", len(outcome.unusable))
        failed = [k for k, hit in zip(keys, outcome.found, strict=True) if not hit]
        self.counters.observe(
            "batched_get",
            _perf() - started,
            entries=len(keys),
            nbytes=outcome.nbytes,
            misses=len(failed),
        )
        seconds = _perf() - started
        if not failed:
            return _Done(JobResult(job_id, True, None, seconds, outcome.nbytes))
        result = JobResult(job_id, False, tuple(loaded) or None, seconds, outcome.nbytes)
        return _Done(result, failed_loads=failed)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        """The jobs that ended since the last call (light: no store call)."""
        results = []
        for done in self._jobs.finished():
            if done.failed_loads:
                # A chunk that failed to load, whatever the error, is a miss from now on,
                # not a retried promotion: neither known nor a cached verdict keeps it.
                self.known.discard(done.failed_loads)
                self._lookups.mark_miss(done.failed_loads)
            results.append(done.result)
        return results

    def _event(self, keys: list[bytes], removed: bool) -> OffloadingEvent:
        return OffloadingEvent(
            keys=list(keys),
            medium=self.medium or Medium.STORAGE,
            removed=removed,
            locality=self.locality,
            ownership=self.tier_type,
        )

    def _evicted(self, names: list[bytes]) -> None:
        """A bounded directory removed entries (called from the thread that evicted)."""
        keys = [
            k
            for k in (offload_key_of(n.decode("utf-8", "replace"), self.space) for n in names)
            if k is not None
        ]
        self.ledger.removed(keys)
        self.tally.add("kvpool:vllm_tier_chunks_evicted", len(keys))

    def has_pending_work(self) -> bool:
        """True while a job is queued, running or waiting to be reported."""
        return self._jobs.busy

    def take_events(self) -> Iterable[OffloadingEvent]:
        """KV events of the tier's chunks since the last call (stores and removals)."""
        events = self._events
        while events:
            yield events.popleft()

    def touch(self, keys: Any, req_context: Any) -> None:
        """Mark chunks recently used (the known set's order; the store tracks its own reads)."""
        for key in keys:
            self.known.touch(key)

    def on_new_request(self, req_context: Any) -> RequestOffloadingContext:
        """Chunk-level offloading: only the chunks a request computed are stored."""
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: Any) -> None:
        """Release the request's lookup verdicts."""
        self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: Any) -> None:
        """Post the step's lookups to the lookup thread as one batch."""
        self._lookups.flush()

    def drain_jobs(self) -> None:
        """Wait until every submitted job has ended (none is cut short)."""
        self._jobs.drain()

    def shutdown(self) -> None:
        """Stop the threads, close the store, release vLLM's primary rows; at most 2 s.

        Queued jobs end as failed; running ones get a second to finish.  The
        store is closed once no call runs (by the last call, if one outlives the
        grace), and the tier drops its hold on the primary region; the objects
        lent to a call still running, or the store's registration of the region,
        hold it until the last call ends (vLLM then keeps the region mapped, so
        nothing is read from or written to unmapped memory).
        """
        if self.closed:
            return
        self.closed = True
        deadline = _perf() + SHUTDOWN_BOUND - CLOSE_STORE_WAIT - _SHUTDOWN_MARGIN
        running = self._jobs.stop(min(_JOB_GRACE, deadline - _perf()))
        self._lookups.stop(min(_LOOKUP_STOP_WAIT, max(deadline - _perf(), 0.0)))
        late = self._calls.close(self._close_store, grace=max(deadline - _perf(), 0.0))
        self.rows.release()
        self.known.clear()
        if running or late:
            self.logger.warning(
                "%s: shut down with %d store calls still running; until the last of them ends "
                "(and closes the store) they hold vLLM's primary region, which vLLM then keeps "
                "mapped",
                self.label,
                max(running, late),
            )
        self.logger.info("%s: shut down", self.label)

    def _close_store(self) -> None:
        store, self.store = self.store, None
        if store is None:
            return
        if self._registered is not None:
            try:
                store.unregister_memory(self._registered[0])
            except KVPoolError as exc:  # closing the store drops it anyway
                self.logger.debug("%s: %s", self.label, exc)
            self._registered = None
        store.close()

    # -- metrics ----------------------------------------------------------------

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, Any]:
        """The tier's own metrics (:mod:`kvpool.integrations.vllm.metrics`)."""
        return definitions()

    def get_stats(self) -> Any:
        """The tier's metric counts since the last call (None when nothing happened)."""
        return self.tally.take()

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        """The info label the tier reports: its store's kind."""
        return ("kvpool_store",)

    def config_info(self) -> dict[str, str]:
        """``{"kvpool_store": kind}``."""
        return {"kvpool_store": self.options.kind}

    def __repr__(self) -> str:
        return f"<KVPoolTier {self.label}>"
