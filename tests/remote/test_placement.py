"""Placed gets: every store reads each key's entry into the range placed for it, in place."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kvpool.errors import CorruptEntryError, InvalidArgumentError
from kvpool.formats import MemoryFormat
from kvpool.pool.borrowed import BorrowedMemory
from kvpool.remote.placement import Placement

from .store_targets import HEADERLESS_KINDS, KINDS, Target, make_target

PAGE = 4096
SHAPE, DTYPE, FMT = [torch.Size([PAGE // 2])], [torch.bfloat16], MemoryFormat.UNDEFINED


@pytest.fixture(params=KINDS + HEADERLESS_KINDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    yield from make_target(request, request.param, tmp_path)


def _pages(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n * PAGE,), dtype=torch.uint8, generator=gen)


def _lend(lender: BorrowedMemory, page: int) -> object:
    return lender.lend(lender.address + page * PAGE, PAGE, SHAPE, DTYPE, FMT)


def test_a_placed_batch_lands_in_the_chosen_pages(target: Target) -> None:
    source = _pages(6, seed=1)
    src = BorrowedMemory(source)
    keys = [f"page-{i}" for i in range(5)]
    objs = [_lend(src, i) for i in range(5)]
    target.call("batched_put", keys, objs)
    for obj in objs:
        obj.ref_count_down()
    dest = torch.zeros(8 * PAGE, dtype=torch.uint8)
    lender = BorrowedMemory(dest)
    place = Placement()
    # Out of order, one key never written; a key asked twice lands in its one place.
    wanted = ["page-3", "page-0", "missing", "page-4"]
    for slot, key in enumerate(wanted):
        place.add(key, lender, lender.address + (slot + 1) * PAGE, PAGE)
    got = target.call("batched_get", [*wanted, "page-3"], place, SHAPE, DTYPE, FMT)
    assert [o is not None for o in got] == [True, True, False, True, True]
    assert got[4].data_ptr == got[0].data_ptr
    got.pop().ref_count_down()
    for slot, (key, obj) in enumerate(zip(wanted, got, strict=True)):
        page = dest[(slot + 1) * PAGE : (slot + 2) * PAGE]
        if obj is None:
            assert not page.any()  # a miss leaves the page as it was
            continue
        assert obj.data_ptr == lender.address + (slot + 1) * PAGE  # read in place
        src_page = int(key.split("-")[1])
        assert torch.equal(page, source[src_page * PAGE : (src_page + 1) * PAGE])
        obj.ref_count_down()
    assert not dest[:PAGE].any() and not dest[5 * PAGE :].any()  # nothing outside the pages
    # A single get takes the placement too.
    one = target.call("get", "page-0", place, SHAPE, DTYPE, FMT)
    assert one is not None and one.data_ptr == lender.address + 2 * PAGE
    one.ref_count_down()


def test_an_entry_of_another_size_is_refused_not_spilled(target: Target) -> None:
    source = _pages(2, seed=2)
    src = BorrowedMemory(source)
    big = src.lend(src.address, 2 * PAGE, [torch.Size([PAGE])], DTYPE, FMT)
    target.call("put", "big", big)
    big.ref_count_down()
    dest = torch.zeros(3 * PAGE, dtype=torch.uint8)
    lender = BorrowedMemory(dest)
    place = Placement()
    place.add("big", lender, lender.address + PAGE, PAGE)
    # A stored layout says the size (InvalidArgumentError); a headerless entry only its length.
    with pytest.raises((InvalidArgumentError, CorruptEntryError)):
        target.call("get", "big", place, SHAPE, DTYPE, FMT)
    assert not dest[2 * PAGE :].any()  # nothing written past the placed range


def test_a_key_without_a_place_and_a_range_outside_are_refused() -> None:
    lender = BorrowedMemory(torch.zeros(PAGE, dtype=torch.uint8))
    place = Placement()
    with pytest.raises(InvalidArgumentError, match="outside"):
        place.add("k", lender, lender.address + 1, PAGE)
    with pytest.raises(InvalidArgumentError, match="no memory was placed"):
        place.for_key(b"k")
    with pytest.raises(InvalidArgumentError, match="per key"):
        place.allocate(SHAPE, DTYPE, FMT)
