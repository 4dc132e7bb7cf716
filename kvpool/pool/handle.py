"""The pooled memory object: a handle on bytes in a flat tensor, the allocation hot path."""

from __future__ import annotations

import logging
import operator
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kvpool.errors import (
    FeatureUnavailableError,
    GroupIndexError,
    InvalidArgumentError,
    InvalidHandleError,
    PoolClosedError,
    RefCountError,
)
from kvpool.formats import MemoryFormat
from kvpool.misuse import report
from kvpool.pool.metadata import MemoryObjMetadata, check_prefix_sums, no_token_dim, view_error
from kvpool.pool.monitor import PinMonitor
from kvpool.pool.objects import MemoryObj

if TYPE_CHECKING:
    from kvpool.pool.interface import MemoryAllocatorInterface

__all__ = ["TensorMemoryObj", "new_pooled_handle"]

logger = logging.getLogger("kvpool")


def _dead_view(obj: TensorMemoryObj, what: str) -> Exception:
    owner = obj.owner
    if owner is not None:
        return owner.dead_handle_error(obj, what)
    return InvalidHandleError(f"{what} of a freed memory object {obj!r}")


def _dead(obj: TensorMemoryObj, action: str, outcome: str = "the call was ignored") -> None:
    error = _dead_view(obj, action)
    if type(error) is PoolClosedError:
        # Closing a pool ends every object's life; users that close their
        # allocator before dropping their references (LMCache's shut-down
        # order) are not misusing anything, so this is not reported.
        logger.debug("%s; ignored", error)
        return
    report(type(error), f"{error}; {outcome}")


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

    # Slots without an underscore are the policy-facing fields of
    # kvpool.pool.contract.PooledHandle; the others are the handle's own.
    __slots__ = (
        "_lock",
        "_mv",
        "_nbytes",
        "_prefix",
        "_raw",
        "_size",
        "_used_size_override",
        "dirty",
        "lease",
        "offset",
        "owner",
        "page",
        "parent_allocator",
        "phy",
        "record",
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
        self.record = metadata
        self.valid = True
        self.parent_allocator = parent_allocator
        self.owner: Any = None
        # Re-entrant: the parent's free() may call back into this object.
        self._lock: Any = threading.RLock()
        self.offset = 0
        self.page = -1
        self.phy = metadata.phy_size
        self._nbytes = metadata.get_size()
        self._size = self._nbytes
        self._used_size_override: int | None = None
        self._prefix: list[int] | None = None
        self._raw: torch.Tensor | None = raw_data
        self._mv: memoryview | None = None
        self.lease: Any = None
        self._l1_manager: Any = None
        self.dirty = True

    # -- metadata ------------------------------------------------------

    @property
    def meta(self) -> MemoryObjMetadata:  # type: ignore[override]
        """The metadata (a pooled handle that exposed it gets fresh metadata on reuse)."""
        self.dirty = True
        return self.record

    @meta.setter
    def meta(self, value: MemoryObjMetadata) -> None:
        self.dirty = True
        self.record = value

    @property
    def metadata(self) -> MemoryObjMetadata:
        """Same as :attr:`meta`."""
        self.dirty = True
        return self.record

    @property
    def group_prefix_sum(self) -> list[int]:
        """Byte offsets of the groups: ``[0, end of group 0, end of group 1, ...]``.

        Assignable, as in the reference: a reader that received fewer
        bytes than the layout holds (a partial chunk) sets ``[0, n]``, and
        ``get_size()``, ``byte_array`` and ``tensor`` then cover ``n`` bytes.

        Raises (on assignment):
            InvalidArgumentError: not a list of non-decreasing ints starting
                at 0 and ending at most at the physical size.
        """
        if self._prefix is not None:
            return list(self._prefix)
        meta = self.record
        sums = [0]
        if meta.shapes is not None and meta.dtypes is not None:
            for shape, dtype in zip(meta.shapes, meta.dtypes, strict=True):
                sums.append(sums[-1] + shape.numel() * dtype.itemsize)
        else:
            sums.append(self._nbytes)
        return sums

    @group_prefix_sum.setter
    def group_prefix_sum(self, value: list[int]) -> None:
        sums = check_prefix_sums(value, self.phy)
        lock = self._lock
        lock.acquire()
        try:
            self._prefix = sums
            self._nbytes = sums[-1]
            if self._used_size_override is None:
                self._size = sums[-1]
            self.dirty = True
        finally:
            lock.release()

    def set_l1_manager(self, owner_tag: int) -> None:
        """Record the L1 owner (see :meth:`MemoryObj.set_l1_manager`).

        A handle with an owner is never recycled as is by a paged pool: its
        next allocation gets a fresh handle with no owner.
        """
        super().set_l1_manager(owner_tag)
        self.dirty = True

    def invalidate(self) -> None:
        """Mark the object invalid; later counting calls are ignored (reported)."""
        self.valid = False

    def is_valid(self) -> bool:
        """True while the object owns its memory (False once freed or its pool closed)."""
        owner = self.owner
        return self.valid and (owner is None or not owner.closed)

    def __del__(self) -> None:
        # The garbage-collection backstop: an object dropped without
        # ref_count_down() gives its memory back (with a warning).
        if not self.valid:
            return
        try:
            pool = self.owner
            if pool is not None:
                pool.release_dropped(self)
            elif self.parent_allocator is not None:
                meta = self.record
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
        if n < 0 or n > self.phy:
            raise InvalidArgumentError(
                f"set_used_size: n={n} is out of range [0, {self.phy}] (the object's physical size)"
            )
        lock = self._lock
        lock.acquire()
        try:
            self._used_size_override = n
            self._size = n
            self.dirty = True
        finally:
            lock.release()

    def get_shape(self) -> torch.Size:
        """Logical shape of the first group."""
        return self.record.shape

    def get_dtype(self) -> torch.dtype:
        """Logical dtype of the first group."""
        return self.record.dtype  # type: ignore[return-value]

    def get_shapes(self) -> list[torch.Size]:
        """Shapes of every group."""
        meta = self.record
        return list(meta.shapes) if meta.shapes is not None else [meta.shape]

    def get_dtypes(self) -> list[torch.dtype]:
        """Dtypes of every group."""
        meta = self.record
        return list(meta.dtypes) if meta.dtypes is not None else [meta.dtype]  # type: ignore[list-item]

    def get_memory_format(self) -> MemoryFormat:
        """The object's :class:`MemoryFormat`."""
        return self.record.fmt

    def get_physical_size(self) -> int:
        """Bytes reserved for the object, alignment included."""
        return self.phy

    def get_num_tokens(self) -> int:
        """Size of the format's token dim (InvalidArgumentError if the shape has no such dim)."""
        meta = self.record
        try:
            return meta.shape[meta.fmt.token_dim()]
        except IndexError:  # a malformed object only: no cost on the common path
            raise no_token_dim(self, meta) from None

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
            self.record.ref_count += 1
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
            pool = self.owner
            if not self.valid or (pool is not None and pool.closed):
                _dead(self, "ref_count_down")
                return
            meta = self.record
            count = meta.ref_count - 1
            if count > 0:
                meta.ref_count = count
            elif count == 0:
                meta.ref_count = 0
                if meta.pin_count <= 0:
                    if pool is not None:
                        pool.release_locked(self)
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
        pool = self.owner
        if pool is not None:
            pool.release_locked(self)
        elif self.parent_allocator is not None:
            self.parent_allocator.free(self)
            self.valid = False

    def get_ref_count(self) -> int:
        """Current reference count."""
        return self.record.ref_count

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
            meta = self.record
            meta.pin_count += 1
            if meta.pin_count == 1 and self.owner is not None:
                self.owner.pin_changed_locked(1)
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
            meta = self.record
            count = meta.pin_count - 1
            if count < 0:
                report(
                    RefCountError,
                    f"unpin of {self!r} which is not pinned; the call was ignored",
                )
                return False
            meta.pin_count = count
            if count == 0:
                if self.owner is not None:
                    self.owner.pin_changed_locked(-1)
                PinMonitor.GetOrCreate().on_unpin(self)
                if meta.ref_count <= 0:
                    if self.owner is None and self.parent_allocator is None:
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
        return self.record.pin_count > 0

    @property
    def can_evict(self) -> bool:
        """True when the object is not pinned and holds exactly one reference."""
        meta = self.record
        return meta.pin_count <= 0 and meta.ref_count == 1

    # -- views ---------------------------------------------------------
    #
    # A pooled handle's views all derive from its lease's root (see
    # kvpool.pool.lease), so they keep the allocation's bytes from being
    # reused; a hand-built handle's views derive from its own tensor.

    def _lease_locked_open(self, what: str) -> Any:
        """The handle's lease, opened on first use (pooled handles only)."""
        lock = self._lock
        lock.acquire()
        try:
            if not self.is_valid():
                raise _dead_view(self, what)
            lease = self.lease
            if lease is None:
                lease = self.owner.open_lease(self)  # type: ignore[union-attr]
                self.lease = lease
            return lease
        finally:
            lock.release()

    @property
    def raw_data(self) -> torch.Tensor:
        """The object's bytes as a flat ``uint8`` tensor (its layout size).

        Raises:
            InvalidHandleError: the object was freed (``PoolClosedError``
                once its pool is closed).
        """
        raw = self._raw
        if raw is not None:  # hand-built, or replaced through the setter
            if self.owner is None or self.is_valid():
                return raw
            raise _dead_view(self, "raw_data")
        lease = self.lease
        if lease is not None:
            raw = lease.raw
            if raw is not None and self.valid:
                return raw
        if self.owner is None:
            raise _dead_view(self, "raw_data")
        lease = self._lease_locked_open("raw_data")
        raw = lease.raw
        if raw is None:
            root = lease.root
            if root is None:  # the pool was closed meanwhile
                raise _dead_view(self, "raw_data")
            whole = torch.from_numpy(root) if isinstance(root, np.ndarray) else root
            raw = whole[: self._nbytes]
            lease.raw = raw
        return raw

    @raw_data.setter
    def raw_data(self, value: torch.Tensor) -> None:
        if not isinstance(value, torch.Tensor):
            raise InvalidArgumentError(
                f"raw_data must be a torch.Tensor, got {type(value).__name__}"
            )
        self._raw = value
        self._mv = None  # views now come from the new tensor
        lease = self.lease
        if lease is not None:
            lease.mv = None  # so byte_array stops using the pool's bytes
        self.dirty = True

    @property
    def raw_tensor(self) -> torch.Tensor | None:
        """The flat byte tensor behind the object (once freed: as :attr:`tensor`)."""
        if not self.is_valid():
            _dead(self, "raw_tensor", "it gave None")
            return None
        return self.raw_data

    @property
    def tensor(self) -> torch.Tensor | None:
        """The data viewed with the logical shape and dtype (zero-copy).

        After :meth:`set_used_size` it is a flat ``uint8`` view of the used
        bytes.  None, with a warning, once the object is freed (as LMCache's).

        Raises:
            InvalidArgumentError: several groups of different dtypes or shapes.
            InvalidHandleError: the object was freed, in strict mode only.
        """
        if not self.is_valid():
            _dead(self, "tensor", "it gave None")
            return None
        raw = self.raw_data
        if self._used_size_override is not None:
            return self._used_bytes_tensor(raw, self._used_size_override)
        meta = self.record
        shapes = meta.shapes
        if shapes is not None and len(shapes) > 1:
            raise InvalidArgumentError(
                f"{self!r} has {len(shapes)} groups ({shapes}); it has no single tensor: "
                "view each group with get_tensor(i)"
            )
        try:
            return raw[: self._size].view(meta.dtype).view(meta.shape)  # type: ignore[arg-type]
        except RuntimeError as exc:  # a malformed object only: no cost on the common path
            raise view_error(self, raw[: self._size], meta.shape, meta.dtype, exc) from None  # type: ignore[arg-type]

    def _used_bytes_tensor(self, raw: torch.Tensor, n: int) -> torch.Tensor:
        """The first ``n`` bytes, which may run past the layout into the aligned tail."""
        lease = self.lease
        if self._raw is None and lease is not None and n > self._nbytes:
            root = lease.root
            if root is None:
                raise _dead_view(self, "tensor")
            whole = torch.from_numpy(root) if isinstance(root, np.ndarray) else root
            return whole[:n]
        return raw.view(torch.uint8).flatten()[:n]

    def get_tensor(self, index: int) -> torch.Tensor | None:
        """Group ``index`` viewed with its shape and dtype (zero-copy).

        Returns:
            The tensor; once the object is freed, as :attr:`tensor`.

        Raises:
            InvalidArgumentError: ``index`` is not an int or names no group.
        """
        if not self.is_valid():
            _dead(self, "get_tensor", "it gave None")
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
            raise GroupIndexError(
                f"group index {index} is out of range: the object has {len(shapes)} group(s)"
            )
        index %= len(shapes)
        sums = self.group_prefix_sum
        data = self.raw_data[sums[index] : sums[index + 1]]
        try:
            return data.view(dtypes[index]).view(shapes[index])
        except RuntimeError as exc:
            raise view_error(self, data, shapes[index], dtypes[index], exc, index) from None

    @property
    def byte_array(self) -> memoryview:
        """The data as a writable 1-D ``memoryview`` of format ``'B'`` (zero-copy).

        Exactly ``get_size()`` bytes.  The view (and anything derived from
        it) keeps the object's bytes from being reused until it is released
        or garbage-collected, even past the object's free.  Costs one slice:
        no per-size type is created or cached.

        Raises:
            InvalidHandleError: the object was freed (``PoolClosedError``
                once its pool is closed).
            FeatureUnavailableError: the object lives in device memory.
        """
        lease = self.lease
        if lease is not None:
            mv = lease.mv
            if mv is not None:
                return mv[: self._size]
        return self._byte_array_slow()

    def _byte_array_slow(self) -> memoryview:
        if self._raw is None and self.owner is not None:
            lease = self._lease_locked_open("byte_array")
            if lease.mv is not None:
                return lease.mv[: self._size]
            if lease.root is None:
                raise _dead_view(self, "byte_array")
        if not self.is_valid():
            raise _dead_view(self, "byte_array")
        raw = self.raw_data
        if raw.device.type != "cpu":
            raise FeatureUnavailableError(
                f"byte_array needs host memory; {self!r} lives on {raw.device}. "
                "Copy it to a host pool first."
            )
        mv = self._mv
        if mv is None:
            mv = memoryview(raw.view(torch.uint8).flatten().numpy())
            self._mv = mv
        return mv[: self._size]

    @property
    def data_ptr(self) -> int:
        """Address of the object's first byte.

        A plain integer holds no lease: use it only while you hold a
        reference count or a view.

        Raises:
            InvalidHandleError: the object was freed.
        """
        if not self.is_valid():
            raise _dead_view(self, "data_ptr")
        if self._raw is not None:
            return self._raw.data_ptr()
        return self.owner.base_address + self.offset  # type: ignore[union-attr]

    @property
    def shm_offset(self) -> int:
        """Byte offset of the object inside its pool's memory.

        Unlike ``meta.address`` (a page *index* in paged pools) this is
        always a byte offset: another process that attached the pool with
        :func:`kvpool.attach_pool` reads the object at it
        (``attached.tensor(obj.shm_offset)``, or
        ``attached.view[off : off + obj.shm_byte_length]``).
        """
        return self.offset if self.owner is not None else self.record.address

    def parent(self) -> MemoryAllocatorInterface | None:
        """The allocator the object came from."""
        return self.parent_allocator

    def __repr__(self) -> str:
        owner = self.owner
        if not self.valid:
            state = "freed"
        elif owner is not None and owner.closed:
            state = "freed (pool closed)"
        else:
            state = "live"
        meta = self.record
        return (
            f"<TensorMemoryObj {state} address={meta.address} size={self._size} "
            f"ref={meta.ref_count} pin={meta.pin_count} fmt={meta.fmt.name}>"
        )


def new_pooled_handle(
    owner: Any,
    meta: MemoryObjMetadata,
    offset: int,
    phy: int,
    nbytes: int,
    page: int = -1,
) -> TensorMemoryObj:
    """The policy-facing factory: a pooled handle without the public constructor's checks.

    Args:
        owner: the policy that placed the allocation (a
            :class:`~kvpool.pool.contract.HandleOwner`); the handle's
            ``parent_allocator`` is its ``outer`` allocator (the pool built
            on it, or the policy itself).
        meta: the handle's metadata (reference count 1).
        offset: byte offset of the allocation in the owner's memory.
        phy: bytes reserved (aligned).
        nbytes: bytes of the layout (the object's size).
        page: the page index in a paged pool, else -1.

    The owner has validated everything; this is the allocation hot path, so
    it only stores the fields (see :mod:`kvpool.pool.contract`).
    """
    obj = _new_obj(TensorMemoryObj)
    obj.record = meta
    obj.valid = True
    obj.parent_allocator = owner.outer
    obj.owner = owner
    obj._lock = owner.lock
    obj.offset = offset
    obj.page = page
    obj.phy = phy
    obj._nbytes = nbytes
    obj._size = nbytes
    obj._used_size_override = None
    obj._prefix = None
    obj._raw = None
    obj._mv = None
    obj.lease = None
    obj._l1_manager = None
    obj.dirty = False
    return obj


_new_obj = object.__new__
