"""The owner of one allocation's views: its bytes are not reused while any view is alive.

Consumers keep views across asynchronous I/O and GPU copies, sometimes past
the handle's death.  So every view a pooled handle hands out - ``byte_array``,
``raw_data``, ``tensor``, ``get_tensor(i)`` - is derived from one *root*
object per allocation, and a :class:`ViewLease` (a weak reference to that
root) learns when the root, and with it the last view, is gone:

* host memory: the root is a numpy ``uint8`` array over the allocation's
  bytes.  ``byte_array`` is a memoryview of it, ``raw_data`` a tensor made by
  ``torch.from_numpy``; every slice, torch view, numpy array or memoryview
  derived from those keeps the root alive (through the buffer protocol or the
  tensor's storage).
* device memory: the root is a tensor sharing the pool's storage at the
  allocation's offset; views derived from it by indexing, ``view`` and the
  like keep it alive through their ``_base``.  (A ``detach()``ed copy of a
  device view does not; device views are used by copies, which finish in
  stream order.)

While the handle lives it holds the root strongly.  When the handle dies the
policy *retires* the lease: it drops the handle's references, and the bytes go
back to the placement when the weak reference's callback reports the root
gone - at once when nobody else held a view, later otherwise.  The callback
runs in whatever thread dropped the last view, possibly inside a pool call,
so it only appends the lease to its policy's queue (a ``deque``, safe without
the lock); the policy releases queued leases under its lock.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any

import numpy as np
import torch

__all__ = ["ViewLease", "open_device_lease", "open_host_lease", "pool_array"]


def _root_gone(lease: ViewLease) -> None:
    # The weak reference's callback: no lock, no allocation, no raise.
    if lease.held:
        lease.returns.append(lease)


class ViewLease(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to an allocation's view root, plus what is needed to give it back.

    Made by :func:`open_host_lease` and :func:`open_device_lease` only.

    Attributes:
        offset: byte offset of the allocation in the pool.
        phy: bytes of the allocation (aligned; the root covers all of them).
        page: its page index in a paged pool, else -1.
        held: True once the handle died while the root may be alive: the
            root's death then returns the bytes.
        returned: True once the bytes went back to the placement.
        returns: the owning policy's queue of leases whose root died.
        root: the root (strong reference) while the handle lives.
        mv: a memoryview of the root (host memory), cached for ``byte_array``.
        raw: the allocation's tensor of its logical size, cached for
            ``raw_data``; None until first asked for.
    """

    __slots__ = (
        "held",
        "mv",
        "offset",
        "page",
        "phy",
        "raw",
        "returned",
        "returns",
        "root",
    )

    held: bool
    returned: bool
    offset: int
    phy: int
    page: int
    returns: deque[ViewLease]
    root: Any
    mv: memoryview | None
    raw: torch.Tensor | None

    def __new__(cls, root: Any, *_: Any) -> ViewLease:
        return super().__new__(cls, root, _root_gone)

    def detach(self) -> bool:
        """Drop every strong reference this lease holds to the views (caller holds the lock).

        Returns:
            True when views are still alive elsewhere (the bytes wait for them).
        """
        self.root = self.mv = self.raw = None
        return self() is not None


def _lease(
    root: Any, mv: memoryview | None, offset: int, phy: int, page: int, returns: deque[Any]
) -> ViewLease:
    """The one way a lease is made (no ``__init__``: a first view pays for every frame)."""
    lease = ViewLease.__new__(ViewLease, root)
    lease.held = lease.returned = False
    lease.offset = offset
    lease.phy = phy
    lease.page = page
    lease.returns = returns
    lease.root = root
    lease.mv = mv
    lease.raw = None
    return lease


def open_host_lease(
    pool_bytes: np.ndarray, offset: int, phy: int, page: int, returns: deque[Any]
) -> ViewLease:
    """A lease whose root is ``pool_bytes[offset:offset + phy]``.

    Args:
        pool_bytes: a ``uint8`` array over the whole pool, made once per pool
            (:func:`pool_array`).  Slicing it costs a fifth of a fresh
            ``np.frombuffer``.  The root is never handed out: only
            memoryviews and tensors made from it are, and those reference
            the root itself (a numpy slice *of the root* would reference
            ``pool_bytes`` instead, so none is made).

    Complexity: O(1); well under a microsecond, paid once per allocation
    that is viewed.
    """
    root = pool_bytes[offset : offset + phy]
    return _lease(root, memoryview(root), offset, phy, page, returns)


def pool_array(view: memoryview) -> np.ndarray:
    """The ``uint8`` array over a pool's bytes that :func:`open_host_lease` slices."""
    return np.frombuffer(view, dtype=np.uint8)


def open_device_lease(
    buffer: torch.Tensor, offset: int, phy: int, page: int, returns: deque[Any]
) -> ViewLease:
    """A lease whose root is a tensor over ``phy`` bytes of ``buffer``'s storage at ``offset``."""
    root = torch.empty(0, dtype=torch.uint8, device=buffer.device)
    root.set_(buffer.untyped_storage(), buffer.storage_offset() + offset, (phy,))
    return _lease(root, None, offset, phy, page, returns)
