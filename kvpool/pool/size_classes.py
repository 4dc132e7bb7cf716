"""Size classes of the good-fit placement: which bin a free block of n units belongs to.

Exact classes below :data:`EXACT_LIMIT` alignment units, then
``2**SUB_BITS`` classes per power of two, so a class spans at most 1/16 of
its lower bound (TLSF's second level).  Both functions are O(1).

Rounding a request up to the next class boundary makes the search O(1) at
the price of sometimes splitting a hole from a larger class than the
tightest fit; with 16 classes per octave the waste is bounded and, on the
reference churn workload (W1), the free space ends in fewer, larger blocks
than first fit leaves.
"""

from __future__ import annotations

__all__ = ["EXACT_LIMIT", "SUB_BITS", "fit_class", "size_class"]

#: Classes per power of two, as a bit count.
SUB_BITS = 4
_SUB_MASK = (1 << SUB_BITS) - 1
#: Below this many units every size has a class of its own.
EXACT_LIMIT = 1 << (SUB_BITS + 1)


def size_class(units: int) -> int:
    """Class index of a hole of ``units`` alignment units (the floor class)."""
    if units < EXACT_LIMIT:
        return units
    top = units.bit_length() - 1
    return ((top - SUB_BITS + 1) << SUB_BITS) | ((units >> (top - SUB_BITS)) & _SUB_MASK)


def fit_class(units: int) -> int:
    """Smallest class whose every hole holds at least ``units`` units."""
    if units < EXACT_LIMIT:
        return units
    step = units.bit_length() - 1 - SUB_BITS
    if units & ((1 << step) - 1):
        units = ((units >> step) + 1) << step
    return size_class(units)
