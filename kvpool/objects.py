"""Memory objects: a handle on one allocation, its metadata and its views.

Contracts (the README's Contracts section says the same for users):

* **A freed handle is dead.**  Pools hand out a *new* handle object for
  every allocation (or recycle one only when nothing else references it),
  so a late call on an old handle can never act on memory that now belongs
  to someone else.  Counting calls on a dead handle (``ref_count_down``,
  ``unpin``...) are reported (see :mod:`kvpool.misuse`) and do nothing;
  views of a dead handle (``byte_array``, ``data_ptr``) raise
  :class:`~kvpool.errors.InvalidHandleError`; ``tensor`` returns ``None``
  with a warning, as in the reference API.
* **Counts never free twice.**  Memory goes back to the pool only on the
  transition of both counts to zero; a count pushed below zero is reported
  and clamped, never acted on.
* **Threads.**  A pooled object's counts are guarded by its pool's lock
  (one lock per pool covers objects, free lists and counters); an object
  built by hand gets a re-entrant lock of its own.
* **Views keep memory alive.**  ``byte_array`` is a slice of the pool's
  memoryview, so it keeps the pool's mapping alive for as long as it
  exists (it does not keep the *allocation*: once the object is freed its
  bytes may be reused, as with any pool).
* **Garbage collection is a backstop.**  A live object dropped without
  ``ref_count_down`` gives its memory back from its finalizer, with a
  warning (see :mod:`kvpool.policy`); a live object keeps its pool alive.
"""

from __future__ import annotations

import abc
import logging
import operator
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kvpool.errors import (
    FeatureUnavailableError,
    InvalidArgumentError,
    InvalidHandleError,
    PoolClosedError,
    RefCountError,
)
from kvpool.formats import MemoryFormat, get_size_bytes
from kvpool.misuse import report
from kvpool.monitor import PinMonitor

if TYPE_CHECKING:
    from kvpool.interface import MemoryAllocatorInterface

__all__ = [
    "BytesBufferMemoryObj",
    "GDSMemoryObject",
    "MemoryObj",
    "MemoryObjMetadata",
    "TensorMemoryObj",
]

logger = logging.getLogger("kvpool")


def _dtype_from_str(text: str) -> torch.dtype:
    value = getattr(torch, text.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise InvalidArgumentError(f"unknown torch dtype {text!r} in serialized metadata")
    return value


@dataclass(slots=True)
class MemoryObjMetadata:
    """Metadata of one memory object.

    Attributes:
        shape: logical shape of the first (or only) group.
        dtype: logical dtype of the first group.
        address: where the object lives in its pool: a byte offset for
            extent pools, a page index for paged pools.
        phy_size: bytes reserved for the object (aligned; >= its size).
        ref_count: references held; the object is freed when both counts
            reach zero.
        pin_count: pins held; a pinned object cannot be evicted.
        fmt: the logical :class:`MemoryFormat`.
        cached_positions: token positions cached in the object, if any.
        shapes: shapes of every group (groups are stored back to back).
        dtypes: dtypes of every group.
    """

    shape: torch.Size
    dtype: torch.dtype | None
    address: int
    phy_size: int
    ref_count: int
    pin_count: int = 0
    fmt: MemoryFormat = MemoryFormat.UNDEFINED
    cached_positions: torch.Tensor | None = None
    shapes: list[torch.Size] | None = None
    dtypes: list[torch.dtype] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialize to plain Python types (for msgpack/JSON).

        ``cached_positions`` is not serialized.
        """
        return {
            "__type__": "MemoryObjMetadata",
            "shape": list(self.shape),
            "dtype": str(self.dtype) if self.dtype is not None else None,
            "address": self.address,
            "phy_size": self.phy_size,
            "ref_count": self.ref_count,
            "pin_count": self.pin_count,
            "fmt": self.fmt.value,
            "shapes": [list(s) for s in self.shapes] if self.shapes else None,
            "dtypes": [str(d) for d in self.dtypes] if self.dtypes else None,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> MemoryObjMetadata:
        """Rebuild metadata serialized by :meth:`to_dict`.

        Raises:
            InvalidArgumentError: a key is missing or a value is malformed.
        """
        try:
            dtype = _dtype_from_str(d["dtype"]) if d["dtype"] else None
            shapes = [torch.Size(s) for s in d["shapes"]] if d.get("shapes") else None
            dtypes = [_dtype_from_str(s) for s in d["dtypes"]] if d.get("dtypes") else None
            return MemoryObjMetadata(
                shape=torch.Size(d["shape"]),
                dtype=dtype,
                address=int(d["address"]),
                phy_size=int(d["phy_size"]),
                ref_count=int(d["ref_count"]),
                pin_count=int(d.get("pin_count", 0)),
                fmt=MemoryFormat(d["fmt"]),
                shapes=shapes,
                dtypes=dtypes,
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, InvalidArgumentError):
                raise
            raise InvalidArgumentError(f"malformed serialized metadata {d!r}: {exc}") from None

    def get_size(self) -> int:
        """Bytes of the logical layout (all groups).

        Raises:
            InvalidArgumentError: no dtype is recorded.
        """
        if self.shapes is not None and self.dtypes is not None:
            return get_size_bytes(self.shapes, self.dtypes)
        if self.dtype is None:
            raise InvalidArgumentError("metadata has no dtype, so it has no byte size")
        return self.shape.numel() * self.dtype.itemsize


class MemoryObj(metaclass=abc.ABCMeta):
    """Interface of a memory object (a handle on one allocation)."""

    __slots__ = ()

    # Subclasses expose their data here (a tensor, bytes...).
    raw_data: Any

    def __init__(self, metadata: MemoryObjMetadata) -> None:
        self.meta = metadata

    @abc.abstractmethod
    def invalidate(self) -> None:
        """Mark the object invalid (its memory is no longer its own)."""

    @abc.abstractmethod
    def is_valid(self) -> bool:
        """Return True while the object owns its memory."""

    @abc.abstractmethod
    def get_size(self) -> int:
        """Logical size in bytes (may be less than the physical size)."""

    @abc.abstractmethod
    def get_shape(self) -> torch.Size:
        """Logical shape of the first group."""

    def get_dtype(self) -> torch.dtype | None:
        """Logical dtype of the first group (None if the object has none)."""
        return None

    @abc.abstractmethod
    def get_shapes(self) -> list[torch.Size]:
        """Shapes of every group."""

    @abc.abstractmethod
    def get_dtypes(self) -> list[torch.dtype]:
        """Dtypes of every group."""

    @abc.abstractmethod
    def get_memory_format(self) -> MemoryFormat:
        """The object's :class:`MemoryFormat`."""

    @abc.abstractmethod
    def get_physical_size(self) -> int:
        """Bytes reserved for the object, alignment included."""

    def set_used_size(self, n: int) -> None:  # noqa: B027 - optional hook
        """Narrow the logical size to the first ``n`` bytes (optional hook).

        The default does nothing; objects that distinguish used from
        reserved bytes override it.
        """

    @abc.abstractmethod
    def pin(self) -> bool:
        """Pin the object so that it cannot be evicted; True on success."""

    @abc.abstractmethod
    def ref_count_up(self) -> None:
        """Take one more reference."""

    @abc.abstractmethod
    def unpin(self) -> bool:
        """Drop one pin; True on success."""

    @abc.abstractmethod
    def ref_count_down(self) -> None:
        """Drop one reference (the last one frees the object)."""

    @abc.abstractmethod
    def get_ref_count(self) -> int:
        """Current reference count."""

    @abc.abstractmethod
    def get_num_tokens(self) -> int:
        """Number of tokens the object holds."""

    @property
    def shm_offset(self) -> int:
        """Byte offset of the object inside its (shared-memory) pool."""
        return self.meta.address

    @property
    def shm_byte_length(self) -> int:
        """Byte length of the object inside its (shared-memory) pool."""
        return self.get_size()

    @property
    @abc.abstractmethod
    def metadata(self) -> MemoryObjMetadata:
        """The object's metadata."""

    @property
    @abc.abstractmethod
    def tensor(self) -> torch.Tensor | None:
        """The data as a tensor of the logical shape and dtype."""

    @property
    @abc.abstractmethod
    def byte_array(self) -> Any:
        """The data as a zero-copy byte buffer of ``get_size()`` bytes."""

    @property
    @abc.abstractmethod
    def data_ptr(self) -> int:
        """Address of the first byte."""

    @property
    @abc.abstractmethod
    def is_pinned(self) -> bool:
        """True while the object is pinned."""

    @property
    @abc.abstractmethod
    def can_evict(self) -> bool:
        """True when the object may be evicted."""

    @property
    @abc.abstractmethod
    def raw_tensor(self) -> torch.Tensor | None:
        """The flat byte tensor behind the object."""

    @abc.abstractmethod
    def get_tensor(self, index: int) -> torch.Tensor | None:
        """Group ``index`` as a tensor of its shape and dtype."""

    @abc.abstractmethod
    def parent(self) -> MemoryAllocatorInterface | None:
        """The allocator the object came from."""


def _dead_view(obj: TensorMemoryObj, what: str) -> InvalidHandleError:
    pool = obj._pool
    if pool is not None and pool._closed:
        return PoolClosedError(f"{what} of {obj!r}: its pool was closed")
    return InvalidHandleError(
        f"{what} of a freed memory object {obj!r}; its memory may belong to another object now"
    )


def _dead(obj: TensorMemoryObj, action: str) -> None:
    pool = obj._pool
    if pool is not None and pool._closed:
        report(
            PoolClosedError,
            f"{action} on a freed memory object ({obj!r}): its pool was closed; "
            "the call was ignored",
        )
        return
    report(
        InvalidHandleError,
        f"{action} on a freed memory object ({obj!r}); the call was ignored. "
        "Keep a reference count for as long as you use the object.",
    )


class TensorMemoryObj(MemoryObj):
    """A memory object whose bytes live in a flat ``uint8`` tensor.

    Build one by hand from a tensor (``TensorMemoryObj(raw_data, metadata,
    parent_allocator)``) or, usually, get one from a pool's ``allocate``.

    Args:
        raw_data: the object's bytes, a flat ``uint8`` tensor.
        metadata: its metadata; ``dtype`` must be set.
        parent_allocator: the allocator whose ``free`` the last
            ``ref_count_down``/``unpin`` calls (None: nothing is called).

    Raises:
        InvalidArgumentError: ``raw_data`` is not a tensor or the metadata
            has no dtype.
    """

    __slots__ = (
        "_dirty",
        "_lock",
        "_meta",
        "_mv",
        "_nbytes",
        "_off",
        "_page",
        "_phy",
        "_pool",
        "_raw",
        "_size",
        "_used_size_override",
        "parent_allocator",
        "valid",
    )

    def __init__(
        self,
        raw_data: torch.Tensor,
        metadata: MemoryObjMetadata,
        parent_allocator: MemoryAllocatorInterface | None = None,
    ) -> None:
        self.valid = False  # until fully built (the finalizer reads it)
        if not isinstance(raw_data, torch.Tensor):
            raise InvalidArgumentError(
                f"raw_data must be a torch.Tensor, got {type(raw_data).__name__}"
            )
        if not isinstance(metadata, MemoryObjMetadata):
            raise InvalidArgumentError(
                f"metadata must be a MemoryObjMetadata, got {type(metadata).__name__}"
            )
        if metadata.dtype is None:
            raise InvalidArgumentError("a TensorMemoryObj needs metadata with a dtype")
        self._meta = metadata
        self.valid = True
        self.parent_allocator = parent_allocator
        self._pool: Any = None
        # Re-entrant: the parent's free() may call back into this object.
        self._lock: Any = threading.RLock()
        self._off = 0
        self._page = -1
        self._phy = metadata.phy_size
        self._nbytes = metadata.get_size()
        self._size = self._nbytes
        self._used_size_override: int | None = None
        self._raw: torch.Tensor | None = raw_data
        self._mv: memoryview | None = None
        self._dirty = True

    # -- metadata ------------------------------------------------------

    @property
    def meta(self) -> MemoryObjMetadata:  # type: ignore[override]
        """The metadata (a pooled handle that exposed it gets fresh metadata on reuse)."""
        self._dirty = True
        return self._meta

    @meta.setter
    def meta(self, value: MemoryObjMetadata) -> None:
        self._dirty = True
        self._meta = value

    @property
    def metadata(self) -> MemoryObjMetadata:
        """Same as :attr:`meta`."""
        self._dirty = True
        return self._meta

    @property
    def group_prefix_sum(self) -> list[int]:
        """Byte offsets of the groups: ``[0, end of group 0, end of group 1, ...]``."""
        meta = self._meta
        sums = [0]
        if meta.shapes is not None and meta.dtypes is not None:
            for shape, dtype in zip(meta.shapes, meta.dtypes, strict=True):
                sums.append(sums[-1] + shape.numel() * dtype.itemsize)
        else:
            sums.append(self._nbytes)
        return sums

    def invalidate(self) -> None:
        """Mark the object invalid; later counting calls are ignored (reported)."""
        self.valid = False

    def is_valid(self) -> bool:
        """True while the object owns its memory (False once freed or its pool closed)."""
        pool = self._pool
        return self.valid and (pool is None or not pool._closed)

    def __del__(self) -> None:
        # The garbage-collection backstop: an object dropped without
        # ref_count_down() gives its memory back (with a warning).
        if not self.valid:
            return
        try:
            pool = self._pool
            if pool is not None:
                pool._release_dropped(self)
            elif self.parent_allocator is not None:
                meta = self._meta
                logger.warning(
                    "memory object %s garbage-collected with ref_count=%d, pin_count=%d; "
                    "freeing it (ref_count_down()/unpin() was not called)",
                    repr(self),
                    meta.ref_count,
                    meta.pin_count,
                )
                self.parent_allocator.free(self)
        except Exception:  # a finalizer must not raise (e.g. at interpreter exit)
            pass

    def get_size(self) -> int:
        """Logical size in bytes (narrowed by :meth:`set_used_size`)."""
        return self._size

    def set_used_size(self, n: int) -> None:
        """Narrow the logical size to the first ``n`` bytes after a write.

        Afterwards ``get_size()``, ``byte_array`` and ``shm_byte_length``
        report ``n`` bytes and ``tensor`` is a flat ``uint8`` view of them;
        the physical allocation is unchanged.  A pool resets this on reuse.

        Args:
            n: bytes in use, ``0 <= n <= get_physical_size()``.

        Raises:
            InvalidArgumentError: ``n`` is not an int in that range.
        """
        if isinstance(n, bool) or not isinstance(n, int):
            raise InvalidArgumentError(f"set_used_size: n must be an int, got {n!r}")
        if n < 0 or n > self._phy:
            raise InvalidArgumentError(
                f"set_used_size: n={n} is out of range [0, {self._phy}] "
                "(the object's physical size)"
            )
        lock = self._lock
        lock.acquire()
        try:
            self._used_size_override = n
            self._size = n
            self._dirty = True
        finally:
            lock.release()

    def get_shape(self) -> torch.Size:
        """Logical shape of the first group."""
        return self._meta.shape

    def get_dtype(self) -> torch.dtype:
        """Logical dtype of the first group."""
        return self._meta.dtype  # type: ignore[return-value]

    def get_shapes(self) -> list[torch.Size]:
        """Shapes of every group."""
        meta = self._meta
        return list(meta.shapes) if meta.shapes is not None else [meta.shape]

    def get_dtypes(self) -> list[torch.dtype]:
        """Dtypes of every group."""
        meta = self._meta
        return list(meta.dtypes) if meta.dtypes is not None else [meta.dtype]  # type: ignore[list-item]

    def get_memory_format(self) -> MemoryFormat:
        """The object's :class:`MemoryFormat`."""
        return self._meta.fmt

    def get_physical_size(self) -> int:
        """Bytes reserved for the object, alignment included."""
        return self._phy

    def get_num_tokens(self) -> int:
        """Size of the token dimension of the object's format."""
        meta = self._meta
        return meta.shape[meta.fmt.token_dim()]

    # -- counting ------------------------------------------------------

    def ref_count_up(self) -> None:
        """Take one more reference.

        A call on a freed object is reported and ignored.
        """
        lock = self._lock
        lock.acquire()
        try:
            if not self.is_valid():
                _dead(self, "ref_count_up")
                return
            self._meta.ref_count += 1
        finally:
            lock.release()

    def ref_count_down(self) -> None:
        """Drop one reference; the last one (with no pins) frees the object.

        A call on a freed object, or one that would take the count below
        zero, is reported and ignored: nothing is ever freed twice.
        """
        lock = self._lock
        lock.acquire()
        try:
            pool = self._pool
            if not self.valid or (pool is not None and pool._closed):
                _dead(self, "ref_count_down")
                return
            meta = self._meta
            count = meta.ref_count - 1
            if count > 0:
                meta.ref_count = count
            elif count == 0:
                meta.ref_count = 0
                if meta.pin_count <= 0:
                    if pool is not None:
                        pool._release_locked(self)
                    else:
                        self._free_locked()
            else:
                report(
                    RefCountError,
                    f"ref_count_down below zero on {self!r} (it is held only by pins); "
                    "the call was ignored",
                )
        finally:
            lock.release()

    def _free_locked(self) -> None:
        pool = self._pool
        if pool is not None:
            pool._release_locked(self)
        elif self.parent_allocator is not None:
            self.parent_allocator.free(self)
            self.valid = False

    def get_ref_count(self) -> int:
        """Current reference count."""
        return self._meta.ref_count

    def pin(self) -> bool:
        """Pin the object so that it cannot be evicted.

        Returns:
            True, or False (reported) when the object was already freed.
        """
        lock = self._lock
        lock.acquire()
        try:
            if not self.is_valid():
                _dead(self, "pin")
                return False
            meta = self._meta
            meta.pin_count += 1
            if meta.pin_count == 1 and self._pool is not None:
                self._pool._pinned += 1
            # Under the lock, so that a concurrent unpin is recorded after it.
            PinMonitor.GetOrCreate().on_pin(self)
        finally:
            lock.release()
        return True

    def unpin(self) -> bool:
        """Drop one pin; with no pins and no references the object is freed.

        Returns:
            True, or False (reported) when the object was freed or not pinned.
        """
        lock = self._lock
        lock.acquire()
        try:
            if not self.is_valid():
                _dead(self, "unpin")
                return False
            meta = self._meta
            count = meta.pin_count - 1
            if count < 0:
                report(
                    RefCountError,
                    f"unpin of {self!r} which is not pinned; the call was ignored",
                )
                return False
            meta.pin_count = count
            if count == 0:
                if self._pool is not None:
                    self._pool._pinned -= 1
                PinMonitor.GetOrCreate().on_unpin(self)
                if meta.ref_count <= 0:
                    if self._pool is None and self.parent_allocator is None:
                        logger.error(
                            "unpin of %s: no references and no parent allocator to free it",
                            repr(self),
                        )
                    else:
                        self._free_locked()
        finally:
            lock.release()
        return True

    @property
    def is_pinned(self) -> bool:
        """True while the object is pinned."""
        return self._meta.pin_count > 0

    @property
    def can_evict(self) -> bool:
        """True when the object is not pinned and holds exactly one reference."""
        meta = self._meta
        return meta.pin_count <= 0 and meta.ref_count == 1

    # -- views ---------------------------------------------------------

    @property
    def raw_data(self) -> torch.Tensor:
        """The object's bytes as a flat ``uint8`` tensor (its layout size)."""
        raw = self._raw
        pool = self._pool
        if raw is not None and (pool is None or (self.valid and not pool._closed)):
            return raw
        if not self.is_valid():
            raise _dead_view(self, "raw_data")
        off = self._off
        raw = self._pool.buffer[off : off + self._nbytes]
        self._raw = raw
        return raw

    @raw_data.setter
    def raw_data(self, value: torch.Tensor) -> None:
        if not isinstance(value, torch.Tensor):
            raise InvalidArgumentError(
                f"raw_data must be a torch.Tensor, got {type(value).__name__}"
            )
        self._raw = value
        self._mv = None  # views now come from the new tensor
        self._dirty = True

    @property
    def raw_tensor(self) -> torch.Tensor | None:
        """The flat byte tensor behind the object (None, with a warning, once freed)."""
        if not self.is_valid():
            logger.warning("raw_tensor of a freed memory object %s", repr(self))
            return None
        return self.raw_data

    @property
    def tensor(self) -> torch.Tensor | None:
        """The data viewed with the logical shape and dtype (zero-copy).

        After :meth:`set_used_size` it is a flat ``uint8`` view of the used
        bytes.  None, with a warning, once the object is freed.
        """
        if not self.is_valid():
            logger.warning("tensor of a freed memory object %s", repr(self))
            return None
        if self._used_size_override is not None:
            return self._bytes_tensor(self._used_size_override)
        meta = self._meta
        return self.raw_data[: self._size].view(meta.dtype).view(meta.shape)  # type: ignore[arg-type]

    def _bytes_tensor(self, n: int) -> torch.Tensor:
        pool = self._pool
        if pool is not None and self._mv is not None:
            return pool.buffer[self._off : self._off + n]
        return self.raw_data.view(torch.uint8).flatten()[:n]

    def get_tensor(self, index: int) -> torch.Tensor | None:
        """Group ``index`` viewed with its shape and dtype (zero-copy).

        Returns:
            The tensor, or None (with a warning) once the object is freed.

        Raises:
            IndexError: no such group.
        """
        if not self.is_valid():
            logger.warning("get_tensor of a freed memory object %s", repr(self))
            return None
        shapes = self.get_shapes()
        dtypes = self.get_dtypes()
        try:
            index = operator.index(index)
        except TypeError:
            raise InvalidArgumentError(
                f"group index must be an int, got {type(index).__name__} {index!r}"
            ) from None
        if not -len(shapes) <= index < len(shapes):
            raise IndexError(
                f"group index {index} is out of range: the object has {len(shapes)} group(s)"
            )
        index %= len(shapes)
        sums = self.group_prefix_sum
        return self.raw_data[sums[index] : sums[index + 1]].view(dtypes[index]).view(shapes[index])

    @property
    def byte_array(self) -> memoryview:
        """The data as a writable 1-D ``memoryview`` of format ``'B'`` (zero-copy).

        Exactly ``get_size()`` bytes.  The view keeps the pool's memory
        mapped while it exists.  Costs one slice: no per-size type is
        created or cached.

        Raises:
            InvalidHandleError: the object was freed.
            FeatureUnavailableError: the object lives in device memory.
        """
        mv = self._mv
        if mv is not None and self.valid:
            off = self._off
            try:
                return mv[off : off + self._size]
            except ValueError:  # the pool released its view: it was closed
                pass
        return self._byte_array_slow()

    def _byte_array_slow(self) -> memoryview:
        if not self.is_valid():
            raise _dead_view(self, "byte_array")
        raw = self.raw_data
        if raw.device.type != "cpu":
            raise FeatureUnavailableError(
                f"byte_array needs host memory; {self!r} lives on {raw.device}. "
                "Copy it to a host pool first."
            )
        flat = raw.view(torch.uint8).flatten()
        view = memoryview(flat.numpy())
        if self._pool is None:
            # Cache for hand-built objects (their own tensor, offset 0).
            self._mv = view
            self._off = 0
        return view[: self._size]

    @property
    def data_ptr(self) -> int:
        """Address of the object's first byte.

        Raises:
            InvalidHandleError: the object was freed.
        """
        if not self.is_valid():
            raise _dead_view(self, "data_ptr")
        pool = self._pool
        if pool is not None and self._mv is not None:
            return pool.base_address + self._off
        return self.raw_data.data_ptr()

    @property
    def shm_offset(self) -> int:
        """Byte offset of the object inside its pool's memory.

        Unlike ``meta.address`` (a page *index* in paged pools) this is
        always a byte offset, usable with ``attach`` from another process.
        """
        return self._off if self._pool is not None else self._meta.address

    def parent(self) -> MemoryAllocatorInterface | None:
        """The allocator the object came from."""
        return self.parent_allocator

    def __repr__(self) -> str:
        state = "live" if self.valid else "freed"
        meta = self._meta
        return (
            f"<TensorMemoryObj {state} address={meta.address} size={self._size} "
            f"ref={meta.ref_count} pin={meta.pin_count} fmt={meta.fmt.name}>"
        )


def _new_pooled(
    pool: Any,
    meta: MemoryObjMetadata,
    off: int,
    phy: int,
    nbytes: int,
    page: int = -1,
) -> TensorMemoryObj:
    """Build a pooled handle without the public constructor's checks.

    The pool has already validated everything; this is the allocation hot
    path, so it only stores the fields.
    """
    obj = _new_obj(TensorMemoryObj)
    obj._meta = meta
    obj.valid = True
    obj.parent_allocator = pool
    obj._pool = pool
    obj._lock = pool._lock
    obj._off = off
    obj._page = page
    obj._phy = phy
    obj._nbytes = nbytes
    obj._size = nbytes
    obj._used_size_override = None
    obj._raw = None
    obj._mv = pool._mv
    obj._dirty = False
    return obj


_new_obj = object.__new__


class BytesBufferMemoryObj(MemoryObj):
    """A memory object over an ordinary Python bytes-like buffer.

    Reference counting does nothing (the buffer is garbage-collected);
    pins are counted.

    Args:
        raw_bytes: the bytes (``bytes``, ``bytearray`` or ``memoryview``).
        metadata: optional metadata; by default a ``BINARY_BUFFER`` record.
    """

    __slots__ = ("meta", "raw_data", "valid")

    def __init__(self, raw_bytes: bytes, metadata: MemoryObjMetadata | None = None) -> None:
        if not isinstance(raw_bytes, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(
                f"raw_bytes must be bytes-like, got {type(raw_bytes).__name__}"
            )
        self.raw_data = raw_bytes
        if metadata is None:
            metadata = MemoryObjMetadata(
                shape=torch.Size([len(raw_bytes), 0, 0, 0]),
                dtype=None,
                address=0,
                phy_size=0,
                ref_count=1,
                pin_count=0,
                fmt=MemoryFormat.BINARY_BUFFER,
            )
        super().__init__(metadata)
        self.valid = True

    def invalidate(self) -> None:
        """Mark the object invalid."""
        self.valid = False

    def is_valid(self) -> bool:
        """True until :meth:`invalidate`."""
        return self.valid

    def get_size(self) -> int:
        """Length of the buffer in bytes."""
        return len(self.raw_data)

    def get_shape(self) -> torch.Size:
        """``[len, 0, 0, 0]``, as in the reference API."""
        return torch.Size([len(self.raw_data), 0, 0, 0])

    def get_dtype(self) -> torch.dtype | None:
        """None: a byte buffer has no dtype."""
        return None

    def get_shapes(self) -> list[torch.Size]:
        """One shape, :meth:`get_shape`."""
        return [self.get_shape()]

    def get_dtypes(self) -> list[torch.dtype]:
        """Empty: a byte buffer has no dtype."""
        return []

    def get_memory_format(self) -> MemoryFormat:
        """The metadata's format (``BINARY_BUFFER`` by default)."""
        return self.meta.fmt

    def get_physical_size(self) -> int:
        """The metadata's ``phy_size``."""
        return self.meta.phy_size

    def pin(self) -> bool:
        """Count a pin."""
        self.meta.pin_count += 1
        return True

    def unpin(self) -> bool:
        """Drop a pin; below zero is reported and ignored."""
        if self.meta.pin_count <= 0:
            report(RefCountError, f"unpin of an unpinned byte buffer object {self!r}")
            return False
        self.meta.pin_count -= 1
        return True

    def ref_count_up(self) -> None:
        """No-op: the buffer is garbage-collected."""

    def ref_count_down(self) -> None:
        """No-op: the buffer is garbage-collected."""

    def get_ref_count(self) -> int:
        """Always 1."""
        return 1

    def get_num_tokens(self) -> int:
        """Always 1 (the number of tokens is not recorded)."""
        return 1

    @property
    def metadata(self) -> MemoryObjMetadata:
        """The metadata."""
        return self.meta

    @property
    def tensor(self) -> torch.Tensor | None:
        """None: a byte buffer has no tensor view."""
        if not self.valid:
            logger.warning("tensor of an invalidated memory object %s", repr(self))
        return None

    @property
    def byte_array(self) -> Any:
        """The buffer itself."""
        return self.raw_data

    @property
    def data_ptr(self) -> int:
        """Address of the buffer's first byte."""
        # numpy reads the address through the buffer protocol, read-only
        # buffers included, without copying.
        return int(np.frombuffer(self.raw_data, dtype=np.uint8).ctypes.data)

    @property
    def is_pinned(self) -> bool:
        """True while pinned."""
        return self.meta.pin_count > 0

    @property
    def can_evict(self) -> bool:
        """True when not pinned."""
        return not self.is_pinned

    @property
    def raw_tensor(self) -> torch.Tensor | None:
        """None: a byte buffer has no tensor."""
        return None

    def get_tensor(self, index: int) -> torch.Tensor | None:
        """None: a byte buffer has no tensor."""
        return None

    def parent(self) -> MemoryAllocatorInterface | None:
        """None: byte buffers belong to no allocator."""
        return None

    def __repr__(self) -> str:
        return f"<BytesBufferMemoryObj {len(self.raw_data)} bytes>"


def _gds_unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"GDSMemoryObject.{what} is not supported: the bytes live in the GDS slab file, "
        "only (slab offset, size) is tracked"
    )


class GDSMemoryObject(MemoryObj):
    """A placeholder object for a chunk stored in a GPUDirect-Storage slab file.

    Only ``(offset, size)`` in the slab is tracked (``meta.address`` and
    ``meta.phy_size``); ``tensor`` is always None and the byte views,
    counting and pinning raise ``NotImplementedError``.
    """

    __slots__ = ("meta", "valid")

    def __init__(self, metadata: MemoryObjMetadata) -> None:
        if not isinstance(metadata, MemoryObjMetadata):
            raise InvalidArgumentError(
                f"metadata must be a MemoryObjMetadata, got {type(metadata).__name__}"
            )
        super().__init__(metadata)
        self.valid = True

    @property
    def slab_offset(self) -> int:
        """Byte offset of the chunk in the slab file (``meta.address``)."""
        return self.meta.address

    def invalidate(self) -> None:
        """Mark the object invalid."""
        self.valid = False

    def is_valid(self) -> bool:
        """True until :meth:`invalidate`."""
        return self.valid

    def get_size(self) -> int:
        """``meta.phy_size``."""
        return self.meta.phy_size

    def get_shape(self) -> torch.Size:
        """``meta.shape``."""
        return self.meta.shape

    def get_dtype(self) -> torch.dtype | None:
        """``meta.dtype``."""
        return self.meta.dtype

    def get_shapes(self) -> list[torch.Size]:
        """Not tracked on the GDS path."""
        raise _gds_unsupported("get_shapes")

    def get_dtypes(self) -> list[torch.dtype]:
        """Not tracked on the GDS path."""
        raise _gds_unsupported("get_dtypes")

    def get_memory_format(self) -> MemoryFormat:
        """``meta.fmt``."""
        return self.meta.fmt

    def get_physical_size(self) -> int:
        """``meta.phy_size``."""
        return self.meta.phy_size

    def ref_count_up(self) -> None:
        """Not used on the GDS path."""
        raise _gds_unsupported("ref_count_up")

    def ref_count_down(self) -> None:
        """Not used on the GDS path."""
        raise _gds_unsupported("ref_count_down")

    def get_ref_count(self) -> int:
        """Not used on the GDS path."""
        raise _gds_unsupported("get_ref_count")

    def get_num_tokens(self) -> int:
        """Not used on the GDS path."""
        raise _gds_unsupported("get_num_tokens")

    def pin(self) -> bool:
        """Not used on the GDS path."""
        raise _gds_unsupported("pin")

    def unpin(self) -> bool:
        """Not used on the GDS path."""
        raise _gds_unsupported("unpin")

    @property
    def metadata(self) -> MemoryObjMetadata:
        """The metadata."""
        return self.meta

    @property
    def tensor(self) -> torch.Tensor | None:
        """Always None."""
        return None

    @property
    def byte_array(self) -> Any:
        """Not supported: the bytes are in the slab file."""
        raise _gds_unsupported("byte_array")

    @property
    def data_ptr(self) -> int:
        """Not supported: the bytes are in the slab file."""
        raise _gds_unsupported("data_ptr")

    @property
    def is_pinned(self) -> bool:
        """Not used on the GDS path."""
        raise _gds_unsupported("is_pinned")

    @property
    def can_evict(self) -> bool:
        """Not used on the GDS path."""
        raise _gds_unsupported("can_evict")

    @property
    def raw_tensor(self) -> torch.Tensor | None:
        """Always None."""
        return None

    def get_tensor(self, index: int) -> torch.Tensor | None:
        """Always None."""
        return None

    def parent(self) -> MemoryAllocatorInterface | None:
        """None: the slab is not an allocator."""
        return None
