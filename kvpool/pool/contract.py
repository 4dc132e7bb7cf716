"""The written contract between pooled handles and the placement policy that owns them.

A pooled :class:`~kvpool.pool.handle.TensorMemoryObj` and its policy
(:class:`~kvpool.pool.extent.TensorMemoryAllocator`,
:class:`~kvpool.pool.paged.PagedTensorMemoryAllocator`) work together on the
allocation hot path, so they share plain attributes instead of calls.  This
module is the list of what each side may read and write; nothing else of the
other side is touched.

Locking: every field marked *(lock)* is read and written only while holding
``owner.lock``, the pool's one lock.

The handle side (:class:`PooledHandle`), written by the policy:

* ``valid`` *(lock)*: True while the handle owns its allocation; the policy
  sets it False when the memory goes back (or to a view lease), True when it
  recycles a handle.
* ``record`` *(lock)*: the :class:`~kvpool.pool.metadata.MemoryObjMetadata`
  whose ``ref_count``/``pin_count`` the handle counts; a policy recycling a
  handle resets ``record.ref_count`` to 1.
* ``owner``, ``offset``, ``phy``, ``page``: set once by
  :func:`~kvpool.pool.handle.new_pooled_handle` (the policy-facing factory)
  and read by the policy to give the memory back.
* ``dirty``: True once the metadata was exposed or changed, so the handle
  may not be recycled as is.
* ``lease`` *(lock)*: the :class:`~kvpool.pool.lease.ViewLease` that owns the
  handle's views, or None before its first view; the policy detaches it when
  the handle dies (see :meth:`HandleOwner.open_lease`).

The policy side (:class:`HandleOwner`), used by the handle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kvpool.pool.lease import ViewLease
    from kvpool.pool.metadata import MemoryObjMetadata

__all__ = ["HandleOwner", "PooledHandle"]


class PooledHandle(Protocol):
    """The fields of a pooled handle that its owning policy reads and writes."""

    valid: bool
    record: MemoryObjMetadata
    owner: HandleOwner | None
    offset: int
    phy: int
    page: int
    dirty: bool
    lease: ViewLease | None


class HandleOwner(Protocol):
    """What a pooled handle may ask of the policy that placed it.

    Attributes:
        lock: the pool's one lock (a ``threading.Lock``); a handle takes it
            around every change of its counts.
        closed: True once the pool was closed, or in a forked child that
            inherited it; every handle of a closed pool is dead.
        base_address: address of byte 0 of the pool's memory.
        outer: what the handles' ``parent()`` is: the allocator the caller
            allocated from (the pool built on the policy, else the policy).
    """

    lock: Any
    closed: bool
    base_address: int
    outer: Any

    def release_locked(self, handle: Any) -> None:
        """Give the memory of ``handle`` back; its last count just dropped.

        The caller holds ``lock`` and checked that the handle is valid.  When
        views of the bytes are alive, the memory waits for them (it goes to
        the handle's lease) instead of being reused.
        """

    def release_dropped(self, handle: Any) -> None:
        """The garbage-collection backstop: a live handle is being destroyed.

        Called from the handle's ``__del__`` without the lock; never blocks.
        """

    def pin_changed_locked(self, delta: int) -> None:
        """A handle's pin count went from 0 to 1 (``+1``) or from 1 to 0 (``-1``)."""

    def open_lease(self, handle: Any) -> ViewLease:
        """Return the lease that owns ``handle``'s views, creating it on first use.

        The caller holds ``lock`` and checked that the handle is valid.

        Raises:
            FeatureUnavailableError: the memory cannot be viewed from Python.
        """

    def dead_handle_error(self, handle: Any, what: str) -> Exception:
        """The typed error for ``what`` (e.g. ``"byte_array"``) on a dead handle."""
