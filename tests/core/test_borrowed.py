"""Borrowed memory: objects over a buffer kvpool does not own; no copy, nothing freed."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from kvpool.errors import ArgumentTypeError, InvalidArgumentError, InvalidHandleError
from kvpool.formats import MemoryFormat
from kvpool.pool.borrowed import BorrowedMemory, borrow


def test_a_lent_object_is_the_owners_bytes_both_ways() -> None:
    owner = torch.arange(64, dtype=torch.int16)
    lender = BorrowedMemory(owner)
    assert (lender.address, lender.nbytes) == (owner.data_ptr(), 128)
    obj = lender.lend(
        owner.data_ptr() + 32, 16, [torch.Size([8])], [torch.int16], MemoryFormat.BINARY
    )
    assert obj.data_ptr == owner.data_ptr() + 32
    assert obj.get_shapes() == [torch.Size([8])] and obj.get_dtypes() == [torch.int16]
    assert obj.get_memory_format() is MemoryFormat.BINARY
    assert np.frombuffer(obj.byte_array, dtype=np.int16).tolist() == list(range(16, 24))
    obj.byte_array[:2] = b"\xff\x7f"  # a write lands in the owner's memory
    assert owner[16].item() == 0x7FFF
    obj.ref_count_down()
    assert not obj.is_valid()
    with pytest.raises(InvalidHandleError):
        obj.byte_array  # noqa: B018
    assert owner[16].item() == 0x7FFF and owner[17].item() == 17  # nothing freed or cleared


def test_the_default_layout_is_one_byte_group() -> None:
    buf = bytearray(b"abcdefgh")
    obj = borrow(buf, nbytes=5)
    assert obj.get_shapes() == [torch.Size([5])] and obj.get_dtypes() == [torch.uint8]
    assert bytes(obj.byte_array) == b"abcde"
    obj.ref_count_down()


def test_views_keep_the_owner_alive() -> None:
    lender = BorrowedMemory(torch.full((1 << 16,), 7, dtype=torch.uint8))
    obj = lender.lend(lender.address, 1 << 16)
    view = obj.byte_array
    del lender, obj
    gc.collect()
    assert view[12345] == 7  # the storage is the view's too


@pytest.mark.parametrize(("offset", "nbytes"), [(-1, 4), (0, 0), (60, 8), (64, 1), (1 << 40, 1)])
def test_ranges_outside_the_buffer_are_refused(offset: int, nbytes: int) -> None:
    lender = BorrowedMemory(torch.zeros(64, dtype=torch.uint8))
    with pytest.raises(InvalidArgumentError):
        lender.lend(lender.address + offset, nbytes)


def test_shapes_must_cover_the_range() -> None:
    lender = BorrowedMemory(torch.zeros(64, dtype=torch.uint8))
    with pytest.raises(InvalidArgumentError, match="cover 32 bytes, the lent range 16"):
        lender.lend(lender.address, 16, [torch.Size([16])], [torch.float16])
    with pytest.raises(InvalidArgumentError, match="both shapes and dtypes"):
        lender.lend(lender.address, 16, [torch.Size([16])], None)


@pytest.mark.parametrize(
    ("memory", "error"),
    [
        (b"read-only", InvalidArgumentError),
        (torch.zeros(4, 4)[:, 1], InvalidArgumentError),
        (object(), ArgumentTypeError),
        (17, ArgumentTypeError),
    ],
    ids=["bytes", "strided", "object", "int"],
)
def test_unusable_memory_is_refused(memory: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        BorrowedMemory(memory)
