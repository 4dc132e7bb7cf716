"""Paged placement: fixed-size pages, one object per page.

:class:`PagedTensorMemoryAllocator` splits an arena into pages of one KV
chunk each and keeps a FIFO of free pages: allocate and free are O(1).

Dead handles stay dead
----------------------
The reference hands out the *same* object every time a page is reused,
so an old handle and the page's new owner are one Python object: a late
``ref_count_down`` through the old handle frees the new owner's page.
Here every allocation gets a handle of its own, so an old handle is
invalid forever and its calls are reported and ignored.

Creating two Python objects per allocation would cost more than the whole
reference allocation, so handles are *recycled*, but only when provably
unreachable: a freed page is queued together with the handle it was last
allocated with, and the next allocation of the page reuses that handle
only if nothing but the queue references it (``sys.getrefcount``) and its
metadata was never exposed or changed (the ``dirty`` flag, set by
``meta``, ``metadata``, ``set_used_size``, ``raw_data =`` or a
non-default layout) and holds no view lease.  Otherwise a fresh handle with fresh metadata is
built.  Either way the new owner gets a handle nobody else can reach,
with every per-allocation field (shape, dtypes, format, counts, used
size, partial-chunk size) as it asked.  Live handles are referenced only
by their users, so one dropped without ``ref_count_down`` is released by
its ``__del__`` (see :mod:`kvpool.pool.policy`).

Thread safety: one lock per pool covers the free queue, the pin counter
and the counts of every object of the pool.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch

from kvpool.checks import REQUIRED, check_batch_size, refuse_in_place
from kvpool.errors import ArgumentTypeError, InvalidArgumentError
from kvpool.formats import MemoryFormat, normalize_layout
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

__all__ = ["PagedAddressManager", "PagedTensorMemoryAllocator"]

# Placeholders written over the consumed part of the free queue (slice
# assignment from a ready list is the cheapest way to let go of handles).
_ZEROS = [0] * 256

_Size = torch.Size
_TMO = TensorMemoryObj
_getrefcount = sys.getrefcount


class PagedAddressManager:
    """Read-only view of a paged pool's space, shaped like an AddressManager.

    Args:
        paged_allocator: the pool to describe.
    """

    def __init__(self, paged_allocator: PagedTensorMemoryAllocator) -> None:
        if not isinstance(paged_allocator, PagedTensorMemoryAllocator):
            raise ArgumentTypeError(
                f"PagedAddressManager describes a PagedTensorMemoryAllocator, got "
                f"{type(paged_allocator).__name__}"
            )
        self._allocator = paged_allocator

    def get_heap_size(self) -> int:
        """Bytes in the pool's pages."""
        return self._allocator.buffer_size

    def get_free_size(self) -> int:
        """Bytes in free pages."""
        return self._allocator._free_count() * self._allocator.align_bytes


class PagedTensorMemoryAllocator(PlacementPolicy):
    """Paged allocator: every object takes one page of ``get_size_bytes(shapes, dtypes)``.

    Args:
        tensor: the memory (contiguous; its size must be a multiple of the
            page size).
        shapes: the layout of a full page (one shape per group).
        dtypes: the dtypes of the groups.
        fmt: the default format of the objects.
        byte_view: a memoryview of the same bytes, when the caller has one.

    Raises:
        InvalidArgumentError: bad layout, or a buffer that is not a whole
            number of pages.

    Complexity: allocate, free and ref_count_down are O(1); the batched
    forms are O(k).
    """

    kind = "paged"

    def __init__(
        self,
        tensor: torch.Tensor,
        shapes: list[torch.Size],
        dtypes: list[torch.dtype],
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        *,
        byte_view: memoryview | None = None,
    ) -> None:
        arena = arena_from_tensor(tensor, byte_view)
        shape_list, dtype_list, page = normalize_layout(shapes, dtypes)
        check_format(fmt)
        if page <= 0:
            raise InvalidArgumentError(f"the page layout {shape_list} has 0 bytes")
        if arena.size < page:
            raise InvalidArgumentError(
                f"the buffer ({arena.size} bytes) is smaller than one page of {page} bytes "
                f"(the layout {[tuple(s) for s in shape_list]}); use at least {page} bytes, "
                f"a multiple of {page}"
            )
        if arena.size % page:
            raise InvalidArgumentError(
                f"the buffer ({arena.size} bytes) must be a whole number of pages of "
                f"{page} bytes; use {arena.size // page * page} or "
                f"{(arena.size // page + 1) * page} bytes"
            )
        self._init_policy(arena, threading.Lock())
        self.buffer_size = arena.size
        self.buffer_ptr = arena.base_address
        self.shapes = shape_list
        self.dtypes = dtype_list
        self.fmt = fmt
        self.align_bytes = page
        self._num_pages = arena.size // page
        # Free pages in FIFO order.  Each entry is the handle the page was
        # last allocated with (its ``page`` says which page), or the page
        # number itself when no handle may be recycled.  The queue is
        # consumed from _head, so a batch is taken by slicing at C speed,
        # and compacted once the consumed prefix outgrows the rest.  FIFO
        # reuse gives a freed handle time to be dropped by its last user.
        self._queue: list[TensorMemoryObj | int] = list(range(self._num_pages))
        self._head = 0
        # Pages that straddle a CUDA registration boundary: never handed out
        # (a GPU copy of one would fail); _usable counts the others.
        self._excluded: set[int] = set()
        self._usable = self._num_pages
        # The request that matches the page layout exactly, for a cheap test.
        self._default_shape = shape_list[0] if len(shape_list) == 1 else None
        self._default_dtype = dtype_list[0] if len(dtype_list) == 1 else None
        self.address_manager = PagedAddressManager(self)
        self._paged_buffers: tuple[torch.Tensor, ...] | None = None

    # -- the free queue (caller holds the lock) ---------------------------

    def _free_count(self) -> int:
        return len(self._queue) - self._head

    def _take(self, count: int) -> list[TensorMemoryObj | int]:
        """Remove the ``count`` oldest queue entries (handles or page numbers)."""
        queue = self._queue
        head = self._head
        end = head + count
        entries = queue[head:end]
        queue[head:end] = _ZEROS[:count] if count <= len(_ZEROS) else [0] * count
        if end > 1024 and end * 2 > len(queue):
            del queue[:end]
            end = 0
        self._head = end
        return entries

    # -- accounting ----------------------------------------------------

    @property
    def num_active_allocations(self) -> int:
        """Pages of live objects (derived from the free queue, less pages only views hold)."""
        return self._usable - self._free_count() - self._held_count

    @property
    def total_allocated_size(self) -> int:
        """Bytes in pages in use."""
        return (self._usable - self._free_count()) * self.align_bytes

    @property
    def num_pages(self) -> int:
        """Pages in the pool (page ``i`` starts at byte ``i * align_bytes``)."""
        return self._num_pages

    @property
    def excluded_pages(self) -> list[int]:
        """Pages never handed out: each straddles a CUDA registration boundary."""
        return sorted(self._excluded)

    @property
    def free_blocks(self) -> list[int]:
        """Snapshot of the free page indices, in the order they will be reused."""
        return [e if e.__class__ is int else e.page for e in self._queue[self._head :]]  # type: ignore[union-attr]

    @property
    def paged_buffers(self) -> tuple[torch.Tensor, ...]:
        """One flat tensor per page (built on first use)."""
        if self._paged_buffers is None:
            self._paged_buffers = torch.split(self.buffer, self.align_bytes)
        return self._paged_buffers

    def get_paged_buffers(self) -> tuple[torch.Tensor, ...]:
        """One flat tensor per page, in page order (e.g. io_uring fixed buffers).

        Empty once the pool is closed.
        """
        return self.paged_buffers if not self.closed else ()

    def stats(self) -> PoolStats:
        """A consistent snapshot of the pool's accounting (see :class:`PoolStats`)."""
        lock = self.lock
        lock.acquire()
        try:
            self._drain_dropped_locked()
            self._raise_leaks()
            free = self._free_count()
            used = self._usable - free
            # Any free page fits any allocation: no external fragmentation.
            return PoolStats(
                self._usable * self.align_bytes,
                used * self.align_bytes,
                free * self.align_bytes,
                used - self._held_count,
                self._pinned,
                self.align_bytes if free else 0,
                0.0,
                self._held_bytes,
                self._freed_under_views,
            )
        finally:
            lock.release()

    # -- allocation ----------------------------------------------------

    def _layout(
        self, shapes: Any, dtypes: Any
    ) -> tuple[list[torch.Size], list[torch.dtype], int, bool]:
        """Validate a request; returns (shapes, dtypes, nbytes, is_default_layout)."""
        if (
            shapes.__class__ is _Size
            and dtypes is self._default_dtype
            and shapes == self._default_shape
        ):
            return self.shapes, self.dtypes, self.align_bytes, True
        shape_list, dtype_list, nbytes = normalize_layout(shapes, dtypes)
        if nbytes > self.align_bytes:
            raise InvalidArgumentError(
                f"the layout {shape_list} x {dtype_list} needs {nbytes} bytes but a page holds "
                f"{self.align_bytes}; allocate it from an extent pool or use bigger pages"
            )
        if nbytes <= 0:
            raise InvalidArgumentError(f"cannot allocate a layout of 0 bytes ({shape_list})")
        if shape_list == self.shapes and dtype_list == self.dtypes:
            return self.shapes, self.dtypes, nbytes, True
        return shape_list, dtype_list, nbytes, False

    def _fresh(
        self,
        page: int,
        shape_list: list[torch.Size],
        dtype_list: list[torch.dtype],
        nbytes: int,
        fmt: MemoryFormat,
        default: bool,
    ) -> TensorMemoryObj:
        """A new handle (and metadata) for ``page``; caller holds the lock."""
        # Lists of its own: a caller that edits its metadata must not edit
        # the pool's layout.
        meta = new_metadata(
            shape_list[0],
            dtype_list[0],
            page,
            self.align_bytes,
            1,
            0,
            fmt,
            None,
            list(shape_list),
            list(dtype_list),
        )
        obj = new_pooled_handle(self, meta, page * self.align_bytes, self.align_bytes, nbytes, page)
        # Only a handle in the page's default state may be recycled as is.
        obj.dirty = not default or fmt is not self.fmt
        return obj

    def allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> TensorMemoryObj | None:
        """Allocate one page for an object of the given layout.

        A layout smaller than a page gives a partial chunk whose size
        (``get_size()``, ``raw_data``, ``byte_array``) is the layout's.

        Returns:
            A new handle with reference count 1, or None when no page is free.

        Raises:
            InvalidArgumentError: bad layout or format, or a layout larger
                than a page.
            PoolClosedError: the allocator was closed.

        Complexity: O(1).
        """
        if unknown:
            refuse_in_place(self, unknown, shapes, dtypes)
        if (
            shapes.__class__ is _Size
            and dtypes is self._default_dtype
            and shapes == self._default_shape
        ):
            # The page's own layout (the common case), checked inline; it is
            # never REQUIRED, so the cheapest hot call tests that off this path.
            shape_list, dtype_list, default = self.shapes, self.dtypes, True
            nbytes = self.align_bytes
        else:
            if shapes is REQUIRED or dtypes is REQUIRED:
                refuse_in_place(self, unknown, shapes, dtypes)
            shape_list, dtype_list, nbytes, default = self._layout(shapes, dtypes)
        if fmt.__class__ is not MemoryFormat:
            check_format(fmt)
        clean = default and fmt is self.fmt
        lock = self.lock
        lock.acquire()
        try:
            if self.closed:
                self._check_open("allocate")
            queue = self._queue
            head = self._head
            if head == len(queue):
                if not self._drain_dropped_locked():
                    return None
                head = self._head
            # _take(1), inlined: this is the hot path of paged pools.
            obj = queue[head]
            queue[head] = 0
            head += 1
            if head > 1024 and head * 2 > len(queue):
                del queue[:head]
                head = 0
            self._head = head
            if self._usage is not None:
                self._report_usage_locked()
            # References to a recyclable handle: the local variable and
            # getrefcount's argument; page numbers are never recycled).
            if clean and obj.__class__ is _TMO and _getrefcount(obj) == 2 and not obj.dirty:  # type: ignore[union-attr]
                obj.valid = True  # type: ignore[union-attr]
                obj.record.ref_count = 1  # type: ignore[union-attr]
                return obj  # type: ignore[return-value]
            page = obj if obj.__class__ is int else obj.page  # type: ignore[union-attr]
            return self._fresh(page, shape_list, dtype_list, nbytes, fmt, default)  # type: ignore[arg-type]
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
        """Allocate ``batch_size`` pages, all or nothing.

        Returns:
            The handles (``[]`` for 0), or None when fewer pages are free
            (nothing is allocated then).

        Raises:
            InvalidArgumentError: bad layout, format or batch size.
            PoolClosedError: the allocator was closed.

        Complexity: O(batch_size).
        """
        if unknown or shapes is REQUIRED or dtypes is REQUIRED or batch_size is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes, batch_size)
        shape_list, dtype_list, nbytes, default = self._layout(shapes, dtypes)
        check_format(fmt)
        check_batch_size(batch_size)
        clean = default and fmt is self.fmt
        lock = self.lock
        lock.acquire()
        try:
            if self.closed:
                self._check_open("batched_allocate")
            if self._free_count() < batch_size:
                self._drain_dropped_locked()
                if self._free_count() < batch_size:
                    self._refuse_too_large_locked(
                        batch_size * self.align_bytes,
                        self.buffer_size,
                        f"batched_allocate of {batch_size} pages",
                    )
                    return None
            out = self._take(batch_size)
            if self._usage is not None:
                self._report_usage_locked()
            if clean:
                # Fast pass: recycle handles while they are unreachable and
                # clean (references: the list, the loop variable and
                # getrefcount's argument; page numbers are never recycled).
                for obj in out:
                    if obj.__class__ is not _TMO or _getrefcount(obj) != 3 or obj.dirty:  # type: ignore[union-attr]
                        break
                    obj.valid = True  # type: ignore[union-attr]
                    obj.record.ref_count = 1  # type: ignore[union-attr]
                else:
                    return out  # type: ignore[return-value]
                first = out.index(obj)
            else:
                first = 0
            # Slow pass from the first handle that cannot be recycled.
            for i in range(first, batch_size):
                obj = out[i]
                if clean and obj.__class__ is _TMO and _getrefcount(obj) == 3 and not obj.dirty:  # type: ignore[union-attr]
                    obj.valid = True  # type: ignore[union-attr]
                    obj.record.ref_count = 1  # type: ignore[union-attr]
                else:
                    page = obj if obj.__class__ is int else obj.page  # type: ignore[union-attr]
                    out[i] = self._fresh(page, shape_list, dtype_list, nbytes, fmt, default)  # type: ignore[arg-type]
            return out  # type: ignore[return-value]
        finally:
            lock.release()

    # -- release -------------------------------------------------------

    def release_locked(self, handle: TensorMemoryObj) -> None:
        """Queue ``handle``'s page (with ``handle`` for recycling); the caller holds the lock.

        With views of it alive, the page waits for them (see
        :mod:`kvpool.pool.policy`).
        """
        handle.valid = False
        if handle.lease is None:
            self._queue.append(handle)
            if self._usage is not None:
                self._report_usage_locked()
        elif self._retire_locked(handle):
            self._report_views_outlive(handle)

    def _release_garbage_locked(self, obj: TensorMemoryObj) -> None:
        # The handle is being destroyed: queue its page without it (storing
        # it would resurrect it, and its finalizer never runs twice).
        obj.valid = False
        if obj.lease is None:
            self._queue.append(obj.page)
        else:
            self._retire_locked(obj)

    def _give_back_locked(self, lease: ViewLease) -> None:
        self._queue.append(lease.page)
        if self._usage is not None:
            self._report_usage_locked()

    def batched_free(
        self,
        memory_objs: list[MemoryObj] = REQUIRED,
        allocator_type: str | None = None,
        update_stats: bool = True,
        **unknown: Any,
    ) -> None:
        """Free every object of the list once (the list is not modified).

        Objects already freed (or listed twice) are reported and skipped,
        after every other object of the list is freed.

        Raises:
            InvalidHandleError: an object belongs to another allocator
                (nothing is freed then).

        Complexity: O(k).
        """
        if unknown or memory_objs is REQUIRED:
            refuse_in_place(self, unknown, memory_objs)
        check_object_list(memory_objs, "batched_free")
        if not memory_objs:
            return
        stale = []
        viewed = []
        lock = self.lock
        lock.acquire()
        try:
            if self._pinned:
                self._unpin_listed_locked(memory_objs)
            queue = self._queue
            put = queue.append
            before = len(queue)
            try:
                if self.closed:  # every object of a closed pool is dead
                    for obj in memory_objs:
                        self._check_owned(obj)
                    stale = memory_objs
                    memory_objs = []
                for obj in memory_objs:
                    if obj.owner is not self:  # type: ignore[attr-defined]
                        raise AttributeError
                    if obj.valid:  # type: ignore[attr-defined]
                        obj.valid = False  # type: ignore[attr-defined]
                        if obj.lease is None:  # type: ignore[attr-defined]
                            put(obj)  # type: ignore[arg-type]
                        else:  # its page waits for the views (below)
                            viewed.append(obj)
                    else:
                        stale.append(obj)
            except AttributeError:
                # Not ours (another pool's handle, or not a handle at all):
                # undo this call's frees, so that nothing is freed, and raise.
                while len(queue) > before:
                    queue.pop().valid = True  # type: ignore[union-attr]
                for done in viewed:
                    done.valid = True  # type: ignore[attr-defined]
                self._check_owned(obj)
                raise
            # Handles with views: their pages wait for the views' leases.
            viewed = [obj for obj in viewed if self._retire_locked(obj)]
            if self._usage is not None:
                self._report_usage_locked()
        finally:
            lock.release()
        for obj in stale:
            self._report_already_freed(obj)
        for obj in viewed:
            self._report_views_outlive(obj)

    def _add_barriers_locked(self, offsets: list[int]) -> None:
        # Pages with a boundary strictly inside them leave the free queue for
        # good; with chunks that are multiples of the page there are none.
        page = self.align_bytes
        across = {b // page for b in offsets if b % page and b // page < self._num_pages}
        across -= self._excluded
        if not across:
            return
        free = set(self.free_blocks)
        busy = sorted(across - free)
        if busy:
            raise InvalidArgumentError(
                f"registration boundaries fall inside pages {busy[:4]} that are in use; a pool "
                "learns its boundaries before it hands out pages"
            )
        self._queue = [
            e
            for e in self._queue[self._head :]
            if (e if e.__class__ is int else e.page) not in across  # type: ignore[union-attr]
        ]
        self._head = 0
        self._excluded |= across
        self._usable = self._num_pages - len(self._excluded)

    # -- lifecycle and checks -----------------------------------------

    def _forget_memory_locked(self) -> None:
        self._queue = self.free_blocks
        self._head = 0
        self._paged_buffers = None

    def memcheck(self) -> bool:
        """Verify every invariant of the pool.

        Checks that the free pages are distinct and in range, that each
        queued handle is invalid and belongs to the page it is queued with,
        that no page across a registration boundary is free to take, and
        that the pin counter is within ``[0, pages in use]``.

        Returns:
            True when all hold; on failure the broken invariant is logged.
        """
        lock = self.lock
        lock.acquire()
        try:
            self._drain_dropped_locked()
            self._raise_leaks()
            problems = []
            head = self._head
            entries = self._queue[head:]
            pages = [e if e.__class__ is int else e.page for e in entries]  # type: ignore[union-attr]
            if len(set(pages)) != len(pages):
                problems.append("a page is in the free queue twice")
            if any(not 0 <= p < self._num_pages for p in pages):
                problems.append("a free page index is out of range")
            for obj in entries:
                if obj.__class__ is not int and (obj.valid or obj.owner is not self):  # type: ignore[union-attr]
                    problems.append(f"queued handle {obj!r} is live or not this pool's")
            if any(e.__class__ is not int for e in self._queue[:head]):
                problems.append("the consumed part of the queue still holds handles")
            if not 0 <= self._held_count <= self._usable - len(pages):
                problems.append(f"{self._held_count} view-held pages, more than in use")
            if not 0 <= self._pinned <= self._usable - len(pages):
                problems.append(f"pin counter {self._pinned} out of range")
            if self._excluded.intersection(pages):
                problems.append("a page across a registration boundary is in the free queue")
            if self._usable != self._num_pages - len(self._excluded):
                problems.append(f"{self._usable} usable pages, {len(self._excluded)} excluded")
        finally:
            lock.release()
        return self._log_problems(problems)

    def __str__(self) -> str:
        return "PagedTensorMemoryAllocator"

    def __repr__(self) -> str:
        return (
            f"<PagedTensorMemoryAllocator {self._num_pages} pages of {self.align_bytes} bytes, "
            f"{self.num_active_allocations} in use{', closed' if self.closed else ''}>"
        )


def _build(tensor: torch.Tensor, byte_view: memoryview | None, spec: PlacementSpec) -> Any:
    missing = [
        n
        for n, v in (("shapes", spec.shapes), ("dtypes", spec.dtypes), ("fmt", spec.fmt))
        if v is None
    ]
    if missing:
        raise InvalidArgumentError(
            f"a paged pool needs {', '.join(missing)}: pass use_paging=True with "
            "shapes=[...], dtypes=[...], fmt=MemoryFormat...."
        )
    return PagedTensorMemoryAllocator(
        tensor, spec.shapes, spec.dtypes, spec.fmt, byte_view=byte_view
    )


register_policy("paged", _build)
