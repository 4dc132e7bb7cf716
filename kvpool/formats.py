"""Memory formats and the shape/dtype arithmetic every pool shares."""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum

import torch

from kvpool.checks import TypedEnumLookup
from kvpool.errors import ArgumentTypeError, InvalidArgumentError

__all__ = [
    "MAX_LAYOUT_BYTES",
    "MemoryFormat",
    "format_hint",
    "get_size_bytes",
    "layout_bytes",
    "normalize_layout",
]

#: The most bytes a layout may describe: what an int64 (torch's sizes, the
#: store headers) can count.  Larger layouts are refused, not wrapped.
MAX_LAYOUT_BYTES = (1 << 63) - 1


def format_hint(value: object) -> str:
    """A fix for a format given by name: ``"; use MemoryFormat.X"`` ('' if none applies)."""
    if isinstance(value, str):
        name = value.removeprefix("MemoryFormat.").upper()
        if name in MemoryFormat.__members__:
            return (
                f"; {value!r} is a str: pass the member MemoryFormat.{name} "
                f"(or MemoryFormat[{name!r}])"
            )
        return f"; {value!r} is a str: pass a MemoryFormat member, e.g. MemoryFormat.KV_2LTD"
    return ""


class MemoryFormat(Enum, metaclass=TypedEnumLookup):
    """The logical layout of the bytes of a memory object.

    Members (``num_tokens`` is abbreviated T, ``num_layers`` L and the
    hidden dimension D):

    * ``UNDEFINED`` - no layout.
    * ``KV_2LTD`` - ``[2, L, T, D]``: K and V of every layer.
    * ``KV_T2D`` - ``[T, 2, D]``: one layer, tokens first.
    * ``KV_2TD`` - ``[2, T, D]``: one layer, K/V first.
    * ``BINARY`` - an opaque byte string (e.g. compressed KV).
    * ``BINARY_BUFFER`` - bytes held in an ordinary Python buffer rather
      than in a pool.
    * ``KV_MLA_FMT`` - ``[1, L, T, aligned_head_size]`` (MLA models).
    * ``EC_TD`` - ``[T, D]``: an encoder-cache entry.
    * ``HS_TD`` - ``[T, D]``: a hidden-state entry (same shape as
      ``EC_TD``, tagged separately).

    The values are those of the reference API, so serialized metadata
    stays compatible.
    """

    UNDEFINED = 0
    KV_2LTD = 1
    KV_T2D = 2
    KV_2TD = 3
    BINARY = 4
    BINARY_BUFFER = 5
    KV_MLA_FMT = 6
    EC_TD = 7
    HS_TD = 8

    def token_dim(self) -> int:
        """Index of the token dimension in this format's shape (0 if none)."""
        return _TOKEN_DIM.get(self, 0)

    @staticmethod
    def _lookup_hint(value: object) -> str:
        return format_hint(value)


_TOKEN_DIM = {
    MemoryFormat.KV_2LTD: 2,
    MemoryFormat.KV_T2D: 1,
    MemoryFormat.KV_MLA_FMT: 2,
}


def get_size_bytes(shapes: Sequence[torch.Size], dtypes: Sequence[torch.dtype]) -> int:
    """Total bytes of tensors of the given shapes and dtypes, back to back.

    Args:
        shapes: one shape per group.
        dtypes: one dtype per group, same length as ``shapes``.

    Returns:
        ``sum(numel(shape) * itemsize(dtype))``, computed exactly (a shape
        whose element count overflows torch's int64 ``numel`` is not
        wrapped around).

    Raises:
        InvalidArgumentError: the lists differ in length, an entry is not a
            shape / dtype, a dimension is negative, or the total exceeds
            :data:`MAX_LAYOUT_BYTES`.
    """
    for what, value in (("shapes", shapes), ("dtypes", dtypes)):
        if not isinstance(value, (list, tuple)):
            raise InvalidArgumentError(
                f"{what} must be a list (one entry per group), got {type(value).__name__} {value!r}"
            )
    if len(shapes) != len(dtypes):
        raise InvalidArgumentError(
            f"shapes and dtypes must have the same length, got {len(shapes)} shapes "
            f"and {len(dtypes)} dtypes"
        )
    total = 0
    for shape, dtype in zip(shapes, dtypes, strict=True):
        total += layout_bytes(_as_shape(shape), dtype)
    if total > MAX_LAYOUT_BYTES:
        raise InvalidArgumentError(
            f"the layout {[tuple(s) for s in shapes]} needs {total} bytes, more than "
            f"{MAX_LAYOUT_BYTES} (the int64 limit); no pool can hold it"
        )
    return total


def layout_bytes(shape: torch.Size, dtype: object) -> int:
    """Exact bytes of one tensor of ``shape`` and ``dtype`` (Python ints: no wrap-around).

    Raises:
        InvalidArgumentError: ``dtype`` is not a torch dtype, a dimension is
            negative, or the bytes exceed :data:`MAX_LAYOUT_BYTES`.
    """
    if not isinstance(dtype, torch.dtype):
        raise ArgumentTypeError(f"expected a torch.dtype, got {type(dtype).__name__} {dtype!r}")
    for d in shape:
        if d < 0:
            raise InvalidArgumentError(f"shape {tuple(shape)} has a negative dimension")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > MAX_LAYOUT_BYTES:
        raise InvalidArgumentError(
            f"shape {tuple(shape)} of {dtype} needs {nbytes} bytes, more than "
            f"{MAX_LAYOUT_BYTES} (the int64 limit); no pool can hold it"
        )
    return nbytes


def _as_shape(shape: object) -> torch.Size:
    if shape.__class__ is torch.Size:
        return shape  # type: ignore[return-value]
    if isinstance(shape, (tuple, list)) and all(
        isinstance(d, int) and not isinstance(d, bool) for d in shape
    ):
        try:
            return torch.Size(shape)
        except (RuntimeError, TypeError, ValueError, OverflowError) as exc:
            raise InvalidArgumentError(f"{shape!r} is not a valid shape: {exc}") from None
    raise ArgumentTypeError(f"expected a torch.Size (or a tuple of ints) as a shape, got {shape!r}")


def normalize_layout(
    shapes: torch.Size | Sequence[torch.Size],
    dtypes: torch.dtype | Sequence[torch.dtype],
) -> tuple[list[torch.Size], list[torch.dtype], int]:
    """Turn the ``shapes``/``dtypes`` arguments of an allocator into lists.

    A single ``torch.Size`` and ``torch.dtype`` describe one group; lists
    describe several groups stored back to back.

    Returns:
        ``(shapes, dtypes, nbytes)`` with fresh lists.

    Raises:
        InvalidArgumentError: mismatched lengths, empty lists, negative
            dimensions or entries of the wrong type.
    """
    if shapes.__class__ is torch.Size:
        shape_list = [shapes]
    elif isinstance(shapes, (list, tuple)) and shapes and not isinstance(shapes[0], int):
        shape_list = [_as_shape(s) for s in shapes]
    elif isinstance(shapes, (list, tuple)) and shapes:
        shape_list = [_as_shape(shapes)]  # a bare tuple of ints is one shape
    else:
        raise InvalidArgumentError(
            f"shapes must be a torch.Size or a non-empty list of them, got {shapes!r}"
        )
    if isinstance(dtypes, torch.dtype):
        dtype_list = [dtypes]
    elif isinstance(dtypes, (list, tuple)) and dtypes:
        dtype_list = list(dtypes)
    else:
        raise InvalidArgumentError(
            f"dtypes must be a torch.dtype or a non-empty list of them, got {dtypes!r}"
        )
    return shape_list, dtype_list, get_size_bytes(shape_list, dtype_list)
