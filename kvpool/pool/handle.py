"""The pooled memory object: a handle on bytes in a flat tensor, the allocation hot path."""

from __future__ import annotations

import logging
import operator
import threading
from typing import TYPE_CHECKING, Any

import torch

from kvpool.errors import (
    FeatureUnavailableError,
    InvalidArgumentError,
    InvalidHandleError,
    PoolClosedError,
    RefCountError,
)
from kvpool.formats import MemoryFormat
from kvpool.misuse import report
from kvpool.pool.metadata import MemoryObjMetadata
from kvpool.pool.monitor import PinMonitor
from kvpool.pool.objects import MemoryObj

if TYPE_CHECKING:
    from kvpool.pool.interface import MemoryAllocatorInterface

__all__ = ["TensorMemoryObj"]

logger = logging.getLogger("kvpool")


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
