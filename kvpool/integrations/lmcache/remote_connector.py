"""KVPoolConnector: LMCache's ``RemoteConnector`` over a kvpool asyncio store.

LMCache calls a remote connector's coroutines on its storage manager's
event loop (``asyncio.run_coroutine_threadsafe``) and its ``*_sync`` and
``batched_contains`` methods from its own threads.  This connector
translates: keys are ``CacheEngineKey.to_string()``, objects go to and
come from the store as they are (see :mod:`.remote_memory`), and every
store error becomes what LMCache expects - a miss, a put not stored -
reported as :mod:`.remote_report` says.  All I/O is the store's: awaited
on the loop, never blocking it on the network; batched LMCache calls are
batched store calls.

Order
-----
A put registers its keys as *pending* before its first await, and a get,
delete or later put of a pending key waits for that put first.  Since
LMCache schedules coroutines in the order it submits them, a get submitted
after a put of the same key never overtakes it (LMCache's own connectors
queue them by priority, and a get can): it returns the new entry, or a
miss when that put failed (what the store then holds may be older).

Close
-----
``close()`` lets the calls in flight finish for up to ``CLOSE_GRACE``
seconds, then cancels the rest - the stores free what a cancelled call
allocated and drop its connection - and closes the store, waiting at most
``CLOSE_STORE_WAIT`` seconds for it; puts that did not finish are logged
once, as :class:`~kvpool.errors.PoolClosedError` (a command already sent
may still be applied by the server: such a put may or may not be stored).
It never waits on its own loop for itself (LMCache 0.5.6's
``RedisConnector.close`` does, and deadlocks).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

from kvpool.errors import (
    CorruptEntryError,
    FeatureUnavailableError,
    InvalidArgumentError,
    OutOfMemoryError,
    PoolClosedError,
    StoreTimeoutError,
)
from kvpool.integrations.lmcache.remote_config import PluginConfigError, PluginSettings
from kvpool.integrations.lmcache.remote_memory import (
    BackendAllocator,
    Sender,
    fits,
    kvpool_format,
    layer_layout,
    unsend,
)
from kvpool.integrations.lmcache.remote_report import Reporter, plugin_logger
from kvpool.integrations.shared.calls import CLOSE_GRACE, CLOSE_STORE_WAIT, InFlight
from kvpool.remote.aiobase import AsyncRemoteStore
from kvpool.remote.counters import StoreCounters
from kvpool.remote.objects import discard

__all__ = ["CLOSE_GRACE", "CLOSE_STORE_WAIT", "KVPoolConnector"]

_perf = time.perf_counter


def _size(obj: Any) -> int:
    return obj.get_size()  # type: ignore[no-any-return]


class KVPoolConnector(RemoteConnector):
    """LMCache 0.5.6's remote connector surface on a kvpool :class:`AsyncRemoteStore`.

    Made by :class:`~kvpool.integrations.lmcache.remote.KVPoolConnectorAdapter`.

    Args:
        store: the open asyncio store (the connector closes it).
        settings: the plugin instance's settings (names and URL for logs).
        loop: LMCache's storage event loop.
        local_cpu_backend: LMCache's ``LocalCPUBackend`` (gets allocate there).
        config: LMCache's engine config.
        metadata: LMCache's engine metadata.

    Raises:
        PluginConfigError: no store or settings.  LMCache makes a connector
            class itself, with only ``loop``, ``local_cpu_backend`` and
            ``config``, when a config's ``class_name`` names it instead of
            its adapter; the message says to name ``KVPoolConnectorAdapter``.

    Attributes:
        store: the store.
        counters: every call this connector made, as a store counts them
            (``counters.snapshot()``); exported by ``kvpool.metrics``.
        report: the :class:`Reporter` (``report.corrupt``, ``report.outages``).
    """

    def __init__(
        self,
        store: AsyncRemoteStore | None = None,
        settings: PluginSettings | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        local_cpu_backend: Any = None,
        config: Any = None,
        metadata: Any = None,
    ) -> None:
        # The defaults are there only to catch LMCache's own way of making a
        # connector class (DynamicConnectorAdapter): a clear error, not a TypeError
        # that LMCache logs as a connection failure and retries for good.
        if store is None or settings is None or loop is None:
            raise PluginConfigError(
                "LMCache made KVPoolConnector itself, without a store: the config's "
                "remote_storage_plugin.<instance>.class_name names the connector; name the "
                "adapter instead: class_name: KVPoolConnectorAdapter"
            )
        super().__init__(config, metadata)
        self.store = store
        self.settings = settings
        self.loop = loop
        self.counters = StoreCounters("KVPoolConnector", f"lmcache:{settings.instance}")
        self.report = Reporter(
            plugin_logger(),
            f"kvpool plugin {settings.instance!r} ({settings.shown_url})",
            self.counters,
            "LMCache gets misses from this backend",
        )
        self._allocator = BackendAllocator(local_cpu_backend)
        self._sendable = Sender(local_cpu_backend)
        self._fmt = kvpool_format(self.meta_fmt)
        # What a stored chunk may be: the engine's chunk, or with use_layerwise
        # one layer of it (LMCache then stores an object per layer).
        shapes: list[Any] = list(self.meta_shapes)
        fmt: Any = self._fmt
        if config.use_layerwise:
            shapes, fmt = layer_layout(
                shapes, bool(metadata.use_mla), bool(getattr(config, "enable_blending", False))
            )
        self._chunk: tuple[list[Any], list[Any], Any] = (shapes, list(self.meta_dtypes), fmt)
        # Every chunk has the full layout when LMCache stores no partial
        # ones: a get can then allocate before the reply (the stores' fast
        # path).  Otherwise the stored layout is read first.
        exact = not getattr(config, "save_unfull_chunk", True) and not config.use_layerwise
        self._layout: tuple[Any, Any, Any] = (
            (self.meta_shapes, self.meta_dtypes, self._fmt) if exact else (None, None, None)
        )
        self._timeout = float(getattr(config, "blocking_timeout_secs", 10) or 10)
        self._pending: dict[str, asyncio.Future[bool]] = {}
        self._inflight = InFlight()
        self._putting: dict[asyncio.Task[Any], int] = {}  # a put's task: its entries
        self.unfinished_puts = 0

    @property
    def closed(self) -> bool:
        """True once :meth:`close` started."""
        return self._inflight.closing

    # -- bookkeeping ----------------------------------------------------

    def _enter(self) -> asyncio.Task[Any] | None:
        """Track the calling task for close(); None once closing."""
        return self._inflight.enter()

    def _leave(self, task: asyncio.Task[Any] | None) -> None:
        self._inflight.leave(task)

    def _count_unfinished(self, task: asyncio.Task[Any]) -> None:
        """close() cancels ``task``: count its entries if it is a put (it may end later)."""
        self.unfinished_puts += self._putting.get(task, 0)

    def _by_close(self, task: asyncio.Task[Any] | None) -> bool:
        """True when ``task`` was cancelled by close() (and so is allowed to finish quietly)."""
        return self._inflight.by_close(task)

    async def _after_pending(self, names: Sequence[str]) -> set[str]:
        """Wait for the pending puts of ``names``; return the names whose put failed."""
        waits = {n: f for n in names if (f := self._pending.get(n)) is not None}
        if not waits:
            return set()
        await asyncio.wait(set(waits.values()))
        return {n for n, f in waits.items() if not f.result()}

    # -- put ------------------------------------------------------------

    async def put(self, key: Any, memory_obj: Any) -> None:
        """Store one chunk; errors are logged and counted, not raised (LMCache frees the object)."""
        await self._put([key], [memory_obj], "put")

    def support_batched_put(self) -> bool:
        """True: ``batched_put`` is one batched store call."""
        return True

    async def batched_put(self, keys: Sequence[Any], memory_objs: Sequence[Any]) -> None:
        """Store the chunks with one batched store call (see :meth:`put`)."""
        await self._put(keys, memory_objs, "batched_put")

    async def _put(self, keys: Sequence[Any], objs: Sequence[Any], op: str) -> None:
        started = _perf()
        task = self._enter()
        if task is None:
            self.report.failed(op, started, PoolClosedError("the connector is closed"))
            return
        names = [k.to_string() for k in keys]
        self._putting[task] = len(names)
        done: asyncio.Future[bool] = self.loop.create_future()
        earlier = {f for n in names if (f := self._pending.get(n)) is not None}
        for n in names:
            self._pending[n] = done
        sent: list[Any] = []
        stored = False
        try:
            if earlier:  # the entry a key ends with is its last put's
                await asyncio.wait(earlier)
            for obj in objs:  # one by one: the views made before a refusal are ended below
                sent.append(self._sendable(obj))
            if len(names) == 1 and op == "put":
                await self.store.put(names[0], sent[0])
            else:
                await self.store.batched_put(names, sent)
            stored = True
            self.counters.observe(
                op, _perf() - started, entries=len(names), nbytes=sum(map(_size, sent))
            )
            self.report.ok()
        except asyncio.CancelledError:
            if not self._by_close(task):  # close() counted it in unfinished_puts
                raise
            self.counters.observe(op, _perf() - started, error=PoolClosedError("closed"))
        except Exception as exc:
            self.report.failed(op, started, exc)
        finally:
            for original, view in zip(objs, sent, strict=False):
                unsend(original, view)
            sent = []
            done.set_result(stored)
            for n in names:
                if self._pending.get(n) is done:
                    del self._pending[n]
            self._putting.pop(task, None)
            self._leave(task)

    # -- get ------------------------------------------------------------

    async def get(self, key: Any) -> Any:
        """The chunk of ``key`` in memory of LMCache's backend, or None (a miss, or any error)."""
        return (await self._get([key], "get"))[0]

    def support_batched_get(self) -> bool:
        """True: ``batched_get`` is one batched store call."""
        return True

    async def batched_get(self, keys: Sequence[Any]) -> list[Any]:
        """The chunks of ``keys`` (None for each miss), with one batched store call."""
        return await self._get(keys, "batched_get")

    def support_batched_get_non_blocking(self) -> bool:
        """True."""
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: Sequence[Any]) -> list[Any]:
        """The chunks of the longest stored prefix of ``keys`` (the others are freed)."""
        objs = await self._get(keys, "batched_get")
        out: list[Any] = []
        for obj in objs:
            if obj is None:
                break
            out.append(obj)
        for obj in objs[len(out) :]:
            discard(obj)
        return out

    async def _get(self, keys: Sequence[Any], op: str) -> list[Any]:
        started = _perf()
        count = len(keys)
        if not count:
            return []
        task = self._enter()
        if task is None:
            return [None] * count
        names = [k.to_string() for k in keys]
        try:
            failed = await self._after_pending(names)
            wanted = [n for n in names if n not in failed] if failed else names
            found = await self._read(wanted, op, started) if wanted else []
            if not failed:
                return found
            by_name = dict(zip(wanted, found, strict=True))
            return [by_name.get(n) for n in names]
        except asyncio.CancelledError:
            if not self._by_close(task):
                raise
            return [None] * count
        finally:
            self._leave(task)

    async def _read(self, names: list[str], op: str, started: float) -> list[Any]:
        """Read ``names`` in one call; when the batch fails on an entry, one by one."""
        shapes, dtypes, fmt = self._layout
        try:
            if len(names) == 1:
                objs = [await self.store.get(names[0], self._allocator, shapes, dtypes, fmt)]
            else:
                objs = await self.store.batched_get(names, self._allocator, shapes, dtypes, fmt)
        except (CorruptEntryError, InvalidArgumentError, OutOfMemoryError) as exc:
            # One entry fails a whole batch: read the keys one by one, so the
            # good ones are still hits and the bad one is named.
            self.counters.observe(op, _perf() - started, error=exc)
            objs = (
                [await self._read_one(n) for n in names]
                if len(names) > 1
                else [await self._read_one(names[0], exc)]
            )
            return self._checked(names, objs)
        except Exception as exc:
            self.report.failed(op, started, exc)
            return [None] * len(names)
        objs = self._checked(names, objs)
        self.counters.observe(
            op,
            _perf() - started,
            entries=len(names),
            nbytes=sum(_size(o) for o in objs if o is not None),
            misses=sum(o is None for o in objs),
        )
        self.report.ok()
        return objs

    async def _read_one(self, name: str, first: BaseException | None = None) -> Any:
        """One get, with its own error handling (after a failed batch, or as a retry)."""
        shapes, dtypes, fmt = self._layout
        started = _perf()
        exc = first
        if exc is None:
            try:
                obj = await self.store.get(name, self._allocator, shapes, dtypes, fmt)
            except Exception as error:
                exc = error
            else:
                self.counters.observe(
                    "get", _perf() - started, nbytes=_size(obj) if obj else 0, misses=obj is None
                )
                return obj
        if isinstance(exc, InvalidArgumentError) and shapes is not None:
            # Not the full layout: a partial chunk (written by an engine that
            # stores them) or another engine's; read what is stored.
            try:
                obj = await self.store.get(name, self._allocator)
            except Exception as error:
                exc = error
            else:
                self.counters.observe(
                    "get", _perf() - started, nbytes=_size(obj) if obj else 0, misses=obj is None
                )
                return obj
        if isinstance(exc, (CorruptEntryError, InvalidArgumentError)):
            self.report.bad_entry(name, exc)
        else:
            self.report.failed("get", started, exc)
        return None

    def _checked(self, names: list[str], objs: list[Any]) -> list[Any]:
        """Keep the objects that are chunks of this engine's layout; free and report the others."""
        shapes, dtypes, fmt = self._chunk
        for i, obj in enumerate(objs):
            if obj is not None and not fits(obj, shapes, dtypes, fmt):
                shown = f"{list(obj.get_shapes())} {list(obj.get_dtypes())}"
                discard(obj)
                objs[i] = None
                self.report.bad_entry(
                    names[i],
                    CorruptEntryError(
                        f"stored layout {shown} is not a chunk of this engine's "
                        f"{shapes} {dtypes} {fmt.name}"
                    ),
                )
        return objs

    # -- exists ---------------------------------------------------------

    async def exists(self, key: Any) -> bool:
        """True when the store holds ``key`` (False on any error)."""
        return (await self._exists([key], "exists"))[0]

    def exists_sync(self, key: Any) -> bool:
        """:meth:`exists` from a thread other than the loop's."""
        return bool(self._sync(self.exists, key, default=False))

    def support_batched_async_contains(self) -> bool:
        """True: one batched store call."""
        return True

    async def batched_async_contains(
        self, lookup_id: str, keys: Sequence[Any], pin: bool = False
    ) -> int:
        """How many of ``keys``, from the first, the store holds (``pin`` is not supported)."""
        return _prefix(await self._exists(keys, "batched_exists"))

    def support_batched_contains(self) -> bool:
        """True."""
        return True

    def batched_contains(self, keys: Sequence[Any]) -> int:
        """:meth:`batched_async_contains` from a thread other than the loop's."""
        return int(self._sync(self.batched_async_contains, "", keys, default=0))

    async def _exists(self, keys: Sequence[Any], op: str) -> list[bool]:
        started = _perf()
        if not keys:
            return []
        task = self._enter()
        if task is None:
            return [False] * len(keys)
        names = [k.to_string() for k in keys]
        try:
            if len(names) == 1 and op == "exists":
                found = [await self.store.exists(names[0])]
            else:
                found = await self.store.batched_exists(names)
        except asyncio.CancelledError:
            if not self._by_close(task):
                raise
            return [False] * len(names)
        except Exception as exc:
            self.report.failed(op, started, exc)
            return [False] * len(names)
        finally:
            self._leave(task)
        self.counters.observe(op, _perf() - started, entries=len(names))
        self.report.ok()
        return found

    # -- remove ---------------------------------------------------------

    def remove_sync(self, key: Any) -> bool:
        """Delete ``key`` (after a put of it still in flight); True when an entry was removed."""
        return bool(self._sync(self._delete, key, default=False))

    async def _delete(self, key: Any) -> bool:
        started = _perf()
        task = self._enter()
        if task is None:
            return False
        name = key.to_string()
        try:
            await self._after_pending([name])
            removed = await self.store.delete(name)
        except asyncio.CancelledError:
            if not self._by_close(task):
                raise
            return False
        except Exception as exc:
            self.report.failed("delete", started, exc)
            return False
        finally:
            self._leave(task)
        self.counters.observe("delete", _perf() - started)
        self.report.ok()
        return bool(removed)

    # -- the rest of LMCache's surface -----------------------------------

    async def list(self) -> list[str]:
        """Not supported: kvpool's stores do not enumerate their keys.

        Raises:
            FeatureUnavailableError: always (LMCache uses ``list`` only to
                load an ``fs://`` directory into its CPU cache).
        """
        raise FeatureUnavailableError(
            "the kvpool LMCache plugin cannot list keys: kvpool's stores do not enumerate "
            "their entries"
        )

    def support_ping(self) -> bool:
        """True when the store can be pinged (the Redis stores)."""
        return callable(getattr(self.store, "ping", None))

    async def ping(self) -> int:
        """0 when the store answers; LMCache's -1 for a timeout, -2 for any other failure."""
        started = _perf()
        try:
            await self.store.ping()  # type: ignore[attr-defined]
        except Exception as exc:
            self.report.failed("ping", started, exc)
            return -1 if isinstance(exc, (StoreTimeoutError, TimeoutError)) else -2
        self.report.ok()
        return 0

    def post_init(self) -> None:
        """Nothing to do after creation."""

    async def close(self) -> None:
        """Finish or cancel the calls in flight, then close the store; bounded (see the module)."""
        if self._inflight.closing:
            return
        label = self.report.label
        await self._inflight.close(
            self.store,
            lambda text: self.report.logger.warning("%s: %s", label, text),
            self._count_unfinished,
        )
        if self.unfinished_puts:
            self.report.logger.warning(
                "%s: closed with %d puts still in flight after %.1f s: cancelled "
                "(PoolClosedError); the store may or may not hold them",
                label,
                self.unfinished_puts,
                CLOSE_GRACE,
            )
        self.report.logger.info("%s: closed", label)

    def _sync(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any, default: Any) -> Any:
        """Run ``fn(*args)`` on the loop from another thread and wait for it (bounded).

        Raises:
            InvalidArgumentError: called on the loop's own thread (it would
                wait for itself forever): await the coroutine instead.
        """
        if self._inflight.closing:
            return default
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise InvalidArgumentError(
                f"{fn.__name__} was called through its blocking form on LMCache's event loop "
                "thread, where it would wait for itself; await the coroutine instead"
            )
        started = _perf()
        future = asyncio.run_coroutine_threadsafe(fn(*args), self.loop)
        try:
            return future.result(self._timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            self.report.failed(
                fn.__name__.strip("_"),
                started,
                StoreTimeoutError(f"no answer within blocking_timeout_secs={self._timeout:g}"),
            )
            return default

    def __repr__(self) -> str:
        return f"<KVPoolConnector {self.settings.instance} {self.store!r}>"


def _prefix(found: Sequence[bool]) -> int:
    """How many leading entries of ``found`` are True."""
    for i, hit in enumerate(found):
        if not hit:
            return i
    return len(found)
