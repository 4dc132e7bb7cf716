"""The store interface and the helpers every store shares.

Counters
--------
Every store counts its calls, entries, bytes, misses, errors and
latencies in ``store.counters`` (:mod:`kvpool.remote.counters`); the
base class wraps the operations each store defines, so a store needs no
code for it.  :func:`live_stores` lists the open stores (for
:mod:`kvpool.metrics`).

How stores hold, read into and refuse memory objects: :mod:`kvpool.remote.objects`.
"""

from __future__ import annotations

import abc
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

from kvpool.checks import RefusesUnknownKeywords
from kvpool.errors import (
    ArgumentTypeError,
    FeatureUnavailableError,
    InvalidArgumentError,
    PoolClosedError,
)
from kvpool.formats import MemoryFormat, normalize_layout
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.counters import OPERATIONS, StoreCounters, counted_calls, counted_method
from kvpool.remote.header import (
    EntryInfo,
    Layout,
    layout_for,
    remember,
    requested,
)
from kvpool.remote.objects import discard

__all__ = ["MAX_KEY_BYTES", "Key", "RemoteStore", "key_bytes", "live_stores", "prefix_bytes"]

#: A store key: ``str`` (encoded as UTF-8) or ``bytes``; ``"a"`` and ``b"a"``
#: name the same entry.
Key = str | bytes

#: Longest key accepted, in bytes.
MAX_KEY_BYTES = 65536

_T = TypeVar("_T")
_R = TypeVar("_R")


def key_bytes(key: object) -> bytes:
    """Return ``key`` as bytes (``str`` keys are encoded as UTF-8).

    Raises:
        InvalidArgumentError: not a ``str``/``bytes``, not encodable, or
            longer than :data:`MAX_KEY_BYTES`.
    """
    if key.__class__ is bytes:
        data = key
    elif isinstance(key, str):
        try:
            data = key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgumentError(f"key {key!r} is not valid UTF-8 text: {exc}") from None
    elif isinstance(key, bytes):
        data = bytes(key)
    else:
        raise InvalidArgumentError(
            f"a store key must be str or bytes, got {type(key).__name__} ({key!r})"
        )
    if len(data) > MAX_KEY_BYTES:  # type: ignore[arg-type]
        raise InvalidArgumentError(
            f"key of {len(data)} bytes is longer than the limit of {MAX_KEY_BYTES}"  # type: ignore[arg-type]
        )
    return data  # type: ignore[return-value]


def prefix_bytes(prefix: object) -> bytes:
    """Return the ``prefix`` of a ``delete_prefix`` as bytes (as :func:`key_bytes`).

    Raises:
        InvalidArgumentError: a bad key, or an empty one (it would name
            every entry of the store, other users' included).
    """
    data = key_bytes(prefix)
    if not data:
        raise InvalidArgumentError(
            "delete_prefix needs a non-empty prefix: an empty one would remove every entry of "
            "the store, other users' too; pass the prefix your keys share"
        )
    return data


def unsupported_prefix(store: object) -> FeatureUnavailableError:
    """The error of a store that cannot enumerate its keys (no ``delete_prefix``)."""
    return FeatureUnavailableError(
        f"{type(store).__name__} cannot list its entries, so it has no delete_prefix; delete "
        "the keys one by one (batched_delete) or expire them"
    )


def check_list(name: str, value: object) -> Sequence[Any]:
    """Return ``value`` if it is a sequence of items (a list, a tuple...).

    ``str`` and bytes-like values are refused: a lone key passed where a
    list of keys is expected would otherwise be read one character at a time.

    Raises:
        ArgumentTypeError: not a sequence, or a ``str``/bytes-like value.
    """
    if value.__class__ is list or value.__class__ is tuple:
        return value  # type: ignore[return-value]
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        return value
    raise ArgumentTypeError(
        f"{name} must be a list (or tuple) of items, got {type(value).__name__} {value!r:.80}"
        + ("; wrap a single key in a list" if isinstance(value, (str, bytes, bytearray)) else "")
    )


def key_list(keys: object) -> list[bytes]:
    """Return the keys of a batched call as bytes (see :func:`key_bytes`).

    Raises:
        ArgumentTypeError: ``keys`` is not a list/tuple of keys.
        InvalidArgumentError: a key is bad.
    """
    return [key_bytes(k) for k in check_list("keys", keys)]


def requested_layout(
    shapes: torch.Size | Sequence[torch.Size] | None,
    dtypes: torch.dtype | Sequence[torch.dtype] | None,
) -> Layout | None:
    """Normalize the ``shapes``/``dtypes`` of a ``get`` (None: as stored).

    Raises:
        InvalidArgumentError: only one of the two given, or a bad layout.
    """
    if shapes is None and dtypes is None:
        return None
    if shapes is None or dtypes is None:
        raise InvalidArgumentError(
            "give both shapes and dtypes (or neither, to allocate the stored layout)"
        )
    layout = requested(shapes, dtypes)
    if layout is None:
        shape_list, dtype_list, _ = normalize_layout(shapes, dtypes)
        layout = layout_for(shape_list, dtype_list)
        remember(shapes, dtypes, layout)
    return layout


def get_request(
    allocator: object,
    shapes: torch.Size | Sequence[torch.Size] | None,
    dtypes: torch.dtype | Sequence[torch.dtype] | None,
    fmt: object,
) -> tuple[Layout | None, MemoryFormat | None]:
    """Validate the arguments every ``get``/``batched_get`` takes, before any I/O.

    Returns:
        ``(layout, fmt)``: the requested layout and format (None: as stored).

    Raises:
        InvalidArgumentError: ``allocator`` has no callable ``allocate`` (a
            pool's object, a tensor or a store passed by mistake), or a bad
            layout or format (see :func:`requested_layout`, :func:`check_format`).
    """
    if not callable(getattr(allocator, "allocate", None)):
        raise InvalidArgumentError(
            f"allocator must be a kvpool/LMCache memory allocator (with an allocate() "
            f"method), got {type(allocator).__name__}; pass the pool to read into"
        )
    return requested_layout(shapes, dtypes), check_format(fmt)


def check_format(fmt: object) -> MemoryFormat | None:
    """Validate the ``fmt`` argument of a ``get`` (None: as stored).

    Raises:
        InvalidArgumentError: not a :class:`MemoryFormat` or None.
    """
    if fmt is None or fmt.__class__ is MemoryFormat:
        return fmt  # type: ignore[return-value]
    raise InvalidArgumentError(f"fmt must be a MemoryFormat or None, got {fmt!r}")


def check_stored(
    info: EntryInfo, layout: Layout | None, fmt: MemoryFormat | None, where: str
) -> None:
    """Raise when a stored entry does not have the requested layout/format.

    Raises:
        InvalidArgumentError: shapes, dtypes or format differ.
    """
    if layout is not None and (
        tuple(info.shapes) != layout.shapes or tuple(info.dtypes) != layout.dtypes
    ):
        raise InvalidArgumentError(
            f"{where}: layout mismatch: stored {_show(info.shapes, info.dtypes)} "
            f"({info.layout_size} bytes), requested {_show(layout.shapes, layout.dtypes)} "
            f"({layout.nbytes} bytes); pass the stored layout, or shapes=None and dtypes=None "
            "to allocate it"
        )
    if fmt is not None and info.fmt is not fmt:
        raise InvalidArgumentError(
            f"{where}: format mismatch: stored {info.fmt.name}, requested {fmt.name}"
        )


def _show(shapes: Iterable[torch.Size], dtypes: Iterable[torch.dtype]) -> str:
    return (
        "["
        + ", ".join(
            f"{tuple(s)} {str(d).removeprefix('torch.')}"
            for s, d in zip(shapes, dtypes, strict=True)
        )
        + "]"
    )


def check_pairs(keys: Sequence[object], objs: Sequence[object]) -> None:
    """Raise when the ``batched_put`` key and object lists are not lists or differ in length."""
    check_list("keys", keys)
    check_list("memory_objs", objs)
    if len(keys) != len(objs):
        raise InvalidArgumentError(f"batched_put: {len(keys)} keys but {len(objs)} memory objects")


_stores: weakref.WeakSet[RemoteStore] = weakref.WeakSet()
_stores_lock = threading.Lock()


def live_stores() -> list[RemoteStore]:
    """The stores of this process that are not closed (for monitoring)."""
    with _stores_lock:
        return [s for s in _stores if not s.closed]


# Counted around the keyword guard the class gets when it is made, as a subclass's own
# operations are (__init_subclass__): a refused keyword is an error of the call.
@counted_calls("batched_put", "batched_get", "batched_exists", "batched_delete")
class RemoteStore(RefusesUnknownKeywords, metaclass=abc.ABCMeta):
    """A key/value store of memory objects: files, Redis/Valkey...

    Every store writes the same self-describing entry: a header (magic,
    version, layout, sizes, CRCs; see :mod:`kvpool.remote.header`) followed
    by the object's bytes.  ``put`` never copies the bytes in Python and
    ``get`` copies them once, into the new object.

    Thread safety: every method may be called from several threads at
    once; ``close`` must not race with calls still running.

    Batched forms run one operation per key; with ``io_threads > 1`` they
    run on a small thread pool (the I/O releases the GIL).

    Counters: ``counters`` (a :class:`~kvpool.remote.counters.StoreCounters`)
    counts every call of the operations, entries, bytes, misses, errors by
    type and latencies; subclasses get this without writing any code
    (their operations are wrapped when the class is defined).

    Args:
        io_threads: threads for the batched forms (1: in the caller's thread).

    Attributes:
        counters: the store's :class:`~kvpool.remote.counters.StoreCounters`.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for op in OPERATIONS:
            fn = cls.__dict__.get(op)
            if (
                callable(fn)
                and not getattr(fn, "__isabstractmethod__", False)
                and not getattr(fn, "_kvpool_counted", False)
            ):
                setattr(cls, op, counted_method(op, fn))

    def __init__(self, io_threads: int = 1) -> None:
        if isinstance(io_threads, bool) or not isinstance(io_threads, int) or io_threads < 1:
            raise InvalidArgumentError(f"io_threads must be an int >= 1, got {io_threads!r}")
        self._io_threads = io_threads
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        self._closed = False
        self.counters = StoreCounters(type(self).__name__)
        with _stores_lock:
            _stores.add(self)

    # -- the operations each store implements ------------------------

    @abc.abstractmethod
    def put(self, key: Key, memory_obj: MemoryObj) -> None:
        """Store ``memory_obj`` under ``key``, replacing any previous entry.

        The entry appears whole or not at all: a reader never sees part of
        it.  The object is referenced during the call and is left as it was.

        Args:
            key: ``str`` or ``bytes``.
            memory_obj: a live host memory object.

        Raises:
            InvalidArgumentError: bad key or object.
            InvalidHandleError: the object was freed.
            PoolClosedError: the store was closed.
            RemoteStoreError: the store failed (a subclass says how).
        """

    @abc.abstractmethod
    def get(
        self,
        key: Key,
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> MemoryObj | None:
        """Read the entry ``key`` into a new object from ``allocator``.

        Args:
            key: ``str`` or ``bytes``.
            allocator: the pool to allocate the object from.
            shapes: expected shape(s); None (with ``dtypes`` None) allocates
                the stored layout.
            dtypes: expected dtype(s).
            fmt: expected format; None takes the stored one.

        Returns:
            The new object (reference count 1, owned by the caller), or
            None when there is no entry ``key``.

        Raises:
            InvalidArgumentError: bad key or arguments, or the stored
                layout/format differs from the requested one.
            CorruptEntryError: the entry is truncated or corrupted.
            OutOfMemoryError: the allocator is full.
            PoolClosedError: the allocator or the store was closed.
            RemoteStoreError: the store failed (a subclass says how).

        On every error the object allocated for the call is freed first.
        """

    @abc.abstractmethod
    def exists(self, key: Key) -> bool:
        """True when an entry ``key`` is stored (its content is not checked).

        Raises:
            InvalidArgumentError: bad key.
            PoolClosedError: the store was closed.
            RemoteStoreError: the store failed.
        """

    @abc.abstractmethod
    def delete(self, key: Key) -> bool:
        """Remove the entry ``key``.

        Returns:
            True when an entry was removed, False when there was none.

        Raises:
            InvalidArgumentError: bad key.
            PoolClosedError: the store was closed.
            RemoteStoreError: the store failed.
        """

    @abc.abstractmethod
    def head(self, key: Key) -> EntryInfo | None:
        """The stored layout of ``key`` (its header), without its bytes.

        Returns:
            The :class:`~kvpool.remote.header.EntryInfo`, or None when
            there is no entry ``key``.

        Raises:
            CorruptEntryError: the header is damaged.
            InvalidArgumentError: bad key.
            PoolClosedError: the store was closed.
            RemoteStoreError: the store failed.
        """

    def delete_prefix(self, prefix: Key) -> int:
        """Remove every entry whose key starts with ``prefix``; returns how many were removed.

        Only this store's entries are looked at (a Redis or Mooncake
        store's own ``prefix`` namespace, a file store's directory), and a
        key matches when it starts with ``prefix`` byte for byte: glob or
        regex characters in it match themselves.  An entry put while the
        call runs may stay.  Every store of kvpool has it; the cost is one
        pass over the keys the store holds (each store says how it is
        bounded).

        Args:
            prefix: ``str`` or ``bytes``, not empty.

        Returns:
            The number of entries removed.

        Raises:
            InvalidArgumentError: an empty or bad prefix.
            FeatureUnavailableError: the store cannot list its keys.
            PoolClosedError: the store was closed.
            RemoteStoreError: the store failed (a subclass says how; a
                ``StoreTimeoutError`` says how many were removed by then).
        """
        raise unsupported_prefix(self)

    def _close(self) -> None:
        """Release the store's own resources (called once by :meth:`close`)."""

    # -- batched forms -----------------------------------------------

    def batched_put(self, keys: Sequence[Key], memory_objs: Sequence[MemoryObj]) -> None:
        """Store each object under its key (``put`` for each pair).

        Every entry that is written is complete.  On an error the other
        pairs are still attempted, then the first error is raised (the
        caller may retry the whole batch: ``put`` replaces).

        Raises:
            InvalidArgumentError: the lists differ in length (nothing is
                stored), or as :meth:`put`.

        It raises any error of :meth:`put`.
        """
        check_pairs(keys, memory_objs)
        self._check_open()
        results = self._map(lambda pair: self.put(*pair), list(zip(keys, memory_objs, strict=True)))
        raise_first(results)

    def batched_get(
        self,
        keys: Sequence[Key],
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> list[MemoryObj | None]:
        """``get`` for each key, all with the same expected layout.

        Returns:
            One object (or None for a missing key) per key, in order.

        It raises any error of :meth:`get`; every object this call allocated is freed first, so
        nothing leaks.
        """
        key_list(keys)
        self._check_open()
        results = self._map(
            lambda k: self.get(k, allocator, shapes, dtypes, fmt), list(keys), stop_on_error=True
        )
        if any(isinstance(r, BaseException) for r in results):
            for r in results:
                if isinstance(r, MemoryObj):
                    discard(r)
            raise_first(results)
        return results  # type: ignore[return-value]

    def batched_exists(self, keys: Sequence[Key]) -> list[bool]:
        """``exists`` for each key, in order.

        It raises any error of :meth:`exists`.
        """
        key_list(keys)
        self._check_open()
        return [self.exists(k) for k in keys]

    def batched_delete(self, keys: Sequence[Key]) -> int:
        """``delete`` each key; returns how many entries were removed.

        It raises any error of :meth:`delete`.
        """
        key_list(keys)
        self._check_open()
        return sum(self.delete(k) for k in keys)

    # -- lifecycle ---------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def close(self) -> None:
        """Release the store's resources; idempotent.  Stored entries stay."""
        with self._executor_lock:
            if self._closed:
                return
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        self._close()

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError(f"{self!r} is closed")

    def _map(
        self, fn: Callable[[_T], _R], items: list[_T], stop_on_error: bool = False
    ) -> list[_R | BaseException]:
        """Run ``fn`` on each item (threaded when configured); errors are returned.

        In the caller's thread, ``stop_on_error`` ends the run at the first
        error (the result list is then shorter than ``items``).
        """
        if self._io_threads > 1 and len(items) > 1:
            executor = self._get_executor()
            futures = [executor.submit(self.counters.run_nested, fn, item) for item in items]
            out: list[Any] = []
            for future in futures:
                try:
                    out.append(future.result())
                except Exception as exc:
                    out.append(exc)
            return out
        out = []
        for item in items:
            try:
                out.append(fn(item))
            except Exception as exc:
                out.append(exc)
                if stop_on_error:
                    break
        return out

    def _get_executor(self) -> ThreadPoolExecutor:
        with self._executor_lock:
            if self._closed:
                raise PoolClosedError(f"{self!r} is closed")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    self._io_threads, thread_name_prefix=f"kvpool-{type(self).__name__}"
                )
            return self._executor


def raise_first(results: Sequence[Any]) -> None:
    """Raise the first exception among ``results`` (one per operation of a batch, in order).

    A note on it counts the batch's other failed operations; results that
    are not exceptions are ignored.  Nothing happens when there is none.
    """
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        first = errors[0]
        if len(errors) > 1:
            first.add_note(f"{len(errors) - 1} more operation(s) of the batch failed")
        raise first
