"""Placement of variable-size extents in a linear address space.

:class:`AddressManager` hands out aligned ``(address, size)`` ranges of a
virtual address space that starts at 0, takes them back with coalescing,
and can grow at the top (``sbrk``).  It never touches the memory it
manages: all bookkeeping lives in Python dicts outside it.

Why this design (and not the reference's first-fit list)
--------------------------------------------------------
The reference keeps one address-ordered list of free blocks and scans it
from the start on every allocation, so the cost of ``allocate`` grows with
the number of holes (10,000 holes: ~170 us per call).  Here placement is
*segregated good fit* in the style of TLSF, plus a *top region*:

* the free space above the highest live allocation (the "top", or
  wilderness) is one counter, not a block: carving from it and giving a
  block back to it are a few integer operations, and ``sbrk`` only moves
  its end;
* every other free block (a hole) is binned by size class
  (:mod:`kvpool.pool.size_classes`); a bitmap (one Python int) of the
  non-empty classes finds the smallest class whose every hole is large
  enough in a few integer operations.  Holes are preferred to the top;
* neighbours are found through two dicts keyed by hole start and hole
  end, so ``free`` coalesces in O(1).

Barriers: a pool registered with CUDA in chunks tells its manager where
the chunks meet (:meth:`AddressManager.add_barriers`); no extent it hands
out crosses one, since a GPU copy across two registrations fails.  Holes
are split at barriers and never merge across one; the top may span them,
and carving from it skips to the next barrier when the request would cross
one (the bytes skipped become holes).  See :mod:`kvpool.pool.barriers`.

Safety: every live allocation is recorded (start -> size).  ``free`` only
accepts whole allocations (or a run of adjacent whole allocations, as
``batched_free`` produces), so a double free, a free of a range that was
never handed out, or one that overlaps a free block raises
:class:`~kvpool.errors.InvalidHandleError` and leaves the state untouched.
The free structures can therefore never hold overlapping blocks.

Thread safety: one lock per manager (``lock``) guards every structure
and counter, and every public method takes it.  Pools built on top share
that lock and call the ``*_locked`` methods while holding it, so one
acquisition covers the pool's own state and the placement.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from kvpool.checks import check_int, check_optional_int, check_power_of_two, check_size
from kvpool.errors import AddressSpaceExhaustedError, InvalidArgumentError, InvalidHandleError
from kvpool.pool.address_batch import BatchPlacement
from kvpool.pool.address_check import AddressState, address_problems, describe_bad_free
from kvpool.pool.barriers import Barriers, TopPlan, plan_top
from kvpool.pool.size_classes import EXACT_LIMIT as _EXACT_LIMIT
from kvpool.pool.size_classes import fit_class as _fit_class
from kvpool.pool.size_classes import size_class as _size_class

__all__ = ["AddressManager", "FreeBlock"]

logger = logging.getLogger("kvpool")


@dataclass
class FreeBlock:
    """A free range ``[start, start + size)`` of an address space."""

    start: int
    size: int

    def can_be_coalesced(self, succ: FreeBlock) -> bool:
        """Return True when ``succ`` starts exactly where this block ends."""
        return self.start + self.size == succ.start


class AddressManager(BatchPlacement):
    """Allocator of aligned extents in a growable address space ``[0, size)``.

    Args:
        size: initial size of the address space in bytes (>= 0).
        align_bytes: alignment of every address and size handed out; a
            positive power of two (default 4096).
        max_size: the most ``sbrk`` may grow the space to (the size of the
            memory it describes); None for no limit.

    Raises:
        InvalidArgumentError: ``size`` negative, ``align_bytes`` not a
            positive power of two, or ``max_size`` below ``size``.

    Complexity: ``allocate``, ``free`` and ``sbrk`` are O(1);
    ``batched_allocate(size, k)`` is O(k) when one free block can hold the
    whole batch, O(k + free blocks) otherwise; ``check_consistency`` is
    O(n log n) in the number of blocks.
    """

    ALIGN_BYTES = 4096

    def __init__(
        self, size: int, align_bytes: int = ALIGN_BYTES, *, max_size: int | None = None
    ) -> None:
        size = check_int("size", size, low=0, fix="the size of the address space in bytes")
        align_bytes = check_power_of_two("align_bytes", align_bytes, fix="a power of two: 4096...")
        max_size = check_optional_int("max_size", max_size, low=size, fix="it bounds sbrk")
        self._size = size
        self._max_size = max_size
        self._align = align_bytes
        self._mask = align_bytes - 1
        self._shift = align_bytes.bit_length() - 1
        # [_top, _size) is free and is not a hole: no hole ends at _top.
        self._top = 0
        # Holes: start -> size, and end -> start (to find a left neighbour).
        self._hole_start: dict[int, int] = {}
        self._hole_end: dict[int, int] = {}
        # Per size class, the starts of its holes.  A dict keeps insertion
        # order, so popitem() reuses the most recently freed hole of the
        # class, the one most likely still warm in the caches.
        self._bins: list[dict[int, None]] = [
            {} for _ in range(_size_class(size >> self._shift) + 1)
        ]
        self._bitmap = 0
        # Live allocations: start -> aligned size.
        self._live: dict[int, int] = {}
        self.lock = threading.Lock()
        #: Bytes currently handed out (aligned sizes); exact, kept under the lock.
        self.total_allocated_size = 0
        # Offsets no extent may cross (CUDA registration boundaries), and the
        # longest extent that fits between two of them.
        self._barriers = Barriers()
        # Its list and set, kept for the hot paths (changed in place only).
        self._cuts = self._barriers.offsets
        self._cut_set = self._barriers.members
        self._widest = max_size if max_size is not None else 1 << 64

    # ------------------------------------------------------------------
    # hole primitives (caller holds the lock)
    # ------------------------------------------------------------------

    def _add_hole(self, start: int, size: int) -> None:
        units = size >> self._shift
        cls = units if units < _EXACT_LIMIT else _size_class(units)
        self._bins[cls][start] = None
        self._bitmap |= 1 << cls
        self._hole_start[start] = size
        self._hole_end[start + size] = start

    def _drop_hole(self, start: int, size: int) -> None:
        units = size >> self._shift
        cls = units if units < _EXACT_LIMIT else _size_class(units)
        members = self._bins[cls]
        del members[start]
        if not members:
            self._bitmap &= ~(1 << cls)
        del self._hole_start[start]
        del self._hole_end[start + size]

    def _take_tight_hole(self, units: int) -> tuple[int, int] | None:
        """Remove and return a hole of at least ``units`` units from their own class.

        The O(1) search rounds a request up to the next class, so a hole in
        the request's own class that would fit is not seen.  This scan
        (O(holes in that class)) runs only when everything else failed.
        """
        if units < _EXACT_LIMIT:  # exact classes: the O(1) search saw them
            return None
        cls = _size_class(units)
        if cls >= len(self._bins):
            return None
        need = units << self._shift
        for start in self._bins[cls]:
            size = self._hole_start[start]
            if size >= need:
                self._drop_hole(start, size)
                return start, size
        return None

    def _take_hole(self, units: int) -> tuple[int, int] | None:
        """Remove and return a hole of at least ``units`` units, if any."""
        cls = units if units < _EXACT_LIMIT else _fit_class(units)
        candidates = self._bitmap >> cls
        if not candidates:
            return None
        cls += (candidates & -candidates).bit_length() - 1
        members = self._bins[cls]
        start = members.popitem()[0]
        if not members:
            self._bitmap &= ~(1 << cls)
        size = self._hole_start.pop(start)
        del self._hole_end[start + size]
        return start, size

    # ------------------------------------------------------------------
    # public API
    # ------------------------------------------------------------------

    def compute_aligned_size(self, raw_size: int) -> int:
        """Round ``raw_size`` up to the alignment.

        Args:
            raw_size: a byte count.

        Returns:
            The smallest multiple of ``align_bytes`` that is >= ``raw_size``.

        Raises:
            InvalidArgumentError: ``raw_size`` is not an int >= 0.
        """
        if raw_size.__class__ is not int and (
            isinstance(raw_size, bool) or not isinstance(raw_size, int)
        ):
            raise InvalidArgumentError(f"raw_size must be an int number of bytes, got {raw_size!r}")
        if raw_size < 0:
            raise InvalidArgumentError(f"raw_size must be >= 0 bytes, got {raw_size}")
        return (raw_size + self._mask) & ~self._mask

    def allocate(self, size: int) -> tuple[int, int]:
        """Allocate an aligned extent of at least ``size`` bytes.

        Args:
            size: requested bytes, > 0.

        Returns:
            ``(address, aligned_size)``.

        Raises:
            InvalidArgumentError: ``size`` is not a positive integer.
            AddressSpaceExhaustedError: no free range is large enough (a
                ``RuntimeError``, as in the reference API).

        Complexity: O(1).
        """
        lock = self.lock
        lock.acquire()
        try:
            return self.allocate_locked(size)
        finally:
            lock.release()

    def allocate_locked(self, size: int) -> tuple[int, int]:
        """:meth:`allocate` for callers that already hold ``_lock``."""
        if size.__class__ is not int or size <= 0:
            size = check_size("size", size)
        aligned = (size + self._mask) & ~self._mask
        # The hole search of _take_hole(), inlined: this is the hot path of
        # every extent pool.
        units = aligned >> self._shift
        cls = units if units < _EXACT_LIMIT else _fit_class(units)
        candidates = self._bitmap >> cls
        if candidates:
            cls += (candidates & -candidates).bit_length() - 1
            members = self._bins[cls]
            start = members.popitem()[0]
            if not members:
                self._bitmap &= ~(1 << cls)
            block = self._hole_start.pop(start)
            del self._hole_end[start + block]
        elif self._size - self._top >= aligned and (
            not self._cuts or not self._barriers.crosses(self._top, self._top + aligned)
        ):
            start = self._top
            self._top = start + aligned
            block = aligned
        else:
            hole = self._take_tight_hole(units)
            if hole is not None:
                start, block = hole
            elif self._cuts:  # past the barriers in the top, if it fits there
                start = self._carve_top(aligned, 1, size)[0][0]
                block = aligned
            else:
                raise self._exhausted(size, aligned)
        if block > aligned:  # a hole larger than asked for: keep the rest free
            self._add_hole(start + aligned, block - aligned)
        self._live[start] = aligned
        self.total_allocated_size += aligned
        return start, aligned

    def _exhausted(self, size: int, aligned: int, count: int = 1) -> AddressSpaceExhaustedError:
        what = f"{size} bytes ({aligned} aligned)" if count == 1 else f"{count} x {aligned} bytes"
        return AddressSpaceExhaustedError(
            f"cannot allocate {what} because no memory is available in a free range that "
            f"large (free {self._size - self.total_allocated_size} of {self._size} bytes in "
            f"{self._num_free_blocks()} blocks); free objects or grow the pool"
        )

    def _top_plan(self, aligned: int, count: int) -> TopPlan | None:
        """:func:`~kvpool.pool.barriers.plan_top` for this top (None: it cannot hold them)."""
        if aligned > self._widest:
            return None  # fits between no two barriers: fail at once
        return plan_top(self._barriers, self._top, self._size, aligned, count)

    def _carve_top(self, aligned: int, count: int, size: int) -> list[tuple[int, int]]:
        """Take ``count`` extents from the top, skipping barriers; raise when it cannot."""
        placed = self._top_plan(aligned, count)
        if placed is None:
            raise self._exhausted(size, aligned, count)
        pieces, gaps, self._top = placed
        for start, block in gaps:
            self._add_hole(start, block)
        return pieces

    def free(self, address: int, size: int) -> None:
        """Return an allocated extent (or a run of adjacent ones).

        Args:
            address: the address ``allocate`` returned.
            size: its size (the aligned size returned, or the size asked
                for; it is aligned here).  A run of adjacent allocations
                may be freed at once by giving its start and total size.

        Raises:
            InvalidHandleError: the range is not exactly a run of live
                allocations: a double free, a range never handed out, one
                that overlaps a free block or lies out of bounds.  Nothing
                changes in that case.

        Complexity: O(1) for one allocation, O(k) for a run of k.
        """
        lock = self.lock
        lock.acquire()
        try:
            self.free_locked(address, size)
        finally:
            lock.release()

    def free_locked(self, address: int, size: int) -> None:
        """:meth:`free` for callers that already hold ``_lock``."""
        live = self._live
        if address.__class__ is int and size.__class__ is int and live.get(address) == size:
            del live[address]
        else:
            size, starts = self._run_starts(address, size)
            for start in starts:
                del live[start]
        self.total_allocated_size -= size
        end = address + size
        if end == self._top and address not in self._hole_end:
            self._top = address  # the topmost allocation: no hole to merge
            return
        self._give_back(address, end)

    def _give_back(self, start: int, end: int) -> None:
        """Make ``[start, end)`` free, coalescing with its free neighbours.

        Holes never merge across a barrier; the top does (it may span them),
        so a range freed at the top takes every hole that then ends there.
        """
        barriers = self._cut_set
        left = self._hole_end.get(start)
        if left is not None and start not in barriers:
            self._drop_hole(left, start - left)
            start = left
        if end == self._top:
            while left is not None:  # holes meeting at barriers join the top
                left = self._hole_end.get(start)
                if left is not None:
                    self._drop_hole(left, start - left)
                    start = left
            self._top = start
            return
        right = self._hole_start.get(end)
        if right is not None and end not in barriers:
            self._drop_hole(end, right)
            end += right
        self._add_hole(start, end - start)

    def _run_starts(self, address: int, size: int) -> tuple[int, list[int]]:
        """Aligned size and starts of the live allocations tiling ``[address, +size)``.

        Raises:
            InvalidArgumentError: ``address`` or ``size`` of the wrong type.
            InvalidHandleError: the range is not a run of live allocations.
        """
        if isinstance(address, bool) or not isinstance(address, int):
            raise InvalidArgumentError(f"address must be an int, got {address!r}")
        size = check_size("size", size)
        aligned = (size + self._mask) & ~self._mask
        live = self._live
        pos = address
        end = address + aligned
        starts = []
        while pos < end:
            chunk = live.get(pos)
            if chunk is None:
                raise InvalidHandleError(describe_bad_free(self._state(), address, aligned, pos))
            starts.append(pos)
            pos += chunk
        if pos != end:
            raise InvalidHandleError(
                f"free(address={address}, size={size}): the range ends inside the allocation "
                f"at {starts[-1]} (size {live[starts[-1]]}); free whole allocations only"
            )
        return aligned, starts

    def add_barriers(self, offsets: Iterable[int]) -> None:
        """Make ``offsets`` barriers: no extent handed out from now on crosses one.

        Args:
            offsets: byte offsets, multiples of the alignment (CUDA
                registration boundaries, :mod:`kvpool.pool.barriers`); ones
                beyond the space count once ``sbrk`` reaches them.

        Raises:
            InvalidArgumentError: an offset that is not an int >= 0 and a
                multiple of the alignment, or that a live allocation crosses
                (nothing changes then).

        Complexity: O(holes + live allocations) when an offset lies below
        the top, O(n log n) in the barriers otherwise.
        """
        with self.lock:
            self.add_barriers_locked(offsets)

    def add_barriers_locked(self, offsets: Iterable[int]) -> None:
        """:meth:`add_barriers` for a caller that holds the manager's lock."""
        new = [check_int("barrier offset", b, low=0) for b in offsets]
        for b in new:
            if b & self._mask:
                raise InvalidArgumentError(
                    f"barrier offset {b} is not a multiple of the alignment {self._align}; "
                    "register the memory in chunks that are multiples of it"
                )
        below = [b for b in new if b < self._top]  # above it nothing is placed
        for start, size in self._live.items() if below else ():
            for b in below:
                if start < b < start + size:
                    raise InvalidArgumentError(
                        f"barrier {b} falls inside the live allocation [{start}, +{size}); "
                        "add barriers before the space around them is handed out"
                    )
        for b in below:  # a hole across it becomes two
            for start, size in list(self._hole_start.items()):
                if start < b < start + size:
                    self._drop_hole(start, size)
                    self._add_hole(start, b - start)
                    self._add_hole(b, start + size - b)
        self._barriers.add(new)
        if self._max_size is not None:
            self._widest = self._barriers.longest_gap(self._max_size)

    @property
    def widest_extent(self) -> int:
        """The largest extent this manager can ever place: the longest run between barriers.

        Without barriers (or ``max_size``) it is unbounded here (``2**64``);
        the space itself still bounds a request.  Read without the lock (an
        int, replaced whole when barriers are added).
        """
        return self._widest

    def sbrk(self, size: int) -> None:
        """Grow the address space by ``size`` bytes (aligned up).

        Args:
            size: bytes to add, > 0.

        Raises:
            InvalidArgumentError: ``size`` is not a positive integer, or the
                space would grow past ``max_size``.

        Complexity: O(1) (amortised: the class table may grow).
        """
        size = check_size("size", size)
        lock = self.lock
        lock.acquire()
        try:
            grown = self._size + ((size + self._mask) & ~self._mask)
            if self._max_size is not None and grown > self._max_size:
                if self._size + size > self._max_size:
                    raise InvalidArgumentError(
                        f"sbrk({size}) would grow the address space to {grown} bytes, past its "
                        f"limit of {self._max_size} (the memory behind it); grow by at most "
                        f"{self._max_size - self._size}"
                    )
                grown = self._max_size  # the last, partial unit of the memory
            self._size = grown
            need = _size_class(self._size >> self._shift) + 1
            if need > len(self._bins):
                self._bins.extend({} for _ in range(need - len(self._bins)))
        finally:
            lock.release()

    def get_heap_size(self) -> int:
        """Total size of the address space in bytes."""
        return self._size

    def get_free_size(self) -> int:
        """Bytes not currently allocated."""
        return self._size - self.total_allocated_size

    def _num_free_blocks(self) -> int:
        return len(self._hole_start) + (self._top < self._size)

    def num_free_blocks(self) -> int:
        """Number of free blocks: the holes, plus the top when not empty. O(1)."""
        return self._num_free_blocks()

    def num_allocations(self) -> int:
        """Number of live allocations. O(1)."""
        return len(self._live)

    def largest_free_locked(self) -> int:
        """:meth:`largest_free_block` for a caller that holds the manager's lock."""
        largest = self._size - self._top
        if self._cuts and largest:
            largest = self._barriers.longest_run(self._top, self._size)
        if self._bitmap:
            top_cls = self._bitmap.bit_length() - 1
            largest = max(largest, max(self._hole_start[s] for s in self._bins[top_cls]))
        return largest

    def largest_free_block(self) -> int:
        """Size in bytes of the largest free block (0 when full).

        Complexity: O(holes in the largest non-empty class).
        """
        lock = self.lock
        lock.acquire()
        try:
            return self.largest_free_locked()
        finally:
            lock.release()

    def free_blocks(self) -> list[FreeBlock]:
        """Snapshot of the free blocks (holes and top) in address order.

        Complexity: O(n log n) in the number of holes.
        """
        lock = self.lock
        lock.acquire()
        try:
            blocks = [FreeBlock(s, n) for s, n in sorted(self._hole_start.items())]
            if self._top < self._size:
                blocks.append(FreeBlock(self._top, self._size - self._top))
            return blocks
        finally:
            lock.release()

    def check_consistency(self) -> bool:
        """Verify every invariant of the free and live structures.

        Each broken invariant is logged (error, on the ``kvpool`` logger)
        with what broke; :meth:`invariant_problems` returns the same text.

        Returns:
            True if every invariant holds, else False.

        Complexity: O(n log n) in the number of holes and allocations.
        """
        problems = self.invariant_problems()
        for problem in problems:
            logger.error("AddressManager.check_consistency: %s", problem)
        return not problems

    def invariant_problems(self) -> list[str]:
        """Describe every broken invariant; an empty list when all hold.

        See :func:`kvpool.pool.address_check.address_problems`: holes and
        live allocations tile the space, coalesced except at barriers, none
        crossing a barrier; the size classes, indexes and counter agree.

        Complexity: O(n log n) in the number of holes and allocations.
        """
        lock = self.lock
        lock.acquire()
        try:
            return self.problems_locked()
        finally:
            lock.release()

    def problems_locked(self) -> list[str]:
        """:meth:`invariant_problems` for a caller that holds the manager's lock."""
        return address_problems(self._state())

    def _state(self) -> AddressState:
        return AddressState(
            self._size,
            self._top,
            self._mask,
            self._shift,
            self._hole_start,
            self._hole_end,
            self._bins,
            self._bitmap,
            self._live,
            self.total_allocated_size,
            self._barriers,
        )

    def __repr__(self) -> str:
        return (
            f"AddressManager(size={self._size}, align={self._align}, "
            f"allocated={self.total_allocated_size}, free_blocks={self._num_free_blocks()})"
        )
