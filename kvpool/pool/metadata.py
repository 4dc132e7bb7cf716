"""The metadata of a memory object: shape, dtype, place, size, counts, format."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from kvpool.errors import InvalidArgumentError
from kvpool.formats import MemoryFormat, get_size_bytes

__all__ = ["MemoryObjMetadata", "check_prefix_sums"]


def _dtype_from_str(text: str) -> torch.dtype:
    value = getattr(torch, text.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise InvalidArgumentError(f"unknown torch dtype {text!r} in serialized metadata")
    return value


@dataclass(slots=True)
class MemoryObjMetadata:
    """Metadata of one memory object.

    Attributes:
        shape: logical shape of the first (or only) group.
        dtype: logical dtype of the first group.
        address: where the object lives in its pool: a byte offset for
            extent pools, a page index for paged pools.
        phy_size: bytes reserved for the object (aligned; >= its size).
        ref_count: references held; the object is freed when both counts
            reach zero.
        pin_count: pins held; a pinned object cannot be evicted.
        fmt: the logical :class:`MemoryFormat`.
        cached_positions: token positions cached in the object, if any.
        shapes: shapes of every group (groups are stored back to back).
        dtypes: dtypes of every group.
    """

    shape: torch.Size
    dtype: torch.dtype | None
    address: int
    phy_size: int
    ref_count: int
    pin_count: int = 0
    fmt: MemoryFormat = MemoryFormat.UNDEFINED
    cached_positions: torch.Tensor | None = None
    shapes: list[torch.Size] | None = None
    dtypes: list[torch.dtype] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialize to plain Python types (for msgpack/JSON).

        ``cached_positions`` is not serialized.
        """
        return {
            "__type__": "MemoryObjMetadata",
            "shape": list(self.shape),
            "dtype": str(self.dtype) if self.dtype is not None else None,
            "address": self.address,
            "phy_size": self.phy_size,
            "ref_count": self.ref_count,
            "pin_count": self.pin_count,
            "fmt": self.fmt.value,
            "shapes": [list(s) for s in self.shapes] if self.shapes else None,
            "dtypes": [str(d) for d in self.dtypes] if self.dtypes else None,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> MemoryObjMetadata:
        """Rebuild metadata serialized by :meth:`to_dict`.

        Raises:
            InvalidArgumentError: a key is missing or a value is malformed.
        """
        try:
            dtype = _dtype_from_str(d["dtype"]) if d["dtype"] else None
            shapes = [torch.Size(s) for s in d["shapes"]] if d.get("shapes") else None
            dtypes = [_dtype_from_str(s) for s in d["dtypes"]] if d.get("dtypes") else None
            return MemoryObjMetadata(
                shape=torch.Size(d["shape"]),
                dtype=dtype,
                address=int(d["address"]),
                phy_size=int(d["phy_size"]),
                ref_count=int(d["ref_count"]),
                pin_count=int(d.get("pin_count", 0)),
                fmt=MemoryFormat(d["fmt"]),
                shapes=shapes,
                dtypes=dtypes,
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, InvalidArgumentError):
                raise
            raise InvalidArgumentError(f"malformed serialized metadata {d!r}: {exc}") from None

    def get_size(self) -> int:
        """Bytes of the logical layout (all groups).

        Raises:
            InvalidArgumentError: no dtype is recorded.
        """
        if self.shapes is not None and self.dtypes is not None:
            return get_size_bytes(self.shapes, self.dtypes)
        if self.dtype is None:
            raise InvalidArgumentError("metadata has no dtype, so it has no byte size")
        return self.shape.numel() * self.dtype.itemsize


def check_prefix_sums(value: object, limit: int) -> list[int]:
    """Validate group byte offsets ``[0, end of group 0, ...]`` ending at most at ``limit``.

    Raises:
        InvalidArgumentError: not non-decreasing ints from 0 to at most ``limit``.
    """
    sums = list(value) if isinstance(value, (list, tuple)) else []
    if (
        not sums
        or any(isinstance(x, bool) or not isinstance(x, int) for x in sums)
        or sums[0] != 0
        or any(b < a for a, b in itertools.pairwise(sums))
        or sums[-1] > limit
    ):
        raise InvalidArgumentError(
            f"group_prefix_sum must be non-decreasing ints from 0 to at most the physical "
            f"size {limit}, got {value!r}"
        )
    return sums
