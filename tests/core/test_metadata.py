"""MemoryObjMetadata (serialization, size) and FreeBlock."""

from __future__ import annotations

import json

import pytest
import torch

import kvpool
from kvpool import FreeBlock, MemoryFormat, MemoryObjMetadata

SINGLE = MemoryObjMetadata(
    shape=torch.Size([2, 4, 16, 8]),
    dtype=torch.bfloat16,
    address=8192,
    phy_size=4096,
    ref_count=3,
    pin_count=2,
    fmt=MemoryFormat.KV_2LTD,
)

MULTI = MemoryObjMetadata(
    shape=torch.Size([2, 3]),
    dtype=torch.float32,
    address=7,
    phy_size=65536,
    ref_count=1,
    pin_count=0,
    fmt=MemoryFormat.KV_MLA_FMT,
    shapes=[torch.Size([2, 3]), torch.Size([5, 1, 4]), torch.Size([9])],
    dtypes=[torch.float32, torch.float16, torch.uint8],
)


@pytest.mark.parametrize("meta", [SINGLE, MULTI], ids=["single", "multi-group"])
def test_to_dict_from_dict_round_trip(meta: MemoryObjMetadata) -> None:
    d = meta.to_dict()
    # Plain types only (what msgpack/JSON can carry).
    back = MemoryObjMetadata.from_dict(json.loads(json.dumps(d)))
    assert back == meta
    assert back.shape.__class__ is torch.Size
    if meta.shapes is not None:
        assert back.shapes is not None and back.dtypes is not None
        assert all(s.__class__ is torch.Size for s in back.shapes)
        assert back.dtypes == meta.dtypes
    assert back.get_size() == meta.get_size()


def test_to_dict_keys_of_reference() -> None:
    d = MULTI.to_dict()
    assert d["__type__"] == "MemoryObjMetadata"
    assert d["shape"] == [2, 3]
    assert d["dtype"] == "torch.float32"
    assert d["fmt"] == MemoryFormat.KV_MLA_FMT.value
    assert d["shapes"] == [[2, 3], [5, 1, 4], [9]]
    assert d["dtypes"] == ["torch.float32", "torch.float16", "torch.uint8"]
    assert (d["address"], d["phy_size"], d["ref_count"]) == (7, 65536, 1)


def test_from_dict_accepts_reference_dict_without_pin_count() -> None:
    # The reference's to_dict() has no pin_count key.
    d = SINGLE.to_dict()
    del d["pin_count"]
    back = MemoryObjMetadata.from_dict(d)
    assert back.pin_count == 0
    assert (back.shape, back.dtype, back.address) == (SINGLE.shape, SINGLE.dtype, 8192)


def test_cached_positions_not_serialized() -> None:
    meta = MemoryObjMetadata(
        torch.Size([4]), torch.uint8, 0, 4, 1, cached_positions=torch.arange(4)
    )
    d = meta.to_dict()
    assert "cached_positions" not in d
    assert MemoryObjMetadata.from_dict(d).cached_positions is None


def test_dtype_none_round_trip() -> None:
    meta = MemoryObjMetadata(torch.Size([10, 0, 0, 0]), None, 0, 0, 1, 0, MemoryFormat.BINARY)
    back = MemoryObjMetadata.from_dict(meta.to_dict())
    assert back.dtype is None and back == meta


def test_get_size_single_and_multi_group() -> None:
    assert SINGLE.get_size() == 2 * 4 * 16 * 8 * 2
    assert MULTI.get_size() == 6 * 4 + 20 * 2 + 9
    assert MULTI.get_size() == kvpool.get_size_bytes(MULTI.shapes, MULTI.dtypes)


def test_get_size_without_dtype_is_a_typed_error() -> None:
    meta = MemoryObjMetadata(torch.Size([4]), None, 0, 0, 1)
    with pytest.raises(kvpool.InvalidArgumentError):
        meta.get_size()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("shape"),
        lambda d: d.update(dtype="torch.not_a_dtype"),
        lambda d: d.update(fmt=99),
        lambda d: d.update(address="x"),
        lambda d: d.update(dtypes=["torch.float32", "nope"]),
    ],
    ids=["missing-shape", "bad-dtype", "bad-fmt", "bad-address", "bad-group-dtype"],
)
def test_from_dict_malformed_is_invalid_argument(mutate) -> None:
    d = MULTI.to_dict()
    mutate(d)
    with pytest.raises(kvpool.InvalidArgumentError):
        MemoryObjMetadata.from_dict(d)


def test_free_block() -> None:
    a = FreeBlock(start=0, size=4096)
    assert a.can_be_coalesced(FreeBlock(4096, 10))
    assert not a.can_be_coalesced(FreeBlock(8192, 10))
    assert not FreeBlock(4096, 10).can_be_coalesced(a)
    assert a == FreeBlock(0, 4096)
