"""Objects over a fresh tensor each, outside any pool: :class:`AdHocMemoryAllocator`.

For tests and small tools, as in the reference; exported by
:mod:`kvpool.allocators` with the pools.
"""

from __future__ import annotations

from typing import Any

import torch

from kvpool.checks import REQUIRED, refuse_in_place
from kvpool.errors import FeatureUnavailableError, OutOfMemoryError
from kvpool.formats import MemoryFormat, normalize_layout
from kvpool.pool.handle import TensorMemoryObj
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.metadata import MemoryObjMetadata
from kvpool.pool.objects import MemoryObj
from kvpool.pool.policy import check_format

__all__ = ["AdHocMemoryAllocator"]


class AdHocMemoryAllocator(MemoryAllocatorInterface):
    """Objects backed by a fresh tensor each (for tests and small tools).

    Args:
        device: where the tensors live ("cpu" without CUDA).
    """

    def __init__(self, device: str = "cpu") -> None:
        self.device = device if torch.cuda.is_available() else "cpu"

    def allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> MemoryObj | None:
        """An object over a new ``torch.empty`` tensor of the layout's size.

        Raises:
            InvalidArgumentError: bad layout.
        """
        if unknown or shapes is REQUIRED or dtypes is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes)
        shape_list, dtype_list, nbytes = normalize_layout(shapes, dtypes)
        check_format(fmt)
        meta = MemoryObjMetadata(
            shape_list[0], dtype_list[0], 0, 0, 1, 0, fmt, None, shape_list, dtype_list
        )
        try:
            raw = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        except RuntimeError as exc:  # torch says "can't allocate memory" this way
            raise OutOfMemoryError(f"{nbytes} bytes on {self.device}: {exc}") from None
        return TensorMemoryObj(raw, meta, self)

    def batched_allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        batch_size: int = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> list[MemoryObj] | None:
        """Not supported, as in the reference: raises FeatureUnavailableError."""
        if unknown or shapes is REQUIRED or dtypes is REQUIRED or batch_size is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes, batch_size)
        raise FeatureUnavailableError("AdHocMemoryAllocator: no batched_allocate; use allocate()")

    def free(
        self, memory_obj: MemoryObj = REQUIRED, allocator_type: str | None = None, **unknown: Any
    ) -> None:
        """Nothing to do: the tensor is garbage-collected."""
        if unknown or memory_obj is REQUIRED:
            refuse_in_place(self, unknown, memory_obj)

    def batched_free(
        self,
        memory_objs: list[MemoryObj] = REQUIRED,
        allocator_type: str | None = None,
        update_stats: bool = True,
        **unknown: Any,
    ) -> None:
        """Nothing to do: the tensors are garbage-collected."""
        if unknown or memory_objs is REQUIRED:
            refuse_in_place(self, unknown, memory_objs)

    def ref_count_up(self, memory_obj: MemoryObj) -> None:
        """No-op, as in the reference (this allocator counts nothing)."""

    def ref_count_down(self, memory_obj: MemoryObj) -> None:
        """No-op, as in the reference (this allocator counts nothing)."""

    def get_ref_count(self, memory_obj: MemoryObj) -> int:
        """Always 0, as in the reference (this allocator counts nothing)."""
        return 0

    def __str__(self) -> str:
        return "AdHocMemoryAllocator"
