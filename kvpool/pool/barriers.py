"""Barriers: offsets no placed object may cross, because a GPU copy across one fails.

CUDA copies a host range only when it lies inside ONE registration (one
``cudaHostRegister`` call, or one ``cudaHostAlloc``).  A pool registered in
chunks (:mod:`kvpool.native.registration`) therefore has boundaries inside
its memory, and an object that straddles one cannot be copied to or from a
GPU.  The placements (:class:`~kvpool.pool.address.AddressManager`, the
paged policy) treat every boundary as a *barrier*: a range ``[start, end)``
crosses barrier ``b`` when ``start < b < end``, and none they hand out does.

:func:`boundaries` turns a backing's registrations into barrier offsets;
:class:`Barriers` keeps them sorted for the placement.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

#: Where extents go in a top region: runs ``(start, bytes)`` of extents, the
#: bytes skipped before barriers ``(start, bytes)``, and the new top.
TopPlan = tuple[list[tuple[int, int]], list[tuple[int, int]], int]

__all__ = ["Barriers", "TopPlan", "boundaries", "plan_top"]


def boundaries(spans: Iterable[tuple[int, int]], size: int) -> list[int]:
    """Every start and end of a registration strictly inside ``(0, size)``, sorted.

    Ends count too: a range partly inside a registration and partly outside
    (unregistered memory, or a commit not made yet) cannot be copied either.

    Args:
        spans: ``(offset, length)`` of each registration.
        size: bytes of the memory they describe.
    """
    cuts = set()
    for offset, length in spans:
        for cut in (offset, offset + length):
            if 0 < cut < size:
                cuts.add(cut)
    return sorted(cuts)


class Barriers:
    """A sorted set of barrier offsets.

    Attributes:
        offsets: the barriers, ascending; ``members``: the same as a set.
            Both are changed in place only (a placement may keep them and
            test them on its hot path without a call: an empty list is
            false, ``x in members`` is a set lookup).

    Complexity: ``next_after`` and ``crosses`` are O(log n); ``add`` is
    O(n log n) (barriers come rarely: when a pool is made or grows).
    """

    __slots__ = ("members", "offsets")

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.members: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets)

    def __contains__(self, offset: object) -> bool:
        return offset in self.members

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.offsets)

    def add(self, offsets: Iterable[int]) -> list[int]:
        """Add offsets; returns the new ones, sorted."""
        new = sorted(set(offsets) - self.members)
        if new:
            self.members.update(new)
            self.offsets[:] = sorted(self.members)
        return new

    def next_after(self, position: int) -> int | None:
        """The smallest barrier above ``position``, or None."""
        offsets = self.offsets
        i = bisect.bisect_right(offsets, position)
        return offsets[i] if i < len(offsets) else None

    def crosses(self, start: int, end: int) -> bool:
        """True when ``[start, end)`` crosses a barrier (``start < b < end``)."""
        offsets = self.offsets
        i = bisect.bisect_right(offsets, start)
        return i < len(offsets) and offsets[i] < end

    def longest_run(self, start: int, end: int) -> int:
        """The longest stretch of ``[start, end)`` that crosses no barrier."""
        longest = 0
        previous = start
        for offset in self.offsets[bisect.bisect_right(self.offsets, start) :]:
            if offset >= end:
                break
            longest = max(longest, offset - previous)
            previous = offset
        return max(longest, end - previous)

    def longest_gap(self, size: int) -> int:
        """The longest distance between neighbouring barriers (and 0, ``size``)."""
        longest = 0
        previous = 0
        for offset in self.offsets:
            if offset >= size:
                break
            longest = max(longest, offset - previous)
            previous = offset
        return max(longest, size - previous)


def plan_top(barriers: Barriers, top: int, size: int, aligned: int, count: int) -> TopPlan | None:
    """Where ``count`` extents of ``aligned`` bytes go in the free top ``[top, size)``.

    Extents are packed from ``top``; one that would cross a barrier starts at
    the barrier instead, and the bytes skipped become gaps (holes for the
    caller).

    Returns:
        The :data:`TopPlan`, or None when the top cannot hold them.

    Complexity: O(barriers the extents reach).
    """
    pieces: list[tuple[int, int]] = []
    gaps: list[tuple[int, int]] = []
    pos = top
    need = count
    while True:
        barrier = barriers.next_after(pos)
        end = size if barrier is None or barrier > size else barrier
        take = min(need, (end - pos) // aligned)
        if take:
            pieces.append((pos, take * aligned))
            pos += take * aligned
            need -= take
        if not need:
            return pieces, gaps, pos
        if end >= size:
            return None
        if pos < end:
            gaps.append((pos, end - pos))
        pos = end
