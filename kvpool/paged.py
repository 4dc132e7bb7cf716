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
unreachable: a page keeps the handle it was last allocated with, and the
next allocation of the page reuses that handle only if nothing but the
pool references it (``sys.getrefcount``) and its metadata was never
exposed or changed (the ``_dirty`` flag, set by ``meta``, ``metadata``,
``set_used_size``, ``raw_data =`` or a non-default layout).  Otherwise a
fresh handle with fresh metadata is built.  Either way the new owner sees
a handle nobody else can reach, with every per-allocation field (shape,
dtypes, format, counts, used size, partial-chunk size) as it asked.

Thread safety: one lock per pool covers the free list, the handle table,
the pin counter and the counts of every object of the pool.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch

from kvpool.arena import arena_from_tensor
from kvpool.errors import InvalidArgumentError, InvalidHandleError, PoolClosedError
from kvpool.extent import check_batch_size, check_format
from kvpool.formats import MemoryFormat, normalize_layout
from kvpool.interface import MemoryAllocatorInterface, PoolStats
from kvpool.misuse import logger, report
from kvpool.monitor import PinMonitor
from kvpool.objects import MemoryObj, MemoryObjMetadata, TensorMemoryObj, _new_pooled

__all__ = ["PagedAddressManager", "PagedTensorMemoryAllocator"]

_Size = torch.Size
_TMO = TensorMemoryObj
_getrefcount = sys.getrefcount
# References to a recyclable handle inside allocate(): the handle table,
# the local variable and getrefcount's own argument.
_UNREFERENCED = 3


class PagedAddressManager:
    """Read-only view of a paged pool's space, shaped like an AddressManager.

    Args:
        paged_allocator: the pool to describe.
    """

    def __init__(self, paged_allocator: PagedTensorMemoryAllocator) -> None:
        self._allocator = paged_allocator

    def get_heap_size(self) -> int:
        """Bytes in the pool's pages."""
        return self._allocator.buffer_size

    def get_free_size(self) -> int:
        """Bytes in free pages."""
        return self._allocator._free_count() * self._allocator.align_bytes


class PagedTensorMemoryAllocator(MemoryAllocatorInterface):
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
        if arena.size % page:
            raise InvalidArgumentError(
                f"the buffer ({arena.size} bytes) must be a whole number of pages of "
                f"{page} bytes; use {arena.size // page * page} or "
                f"{(arena.size // page + 1) * page} bytes"
            )
        self._arena = arena
        self.buffer = arena.buffer
        self.buffer_size = arena.size
        self.buffer_ptr = arena.base_address
        self.base_address = arena.base_address
        self._mv = arena.view
        self.shapes = shape_list
        self.dtypes = dtype_list
        self.fmt = fmt
        self.align_bytes = page
        self._num_pages = arena.size // page
        # Free pages in FIFO order: a list consumed from _head (slicing
        # takes a batch at C speed), compacted once the consumed prefix
        # outgrows the rest.  FIFO reuse gives a freed handle time to be
        # dropped by its last user, so that it can be recycled.
        self._free: list[int] = list(range(self._num_pages))
        self._head = 0
        self._handles: list[TensorMemoryObj | None] = [None] * self._num_pages
        self._lock = threading.Lock()
        self._pinned = 0
        self._closed = False
        # The request that matches the page layout exactly, for a cheap test.
        self._default_shape = shape_list[0] if len(shape_list) == 1 else None
        self._default_dtype = dtype_list[0] if len(dtype_list) == 1 else None
        self.address_manager = PagedAddressManager(self)
        self._paged_buffers: tuple[torch.Tensor, ...] | None = None

    # -- accounting ----------------------------------------------------

    @property
    def num_active_allocations(self) -> int:
        """Pages in use (exact: derived from the free list)."""
        return self._num_pages - self._free_count()

    def _free_count(self) -> int:
        return len(self._free) - self._head

    def _take_pages(self, count: int) -> list[int]:
        """Remove the ``count`` oldest free pages; caller holds the lock."""
        head = self._head
        pages = self._free[head : head + count]
        head += count
        if head > 1024 and head * 2 > len(self._free):
            del self._free[:head]
            head = 0
        self._head = head
        return pages

    @property
    def total_allocated_size(self) -> int:
        """Bytes in pages in use."""
        return (self._num_pages - self._free_count()) * self.align_bytes

    @property
    def num_pages(self) -> int:
        """Pages in the pool."""
        return self._num_pages

    @property
    def free_blocks(self) -> list[int]:
        """Snapshot of the free page indices, in the order they will be reused."""
        return self._free[self._head :]

    @property
    def paged_buffers(self) -> tuple[torch.Tensor, ...]:
        """One flat tensor per page (built on first use)."""
        if self._paged_buffers is None:
            self._paged_buffers = torch.split(self.buffer, self.align_bytes)
        return self._paged_buffers

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def stats(self) -> PoolStats:
        """A consistent snapshot of the pool's accounting (see :class:`PoolStats`)."""
        lock = self._lock
        lock.acquire()
        try:
            free = self._free_count()
            used = self._num_pages - free
            # Any free page fits any allocation: no external fragmentation.
            return PoolStats(
                self.buffer_size,
                used * self.align_bytes,
                free * self.align_bytes,
                used,
                self._pinned,
                self.align_bytes if free else 0,
                0.0,
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
        default = shape_list == self.shapes and dtype_list == self.dtypes
        if default:
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
        meta = MemoryObjMetadata(
            shape_list[0],
            dtype_list[0],
            page,
            self.align_bytes,
            1,
            0,
            fmt,
            None,
            shape_list,
            dtype_list,
        )
        obj = _new_pooled(self, meta, page * self.align_bytes, self.align_bytes, nbytes, page)
        # Only a handle in the page's default state may be recycled as is.
        obj._dirty = not default or fmt is not self.fmt
        self._handles[page] = obj
        return obj

    def allocate(
        self,
        shapes: torch.Size | list[torch.Size],
        dtypes: torch.dtype | list[torch.dtype],
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
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
        if (
            shapes.__class__ is _Size
            and dtypes is self._default_dtype
            and shapes == self._default_shape
        ):
            # The page's own layout (the common case), checked inline.
            shape_list, dtype_list, nbytes, default = (
                self.shapes,
                self.dtypes,
                self.align_bytes,
                True,
            )
        else:
            shape_list, dtype_list, nbytes, default = self._layout(shapes, dtypes)
        if fmt.__class__ is not MemoryFormat:
            check_format(fmt)
        clean = default and fmt is self.fmt
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                raise PoolClosedError(f"allocate on a closed {self}")
            free = self._free
            head = self._head
            if head == len(free):
                if not self._reclaim_locked():
                    return None
                free = self._free
                head = self._head
            page = free[head]
            head += 1
            if head > 1024 and head * 2 > len(free):
                del free[:head]
                head = 0
            self._head = head
            obj = self._handles[page]
            if clean and obj is not None and not obj._dirty and _getrefcount(obj) == _UNREFERENCED:
                obj.valid = True
                obj._meta.ref_count = 1
                return obj
            return self._fresh(page, shape_list, dtype_list, nbytes, fmt, default)
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
        """Allocate ``batch_size`` pages, all or nothing.

        Returns:
            The handles (``[]`` for 0), or None when fewer pages are free
            (nothing is allocated then).

        Raises:
            InvalidArgumentError: bad layout, format or batch size.
            PoolClosedError: the allocator was closed.

        Complexity: O(batch_size).
        """
        shape_list, dtype_list, nbytes, default = self._layout(shapes, dtypes)
        check_format(fmt)
        check_batch_size(batch_size)
        clean = default and fmt is self.fmt
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                raise PoolClosedError(f"batched_allocate on a closed {self}")
            if self._free_count() < batch_size:
                self._reclaim_locked()
                if self._free_count() < batch_size:
                    return None
            pages = self._take_pages(batch_size)
            out = list(map(self._handles.__getitem__, pages))
            if not clean:
                return [
                    self._fresh(page, shape_list, dtype_list, nbytes, fmt, default)
                    for page in pages
                ]
            # Fast pass: recycle handles while they are unreachable and clean
            # (references: the table, the list, the loop variable, the call
            # argument; a never-used page holds None, whose count is huge).
            for obj in out:
                if _getrefcount(obj) != _UNREFERENCED + 1 or obj._dirty:  # type: ignore[union-attr]
                    break
                obj.valid = True  # type: ignore[union-attr]
                obj._meta.ref_count = 1  # type: ignore[union-attr]
            else:
                return out  # type: ignore[return-value]
            # Slow pass from the first handle that cannot be recycled.
            for i in range(out.index(obj), batch_size):
                obj = out[i]
                if _getrefcount(obj) == _UNREFERENCED + 1 and not obj._dirty:  # type: ignore[union-attr]
                    obj.valid = True  # type: ignore[union-attr]
                    obj._meta.ref_count = 1  # type: ignore[union-attr]
                else:
                    out[i] = self._fresh(pages[i], shape_list, dtype_list, nbytes, fmt, default)
            return out  # type: ignore[return-value]
        finally:
            lock.release()

    # -- release -------------------------------------------------------

    def _release_locked(self, obj: TensorMemoryObj) -> None:
        """Return ``obj``'s page; the caller holds the lock and checked it is live."""
        obj.valid = False
        self._free.append(obj._page)

    def _check_owned(self, obj: object) -> TensorMemoryObj:
        if obj.__class__ is not _TMO or obj._pool is not self:  # type: ignore[attr-defined]
            raise InvalidHandleError(
                f"{obj!r} was not allocated by this {self}; free it with its own allocator"
            )
        return obj  # type: ignore[return-value]

    def _unpinned_by_free(self, obj: TensorMemoryObj) -> bool:
        if obj._meta.pin_count > 0:
            obj._meta.pin_count = 0
            self._pinned -= 1
            return True
        return False

    def free(self, memory_obj: MemoryObj, allocator_type: str | None = None) -> None:
        """Give an object's page back now, whatever its counts.

        Freeing twice is reported (see :mod:`kvpool.misuse`) and ignored.

        Raises:
            InvalidHandleError: the object belongs to another allocator.
        """
        obj = self._check_owned(memory_obj)
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
        """Free every object of the list once (the list is not modified).

        Objects already freed (or listed twice) are reported and skipped.

        Raises:
            InvalidHandleError: an object belongs to another allocator
                (nothing is freed then).

        Complexity: O(k).
        """
        if not memory_objs:
            return
        unpinned: list[TensorMemoryObj] = []
        lock = self._lock
        lock.acquire()
        try:
            free = self._free
            put = free.append
            if self._pinned:
                self._unpin_listed_locked(memory_objs, unpinned)
            before = len(free)
            try:
                for obj in memory_objs:
                    if obj._pool is self and obj.valid:  # type: ignore[attr-defined]
                        obj.valid = False  # type: ignore[attr-defined]
                        put(obj._page)  # type: ignore[attr-defined]
                    elif obj._pool is self:  # type: ignore[attr-defined]
                        report(
                            InvalidHandleError,
                            f"batched_free of an already freed object {obj!r}; skipped",
                        )
                    else:
                        raise AttributeError
            except AttributeError:
                # Not ours (another pool's handle, or not a handle at all):
                # undo this call's frees, so that nothing is freed, and raise.
                while len(free) > before:
                    self._handles[free.pop()].valid = True  # type: ignore[union-attr]
                self._check_owned(obj)
                raise
        finally:
            lock.release()
        for obj in unpinned:
            PinMonitor.GetOrCreate().on_unpin(obj)

    def _unpin_listed_locked(self, memory_objs: list[MemoryObj], unpinned: list[Any]) -> None:
        """Drop the pins of the pinned objects of a batch about to be freed."""
        for obj in memory_objs:
            self._check_owned(obj)
        for obj in memory_objs:
            if obj.valid and self._unpinned_by_free(obj):  # type: ignore[attr-defined,arg-type]
                unpinned.append(obj)

    def _reclaim_locked(self) -> int:
        """Free live pages whose handles nobody references; returns how many."""
        reclaimed = 0
        for obj in self._handles:
            # references: the table, the loop variable, the call argument
            if obj is not None and obj.valid and _getrefcount(obj) <= 3:
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
                reclaimed += 1
        return reclaimed

    # -- lifecycle and checks -----------------------------------------

    def close(self) -> None:
        """Invalidate every live object and refuse further allocations (idempotent)."""
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                return
            self._closed = True
            for obj in self._handles:
                if obj is not None:
                    obj.valid = False
                    obj._mv = None
                    obj._raw = None
            self._handles = [None] * self._num_pages
            # A fresh empty tensor: a slice would keep the storage alive.
            self.buffer = torch.empty(0, dtype=torch.uint8, device=self.buffer.device)
            self._mv = None
            self._paged_buffers = None
            self._arena = None  # type: ignore[assignment]
        finally:
            lock.release()

    def memcheck(self) -> bool:
        """Verify every invariant of the pool.

        Checks that free pages are distinct and in range, that free and
        live pages partition the pool (a live page's table handle is valid,
        a free page's is not), that every handle sits at its page's offset
        with a size no larger than a page, and that the pin counter equals
        a recount.

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
        problems = []
        free = set(self._free[self._head :])
        if len(free) != self._free_count():
            problems.append("a page is in the free list twice")
        if any(not 0 <= p < self._num_pages for p in free):
            problems.append("a free page index is out of range")
        pinned = 0
        for page, obj in enumerate(self._handles):
            live = obj is not None and obj.valid
            # Free and live pages partition the pool (closing invalidates
            # live handles without freeing their pages).
            if live == (page in free) and not self._closed:
                state = "live and free" if live else "neither live nor free"
                problems.append(f"page {page} is {state}")
            if obj is not None:
                if obj._page != page or obj._off != page * self.align_bytes:
                    problems.append(f"handle {obj!r} is filed under page {page}")
                if obj._size > obj._phy or obj._phy != self.align_bytes:
                    problems.append(f"handle {obj!r} is larger than a page")
                pinned += live and obj._meta.pin_count > 0
        if pinned != self._pinned:
            problems.append(f"pin counter {self._pinned} but {pinned} pinned objects")
        for problem in problems:
            logger.error("memcheck(%s): %s", self, problem)
        return not problems

    def __str__(self) -> str:
        return "PagedTensorMemoryAllocator"

    def __repr__(self) -> str:
        return (
            f"<PagedTensorMemoryAllocator {self._num_pages} pages of {self.align_bytes} bytes, "
            f"{self.num_active_allocations} in use{', closed' if self._closed else ''}>"
        )
