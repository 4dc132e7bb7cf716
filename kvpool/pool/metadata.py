"""The metadata of a memory object: shape, dtype, place, size, counts, format."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kvpool.checks import check_int
from kvpool.errors import ArgumentTypeError, InvalidArgumentError, KVPoolError
from kvpool.formats import MemoryFormat, get_size_bytes, layout_bytes

__all__ = ["MemoryObjMetadata", "check_prefix_sums", "new_metadata", "no_token_dim", "view_error"]


def _dtype_from_str(text: object) -> torch.dtype:
    if not isinstance(text, str):
        raise ArgumentTypeError(
            f"a serialized dtype must be a str such as 'torch.float16', got {text!r}"
        )
    value = getattr(torch, text.removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise InvalidArgumentError(f"unknown torch dtype {text!r} in serialized metadata")
    return value


def _items(value: object) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise ArgumentTypeError(f"expected a list in serialized metadata, got {value!r}")
    return list(value)


def _shape(value: object) -> torch.Size:
    """A serialized shape (a list of ints >= 0) as a ``torch.Size``."""
    dims = [check_int("a shape dimension", d, low=0) for d in _items(value)]
    return torch.Size(dims)


def _brief(d: Mapping[str, Any]) -> str:
    text = repr(dict(d))
    return text if len(text) <= 200 else text[:200] + "...}"


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
            InvalidArgumentError: ``d`` is not a mapping, a key is missing or
                a value is malformed (``ArgumentTypeError`` for a wrong type).
        """
        if not isinstance(d, Mapping):
            raise ArgumentTypeError(
                f"serialized metadata must be a dict (from to_dict()), got {type(d).__name__}"
            )
        try:
            dtype = _dtype_from_str(d["dtype"]) if d["dtype"] is not None else None
            raw_shapes = d.get("shapes")
            raw_dtypes = d.get("dtypes")
            shapes = [_shape(s) for s in _items(raw_shapes)] if raw_shapes is not None else None
            dtypes = [_dtype_from_str(s) for s in _items(raw_dtypes)] if raw_dtypes else None
            meta = MemoryObjMetadata(
                shape=_shape(d["shape"]),
                dtype=dtype,
                address=check_int("address", d["address"], low=0),
                phy_size=check_int("phy_size", d["phy_size"], low=0),
                ref_count=check_int("ref_count", d["ref_count"]),
                pin_count=check_int("pin_count", d.get("pin_count", 0)),
                fmt=MemoryFormat(d["fmt"]),
                shapes=shapes or None,
                dtypes=dtypes,
            )
            if dtype is not None:  # the layout is sane (sizes within int64)
                layout_bytes(meta.shape, dtype)
                meta.get_size()
            return meta
        except KVPoolError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as exc:
            raise InvalidArgumentError(
                f"malformed serialized metadata {_brief(d)}: {type(exc).__name__}: {exc}"
            ) from None

    def get_size(self) -> int:
        """Bytes of the logical layout (all groups).

        Raises:
            InvalidArgumentError: no dtype is recorded.
        """
        if self.shapes is not None and self.dtypes is not None:
            return get_size_bytes(self.shapes, self.dtypes)
        if self.dtype is None:
            raise InvalidArgumentError("metadata has no dtype, so it has no byte size")
        return layout_bytes(self.shape, self.dtype)


_new = object.__new__
_init = MemoryObjMetadata.__init__  # the dataclass's own: kvpool guards the public one


def new_metadata(
    shape: torch.Size,
    dtype: torch.dtype | None,
    address: int,
    phy_size: int,
    ref_count: int,
    pin_count: int,
    fmt: MemoryFormat,
    cached_positions: torch.Tensor | None,
    shapes: list[torch.Size] | None,
    dtypes: list[torch.dtype] | None,
) -> MemoryObjMetadata:
    """``MemoryObjMetadata(...)`` (every field, by position) for the pools' allocation hot path.

    The public constructor refuses unknown keywords through a wrapper
    (:func:`kvpool.checks.refuse_unknown_keywords`); the pools, which pass
    every field by position, build their metadata without it.
    """
    meta = _new(MemoryObjMetadata)
    _init(
        meta,
        shape,
        dtype,
        address,
        phy_size,
        ref_count,
        pin_count,
        fmt,
        cached_positions,
        shapes,
        dtypes,
    )
    return meta


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


def no_token_dim(who: object, meta: MemoryObjMetadata) -> InvalidArgumentError:
    """The error of a token count asked of ``meta``, whose shape lacks its format's token dim.

    Args:
        who: the object (named by its repr).
        meta: its metadata.
    """
    dim = meta.fmt.token_dim()
    return InvalidArgumentError(
        f"{who!r} has shape {tuple(meta.shape)}, which has no token dimension: format "
        f"{meta.fmt.name} counts tokens in dim {dim}, so the shape needs at least {dim + 1} "
        "dims; build the object with a shape of its format's layout"
    )


def view_error(
    who: object,
    data: torch.Tensor,
    shape: torch.Size,
    dtype: torch.dtype,
    exc: RuntimeError,
    index: int | None = None,
) -> InvalidArgumentError:
    """The error of a view an object's bytes cannot give (its metadata and bytes disagree).

    Args:
        who: the object (named by its repr).
        data: the bytes that were to be viewed.
        shape, dtype: the view asked for.
        exc: torch's refusal.
        index: the group, for a view of one group.
    """
    have = data.numel() * data.element_size()
    need = math.prod(shape) * dtype.itemsize
    group = "" if index is None else f"group {index}: "
    return InvalidArgumentError(
        f"{who!r}: {group}its {have} bytes cannot be viewed as shape {tuple(shape)} of {dtype} "
        f"({need} bytes): {exc}. Its raw_data must be a contiguous tensor holding the "
        "metadata's layout (shape x dtype, or group_prefix_sum)"
    )
