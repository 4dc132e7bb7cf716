"""Batched placement for :class:`~kvpool.pool.address.AddressManager`: many extents at once.

``batched_allocate`` carves equal extents all or nothing -- from one free
block when one holds the whole batch, else gathered from several -- and
``batched_free_locked`` gives many back with one coalescing step per run.
:class:`BatchPlacement` is a base of the manager, not used alone: it works
on the manager's free structures and lock, under the same contract (see
:mod:`kvpool.pool.address`).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable

from kvpool.checks import check_batch_size as _check_batch_size
from kvpool.checks import check_size, refuse_unknown_keywords
from kvpool.errors import AddressSpaceExhaustedError, InvalidHandleError
from kvpool.pool.barriers import Barriers, TopPlan
from kvpool.pool.size_classes import EXACT_LIMIT as _EXACT_LIMIT
from kvpool.pool.size_classes import size_class as _size_class

__all__ = ["BatchPlacement"]


@refuse_unknown_keywords  # its public calls are AddressManager's: guarded alike
class BatchPlacement:
    """The batched calls of an address manager (a base class of it)."""

    # The manager's state these methods use (see AddressManager).
    lock: threading.Lock
    total_allocated_size: int
    _size: int
    _top: int
    _mask: int
    _shift: int
    _bitmap: int
    _bins: list[dict[int, None]]
    _hole_start: dict[int, int]
    _live: dict[int, int]
    _barriers: Barriers
    _cuts: list[int]

    def _take_hole(self, units: int) -> tuple[int, int] | None:
        raise NotImplementedError

    def _take_tight_hole(self, units: int) -> tuple[int, int] | None:
        raise NotImplementedError

    def _add_hole(self, start: int, size: int) -> None:
        raise NotImplementedError

    def _drop_hole(self, start: int, size: int) -> None:
        raise NotImplementedError

    def _top_plan(self, aligned: int, count: int) -> TopPlan | None:
        raise NotImplementedError

    def _exhausted(self, size: int, aligned: int, count: int = 1) -> AddressSpaceExhaustedError:
        raise NotImplementedError

    def _give_back(self, start: int, end: int) -> None:
        raise NotImplementedError

    def _run_starts(self, address: int, size: int) -> tuple[int, list[int]]:
        raise NotImplementedError

    def batched_allocate(self, size: int, batch_size: int) -> list[tuple[int, int]]:
        """Allocate ``batch_size`` extents of ``size`` bytes, all or nothing.

        Chunks are carved consecutively from one free block when one can
        hold the whole batch (a hole first, else the top); otherwise from
        several blocks, smallest suitable first.  On failure nothing is
        allocated.

        Args:
            size: bytes per extent, > 0.
            batch_size: number of extents, >= 0 (0 returns ``[]``).

        Returns:
            ``batch_size`` tuples ``(address, aligned_size)``.

        Raises:
            InvalidArgumentError: bad ``size`` (BatchSizeError: bad ``batch_size``).
            AddressSpaceExhaustedError: the free space cannot hold the batch.

        Complexity: O(batch_size) when one block suffices, else
        O(batch_size + free blocks).
        """
        _check_batch_size(batch_size)
        if size.__class__ is not int or size <= 0:
            size = check_size("size", size)
        if batch_size == 0:
            return []
        lock = self.lock
        lock.acquire()
        try:
            return self.batched_allocate_locked(size, batch_size)
        finally:
            lock.release()

    def batched_allocate_locked(self, size: int, batch_size: int) -> list[tuple[int, int]]:
        """:meth:`batched_allocate` for callers that already hold ``_lock``.

        ``size`` must already be a positive int and ``batch_size`` > 0.
        """
        aligned = (size + self._mask) & ~self._mask
        total = aligned * batch_size
        hole = self._take_hole(total >> self._shift)
        if hole is not None:
            pieces = [hole]
        elif self._size - self._top >= total and (
            not self._cuts or not self._barriers.crosses(self._top, self._top + total)
        ):
            pieces = [(self._top, total)]
            self._top += total
        else:
            hole = self._take_tight_hole(total >> self._shift)
            pieces = [hole] if hole is not None else self._gather(aligned, batch_size)
        live = self._live
        out: list[tuple[int, int]] = []
        remaining = batch_size
        for start, block in pieces:
            count = min(remaining, block // aligned)
            for addr in range(start, start + count * aligned, aligned):
                live[addr] = aligned
                out.append((addr, aligned))
            used = count * aligned
            if block > used:
                self._add_hole(start + used, block - used)
            remaining -= count
        self.total_allocated_size += total
        return out

    def _gather(self, aligned: int, batch_size: int) -> list[tuple[int, int]]:
        """Take free blocks that together hold ``batch_size`` chunks.

        Holes smallest class first (fills holes before cutting the top),
        then the top.  Checks before it changes anything, so on failure
        the free structures are untouched.
        """
        need = batch_size
        picked: list[tuple[int, int]] = []
        units = aligned >> self._shift
        cls = units if units < _EXACT_LIMIT else _size_class(units)
        bits = self._bitmap >> cls
        while bits and need > 0:
            if bits & 1:
                for start in self._bins[cls]:
                    block = self._hole_start[start]
                    fits = block // aligned
                    if fits:
                        picked.append((start, block))
                        need -= fits
                        if need <= 0:
                            break
            bits >>= 1
            cls += 1
        placed = self._top_plan(aligned, need) if need > 0 else ([], [], self._top)
        if placed is None:
            raise self._exhausted(aligned, aligned, batch_size)
        for start, block in picked:
            self._drop_hole(start, block)
        pieces, gaps, self._top = placed
        for start, block in gaps:
            self._add_hole(start, block)
        picked.extend(pieces)
        return picked

    def batched_free_locked(self, ranges: Iterable[tuple[int, int]]) -> int:
        """Free many ``(address, size)`` ranges; caller holds ``_lock``.

        Every range is validated before anything changes, so a bad entry
        (or the same allocation listed twice) raises
        :class:`InvalidHandleError` with the state untouched.  Adjacent
        ranges are merged before coalescing, so freeing a consecutive batch
        costs one coalescing step, not one per range.

        Returns:
            The number of ranges freed.

        Complexity: O(k log k) for k ranges.
        """
        live = self._live
        starts: list[int] = []
        count = 0
        for address, size in ranges:
            count += 1
            if address.__class__ is int and size.__class__ is int and live.get(address) == size:
                starts.append(address)
            else:
                starts.extend(self._run_starts(address, size)[1])
        if not starts:
            return 0
        starts.sort()
        for prev, cur in itertools.pairwise(starts):
            if prev == cur:
                raise InvalidHandleError(
                    f"batched free: the allocation at address {cur} is listed twice; "
                    "each object can be freed once"
                )
        freed = 0
        run_start = run_end = starts[0]
        for start in starts:
            size = live.pop(start)
            freed += size
            if start != run_end:
                self._give_back(run_start, run_end)
                run_start = start
            run_end = start + size
        self._give_back(run_start, run_end)
        self.total_allocated_size -= freed
        return count
