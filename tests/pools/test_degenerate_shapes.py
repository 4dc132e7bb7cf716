"""Memory objects whose shape and bytes disagree raise typed errors, not torch's or IndexError.

A ``TensorMemoryObj`` built by hand can carry any metadata: an empty shape
(``torch.Size([])``), a shape with fewer dims than its format's token dim,
or a layout larger than its bytes; a pooled one can be narrowed by
``group_prefix_sum`` to a byte count its dtype does not divide.  The token
count and the tensor views of such objects raise ``InvalidArgumentError``
(a ``ValueError``) naming the shape and the bytes; sound objects, zero-sized
dims included, still work.
"""

from __future__ import annotations

import pytest
import torch

import kvpool
from kvpool import MemoryFormat, MemoryObjMetadata, TensorMemoryObj
from kvpool.errors import InvalidArgumentError


def _by_hand(shape: torch.Size, nbytes: int, fmt: MemoryFormat) -> TensorMemoryObj:
    raw = torch.zeros(nbytes, dtype=torch.uint8)
    meta = MemoryObjMetadata(shape, torch.float16, 0, nbytes, 1, fmt=fmt)
    return TensorMemoryObj(raw, meta, None)


@pytest.mark.parametrize(
    ("shape", "fmt"),
    [
        (torch.Size([]), MemoryFormat.KV_2LTD),
        (torch.Size([]), MemoryFormat.UNDEFINED),
        (torch.Size([0, 0]), MemoryFormat.KV_2LTD),
        (torch.Size([8]), MemoryFormat.KV_T2D),
    ],
)
def test_a_shape_without_token_dim_has_a_typed_token_count_error(
    shape: torch.Size, fmt: MemoryFormat
) -> None:
    obj = _by_hand(shape, 2 * shape.numel(), fmt)
    with pytest.raises(InvalidArgumentError, match="no token dimension") as info:
        obj.get_num_tokens()
    assert type(info.value) is InvalidArgumentError
    assert f"shape {tuple(shape)}" in str(info.value) and fmt.name in str(info.value)


def test_an_empty_shape_over_no_bytes_has_typed_view_errors() -> None:
    obj = _by_hand(torch.Size([]), 0, MemoryFormat.KV_2LTD)
    for view in (lambda: obj.tensor, lambda: obj.get_tensor(0)):
        with pytest.raises(InvalidArgumentError, match=r"0 bytes cannot be viewed as shape \(\)"):
            view()


def test_a_layout_larger_than_its_bytes_has_typed_view_errors() -> None:
    raw = torch.zeros(4, dtype=torch.uint8)
    meta = MemoryObjMetadata(torch.Size([2, 4]), torch.float16, 0, 4, 1)
    obj = TensorMemoryObj(raw, meta, None)
    for view in (lambda: obj.tensor, lambda: obj.get_tensor(-1)):
        with pytest.raises(InvalidArgumentError, match=r"4 bytes .* \(2, 4\) .* \(16 bytes\)"):
            view()


def test_a_narrowed_group_its_dtype_does_not_divide_has_typed_view_errors() -> None:
    pool = kvpool.TensorMemoryAllocator(torch.empty(1 << 16, dtype=torch.uint8))
    obj = pool.allocate(torch.Size([2, 4, 16, 32]), torch.float16, MemoryFormat.KV_2LTD)
    assert obj is not None
    obj.group_prefix_sum = [0, 3]
    for view in (lambda: obj.tensor, lambda: obj.get_tensor(0)):
        with pytest.raises(InvalidArgumentError, match="3 bytes cannot be viewed"):
            view()
    obj.ref_count_down()
    pool.close()


@pytest.mark.parametrize(
    ("shape", "fmt", "tokens"),
    [
        (torch.Size([2, 0, 16, 32]), MemoryFormat.KV_2LTD, 16),
        (torch.Size([2, 4, 0, 32]), MemoryFormat.KV_2LTD, 0),
        (torch.Size([0]), MemoryFormat.UNDEFINED, 0),
        (torch.Size([3]), MemoryFormat.UNDEFINED, 3),
    ],
)
def test_sound_shapes_still_work(shape: torch.Size, fmt: MemoryFormat, tokens: int) -> None:
    obj = _by_hand(shape, 2 * shape.numel(), fmt)
    assert obj.get_num_tokens() == tokens
    tensor = obj.tensor
    assert tensor is not None and tensor.shape == shape and tensor.dtype == torch.float16
    group = obj.get_tensor(0)
    assert group is not None and group.shape == shape


def test_a_scalar_shape_over_its_bytes_is_a_scalar_view() -> None:
    obj = _by_hand(torch.Size([]), 2, MemoryFormat.UNDEFINED)
    tensor = obj.tensor
    assert tensor is not None and tensor.shape == torch.Size([]) and tensor.numel() == 1
