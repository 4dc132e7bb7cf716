"""Extent placement: objects of any size carved out of one arena.

:class:`TensorMemoryAllocator` places each object at an aligned offset
chosen by an :class:`~kvpool.address.AddressManager` (O(1) good fit) and
hands out a fresh :class:`~kvpool.objects.TensorMemoryObj` per allocation.

Thread safety: one lock - the address manager's - covers the placement,
the table of live objects and the pin counter, and guards the counts of
every object of the pool.  Statistics are derived from that state under
the lock, so they are exact under any interleaving.
"""

from __future__ import annotations

import sys

import torch

from kvpool.address import AddressManager
from kvpool.arena import Arena, arena_from_tensor
from kvpool.errors import (
    AddressSpaceExhaustedError,
    InvalidArgumentError,
    InvalidHandleError,
    PoolClosedError,
)
from kvpool.formats import MemoryFormat, normalize_layout
from kvpool.interface import MemoryAllocatorInterface, PoolStats
from kvpool.misuse import logger, report
from kvpool.monitor import PinMonitor
from kvpool.objects import MemoryObj, MemoryObjMetadata, TensorMemoryObj, _new_pooled

__all__ = ["TensorMemoryAllocator"]

_Size = torch.Size
_dtype = torch.dtype
_TMO = TensorMemoryObj
_getrefcount = sys.getrefcount


def check_format(fmt: object) -> MemoryFormat:
    """Validate a ``fmt`` argument.

    Raises:
        InvalidArgumentError: ``fmt`` is not a :class:`MemoryFormat`.
    """
    if fmt.__class__ is not MemoryFormat:
        names = ", ".join(f.name for f in MemoryFormat)
        raise InvalidArgumentError(f"fmt must be a MemoryFormat ({names}), got {fmt!r}")
    return fmt  # type: ignore[return-value]


def check_batch_size(batch_size: object) -> int:
    """Validate a ``batch_size`` argument (an int >= 0).

    Raises:
        InvalidArgumentError: not an int, or negative.
    """
    if batch_size.__class__ is not int and (
        isinstance(batch_size, bool) or not isinstance(batch_size, int)
    ):
        raise InvalidArgumentError(f"batch_size must be an int, got {batch_size!r}")
    if batch_size < 0:  # type: ignore[operator]
        raise InvalidArgumentError(f"batch_size must be >= 0, got {batch_size}")
    return batch_size  # type: ignore[return-value]


class TensorMemoryAllocator(MemoryAllocatorInterface):
    """Extent allocator over one flat buffer (variable-size objects).

    Args:
        tensor: the memory to place objects in (contiguous, any dtype; it
            is used as bytes).
        align_bytes: alignment of every object (a power of two).
        init_address_space: bytes usable at first (default: all of
            ``tensor``); :meth:`AddressManager.sbrk` on ``address_manager``
            extends it up to the tensor's size (lazy pools grow this way).
        byte_view: a memoryview of the same bytes, when the caller has one
            (native pools pass their mapping's view so that ``byte_array``
            keeps the mapping alive).

    Raises:
        InvalidArgumentError: bad tensor, alignment or address space.

    Complexity: allocate and free are O(1); ``batched_allocate(k)`` and
    ``batched_free(k)`` are O(k) (O(k log k) for the free).
    """

    def __init__(
        self,
        tensor: torch.Tensor,
        align_bytes: int = AddressManager.ALIGN_BYTES,
        init_address_space: int | None = None,
        *,
        byte_view: memoryview | None = None,
    ) -> None:
        arena = arena_from_tensor(tensor, byte_view)
        space = arena.size if init_address_space is None else init_address_space
        if isinstance(space, bool) or not isinstance(space, int) or space < 0:
            raise InvalidArgumentError(
                f"init_address_space must be an int >= 0, got {init_address_space!r}"
            )
        if space > arena.size:
            raise InvalidArgumentError(
                f"init_address_space={space} exceeds the buffer's {arena.size} bytes"
            )
        self._arena: Arena = arena
        self.buffer = arena.buffer
        self._mv = arena.view
        self.base_address = arena.base_address
        self.address_manager = AddressManager(space, align_bytes)
        self.align_bytes = align_bytes
        self._lock = self.address_manager._lock
        self._am_allocate = self.address_manager.allocate_locked
        self._am_free = self.address_manager.free_locked
        # Live handles by address: close() invalidates them, and when the
        # pool runs dry, handles nobody references any more are reclaimed
        # (the garbage-collection backstop, without a __del__ on every object).
        self._objs: dict[int, TensorMemoryObj] = {}
        self._pinned = 0
        self._closed = False

    # -- accounting ----------------------------------------------------

    @property
    def total_allocated_size(self) -> int:
        """Bytes held by live objects (aligned sizes)."""
        return self.address_manager.total_allocated_size

    @property
    def num_active_allocations(self) -> int:
        """Number of live objects (exact: derived from the live table)."""
        return len(self._objs)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def stats(self) -> PoolStats:
        """A consistent snapshot of the pool's accounting (see :class:`PoolStats`)."""
        lock = self._lock
        lock.acquire()
        try:
            am = self.address_manager
            return PoolStats.build(
                am.get_heap_size(),
                am.total_allocated_size,
                len(self._objs),
                self._pinned,
                am._largest_free(),
            )
        finally:
            lock.release()

    # -- allocation ----------------------------------------------------

    def allocate(
        self,
        shapes: torch.Size | list[torch.Size],
        dtypes: torch.dtype | list[torch.dtype],
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
    ) -> TensorMemoryObj | None:
        """Allocate one object of the given layout.

        Args:
            shapes: a ``torch.Size``, or one per group.
            dtypes: a ``torch.dtype``, or one per group.
            fmt: the object's :class:`MemoryFormat`.
            allocator_type: ignored (kept for the common interface).

        Returns:
            A new object with reference count 1, or None when no free range
            is large enough (as in the reference API).

        Raises:
            InvalidArgumentError: bad shapes, dtypes or format, or a layout
                of zero bytes.
            PoolClosedError: the allocator was closed.

        Complexity: O(1).
        """
        if shapes.__class__ is _Size and dtypes.__class__ is _dtype:
            nbytes = shapes.numel() * dtypes.itemsize  # type: ignore[union-attr]
            shape_list = [shapes]
            dtype_list = [dtypes]
        else:
            shape_list, dtype_list, nbytes = normalize_layout(shapes, dtypes)
        if fmt.__class__ is not MemoryFormat:
            check_format(fmt)
        if nbytes <= 0:
            raise InvalidArgumentError(
                f"cannot allocate a layout of 0 bytes (shapes {shape_list}); "
                "every dimension must be > 0"
            )
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                raise PoolClosedError(f"allocate on a closed {self}")
            try:
                addr, phy = self._am_allocate(nbytes)
            except AddressSpaceExhaustedError:
                if not self._reclaim_locked():
                    return None
                try:
                    addr, phy = self._am_allocate(nbytes)
                except AddressSpaceExhaustedError:
                    return None
            meta = MemoryObjMetadata(
                shape_list[0], dtype_list[0], addr, phy, 1, 0, fmt, None, shape_list, dtype_list
            )
            obj = _new_pooled(self, meta, addr, phy, nbytes)
            self._objs[addr] = obj
            return obj
        finally:
            lock.release()

    def batched_allocate(
        self,
        shapes: torch.Size | list[torch.Size],
        dtypes: torch.dtype | list[torch.dtype],
        batch_size: int,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
    ) -> list[TensorMemoryObj] | None:
        """Allocate ``batch_size`` objects of one layout, all or nothing.

        The objects are carved consecutively from one free range when one
        is large enough.  Each object's ``raw_data`` has the layout's
        (logical) size, exactly as with :meth:`allocate`.

        Returns:
            The objects (``[]`` for a batch of 0), or None when the pool
            cannot hold them all (nothing is allocated then).

        Raises:
            InvalidArgumentError: bad layout, format or ``batch_size``.
            PoolClosedError: the allocator was closed.

        Complexity: O(batch_size).
        """
        if shapes.__class__ is _Size and dtypes.__class__ is _dtype:
            nbytes = shapes.numel() * dtypes.itemsize  # type: ignore[union-attr]
            shape_list = [shapes]
            dtype_list = [dtypes]
        else:
            shape_list, dtype_list, nbytes = normalize_layout(shapes, dtypes)
        check_format(fmt)
        check_batch_size(batch_size)
        if nbytes <= 0:
            raise InvalidArgumentError(
                f"cannot allocate a layout of 0 bytes (shapes {shape_list}); "
                "every dimension must be > 0"
            )
        if batch_size == 0:
            return []
        shape0 = shape_list[0]
        dtype0 = dtype_list[0]
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                raise PoolClosedError(f"batched_allocate on a closed {self}")
            am = self.address_manager
            try:
                ranges = am.batched_allocate_locked(nbytes, batch_size)
            except AddressSpaceExhaustedError:
                if not self._reclaim_locked():
                    return None
                try:
                    ranges = am.batched_allocate_locked(nbytes, batch_size)
                except AddressSpaceExhaustedError:
                    return None
            objs = self._objs
            out = []
            for addr, phy in ranges:
                obj = _new_pooled(
                    self,
                    MemoryObjMetadata(
                        shape0, dtype0, addr, phy, 1, 0, fmt, None, shape_list, dtype_list
                    ),
                    addr,
                    phy,
                    nbytes,
                )
                objs[addr] = obj
                out.append(obj)
            return out
        finally:
            lock.release()

    # -- release -------------------------------------------------------

    def _release_locked(self, obj: TensorMemoryObj) -> None:
        """Give ``obj``'s range back; the caller holds the lock and checked it is live."""
        obj.valid = False
        # A freed handle no longer holds the pool's memory alive.
        obj._mv = None
        obj._raw = None
        off = obj._off
        del self._objs[off]
        self._am_free(off, obj._phy)

    def _check_owned(self, obj: object) -> TensorMemoryObj:
        if obj.__class__ is not _TMO or obj._pool is not self:  # type: ignore[attr-defined]
            raise InvalidHandleError(
                f"{obj!r} was not allocated by this {self}; free it with its own allocator"
            )
        return obj  # type: ignore[return-value]

    def _unpinned_by_free(self, obj: TensorMemoryObj) -> bool:
        """Account for freeing a pinned object; True when the monitor must hear of it."""
        if obj._meta.pin_count > 0:
            obj._meta.pin_count = 0
            self._pinned -= 1
            return True
        return False

    def free(self, memory_obj: MemoryObj, allocator_type: str | None = None) -> None:
        """Give an object's memory back now, whatever its counts.

        Normally the last ``ref_count_down`` does this.  Freeing an object
        twice is reported (see :mod:`kvpool.misuse`) and ignored.

        Raises:
            InvalidHandleError: the object belongs to another allocator.
        """
        obj = self._check_owned(memory_obj)
        unpinned = False
        lock = self._lock
        lock.acquire()
        try:
            if not obj.valid:
                report(InvalidHandleError, f"free of an already freed object {obj!r}; ignored")
                return
            unpinned = self._unpinned_by_free(obj)
            self._release_locked(obj)
        finally:
            lock.release()
        if unpinned:
            PinMonitor.GetOrCreate().on_unpin(obj)

    def batched_free(
        self,
        memory_objs: list[MemoryObj],
        allocator_type: str | None = None,
        update_stats: bool = True,
    ) -> None:
        """Free every object of the list once.

        The caller's list is not modified.  Objects already freed (or
        listed twice) are reported and skipped; adjacent objects are
        coalesced in one step.

        Raises:
            InvalidHandleError: an object belongs to another allocator
                (nothing is freed then).

        Complexity: O(k log k) for k objects.
        """
        if not memory_objs:
            return
        for obj in memory_objs:
            if obj.__class__ is not _TMO or obj._pool is not self:  # type: ignore[attr-defined]
                self._check_owned(obj)
        unpinned: list[TensorMemoryObj] = []
        lock = self._lock
        lock.acquire()
        try:
            objs = self._objs
            ranges = []
            check_pins = self._pinned > 0
            for obj in memory_objs:
                if not obj.valid:  # type: ignore[attr-defined]
                    report(
                        InvalidHandleError,
                        f"batched_free of an already freed object {obj!r}; skipped",
                    )
                    continue
                obj.valid = False  # type: ignore[attr-defined]
                obj._mv = None  # type: ignore[attr-defined]
                obj._raw = None  # type: ignore[attr-defined]
                if check_pins and self._unpinned_by_free(obj):  # type: ignore[arg-type]
                    unpinned.append(obj)  # type: ignore[arg-type]
                off = obj._off  # type: ignore[attr-defined]
                del objs[off]
                ranges.append((off, obj._phy))  # type: ignore[attr-defined]
            if ranges:
                self.address_manager.batched_free_locked(ranges)
        finally:
            lock.release()
        monitor = PinMonitor.GetOrCreate() if unpinned else None
        for obj in unpinned:
            monitor.on_unpin(obj)  # type: ignore[union-attr]

    def _reclaim_locked(self) -> int:
        """Free live objects nobody references any more; returns how many.

        This is the garbage-collection backstop: an object dropped without
        ``ref_count_down`` is found here when the pool runs dry.
        """
        leaked = [
            obj
            for obj in list(self._objs.values())
            # references: the table, the list, the loop variable, the call argument
            if _getrefcount(obj) <= 4
        ]
        for obj in leaked:
            meta = obj._meta
            logger.warning(
                "reclaiming %r: it was dropped with ref_count=%d, pin_count=%d "
                "(ref_count_down()/unpin() was not called)",
                obj,
                meta.ref_count,
                meta.pin_count,
            )
            self._unpinned_by_free(obj)
            self._release_locked(obj)
        return len(leaked)

    # -- lifecycle and checks -----------------------------------------

    def close(self) -> None:
        """Invalidate every live object and refuse further allocations.

        Idempotent.  The allocator and its objects drop their references to
        the buffer, so the memory can go once the caller (or the pool that
        built this allocator) releases it; views made earlier keep it alive.
        """
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                return
            self._closed = True
            for obj in self._objs.values():
                obj.valid = False
                obj._mv = None
                obj._raw = None
            # A fresh empty tensor: a slice would keep the storage alive.
            self.buffer = torch.empty(0, dtype=torch.uint8, device=self.buffer.device)
            self._mv = None
            self._arena = None  # type: ignore[assignment]
        finally:
            lock.release()

    def memcheck(self) -> bool:
        """Verify every invariant of the pool.

        Checks the address manager's invariants, that the live-object table
        matches its live allocations one to one (same offsets, same sizes,
        every object valid and in bounds of the buffer) and that the pin
        counter equals a recount.

        Returns:
            True when all hold; on failure the broken invariant is logged.
        """
        lock = self._lock
        lock.acquire()
        try:
            return self._memcheck_locked()
        finally:
            lock.release()

    def _memcheck_locked(self) -> bool:
        am = self.address_manager
        problems = []
        if not am._check_locked():
            problems.append("address manager invariants broken")
        live = am._live
        if len(live) != len(self._objs):
            problems.append(f"{len(live)} live ranges but {len(self._objs)} live objects")
        pinned = 0
        for off, obj in self._objs.items():
            if live.get(off) != obj._phy or obj._off != off or obj.valid == self._closed:
                problems.append(f"object {obj!r} disagrees with the live range at {off}")
            if not self._closed and off + obj._phy > self.buffer.numel():
                problems.append(f"object {obj!r} runs past the end of the buffer")
            pinned += obj._meta.pin_count > 0
        if pinned != self._pinned:
            problems.append(f"pin counter {self._pinned} but {pinned} pinned objects")
        for problem in problems:
            logger.error("memcheck(%s): %s", self, problem)
        return not problems

    def __str__(self) -> str:
        return "TensorMemoryAllocator"

    def __repr__(self) -> str:
        am = self.address_manager
        return (
            f"<TensorMemoryAllocator {am.get_heap_size()} bytes, "
            f"{len(self._objs)} objects, {am.total_allocated_size} bytes used"
            f"{', closed' if self._closed else ''}>"
        )
