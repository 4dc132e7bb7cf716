"""AddressManager against a plain model, driven by a hypothesis state machine.

The model is the list of live extents ``{address: aligned size}`` and the
heap size; the free space is its complement.  After every step the manager
must pass ``check_consistency()`` and agree with the model: same free size,
same free blocks (coalesced gaps), same largest block.  Allocations must be
aligned, in bounds and disjoint from every live extent.

The manager is good-fit, not first-fit, so the model does not predict
*where* an extent goes; it predicts *whether* a request can succeed:
``allocate(n)`` may fail only when no single free gap holds ``n`` aligned
bytes, and ``batched_allocate(n, k)`` only when all gaps together hold fewer
than ``k`` chunks (and its chunks must be consecutive whenever one gap holds
the whole batch).  Bad frees must raise ``InvalidHandleError`` and change
nothing.

Shrinking is off by default (a failing run would spend half a minute
minimising the example, past this suite's time budget); set
``KVPOOL_HYPOTHESIS_SHRINK=1`` to get the minimal failing sequence.
"""

from __future__ import annotations

import itertools
import os

import hypothesis.strategies as st
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import kvpool
from kvpool import AddressManager

ALIGN = 64  # small alignment: many size classes in a small space
START_UNITS = 256

# Sizes straddle the exact classes (< 32 units) and the first log classes.
sizes = st.integers(min_value=1, max_value=80 * ALIGN)


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class AddressManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.am = AddressManager(START_UNITS * ALIGN, ALIGN)
        self.heap = START_UNITS * ALIGN
        self.live: dict[int, int] = {}
        self.freed: list[tuple[int, int]] = []  # recently freed extents

    # -- the model -----------------------------------------------------

    def gaps(self) -> list[tuple[int, int]]:
        out = []
        pos = 0
        for start in sorted(self.live):
            if start > pos:
                out.append((pos, start - pos))
            pos = start + self.live[start]
        if pos < self.heap:
            out.append((pos, self.heap - pos))
        return out

    def is_live_run(self, address: int, size: int) -> bool:
        """True when ``[address, address + size)`` is exactly a run of live extents."""
        pos = address
        while pos < address + size and pos in self.live:
            pos += self.live[pos]
        return pos == address + size

    def record(self, address: int, size: int) -> None:
        assert size > 0 and size % ALIGN == 0
        assert address % ALIGN == 0
        assert address >= 0 and address + size <= self.heap, "allocation out of bounds"
        for start, n in self.live.items():
            assert address + size <= start or start + n <= address, (
                f"[{address}, {address + size}) overlaps live [{start}, {start + n})"
            )
        self.live[address] = size

    def snapshot(self) -> tuple:
        am = self.am
        return (
            am.get_heap_size(),
            am.get_free_size(),
            am.total_allocated_size,
            [(b.start, b.size) for b in am.free_blocks()],
        )

    # -- rules ----------------------------------------------------------

    @rule(size=sizes)
    def allocate(self, size: int) -> None:
        want = aligned(size)
        try:
            address, got = self.am.allocate(size)
        except kvpool.AddressSpaceExhaustedError:
            largest = max((n for _, n in self.gaps()), default=0)
            assert largest < want, f"allocate({size}) failed but a {largest}-byte gap is free"
            return
        assert got == want
        self.record(address, got)

    @rule(data=st.data(), shave=st.integers(0, ALIGN - 1))
    def allocate_a_gap_exactly(self, data: st.DataObject, shave: int) -> None:
        """Ask for exactly the size of a free gap (the request good fit must not miss)."""
        gaps = self.gaps()
        if not gaps:
            return
        _, n = data.draw(st.sampled_from(gaps))
        self.allocate(n - shave)

    @rule(data=st.data(), size=sizes)
    def batch_filling_a_gap(self, data: st.DataObject, size: int) -> None:
        """A batch that exactly one gap can hold, if any gap holds one chunk."""
        want = aligned(size)
        fitting = [n for _, n in self.gaps() if n >= want]
        if not fitting:
            return
        n = data.draw(st.sampled_from(fitting))
        self.batched_allocate(size, n // want)

    @rule(size=sizes, batch=st.integers(min_value=0, max_value=12))
    def batched_allocate(self, size: int, batch: int) -> None:
        want = aligned(size)
        gaps = self.gaps()
        before = self.snapshot()
        try:
            out = self.am.batched_allocate(size, batch)
        except kvpool.AddressSpaceExhaustedError:
            room = sum(n // want for _, n in gaps)
            assert room < batch, f"batched_allocate({size}, {batch}) failed with room for {room}"
            assert self.snapshot() == before, "a failed batch changed the state"
            return
        assert len(out) == batch
        for address, got in out:
            assert got == want
            self.record(address, got)
        if batch and any(n >= batch * want for _, n in gaps):
            starts = [a for a, _ in out]
            assert starts == [starts[0] + i * want for i in range(batch)], (
                f"one gap holds the batch but the chunks are scattered: {starts}"
            )

    @precondition(lambda self: self.live)
    @rule(data=st.data(), exact=st.booleans())
    def free(self, data: st.DataObject, exact: bool) -> None:
        address = data.draw(st.sampled_from(sorted(self.live)))
        size = self.live.pop(address)
        # Either the aligned size or any size that aligns to it.
        given = size if exact else data.draw(st.integers(size - ALIGN + 1, size))
        self.am.free(address, given)
        self.freed.append((address, size))
        del self.freed[:-8]

    @precondition(lambda self: len(self.live) >= 2)
    @rule(data=st.data())
    def free_adjacent_run(self, data: st.DataObject) -> None:
        starts = sorted(self.live)
        runs = [(a, b) for a, b in itertools.pairwise(starts) if a + self.live[a] == b]
        if not runs:
            return
        first, second = data.draw(st.sampled_from(runs))
        total = self.live.pop(first) + self.live.pop(second)
        self.am.free(first, total)

    @rule(size=st.integers(min_value=1, max_value=64 * ALIGN))
    def sbrk(self, size: int) -> None:
        self.am.sbrk(size)
        self.heap += aligned(size)

    def _bad_free(self, address: int, size: int) -> None:
        before = self.snapshot()
        try:
            self.am.free(address, size)
        except kvpool.InvalidHandleError:
            pass
        else:
            raise AssertionError(f"free({address}, {size}) of a non-allocated range succeeded")
        assert self.snapshot() == before, "a rejected free changed the state"
        assert self.am.check_consistency()

    @precondition(lambda self: self.freed)
    @rule(data=st.data())
    def double_free(self, data: st.DataObject) -> None:
        address, size = data.draw(st.sampled_from(self.freed))
        if self.is_live_run(address, size):
            return  # reallocated since: a legitimate free
        self._bad_free(address, size)

    @rule(data=st.data())
    def free_inside_a_gap(self, data: st.DataObject) -> None:
        gaps = self.gaps()
        if not gaps:
            return
        start, n = data.draw(st.sampled_from(gaps))
        offset = data.draw(st.integers(0, n // ALIGN - 1)) * ALIGN
        length = data.draw(st.integers(1, 4)) * ALIGN
        self._bad_free(start + offset, length)

    @precondition(lambda self: any(n > ALIGN for n in self.live.values()))
    @rule(data=st.data(), head=st.booleans())
    def free_part_of_an_allocation(self, data: st.DataObject, head: bool) -> None:
        address, size = data.draw(
            st.sampled_from([(a, n) for a, n in self.live.items() if n > ALIGN])
        )
        cut = data.draw(st.integers(1, size // ALIGN - 1)) * ALIGN
        if head:
            self._bad_free(address, cut)  # the first part only
        else:
            self._bad_free(address + cut, size - cut)  # starts inside the extent

    @rule(beyond=st.integers(0, 16), negative=st.booleans())
    def free_out_of_bounds(self, beyond: int, negative: bool) -> None:
        address = -(beyond + 1) * ALIGN if negative else self.heap + beyond * ALIGN
        self._bad_free(address, ALIGN)

    # -- invariants ------------------------------------------------------------

    @invariant()
    def consistent_with_the_model(self) -> None:
        am = self.am
        assert am.check_consistency()
        used = sum(self.live.values())
        assert am.get_heap_size() == self.heap
        assert am.total_allocated_size == used
        assert am.get_free_size() == self.heap - used
        gaps = self.gaps()
        assert [(b.start, b.size) for b in am.free_blocks()] == gaps
        assert am.num_free_blocks() == len(gaps)
        assert am.largest_free_block() == max((n for _, n in gaps), default=0)


PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
if os.environ.get("KVPOOL_HYPOTHESIS_SHRINK") == "1":
    PHASES.append(Phase.shrink)

AddressManagerMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    phases=PHASES,
)
TestAddressManagerStateful = AddressManagerMachine.TestCase
