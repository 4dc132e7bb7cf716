"""Bad input everywhere: a typed exception that is also a ValueError, naming the value.

Every public call validates its arguments (wrong types, negative sizes,
mismatched shapes/dtypes lengths, a fmt that is not a MemoryFormat, a
non-contiguous tensor, a buffer that is not a whole number of pages) and
raises :class:`kvpool.InvalidArgumentError` (a ``ValueError``) whose
message names the offending value - never a ``TypeError`` from deep inside,
an ``AssertionError`` or a crash.  Objects passed where a handle of the
pool is expected may raise :class:`kvpool.InvalidHandleError` instead (also
a ``ValueError``).  A rejected call changes nothing.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from core_helpers import PAGED_BYTES, PAGED_DTYPE, PAGED_SHAPE

import kvpool
from kvpool import (
    AddressManager,
    BytesBufferMemoryObj,
    GDSMemoryObject,
    MemoryObjMetadata,
    PagedTensorMemoryAllocator,
    TensorMemoryAllocator,
    TensorMemoryObj,
)

U = 4096
S = torch.Size([4, 8])
D = torch.float16
BUF = torch.zeros(16 * U, dtype=torch.uint8)
STRIDED = torch.zeros(2 * 16 * U, dtype=torch.uint8)[::2]


def context() -> SimpleNamespace:
    extent = TensorMemoryAllocator(torch.zeros(16 * U, dtype=torch.uint8))
    paged = PagedTensorMemoryAllocator(
        torch.zeros(4 * PAGED_BYTES, dtype=torch.uint8), [PAGED_SHAPE], [PAGED_DTYPE]
    )
    return SimpleNamespace(
        am=AddressManager(16 * U),
        extent=extent,
        paged=paged,
        obj=extent.allocate(S, D),
        page_obj=paged.allocate(PAGED_SHAPE, PAGED_DTYPE),
    )


# name -> (call, text the message must contain, or None when the value has no short repr)
ARGUMENT_CASES = {
    # AddressManager
    "AddressManager(size='1')": (lambda c: AddressManager("1"), "'1'"),
    "AddressManager(size=-1)": (lambda c: AddressManager(-1), "-1"),
    "AddressManager(size=1.5)": (lambda c: AddressManager(1.5), "1.5"),
    "AddressManager(align=0)": (lambda c: AddressManager(U, 0), "0"),
    "AddressManager(align=3)": (lambda c: AddressManager(U, 3), "3"),
    "AddressManager(align=-8)": (lambda c: AddressManager(U, -8), "-8"),
    "AddressManager(align='64')": (lambda c: AddressManager(U, "64"), "'64'"),
    "allocate('x')": (lambda c: c.am.allocate("x"), "'x'"),
    "allocate(None)": (lambda c: c.am.allocate(None), "None"),
    "allocate(1.5)": (lambda c: c.am.allocate(1.5), "1.5"),
    "allocate(True)": (lambda c: c.am.allocate(True), "True"),
    "allocate(-4)": (lambda c: c.am.allocate(-4), "-4"),
    "allocate(0)": (lambda c: c.am.allocate(0), "0"),
    "batched_allocate(size='x')": (lambda c: c.am.batched_allocate("x", 2), "'x'"),
    "batched_allocate(size=0)": (lambda c: c.am.batched_allocate(0, 2), "0"),
    "batched_allocate(batch='2')": (lambda c: c.am.batched_allocate(U, "2"), "'2'"),
    "batched_allocate(batch=2.0)": (lambda c: c.am.batched_allocate(U, 2.0), "2.0"),
    "batched_allocate(batch=-1)": (lambda c: c.am.batched_allocate(U, -1), "-1"),
    "free(address='0')": (lambda c: c.am.free("0", U), "'0'"),
    "free(address=None)": (lambda c: c.am.free(None, U), "None"),
    "free(address=1.5)": (lambda c: c.am.free(1.5, U), "1.5"),
    "free(address=[0])": (lambda c: c.am.free([0], U), "[0]"),
    "free(address={})": (lambda c: c.am.free({}, U), "{}"),
    "free(size='4096')": (lambda c: c.am.free(0, "4096"), "'4096'"),
    "free(size=None)": (lambda c: c.am.free(0, None), "None"),
    "free(size=-4096)": (lambda c: c.am.free(0, -U), "-4096"),
    "free(size=0)": (lambda c: c.am.free(0, 0), "0"),
    "sbrk('x')": (lambda c: c.am.sbrk("x"), "'x'"),
    "sbrk(None)": (lambda c: c.am.sbrk(None), "None"),
    "sbrk(-1)": (lambda c: c.am.sbrk(-1), "-1"),
    "sbrk(2.5)": (lambda c: c.am.sbrk(2.5), "2.5"),
    "compute_aligned_size('x')": (lambda c: c.am.compute_aligned_size("x"), "'x'"),
    "compute_aligned_size(None)": (lambda c: c.am.compute_aligned_size(None), "None"),
    "compute_aligned_size(-1)": (lambda c: c.am.compute_aligned_size(-1), "-1"),
    # get_size_bytes
    "get_size_bytes(mismatched)": (lambda c: kvpool.get_size_bytes([S], [D, D]), "2"),
    "get_size_bytes(dtype str)": (lambda c: kvpool.get_size_bytes([S], ["float16"]), "float16"),
    "get_size_bytes(shape str)": (lambda c: kvpool.get_size_bytes(["x"], [D]), "'x'"),
    "get_size_bytes(None, [D])": (lambda c: kvpool.get_size_bytes(None, [D]), "None"),
    "get_size_bytes(Size, dtype)": (lambda c: kvpool.get_size_bytes(S, D), "float16"),
    # TensorMemoryAllocator
    "TMA(tensor=list)": (lambda c: TensorMemoryAllocator([1, 2]), "list"),
    "TMA(tensor=None)": (lambda c: TensorMemoryAllocator(None), "None"),
    "TMA(non-contiguous)": (lambda c: TensorMemoryAllocator(STRIDED), "contiguous"),
    "TMA(align=0)": (lambda c: TensorMemoryAllocator(BUF, 0), "0"),
    "TMA(align=3000)": (lambda c: TensorMemoryAllocator(BUF, 3000), "3000"),
    "TMA(align='4096')": (lambda c: TensorMemoryAllocator(BUF, "4096"), "'4096'"),
    "TMA(init=-1)": (lambda c: TensorMemoryAllocator(BUF, U, -1), "-1"),
    "TMA(init='x')": (lambda c: TensorMemoryAllocator(BUF, U, "x"), "'x'"),
    "TMA(init=1.5)": (lambda c: TensorMemoryAllocator(BUF, U, 1.5), "1.5"),
    "TMA(init>size)": (lambda c: TensorMemoryAllocator(BUF, U, 17 * U), str(17 * U)),
    "TMA.allocate(shapes='x')": (lambda c: c.extent.allocate("x", D), "'x'"),
    "TMA.allocate(shapes=None)": (lambda c: c.extent.allocate(None, D), "None"),
    "TMA.allocate(shapes=5)": (lambda c: c.extent.allocate(5, D), "5"),
    "TMA.allocate(shapes=[])": (lambda c: c.extent.allocate([], D), "[]"),
    "TMA.allocate(shapes=[S,'x'])": (lambda c: c.extent.allocate([S, "x"], [D, D]), "'x'"),
    "TMA.allocate(negative dim)": (lambda c: c.extent.allocate((2, -3), D), "-3"),
    "TMA.allocate(zero bytes)": (lambda c: c.extent.allocate(torch.Size([0, 4]), D), "0"),
    "TMA.allocate(dtypes='f16')": (lambda c: c.extent.allocate(S, "f16"), "'f16'"),
    "TMA.allocate(dtypes=None)": (lambda c: c.extent.allocate(S, None), "None"),
    "TMA.allocate(mismatched)": (lambda c: c.extent.allocate([S], [D, D]), "2"),
    "TMA.allocate(fmt=1)": (lambda c: c.extent.allocate(S, D, 1), "1"),
    "TMA.allocate(fmt=str)": (lambda c: c.extent.allocate(S, D, "KV_2LTD"), "'KV_2LTD'"),
    "TMA.allocate(fmt=None)": (lambda c: c.extent.allocate(S, D, None), "None"),
    "TMA.batched(batch='2')": (lambda c: c.extent.batched_allocate(S, D, "2"), "'2'"),
    "TMA.batched(batch=-1)": (lambda c: c.extent.batched_allocate(S, D, -1), "-1"),
    "TMA.batched(batch=1.0)": (lambda c: c.extent.batched_allocate(S, D, 1.0), "1.0"),
    "TMA.batched(batch=None)": (lambda c: c.extent.batched_allocate(S, D, None), "None"),
    "TMA.batched(fmt=2)": (lambda c: c.extent.batched_allocate(S, D, 1, 2), "2"),
    "TMA.batched(mismatched)": (lambda c: c.extent.batched_allocate([S, S], [D], 1), "1"),
    # PagedTensorMemoryAllocator
    "Paged(tensor=None)": (lambda c: PagedTensorMemoryAllocator(None, [S], [D]), "None"),
    "Paged(non-contiguous)": (
        lambda c: PagedTensorMemoryAllocator(STRIDED, [S], [D]),
        "contiguous",
    ),
    "Paged(not whole pages)": (
        lambda c: PagedTensorMemoryAllocator(BUF[:1000], [S], [D]),
        "1000",
    ),
    "Paged(mismatched)": (lambda c: PagedTensorMemoryAllocator(BUF, [S], [D, D]), "2"),
    "Paged(shapes='x')": (lambda c: PagedTensorMemoryAllocator(BUF, "x", [D]), "'x'"),
    "Paged(dtypes='x')": (lambda c: PagedTensorMemoryAllocator(BUF, [S], "x"), "'x'"),
    "Paged(fmt=1)": (lambda c: PagedTensorMemoryAllocator(BUF, [S], [D], 1), "1"),
    "Paged(zero page)": (
        lambda c: PagedTensorMemoryAllocator(BUF, [torch.Size([0])], [D]),
        "0",
    ),
    "Paged.allocate(larger than a page)": (
        lambda c: c.paged.allocate(torch.Size([2, 2, 17, 8]), PAGED_DTYPE),
        "17",
    ),
    "Paged.allocate(shapes=None)": (lambda c: c.paged.allocate(None, PAGED_DTYPE), "None"),
    "Paged.allocate(dtypes='x')": (lambda c: c.paged.allocate(PAGED_SHAPE, "x"), "'x'"),
    "Paged.allocate(fmt='x')": (lambda c: c.paged.allocate(PAGED_SHAPE, PAGED_DTYPE, "x"), "'x'"),
    "Paged.batched(batch=-2)": (
        lambda c: c.paged.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, -2),
        "-2",
    ),
    "Paged.batched(batch='1')": (
        lambda c: c.paged.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, "1"),
        "'1'",
    ),
    # memory objects
    "TensorMemoryObj(raw=list)": (
        lambda c: TensorMemoryObj([0], MemoryObjMetadata(S, D, 0, 64, 1)),
        "list",
    ),
    "TensorMemoryObj(meta=dict)": (
        lambda c: TensorMemoryObj(torch.zeros(64, dtype=torch.uint8), {}),
        "dict",
    ),
    "TensorMemoryObj(meta.dtype=None)": (
        lambda c: TensorMemoryObj(
            torch.zeros(64, dtype=torch.uint8), MemoryObjMetadata(S, None, 0, 64, 1)
        ),
        "dtype",
    ),
    "set_used_size('3')": (lambda c: c.obj.set_used_size("3"), "'3'"),
    "set_used_size(1.5)": (lambda c: c.obj.set_used_size(1.5), "1.5"),
    "set_used_size(None)": (lambda c: c.obj.set_used_size(None), "None"),
    "set_used_size(-1)": (lambda c: c.obj.set_used_size(-1), "-1"),
    "set_used_size(phy+1)": (lambda c: c.obj.set_used_size(U + 1), str(U + 1)),
    "paged set_used_size(page+1)": (
        lambda c: c.page_obj.set_used_size(PAGED_BYTES + 1),
        str(PAGED_BYTES + 1),
    ),
    "get_tensor('a')": (lambda c: c.obj.get_tensor("a"), "'a'"),
    "get_tensor(None)": (lambda c: c.obj.get_tensor(None), "None"),
    "get_tensor(1.5)": (lambda c: c.obj.get_tensor(1.5), "1.5"),
    "raw_data = 5": (lambda c: setattr(c.obj, "raw_data", 5), "int"),
    "BytesBufferMemoryObj(123)": (lambda c: BytesBufferMemoryObj(123), "int"),
    "BytesBufferMemoryObj(str)": (lambda c: BytesBufferMemoryObj("abc"), "str"),
    "GDSMemoryObject('x')": (lambda c: GDSMemoryObject("x"), "str"),
    "MemoryObjMetadata.from_dict(None)": (lambda c: MemoryObjMetadata.from_dict(None), "None"),
    "MemoryObjMetadata.from_dict({})": (lambda c: MemoryObjMetadata.from_dict({}), "{}"),
}

# Handles that are not the pool's own: InvalidHandleError (or InvalidArgumentError).
HANDLE_CASES = {
    "TMA.free('x')": lambda c: c.extent.free("x"),
    "TMA.free(None)": lambda c: c.extent.free(None),
    "TMA.free(paged object)": lambda c: c.extent.free(c.page_obj),
    "TMA.batched_free(5)": lambda c: c.extent.batched_free(5),
    "TMA.batched_free(an object, not a list)": lambda c: c.extent.batched_free(c.obj),
    "TMA.batched_free([obj, 'x'])": lambda c: c.extent.batched_free([c.obj, "x"]),
    "Paged.free(extent object)": lambda c: c.paged.free(c.obj),
    "Paged.batched_free(5)": lambda c: c.paged.batched_free(5),
    "Paged.batched_free(an object, not a list)": lambda c: c.paged.batched_free(c.page_obj),
    "Paged.batched_free([obj, None])": lambda c: c.paged.batched_free([c.page_obj, None]),
}


def _state(c: SimpleNamespace) -> tuple:
    return (
        c.extent.stats(),
        c.paged.stats(),
        c.obj.is_valid(),
        c.obj.get_size(),
        c.page_obj.is_valid(),
        c.page_obj.get_size(),
        c.am.get_heap_size(),
        c.am.get_free_size(),
    )


@pytest.mark.parametrize("case", list(ARGUMENT_CASES))
def test_bad_argument_is_invalid_argument_error(case: str) -> None:
    call, named = ARGUMENT_CASES[case]
    c = context()
    before = _state(c)
    try:
        call(c)
    except kvpool.InvalidArgumentError as exc:
        assert isinstance(exc, ValueError)
        if named is not None:
            assert named in str(exc), f"the message does not name {named}: {exc}"
    except BaseException as exc:
        pytest.fail(f"{case} raised {type(exc).__name__}: {exc} (expected InvalidArgumentError)")
    else:
        pytest.fail(f"{case} was accepted")
    assert _state(c) == before
    assert c.extent.memcheck() and c.paged.memcheck() and c.am.check_consistency()


@pytest.mark.parametrize("case", list(HANDLE_CASES))
def test_foreign_handle_is_a_typed_value_error(case: str) -> None:
    c = context()
    before = _state(c)
    try:
        HANDLE_CASES[case](c)
    except (kvpool.InvalidHandleError, kvpool.InvalidArgumentError) as exc:
        assert isinstance(exc, ValueError)
    except BaseException as exc:
        pytest.fail(f"{case} raised {type(exc).__name__}: {exc} (expected a typed ValueError)")
    else:
        pytest.fail(f"{case} was accepted")
    assert _state(c) == before
    assert c.extent.memcheck() and c.paged.memcheck()
