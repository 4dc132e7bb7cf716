"""The byte arena a placement policy carves objects out of.

A policy (extent or paged) places objects in one flat byte range.  That
range comes either from a caller's tensor (the reference API:
``TensorMemoryAllocator(torch.empty(n, dtype=torch.uint8))``) or from a
native :class:`~kvpool.native.buffer.HostBuffer` (the pools).  This module turns
either into the three things a policy needs: a flat ``uint8`` tensor, a
``memoryview`` of the same bytes (None for device memory) and the base
address.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvpool.errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["Arena", "arena_from_tensor"]


@dataclass(frozen=True)
class Arena:
    """A flat byte range: tensor, memoryview (host only) and base address."""

    buffer: torch.Tensor
    view: memoryview | None
    base_address: int

    @property
    def size(self) -> int:
        """Bytes in the arena."""
        return self.buffer.numel()


def arena_from_tensor(tensor: torch.Tensor, view: memoryview | None = None) -> Arena:
    """Wrap a contiguous tensor (of any dtype) as a byte arena.

    Args:
        tensor: the memory; must be contiguous (a copy would not be the
            caller's memory).
        view: a memoryview of the same bytes, when the caller has one (a
            native buffer's view keeps its mapping alive); derived from
            the tensor for host memory otherwise.

    Raises:
        InvalidArgumentError: not a tensor, or not contiguous, or ``view``
            does not match the tensor's size.
    """
    if not isinstance(tensor, torch.Tensor):
        raise ArgumentTypeError(
            f"expected a torch.Tensor as the memory pool, got {type(tensor).__name__}"
        )
    if tensor.layout is not torch.strided:
        raise InvalidArgumentError(
            f"the pool tensor must be a dense tensor, got a {tensor.layout} tensor; pass e.g. "
            "torch.empty(nbytes, dtype=torch.uint8)"
        )
    if not tensor.is_contiguous():
        raise InvalidArgumentError(
            "the pool tensor must be contiguous (a non-contiguous tensor would be copied, "
            "and the pool would not use your memory); pass tensor.contiguous() or a fresh buffer"
        )
    # Flattened first: a 0-d tensor of a wider dtype cannot be viewed as bytes.
    buffer = tensor.reshape(-1)
    if buffer.dtype != torch.uint8:
        buffer = buffer.view(torch.uint8)
    if view is None and buffer.device.type == "cpu":
        view = memoryview(buffer.numpy())
    if view is not None and (view.format != "B" or view.ndim != 1 or view.nbytes != buffer.numel()):
        raise InvalidArgumentError(
            f"the byte view must be 1-D, format 'B' and {buffer.numel()} bytes long, "
            f"got format {view.format!r}, {view.ndim}-D, {view.nbytes} bytes"
        )
    return Arena(buffer, view, buffer.data_ptr())
