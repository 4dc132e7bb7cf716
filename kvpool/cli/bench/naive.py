"""Naive baselines: what one writes without kvpool.

These are deliberately simple but not sabotaged: each is the obvious
correct implementation, written to run as fast as plain Python allows,
so the ratios measure the design, not a strawman.

* :class:`FirstFitAllocator` -- an address-ordered list of free blocks
  scanned from the start on every allocation (the reference's placement
  algorithm).  Allocation is O(free blocks); freeing is a binary search
  plus a list insertion, with coalescing.  Unlike kvpool's
  :class:`~kvpool.pool.address.AddressManager` it validates nothing (a double
  free corrupts it silently), which only makes it faster.
* :class:`SlicePagedPool` -- a free list of page indices over one tensor;
  every allocation builds a fresh tensor slice (and view) for the page.
"""

from __future__ import annotations

import bisect

import torch

__all__ = ["FirstFitAllocator", "SlicePagedPool"]


class FirstFitAllocator:
    """First-fit placement over a sorted list of free blocks.

    Args:
        size: bytes of address space, starting at 0.
        align_bytes: alignment of every address and size (a power of two).

    Same calling convention as :class:`kvpool.AddressManager`:
    ``allocate(n) -> (address, aligned_size)`` raising ``RuntimeError``
    when no free block is large enough, and ``free(address, size)``.
    """

    def __init__(self, size: int, align_bytes: int = 4096) -> None:
        self._mask = align_bytes - 1
        # Parallel lists, sorted by start: the scan reads only the sizes.
        self._starts: list[int] = [0] if size > 0 else []
        self._sizes: list[int] = [size] if size > 0 else []

    def allocate(self, size: int) -> tuple[int, int]:
        """Carve ``size`` bytes (aligned up) from the first free block that holds them.

        Raises:
            RuntimeError: no free block is large enough.
        """
        need = (size + self._mask) & ~self._mask
        sizes = self._sizes
        for i, free in enumerate(sizes):  # noqa: B007 - i is used after the loop
            if free >= need:
                break
        else:
            raise RuntimeError(f"first-fit: no free block of {need} bytes")
        start = self._starts[i]
        if free == need:
            del self._starts[i]
            del sizes[i]
        else:
            self._starts[i] = start + need
            sizes[i] = free - need
        return start, need

    def free(self, address: int, size: int) -> None:
        """Give ``[address, address + size)`` back, merging it with adjacent free blocks."""
        starts, sizes = self._starts, self._sizes
        size = (size + self._mask) & ~self._mask
        i = bisect.bisect_left(starts, address)
        end = address + size
        joins_prev = i > 0 and starts[i - 1] + sizes[i - 1] == address
        joins_next = i < len(starts) and starts[i] == end
        if joins_prev and joins_next:
            sizes[i - 1] += size + sizes[i]
            del starts[i]
            del sizes[i]
        elif joins_prev:
            sizes[i - 1] += size
        elif joins_next:
            starts[i] = address
            sizes[i] += size
        else:
            starts.insert(i, address)
            sizes.insert(i, size)

    def num_free_blocks(self) -> int:
        """Number of free blocks (holes and the space above the last allocation)."""
        return len(self._starts)


class SlicePagedPool:
    """A paged pool that builds a fresh tensor view for every allocation.

    Args:
        buffer: flat ``uint8`` tensor, a whole number of pages.
        shape: the layout of a page.
        dtype: its dtype.

    ``allocate()`` returns ``(page, tensor)`` or None when full;
    ``free(page)`` puts the page back (LIFO).
    """

    def __init__(self, buffer: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> None:
        self.buffer = buffer
        self.shape = shape
        self.dtype = dtype
        self.page = shape.numel() * dtype.itemsize
        self._free = list(range(buffer.numel() // self.page - 1, -1, -1))

    def allocate(self) -> tuple[int, torch.Tensor] | None:
        """Take a free page and return it with a new view of its bytes."""
        if not self._free:
            return None
        i = self._free.pop()
        start = i * self.page
        return i, self.buffer[start : start + self.page].view(self.dtype).view(self.shape)

    def batched_allocate(self, n: int) -> list[tuple[int, torch.Tensor]] | None:
        """Allocate ``n`` pages, all or nothing."""
        if len(self._free) < n:
            return None
        return [self.allocate() for _ in range(n)]  # type: ignore[misc]

    def free(self, page: int) -> None:
        """Return a page to the pool."""
        self._free.append(page)
