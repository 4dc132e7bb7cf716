"""An :class:`~kvpool.pool.address.AddressManager`'s state, checked: its invariants, a bad free.

The manager hands its state to these functions as an :class:`AddressState`
(under its lock); they read nothing else and change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.pool.barriers import Barriers
from kvpool.pool.size_classes import size_class

__all__ = ["AddressState", "address_problems", "describe_bad_free"]


@dataclass(frozen=True)
class AddressState:
    """What an address manager's invariants are about.

    Attributes:
        size: the address space ``[0, size)``.
        top: the start of the free top region ``[top, size)``.
        mask: ``align - 1``.
        shift: ``log2(align)``.
        holes: hole start -> size.
        hole_ends: hole end -> start.
        bins: per size class, the starts of its holes.
        bitmap: bit ``c`` set when class ``c`` has holes.
        live: live allocation start -> aligned size.
        allocated: the allocated-bytes counter.
        barriers: offsets no hole or allocation may cross.
    """

    size: int
    top: int
    mask: int
    shift: int
    holes: dict[int, int]
    hole_ends: dict[int, int]
    bins: list[dict[int, None]]
    bitmap: int
    live: dict[int, int]
    allocated: int
    barriers: Barriers


def address_problems(s: AddressState) -> list[str]:
    """Describe every broken invariant of ``s``; an empty list when all hold.

    Checked: holes are aligned, in bounds, below the top, neither
    overlapping nor touching except at a barrier (they are coalesced), and
    none ends at the top (it is merged into it); each sits in the class its
    size maps to and the bitmap marks exactly the non-empty classes; the end
    index mirrors the start index; live allocations are aligned; no hole and
    no live allocation crosses a barrier; holes, allocations and the top tile
    ``[0, size)`` exactly; the allocated-bytes counter matches.

    Complexity: O(n log n) in the number of holes and allocations.
    """
    problems: list[str] = []
    holes = sorted(s.holes.items())
    if len(s.hole_ends) != len(holes):
        problems.append(f"end index has {len(s.hole_ends)} holes, start index {len(holes)}")
    if not 0 <= s.top <= s.size:
        problems.append(f"top {s.top} is outside [0, {s.size}]")
    bitmap = 0
    in_bins = 0
    for cls, members in enumerate(s.bins):
        if members:
            bitmap |= 1 << cls
        in_bins += len(members)
        for start in members:
            size = s.holes.get(start)
            if size is None:
                problems.append(f"class {cls} lists a hole at {start} that is not free")
            elif size_class(size >> s.shift) != cls:
                problems.append(f"hole [{start}, +{size}) is binned in class {cls}")
    if bitmap != s.bitmap:
        problems.append(f"class bitmap {s.bitmap:#x} should be {bitmap:#x}")
    if in_bins != len(holes):
        problems.append(f"{in_bins} holes in the classes, {len(holes)} in the start index")
    prev_end = -1
    for start, size in holes:
        if size <= 0 or start & s.mask or start < 0 or start + size > s.top:
            problems.append(f"hole [{start}, +{size}) is empty, unaligned or above the top")
        if start < prev_end:
            problems.append(f"hole at {start} overlaps the hole before it")
        elif start == prev_end and start not in s.barriers:
            problems.append(f"hole at {start} touches the hole before it (not coalesced)")
        if s.hole_ends.get(start + size) != start:
            problems.append(f"end index does not map {start + size} back to hole {start}")
        if s.barriers.crosses(start, start + size):
            problems.append(f"hole [{start}, +{size}) crosses a registration boundary")
        prev_end = start + size
    if prev_end == s.top:
        problems.append(f"the hole ending at {prev_end} touches the top (not merged into it)")
    total_live = 0
    for start, size in s.live.items():
        if size <= 0 or start & s.mask or size & s.mask:
            problems.append(f"live allocation [{start}, +{size}) is empty or unaligned")
        if s.barriers.crosses(start, start + size):
            problems.append(
                f"live allocation [{start}, +{size}) crosses a registration boundary at "
                f"{s.barriers.next_after(start)}: a GPU copy of it would fail"
            )
        total_live += size
    if total_live != s.allocated:
        problems.append(f"allocated-bytes counter {s.allocated} != live total {total_live}")
    pos = 0
    for start, size in sorted(holes + list(s.live.items())):
        if start != pos:
            problems.append(f"holes and allocations do not tile the space at {pos}")
            break
        pos = start + size
    else:
        if pos != s.top:
            problems.append(f"holes and allocations end at {pos}, the top is at {s.top}")
    return problems


def describe_bad_free(s: AddressState, address: int, aligned: int, pos: int) -> str:
    """Why ``free(address, aligned)`` is refused: no live allocation starts at ``pos``.

    Names what the range hits: out of bounds, unaligned, the free top, a
    free block (a double free), or nothing handed out there.
    """
    head = f"free(address={address}, size={aligned})"
    if address < 0 or address + aligned > s.size:
        return f"{head}: out of bounds of the address space [0, {s.size})"
    if address & s.mask:
        return f"{head}: address is not a multiple of the alignment {s.mask + 1}"
    if address + aligned > s.top:
        return (
            f"{head}: overlaps the free top region [{s.top}, {s.size}) - "
            "a double free or a wrong address"
        )
    for start, block in s.holes.items():
        if start < address + aligned and address < start + block:
            return (
                f"{head}: overlaps the free block [{start}, {start + block}) - "
                "a double free or a wrong address"
            )
    return f"{head}: no live allocation starts at {pos}; free only what allocate() returned"
