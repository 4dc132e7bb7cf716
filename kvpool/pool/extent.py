"""Extent placement: objects of any size carved out of one arena.

:class:`TensorMemoryAllocator` places each object at an aligned offset
chosen by an :class:`~kvpool.pool.address.AddressManager` (O(1) good fit) and
hands out a fresh :class:`~kvpool.pool.objects.TensorMemoryObj` per allocation.

Thread safety: one lock - the address manager's - covers the placement
and the pin counter, and guards the counts of every object of the pool.
Statistics are derived from that state under the lock, so they are exact
under any interleaving.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kvpool.checks import REQUIRED, check_batch_size, refuse_in_place
from kvpool.errors import AddressSpaceExhaustedError, InvalidArgumentError
from kvpool.formats import MemoryFormat, normalize_layout
from kvpool.pool.address import AddressManager
from kvpool.pool.arena import arena_from_tensor
from kvpool.pool.handle import TensorMemoryObj, new_pooled_handle
from kvpool.pool.interface import PoolStats
from kvpool.pool.lease import ViewLease
from kvpool.pool.metadata import new_metadata
from kvpool.pool.objects import MemoryObj
from kvpool.pool.policy import (
    PlacementPolicy,
    PlacementSpec,
    check_format,
    check_object_list,
    register_policy,
)

__all__ = ["TensorMemoryAllocator"]

_Size = torch.Size
_dtype = torch.dtype
_prod = math.prod
_TMO = TensorMemoryObj


def _layout(shapes: Any, dtypes: Any) -> tuple[list[torch.Size], list[torch.dtype], int]:
    """Validate a request's layout; returns (shapes, dtypes, bytes > 0).

    The bytes are exact (Python ints, not torch's wrapping int64 ``numel``),
    possibly beyond any pool: the placement then fails, and
    :meth:`PlacementPolicy._refuse_too_large_locked` says why.
    """
    if shapes.__class__ is _Size and dtypes.__class__ is _dtype:
        nbytes = _prod(shapes) * dtypes.itemsize
        if nbytes > 0:  # the common case: one group, checked inline
            return [shapes], [dtypes], nbytes
    shape_list, dtype_list, nbytes = normalize_layout(shapes, dtypes)
    if nbytes <= 0:
        raise InvalidArgumentError(
            f"cannot allocate a layout of 0 bytes (shapes {shape_list}); "
            "every dimension must be > 0"
        )
    return shape_list, dtype_list, nbytes


class TensorMemoryAllocator(PlacementPolicy):
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

    kind = "extent"

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
        self.address_manager = AddressManager(space, align_bytes, max_size=arena.size)
        self.align_bytes = align_bytes
        self._arena_size = arena.size
        self._init_policy(arena, self.address_manager.lock)
        self._am_allocate = self.address_manager.allocate_locked
        self._am_free = self.address_manager.free_locked

    def _span_limit(self, nbytes: int) -> tuple[int, int] | None:
        """``(aligned object bytes, widest placeable extent)`` if the object is wider, else None.

        Barriers (CUDA registration boundaries) cut the pool into spans an
        object cannot cross, so an object wider than the widest span can
        never be placed, however much of the pool is free.
        """
        widest = self.address_manager.widest_extent
        if widest >= self._arena_size:  # no barriers: the pool's size is the bound
            return None
        aligned = self.address_manager.compute_aligned_size(nbytes)
        if aligned > widest:
            return aligned, widest
        return None

    # -- accounting ----------------------------------------------------

    @property
    def total_allocated_size(self) -> int:
        """Bytes held by live objects (aligned sizes)."""
        return self.address_manager.total_allocated_size

    @property
    def num_active_allocations(self) -> int:
        """Live objects: the address manager's ranges, less those only views hold."""
        return self.address_manager.num_allocations() - self._held_count

    def stats(self) -> PoolStats:
        """A consistent snapshot of the pool's accounting (see :class:`PoolStats`)."""
        lock = self.lock
        lock.acquire()
        try:
            self._drain_dropped_locked()
            self._raise_leaks()
            am = self.address_manager
            return PoolStats.build(
                am.get_heap_size(),
                am.total_allocated_size,
                am.num_allocations() - self._held_count,
                self._pinned,
                am.largest_free_locked(),
                self._held_bytes,
                self._freed_under_views,
            )
        finally:
            lock.release()

    # -- allocation ----------------------------------------------------

    def allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
        **unknown: Any,
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
        if unknown or shapes is REQUIRED or dtypes is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes)
        shape_list, dtype_list, nbytes = _layout(shapes, dtypes)
        if fmt.__class__ is not MemoryFormat:
            check_format(fmt)
        lock = self.lock
        lock.acquire()
        try:
            if self.closed:
                self._check_open("allocate")
            # _retry_after_drain_locked, inlined (the hot path of every extent pool).
            try:
                placed = self._am_allocate(nbytes)
            except AddressSpaceExhaustedError:
                placed = self._drain_and_retry_locked(self._am_allocate, nbytes)
            if placed is None:
                self._refuse_too_large_locked(
                    nbytes, self._arena_size, "allocate", self._span_limit(nbytes)
                )
                return None
            addr, phy = placed
            meta = new_metadata(
                shape_list[0], dtype_list[0], addr, phy, 1, 0, fmt, None, shape_list, dtype_list
            )
            if self._usage is not None:
                self._report_usage_locked()
            return new_pooled_handle(self, meta, addr, phy, nbytes)
        finally:
            lock.release()

    def batched_allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        batch_size: int = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
        **unknown: Any,
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
        if unknown or shapes is REQUIRED or dtypes is REQUIRED or batch_size is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes, batch_size)
        shape_list, dtype_list, nbytes = _layout(shapes, dtypes)
        check_format(fmt)
        check_batch_size(batch_size)
        if batch_size == 0:
            return []
        shape0 = shape_list[0]
        dtype0 = dtype_list[0]
        lock = self.lock
        lock.acquire()
        try:
            if self.closed:
                self._check_open("batched_allocate")
            ranges = self._retry_after_drain_locked(
                self.address_manager.batched_allocate_locked, nbytes, batch_size
            )
            if ranges is None:
                self._refuse_too_large_locked(
                    self.address_manager.compute_aligned_size(nbytes) * batch_size,
                    self._arena_size,
                    f"batched_allocate of {batch_size} objects",
                    self._span_limit(nbytes),
                )
                return None
            if self._usage is not None:
                self._report_usage_locked()
            return [
                new_pooled_handle(
                    self,
                    new_metadata(
                        shape0, dtype0, addr, phy, 1, 0, fmt, None, shape_list, dtype_list
                    ),
                    addr,
                    phy,
                    nbytes,
                )
                for addr, phy in ranges
            ]
        finally:
            lock.release()

    # -- release -------------------------------------------------------

    def release_locked(self, handle: TensorMemoryObj) -> None:
        """Give ``handle``'s range back; the caller holds the lock and checked it is live.

        With views of it alive, the range waits for them (see
        :mod:`kvpool.pool.policy`).
        """
        handle.valid = False
        if handle.lease is None:
            handle._raw = None
            self._am_free(handle.offset, handle.phy)
            if self._usage is not None:
                self._report_usage_locked()
        elif self._retire_locked(handle):
            self._report_views_outlive(handle)

    def _give_back_locked(self, lease: ViewLease) -> None:
        self._am_free(lease.offset, lease.phy)
        if self._usage is not None:
            self._report_usage_locked()

    def _add_barriers_locked(self, offsets: list[int]) -> None:
        # Extents never cross them (the manager raises for an unaligned one).
        self.address_manager.add_barriers_locked(offsets)

    def batched_free(
        self,
        memory_objs: list[MemoryObj] = REQUIRED,
        allocator_type: str | None = None,
        update_stats: bool = True,
        **unknown: Any,
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
        if unknown or memory_objs is REQUIRED:
            refuse_in_place(self, unknown, memory_objs)
        check_object_list(memory_objs, "batched_free")
        if not memory_objs:
            return
        for obj in memory_objs:
            if obj.__class__ is not _TMO or obj.owner is not self:  # type: ignore[attr-defined]
                self._check_owned(obj)
        stale = []
        viewed = []
        lock = self.lock
        lock.acquire()
        try:
            if self._pinned:
                self._unpin_listed_locked(memory_objs)
            ranges = []
            for obj in memory_objs:
                if not obj.valid or self.closed:  # type: ignore[attr-defined]
                    stale.append(obj)
                    continue
                obj.valid = False  # type: ignore[attr-defined]
                if obj.lease is None:  # type: ignore[attr-defined]
                    obj._raw = None  # type: ignore[attr-defined]
                    ranges.append((obj.offset, obj.phy))  # type: ignore[attr-defined]
                elif self._retire_locked(obj):  # type: ignore[arg-type]
                    viewed.append(obj)
            if ranges:
                self.address_manager.batched_free_locked(ranges)
                if self._usage is not None:
                    self._report_usage_locked()
        finally:
            lock.release()
        # Reported once everything valid is freed (strict mode raises here).
        for obj in stale:
            self._report_already_freed(obj)
        for obj in viewed:
            self._report_views_outlive(obj)

    def memcheck(self) -> bool:
        """Verify every invariant of the pool.

        Checks the address manager's invariants (see
        :meth:`AddressManager.check_consistency`), that every live range
        lies inside the buffer and that the pin counter is within
        ``[0, live objects]``.

        Returns:
            True when all hold; on failure the broken invariant is logged.
        """
        lock = self.lock
        lock.acquire()
        try:
            self._drain_dropped_locked()
            self._raise_leaks()
            am = self.address_manager
            problems = [f"address manager: {p}" for p in am.problems_locked()]
            if am.get_heap_size() > self._arena_size:
                problems.append(f"address space {am.get_heap_size()} exceeds the buffer")
            if not 0 <= self._held_count <= am.num_allocations():
                problems.append(f"{self._held_count} view-held ranges, more than allocated")
            if not 0 <= self._pinned <= am.num_allocations():
                problems.append(f"pin counter {self._pinned} out of range")
        finally:
            lock.release()
        return self._log_problems(problems)

    def __str__(self) -> str:
        return "TensorMemoryAllocator"

    def __repr__(self) -> str:
        am = self.address_manager
        return (
            f"<TensorMemoryAllocator {am.get_heap_size()} bytes, "
            f"{am.num_allocations()} objects, {am.total_allocated_size} bytes used"
            f"{', closed' if self.closed else ''}>"
        )


def _build(tensor: torch.Tensor, byte_view: memoryview | None, spec: PlacementSpec) -> Any:
    return TensorMemoryAllocator(
        tensor, spec.align_bytes, spec.init_address_space, byte_view=byte_view
    )


register_policy("extent", _build)
