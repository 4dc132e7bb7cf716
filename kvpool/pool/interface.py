"""The allocator interface shared by every pool."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvpool.checks import REQUIRED, RefusesUnknownKeywords, check_int, refuse_in_place
from kvpool.errors import FeatureUnavailableError
from kvpool.formats import MemoryFormat, normalize_layout
from kvpool.pool.objects import MemoryObj

__all__ = ["MemoryAllocatorInterface", "PoolStats"]


@dataclass(frozen=True)
class PoolStats:
    """A consistent snapshot of a pool's accounting (taken under its lock).

    Attributes:
        total_bytes: bytes the pool manages.
        used_bytes: bytes not free: held by live objects (aligned/page
            sizes) and by views of freed ones.
        free_bytes: ``total_bytes - used_bytes``.
        active_objects: live objects.
        pinned_objects: live objects with a pin count above zero.
        largest_free_block: largest allocation that can succeed now, in
            bytes (in a paged pool: one page while any page is free, else 0).
        fragmentation: external fragmentation of the free space, in [0, 1).
            Extent pool: ``1 - largest_free_block / free_bytes`` (0 when the
            free space is one block or there is none).  Paged pool: always
            0, since any free page fits any allocation (the formula does not
            apply there: its largest block is one page).
        held_by_views_bytes: of ``used_bytes``, the bytes of freed objects
            that views (``byte_array``, tensors) still hold; they become
            free when the last view is gone.
        freed_under_views: objects freed while views of their bytes were
            alive, since the pool was made (a count that only grows; such a
            free is safe and is logged only at DEBUG, or raises
            ``ViewsOutliveHandleError`` in strict mode).
    """

    total_bytes: int
    used_bytes: int
    free_bytes: int
    active_objects: int
    pinned_objects: int
    largest_free_block: int
    fragmentation: float
    held_by_views_bytes: int = 0
    freed_under_views: int = 0

    @staticmethod
    def build(
        total: int,
        used: int,
        active: int,
        pinned: int,
        largest: int,
        held_by_views: int = 0,
        freed_under_views: int = 0,
    ) -> PoolStats:
        """Fill in the derived fields.

        Raises:
            InvalidArgumentError: a figure that is not an int >= 0.
        """
        total, used, active, pinned, largest, held_by_views, freed_under_views = (
            check_int(name, value, low=0)
            for name, value in (
                ("total", total),
                ("used", used),
                ("active", active),
                ("pinned", pinned),
                ("largest", largest),
                ("held_by_views", held_by_views),
                ("freed_under_views", freed_under_views),
            )
        )
        free = total - used
        frag = 1.0 - largest / free if free > 0 else 0.0
        return PoolStats(
            total,
            used,
            free,
            active,
            pinned,
            largest,
            max(0.0, frag),
            held_by_views,
            freed_under_views,
        )


class MemoryAllocatorInterface(RefusesUnknownKeywords, metaclass=abc.ABCMeta):
    """What every allocator offers: allocate, free, batched forms, close.

    Every public call refuses an unknown keyword naming the closest known
    one (:func:`kvpool.checks.refuse_unknown_keywords`).  The allocation
    hot path (``_hot_calls``) does it in place, as below, without a
    wrapper's extra call: ``**unknown``, :data:`~kvpool.checks.REQUIRED`
    defaults for the required arguments, and
    :func:`~kvpool.checks.refuse_in_place` on the first line.  An
    implementation that does not gets a wrapper.
    """

    _hot_calls = frozenset(("allocate", "batched_allocate", "free", "batched_free"))

    @abc.abstractmethod
    def allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.UNDEFINED,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> MemoryObj | None:
        """Allocate one object of the given shape(s) and dtype(s).

        Args:
            shapes: a shape, or one shape per group (stored back to back).
            dtypes: a dtype, or one dtype per group.
            fmt: the object's logical format.
            allocator_type: which sub-allocator to use, where there are several.

        Returns:
            The new object (reference count 1), or None when the pool is full.

        Raises:
            ArgumentTypeError: an unknown keyword (a ``TypeError`` naming
                the closest known one); a missing argument raises Python's
                ``TypeError``.
        """
        if unknown or shapes is REQUIRED or dtypes is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes)

    @abc.abstractmethod
    def batched_allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        batch_size: int = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.UNDEFINED,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> list[MemoryObj] | None:
        """Allocate ``batch_size`` equal objects, all or nothing.

        Returns:
            The objects, or None when the pool cannot hold them all.
        """
        if unknown or shapes is REQUIRED or dtypes is REQUIRED or batch_size is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes, batch_size)

    @abc.abstractmethod
    def free(
        self, memory_obj: MemoryObj = REQUIRED, allocator_type: str | None = None, **unknown: Any
    ) -> None:
        """Give an object's memory back at once (normally ``ref_count_down`` does it)."""
        if unknown or memory_obj is REQUIRED:
            refuse_in_place(self, unknown, memory_obj)

    @abc.abstractmethod
    def batched_free(
        self,
        memory_objs: list[MemoryObj] = REQUIRED,
        allocator_type: str | None = None,
        update_stats: bool = True,
        **unknown: Any,
    ) -> None:
        """Free every object of the list once (the list itself is not modified)."""
        if unknown or memory_objs is REQUIRED:
            refuse_in_place(self, unknown, memory_objs)

    def close(self) -> None:
        """Release the allocator's resources; safe to call more than once."""
        return None

    def memcheck(self) -> bool:
        """Verify the allocator's invariants; True when all hold."""
        return True

    # -- for consumers that register the memory (transfer engines) -----

    def memory_region(self) -> tuple[int, int] | None:
        """``(address, nbytes)`` of the one host range all objects live in, or None.

        A consumer that must register memory with a transfer engine (RDMA,
        Mooncake) registers this range once and drops it in a hook added
        with :meth:`add_close_hook`.  None: no such range (device memory,
        Python byte buffers, a closed pool); the default.
        """
        return None

    def add_close_hook(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call ``hook()`` once when the allocator closes; returns its remover.

        Offered by the allocators whose :meth:`memory_region` is not None.

        Raises:
            FeatureUnavailableError: this allocator has no close hooks (the default).
        """
        raise FeatureUnavailableError(f"{self} has no close hooks (it has no memory region)")

    def _adapt_shapes_and_dtypes(
        self,
        shapes: torch.Size | Sequence[torch.Size],
        dtypes: torch.dtype | Sequence[torch.dtype],
    ) -> tuple[list[torch.Size], list[torch.dtype]]:
        """Turn a single shape/dtype into one-element lists (validated).

        Raises:
            InvalidArgumentError: mismatched lengths or wrong types.
        """
        shape_list, dtype_list, _ = normalize_layout(shapes, dtypes)
        return shape_list, dtype_list
