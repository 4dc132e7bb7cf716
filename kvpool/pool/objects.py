"""The abstract memory object every pool hands out: what a handle on one allocation offers.

Contracts (the README's Contracts section says the same for users):

* **A freed handle is dead.**  Pools hand out a *new* handle object for
  every allocation (or recycle one only when nothing else references it),
  so a late call on an old handle can never act on memory that now belongs
  to someone else.  Counting calls on a dead handle (``ref_count_down``,
  ``unpin``...) are reported (see :mod:`kvpool.misuse`) and do nothing;
  after the pool was closed they do nothing quietly (closing ended every
  object's life; a caller that closes first and drops its references after
  is not misusing anything); views of a dead handle (``byte_array``, ``data_ptr``) raise
  :class:`~kvpool.errors.InvalidHandleError`; ``tensor`` returns ``None``
  with a warning, as in the reference API.
* **Counts never free twice.**  Memory goes back to the pool only on the
  transition of both counts to zero; a count pushed below zero is reported
  and clamped, never acted on.
* **Threads.**  A pooled object's counts are guarded by its pool's lock
  (one lock per pool covers objects, free lists and counters); an object
  built by hand gets a re-entrant lock of its own.
* **Views keep memory alive.**  ``byte_array`` is a slice of the pool's
  memoryview, so it keeps the pool's mapping alive for as long as it
  exists (it does not keep the *allocation*: once the object is freed its
  bytes may be reused, as with any pool).
* **Garbage collection is a backstop.**  A live object dropped without
  ``ref_count_down`` gives its memory back from its finalizer, with a
  warning (see :mod:`kvpool.pool.policy`); a live object keeps its pool alive.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

import torch

from kvpool.checks import RefusesUnknownKeywords
from kvpool.errors import InvalidArgumentError
from kvpool.formats import MemoryFormat
from kvpool.pool.metadata import MemoryObjMetadata

if TYPE_CHECKING:
    from kvpool.pool.interface import MemoryAllocatorInterface

__all__ = ["MemoryObj"]


class MemoryObj(RefusesUnknownKeywords, metaclass=abc.ABCMeta):
    """Interface of a memory object (a handle on one allocation).

    Besides the abstract interface it carries one piece of bookkeeping for
    its users: the *L1 owner tag* (:meth:`set_l1_manager`), the identity of
    the process-local cache manager responsible for the object.
    """

    __slots__ = ("_l1_manager",)

    # Subclasses expose their data here (a tensor, bytes...).
    raw_data: Any

    def __init__(self, metadata: MemoryObjMetadata) -> None:
        self.meta = metadata

    def set_l1_manager(self, owner_tag: int) -> None:
        """Record which L1 manager is responsible for the object.

        Args:
            owner_tag: the manager's stable identity.

        Raises:
            InvalidArgumentError: the object already belongs to another
                manager (a ``ValueError``, as in the reference).
        """
        current = getattr(self, "_l1_manager", None)
        if current is not None and current != owner_tag:
            raise InvalidArgumentError(
                f"memory object already belongs to L1 manager {current!r}, not {owner_tag!r}; "
                "reset_l1_manager() first if its previous life is over"
            )
        self._l1_manager = owner_tag

    def get_l1_manager(self) -> int | None:
        """The L1 manager responsible for the object, or None."""
        return getattr(self, "_l1_manager", None)

    def reset_l1_manager(self) -> None:
        """Forget the L1 owner (when a recycled object starts a new life)."""
        self._l1_manager = None

    @abc.abstractmethod
    def invalidate(self) -> None:
        """Mark the object invalid (its memory is no longer its own)."""

    @abc.abstractmethod
    def is_valid(self) -> bool:
        """Return True while the object owns its memory."""

    @abc.abstractmethod
    def get_size(self) -> int:
        """Logical size in bytes (may be less than the physical size)."""

    @abc.abstractmethod
    def get_shape(self) -> torch.Size:
        """Logical shape of the first group."""

    def get_dtype(self) -> torch.dtype | None:
        """Logical dtype of the first group (None if the object has none)."""
        return None

    @abc.abstractmethod
    def get_shapes(self) -> list[torch.Size]:
        """Shapes of every group."""

    @abc.abstractmethod
    def get_dtypes(self) -> list[torch.dtype]:
        """Dtypes of every group."""

    @abc.abstractmethod
    def get_memory_format(self) -> MemoryFormat:
        """The object's :class:`MemoryFormat`."""

    @abc.abstractmethod
    def get_physical_size(self) -> int:
        """Bytes reserved for the object, alignment included."""

    def set_used_size(self, n: int) -> None:
        """Narrow the logical size to the first ``n`` bytes (optional hook).

        The default does nothing; objects that distinguish used from
        reserved bytes override it.
        """

    @abc.abstractmethod
    def pin(self) -> bool:
        """Pin the object so that it cannot be evicted; True on success."""

    @abc.abstractmethod
    def ref_count_up(self) -> None:
        """Take one more reference."""

    @abc.abstractmethod
    def unpin(self) -> bool:
        """Drop one pin; True on success."""

    @abc.abstractmethod
    def ref_count_down(self) -> None:
        """Drop one reference (the last one frees the object)."""

    @abc.abstractmethod
    def get_ref_count(self) -> int:
        """Current reference count."""

    @abc.abstractmethod
    def get_num_tokens(self) -> int:
        """Number of tokens the object holds."""

    @property
    def shm_offset(self) -> int:
        """Byte offset of the object inside its (shared-memory) pool."""
        return self.meta.address

    @property
    def shm_byte_length(self) -> int:
        """Byte length of the object inside its (shared-memory) pool."""
        return self.get_size()

    @property
    @abc.abstractmethod
    def metadata(self) -> MemoryObjMetadata:
        """The object's metadata."""

    @property
    @abc.abstractmethod
    def tensor(self) -> torch.Tensor | None:
        """The data as a tensor of the logical shape and dtype.

        Once the object is freed: None with a warning, as LMCache's objects
        (whose callers test for None); in strict mode
        (:func:`kvpool.set_strict_mode`) an ``InvalidHandleError`` naming the
        object.  So are :attr:`raw_tensor` and :meth:`get_tensor`.
        """

    @property
    @abc.abstractmethod
    def byte_array(self) -> Any:
        """The data as a zero-copy byte buffer of ``get_size()`` bytes."""

    @property
    @abc.abstractmethod
    def data_ptr(self) -> int:
        """Address of the first byte."""

    @property
    @abc.abstractmethod
    def is_pinned(self) -> bool:
        """True while the object is pinned."""

    @property
    @abc.abstractmethod
    def can_evict(self) -> bool:
        """True when the object may be evicted."""

    @property
    @abc.abstractmethod
    def raw_tensor(self) -> torch.Tensor | None:
        """The flat byte tensor behind the object (freed: as :attr:`tensor`)."""

    @abc.abstractmethod
    def get_tensor(self, index: int) -> torch.Tensor | None:
        """Group ``index`` as a tensor of its shape and dtype (freed: as :attr:`tensor`)."""

    @abc.abstractmethod
    def parent(self) -> MemoryAllocatorInterface | None:
        """The allocator the object came from."""
