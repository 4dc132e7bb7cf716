"""AddressManager: allocation, batches, frees with coalescing, bad frees, sbrk, stats."""

from __future__ import annotations

import pytest

import kvpool
from kvpool import AddressManager, FreeBlock

U = 4096  # default alignment unit


def snapshot(am: AddressManager) -> tuple:
    """Everything observable about the manager's state."""
    return (
        am.get_heap_size(),
        am.get_free_size(),
        am.total_allocated_size,
        am.num_free_blocks(),
        am.largest_free_block(),
        [(b.start, b.size) for b in am.free_blocks()],
    )


def fragment(am: AddressManager, units: list[int]) -> list[tuple[int, int]]:
    """Allocate extents of the given unit counts back to back; return them."""
    return [am.allocate(n * U) for n in units]


# -- allocate --------------------------------------------------------------


def test_allocate_returns_aligned_address_and_size() -> None:
    am = AddressManager(16 * U)
    a = am.allocate(1)
    b = am.allocate(U + 1)
    c = am.allocate(U)
    assert a == (0, U)
    assert b == (U, 2 * U)
    assert c == (3 * U, U)
    assert am.total_allocated_size == 4 * U
    assert am.get_free_size() == 12 * U
    assert am.get_heap_size() == 16 * U
    assert am.check_consistency()


@pytest.mark.parametrize("align", [1, 8, 64, 2 << 20])
def test_custom_alignment(align: int) -> None:
    am = AddressManager(64 * align, align)
    addrs = [am.allocate(s) for s in (1, align + 1, 2 * align + 1)]
    for addr, size in addrs:
        assert addr % align == 0 and size % align == 0
    assert [s for _, s in addrs] == [align, 2 * align, 3 * align]
    assert am.compute_aligned_size(align + 1) == 2 * align
    assert am.check_consistency()


@pytest.mark.parametrize(("raw", "aligned"), [(0, 0), (1, U), (U, U), (U + 1, 2 * U)])
def test_compute_aligned_size(raw: int, aligned: int) -> None:
    assert AddressManager(0).compute_aligned_size(raw) == aligned


@pytest.mark.parametrize("size", [0, -1, -U])
def test_allocate_non_positive_size_is_value_error(size: int) -> None:
    am = AddressManager(4 * U)
    before = snapshot(am)
    with pytest.raises(ValueError, match=str(size)) as info:
        am.allocate(size)
    assert isinstance(info.value, kvpool.InvalidArgumentError)
    assert snapshot(am) == before and am.check_consistency()


def test_allocate_when_full_is_runtime_error() -> None:
    am = AddressManager(4 * U)
    am.allocate(3 * U)
    before = snapshot(am)
    with pytest.raises(RuntimeError) as info:
        am.allocate(2 * U)
    assert isinstance(info.value, kvpool.AddressSpaceExhaustedError)
    assert snapshot(am) == before
    am.allocate(U)
    with pytest.raises(RuntimeError):
        am.allocate(1)
    assert am.get_free_size() == 0 and am.num_free_blocks() == 0
    assert am.largest_free_block() == 0
    assert am.check_consistency()


def test_exact_fit_leaves_no_zero_size_block() -> None:
    am = AddressManager(8 * U)
    a, _b, _c = fragment(am, [3, 1, 4])  # fills the space exactly
    assert am.free_blocks() == []
    am.free(*a)
    assert am.free_blocks() == [FreeBlock(0, 3 * U)]
    assert am.allocate(3 * U) == (0, 3 * U)  # the hole, exactly
    assert am.free_blocks() == [] and am.num_free_blocks() == 0
    assert all(b.size > 0 for b in am.free_blocks())
    assert am.check_consistency()


def test_allocate_prefers_fitting_hole_over_top() -> None:
    am = AddressManager(64 * U)
    a, _ = am.allocate(2 * U)
    am.allocate(U)  # keeps the hole apart from the top
    am.free(a, 2 * U)
    assert am.allocate(2 * U)[0] == a


@pytest.mark.parametrize("units", [1, 16, 31, 32, 33, 47, 63, 100, 1000])
def test_allocate_succeeds_when_a_hole_of_exactly_that_size_exists(units: int) -> None:
    """Good fit may choose any block, but must not fail while one block is big enough."""
    am = AddressManager((units + 1) * U)
    a, _ = am.allocate(units * U)
    am.allocate(U)  # the top is now empty
    am.free(a, units * U)
    assert am.largest_free_block() == units * U
    assert am.allocate(units * U) == (0, units * U)
    assert am.check_consistency()


# -- batched_allocate --------------------------------------------------------


def test_batched_allocate_zero_returns_empty_list() -> None:
    am = AddressManager(4 * U)
    before = snapshot(am)
    assert am.batched_allocate(U, 0) == []
    assert snapshot(am) == before


@pytest.mark.parametrize("batch", [-1, -100])
def test_batched_allocate_negative_batch_is_value_error(batch: int) -> None:
    am = AddressManager(4 * U)
    with pytest.raises(kvpool.InvalidArgumentError, match=str(batch)):
        am.batched_allocate(U, batch)
    assert am.total_allocated_size == 0


@pytest.mark.parametrize("size", [0, -5])
def test_batched_allocate_non_positive_size_is_value_error(size: int) -> None:
    am = AddressManager(4 * U)
    with pytest.raises(kvpool.InvalidArgumentError):
        am.batched_allocate(size, 2)
    assert am.total_allocated_size == 0


def test_batched_allocate_consecutive_from_fresh_space() -> None:
    am = AddressManager(32 * U)
    out = am.batched_allocate(U + 7, 5)
    assert out == [(i * 2 * U, 2 * U) for i in range(5)]
    assert am.total_allocated_size == 10 * U
    assert am.check_consistency()


def test_batched_allocate_consecutive_from_one_hole() -> None:
    am = AddressManager(64 * U)
    _, _, hole, _ = fragment(am, [1, 1, 8, 1])
    am.free(hole[0], 8 * U)
    out = am.batched_allocate(U, 6)
    starts = [a for a, _ in out]
    assert starts == [starts[0] + i * U for i in range(6)]
    assert am.check_consistency()


@pytest.mark.parametrize("units", [8, 32, 33, 40, 47])
def test_batched_allocate_consecutive_when_exactly_one_block_fits(units: int) -> None:
    """A smaller hole elsewhere must not split a batch that one hole can hold."""
    am = AddressManager((units + 4) * U)
    big, _, small, _ = fragment(am, [units, 1, 1, 2])  # full; top empty
    am.free(big[0], units * U)
    am.free(small[0], U)
    out = am.batched_allocate(U, units)
    assert [a for a, _ in out] == [i * U for i in range(units)]
    assert am.check_consistency()


def test_batched_allocate_spans_blocks_when_no_single_block_fits() -> None:
    am = AddressManager(10 * U)
    a, _, c, _, e = fragment(am, [2, 1, 3, 1, 3])
    am.free(a[0], 2 * U)
    am.free(c[0], 3 * U)
    am.free(e[0], 3 * U)  # joins the (empty) top
    out = am.batched_allocate(U, 8)
    addrs = sorted(x for x, _ in out)
    assert len(set(addrs)) == 8
    assert all(size == U for _, size in out)
    assert am.get_free_size() == 0
    assert am.check_consistency()


def test_batched_allocate_is_all_or_nothing() -> None:
    am = AddressManager(10 * U)
    a, _, c, _ = fragment(am, [2, 1, 3, 4])
    am.free(a[0], 2 * U)
    am.free(c[0], 3 * U)
    before = snapshot(am)
    with pytest.raises(RuntimeError) as info:
        am.batched_allocate(U, 6)  # 5 units free in all
    assert isinstance(info.value, kvpool.AddressSpaceExhaustedError)
    assert snapshot(am) == before
    with pytest.raises(RuntimeError):
        am.batched_allocate(2 * U, 3)  # 2 + 3 units hold only 2 chunks of 2
    assert snapshot(am) == before
    assert am.check_consistency()
    assert len(am.batched_allocate(2 * U, 2)) == 2


# -- free ----------------------------------------------------------------------


def test_free_coalesces_with_both_neighbours() -> None:
    am = AddressManager(8 * U)
    a, b, c, d = fragment(am, [1, 2, 1, 4])
    am.free(a[0], a[1])
    am.free(c[0], c[1])
    assert am.num_free_blocks() == 2
    am.free(b[0], b[1])
    assert am.free_blocks() == [FreeBlock(0, 4 * U)]
    am.free(d[0], d[1])
    assert am.free_blocks() == [FreeBlock(0, 8 * U)]
    assert am.largest_free_block() == 8 * U
    assert am.total_allocated_size == 0 and am.check_consistency()


def test_free_accepts_requested_size() -> None:
    am = AddressManager(4 * U)
    addr, _ = am.allocate(100)
    am.free(addr, 100)  # the size asked for is aligned by free()
    assert am.get_free_size() == 4 * U and am.check_consistency()


def test_free_of_a_run_of_adjacent_allocations() -> None:
    am = AddressManager(8 * U)
    out = am.batched_allocate(U, 4)
    am.free(out[0][0], 4 * U)
    assert am.total_allocated_size == 0
    assert am.free_blocks() == [FreeBlock(0, 8 * U)]
    assert am.check_consistency()


def _bad_free_cases(am: AddressManager) -> dict[str, tuple[int, int]]:
    """A manager with live [0,2U) [2U,3U), hole [3U,5U), live [5U,7U), top [7U,8U)."""
    fragment(am, [2, 1, 2, 2])
    am.free(3 * U, 2 * U)
    return {
        "double-free": (3 * U, 2 * U),
        "overlaps-free-block": (2 * U, 2 * U),
        "inside-free-block": (4 * U, U),
        "top-region": (7 * U, U),
        "past-the-end": (8 * U, U),
        "far-out-of-bounds": (1 << 40, U),
        "negative-address": (-U, U),
        "partial-head": (0, U),
        "partial-tail": (U, U),
        "too-long": (5 * U, 3 * U),
        "unaligned-address": (5 * U + 8, U),
    }


@pytest.mark.parametrize(
    "case",
    list(_bad_free_cases(AddressManager(8 * U))),
)
def test_bad_free_raises_and_changes_nothing(case: str) -> None:
    am = AddressManager(8 * U)
    address, size = _bad_free_cases(am)[case]
    before = snapshot(am)
    with pytest.raises(kvpool.InvalidHandleError) as info:
        am.free(address, size)
    assert isinstance(info.value, ValueError)
    assert str(address) in str(info.value)
    assert snapshot(am) == before
    assert am.check_consistency()


def test_double_free_after_coalescing_is_detected() -> None:
    am = AddressManager(8 * U)
    a, b, _ = fragment(am, [1, 1, 1])
    am.free(*a)
    am.free(*b)  # coalesced with a
    with pytest.raises(kvpool.InvalidHandleError):
        am.free(*a)
    with pytest.raises(kvpool.InvalidHandleError):
        am.free(*b)
    assert am.get_free_size() == 7 * U and am.check_consistency()


# -- sbrk ------------------------------------------------------------------------


def test_sbrk_grows_the_top() -> None:
    am = AddressManager(2 * U)
    am.allocate(2 * U)
    with pytest.raises(RuntimeError):
        am.allocate(U)
    am.sbrk(U + 1)  # aligned up
    assert am.get_heap_size() == 4 * U
    assert am.get_free_size() == 2 * U
    assert am.free_blocks() == [FreeBlock(2 * U, 2 * U)]
    assert am.allocate(2 * U) == (2 * U, 2 * U)
    assert am.check_consistency()


def test_sbrk_coalesces_with_a_free_top() -> None:
    am = AddressManager(4 * U)
    a, _ = am.allocate(U)
    am.allocate(U)
    am.sbrk(4 * U)
    assert am.num_free_blocks() == 1
    am.free(a, U)
    assert am.num_free_blocks() == 2
    assert am.largest_free_block() == 6 * U
    assert am.allocate(6 * U) == (2 * U, 6 * U)
    assert am.check_consistency()


def test_empty_manager_grows_from_zero() -> None:
    am = AddressManager(0)
    assert am.get_heap_size() == 0 and am.num_free_blocks() == 0
    with pytest.raises(RuntimeError):
        am.allocate(1)
    for _ in range(10):
        am.sbrk(100 * U)  # the size-class table must follow the growth
    assert am.allocate(1000 * U) == (0, 1000 * U)
    assert am.check_consistency()


@pytest.mark.parametrize("size", [0, -U])
def test_sbrk_non_positive_is_value_error(size: int) -> None:
    am = AddressManager(U)
    with pytest.raises(kvpool.InvalidArgumentError):
        am.sbrk(size)
    assert am.get_heap_size() == U


# -- counters --------------------------------------------------------------------


def test_counters_follow_allocations() -> None:
    am = AddressManager(16 * U)
    a, b, c = fragment(am, [1, 2, 3])
    assert am.total_allocated_size == 6 * U
    assert am.num_free_blocks() == 1
    am.free(*b)
    assert am.num_free_blocks() == 2
    assert am.largest_free_block() == 10 * U
    assert am.get_free_size() == 12 * U
    am.free(*c)
    assert am.num_free_blocks() == 1
    am.free(*a)
    assert am.get_free_size() == am.get_heap_size() == 16 * U


def test_repr_mentions_sizes() -> None:
    text = repr(AddressManager(4 * U))
    assert "AddressManager" in text and str(4 * U) in text
