"""What the two placement policies share: lifecycle, ownership, backstops.

:class:`PlacementPolicy` is the base of
:class:`~kvpool.pool.extent.TensorMemoryAllocator` and
:class:`~kvpool.pool.paged.PagedTensorMemoryAllocator`.  A subclass supplies
the placement (allocate, batched forms, ``_release_locked``, stats,
memcheck); this class supplies everything around it:

* **ownership** - a pool frees only handles it made, and each once;
* **pins** - the pool's pinned-object counter and the monitor calls when a
  pinned object is freed;
* **the garbage-collection backstop** - a handle dropped without
  ``ref_count_down`` is released by its ``__del__`` (with a warning), at
  once if the pool's lock is free, else queued and released under the
  lock before the pool next reports full or gives statistics;
* **close** - refuses new allocations, releases the view handles slice
  their ``byte_array`` from (so live handles stop holding the memory and
  their views raise :class:`~kvpool.errors.PoolClosedError`), and drops
  every reference to the memory.

Thread safety: one lock per pool (``_lock``) guards the placement, the
counts of every object of the pool and the counters.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch

from kvpool.errors import (
    AddressSpaceExhaustedError,
    InvalidArgumentError,
    InvalidHandleError,
    PoolClosedError,
)
from kvpool.formats import MemoryFormat
from kvpool.misuse import report
from kvpool.pool.arena import Arena
from kvpool.pool.handle import TensorMemoryObj
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.monitor import PinMonitor
from kvpool.pool.objects import MemoryObj

__all__ = ["PlacementPolicy"]

logger = logging.getLogger("kvpool")

_TMO = TensorMemoryObj


def check_object_list(memory_objs: object, what: str) -> Sequence[Any]:
    """Validate the list argument of a batched free.

    Raises:
        InvalidArgumentError: not a list or tuple.
    """
    if not isinstance(memory_objs, (list, tuple)):
        raise InvalidArgumentError(
            f"{what} takes a list of memory objects, got {type(memory_objs).__name__}; "
            "wrap a single object in a list"
        )
    return memory_objs


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


class PlacementPolicy(MemoryAllocatorInterface):
    """Base of the placement policies (see the module docstring)."""

    buffer: torch.Tensor
    base_address: int

    def _init_policy(self, arena: Arena, lock: Any) -> None:
        self._arena: Arena | None = arena
        self.buffer = arena.buffer
        self.base_address = arena.base_address
        # Handles slice byte_array from this view of their own; close()
        # releases it, so a live handle does not keep the memory mapped.
        self._mv: memoryview | None = memoryview(arena.view) if arena.view is not None else None
        self._lock = lock
        self._pinned = 0
        self._closed = False
        # Handles whose __del__ found the lock taken, released later.
        self._dropped: deque[TensorMemoryObj] = deque()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    # -- hooks for the subclasses ----------------------------------------

    def _release_locked(self, obj: TensorMemoryObj) -> None:
        """Give ``obj``'s memory back; the caller holds the lock and checked it."""
        raise NotImplementedError

    def _release_garbage_locked(self, obj: TensorMemoryObj) -> None:
        """Give back the memory of a handle being garbage-collected."""
        self._release_locked(obj)

    def _forget_memory_locked(self) -> None:
        """Drop the subclass's own references to the memory (at close)."""

    # -- ownership and pins ------------------------------------------------

    def _check_owned(self, obj: object) -> TensorMemoryObj:
        if obj.__class__ is not _TMO or obj._pool is not self:  # type: ignore[attr-defined]
            raise InvalidHandleError(
                f"{obj!r} was not allocated by this {self}; free it with its own allocator"
            )
        return obj  # type: ignore[return-value]

    def _unpinned_by_free(self, obj: TensorMemoryObj) -> bool:
        """Account for freeing a pinned object; True when it was pinned."""
        if obj._meta.pin_count > 0:
            obj._meta.pin_count = 0
            self._pinned -= 1
            PinMonitor.GetOrCreate().on_unpin(obj)
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
        lock = self._lock
        lock.acquire()
        try:
            if not obj.valid or self._closed:
                report(InvalidHandleError, f"free of an already freed object {obj!r}; ignored")
                return
            self._unpinned_by_free(obj)
            self._release_locked(obj)
        finally:
            lock.release()

    # -- the garbage-collection backstop -----------------------------------

    def _release_dropped(self, obj: TensorMemoryObj) -> None:
        """Called by a live handle's ``__del__``: release its memory.

        Never blocks: when the lock is taken (another thread, or this one
        in the middle of a pool call), the handle is queued and released
        under the lock later.
        """
        lock = self._lock
        if not lock.acquire(False):
            self._dropped.append(obj)
            return
        try:
            self._release_dropped_locked(obj)
        finally:
            lock.release()

    def _release_dropped_locked(self, obj: TensorMemoryObj) -> None:
        if not obj.valid or self._closed:
            return
        meta = obj._meta
        logger.warning(
            "reclaiming %s: it was garbage-collected with ref_count=%d, pin_count=%d "
            "(ref_count_down()/unpin() was not called)",
            repr(obj),
            meta.ref_count,
            meta.pin_count,
        )
        self._unpinned_by_free(obj)
        self._release_garbage_locked(obj)

    def _drain_dropped_locked(self) -> int:
        """Release the queued garbage handles; returns how many there were."""
        dropped = self._dropped
        count = 0
        while dropped:
            self._release_dropped_locked(dropped.popleft())
            count += 1
        return count

    def _retry_after_drain_locked(self, place: Any, *args: Any) -> Any:
        """``place(*args)``; on a full pool, release the queued garbage and retry.

        Returns:
            What ``place`` returned, or None when the pool stays full.
        """
        try:
            return place(*args)
        except AddressSpaceExhaustedError:
            if not self._drain_dropped_locked():
                return None
            try:
                return place(*args)
            except AddressSpaceExhaustedError:
                return None

    def _unpin_listed_locked(self, memory_objs: Sequence[Any]) -> None:
        """Drop the pins of the live objects of a batch about to be freed.

        Every object is checked to be this pool's first, so a foreign one
        raises before any pin is dropped.
        """
        for obj in memory_objs:
            self._check_owned(obj)
        for obj in memory_objs:
            if obj.valid:
                self._unpinned_by_free(obj)

    def _log_problems(self, problems: list[str]) -> bool:
        """Log memcheck's findings; True when there are none."""
        for problem in problems:
            logger.error("memcheck(%s): %s", self, problem)
        return not problems

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Invalidate every object and refuse further allocations.  Idempotent.

        The allocator and its handles drop their references to the memory,
        so it can go once the caller (or the pool that built this
        allocator) releases it; views made earlier keep it alive.
        """
        lock = self._lock
        lock.acquire()
        try:
            if self._closed:
                return
            self._closed = True
            self._dropped.clear()
            if self._mv is not None:
                try:
                    self._mv.release()
                except BufferError:  # someone exported this view: it keeps the memory
                    logger.warning("close(%s): a view of the pool is still exported", self)
            self._mv = None
            self.buffer = torch.empty(0, dtype=torch.uint8, device=self.buffer.device)
            self._arena = None
            self._forget_memory_locked()
            pinned = self._pinned
        finally:
            lock.release()
        if pinned:
            # Its pinned objects are gone with it: the monitor lets go of them.
            PinMonitor.GetOrCreate().forget_owner(self)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise PoolClosedError(f"{what} on a closed {self}")

    def _report_already_freed(self, obj: object) -> None:
        report(InvalidHandleError, f"batched_free of an already freed object {obj!r}; skipped")
