"""kvpool memory registered with Mooncake's transfer engine: pool ranges and header slots.

* :class:`PoolRegions` registers the memory of each pool a store meets
  once - the pool's whole range, ``memory_region()`` - and deregisters it
  in the pool's close hook (``add_close_hook``), when the pool is
  garbage-collected, or when the store closes.  RDMA needs registered
  memory; over TCP registration is what lets the engine move the bytes in
  place.  Mooncake refuses a range that overlaps one registered already.
* :class:`HeaderSlabs` are small registered buffers that hold the entry
  headers of the calls in flight (one slab per call, reused), so a header
  and the object's bytes go out and come in as the two buffers of one
  Mooncake object.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import kvpool.remote.mooncake.codes as codes
from kvpool.errors import PoolClosedError
from kvpool.pool.handle import TensorMemoryObj
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.ranges import Range, RangeTable

__all__ = ["HeaderSlabs", "PoolRegions", "Slab", "address_of"]

#: Smallest header slab.
_SLAB_MIN = 64 << 10
#: Free slabs kept for reuse.
_SLABS_KEPT = 8


class Slab:
    """A piece of registered scratch memory for headers."""

    __slots__ = ("ptr", "size", "tensor", "view")

    def __init__(self, size: int) -> None:
        self.tensor = torch.empty(size, dtype=torch.uint8)
        self.ptr = self.tensor.data_ptr()
        self.size = size
        self.view = memoryview(self.tensor.numpy())


class HeaderSlabs:
    """Header slots: registered slabs, one per call in flight, reused.

    Thread safety: ``take``/``give`` may be called from any thread.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._free: list[Slab] = []
        self._closed = False

    def take(self, nbytes: int) -> Slab:
        """A slab of at least ``nbytes`` (registered; give it back with :meth:`give`).

        Raises:
            RemoteStoreError: Mooncake refused to register new scratch memory.
        """
        with self._lock:
            for i, slab in enumerate(self._free):
                if slab.size >= nbytes:
                    return self._free.pop(i)
        size = max(_SLAB_MIN, 1 << max(nbytes - 1, 1).bit_length())
        slab = Slab(size)
        rc = self._client.register_buffer(slab.ptr, size)
        if rc != 0:
            raise codes.error_for(rc, f"registering {size} bytes of header slots")
        return slab

    def give(self, slab: Slab) -> None:
        """Return a slab for reuse (it is deregistered once the slabs are closed or too many)."""
        with self._lock:
            if not self._closed and len(self._free) < _SLABS_KEPT:
                self._free.append(slab)
                return
        self._client.unregister_buffer(slab.ptr)

    def close(self) -> None:
        """Deregister every free slab; slabs given back later are deregistered then."""
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
        for slab in free:
            self._client.unregister_buffer(slab.ptr)


class _Region:
    __slots__ = ("address", "nbytes", "owner", "unhook")

    def __init__(self, owner: weakref.ref[Any], address: int, nbytes: int) -> None:
        self.owner = owner
        self.address = address
        self.nbytes = nbytes
        self.unhook: Callable[[], None] | None = None


class PoolRegions:
    """The pool memory registered with Mooncake: once per pool, dropped at its close.

    A pool is known by its allocator (``obj.parent()``), which says where
    its memory is (``memory_region()``) and runs a hook when it closes
    (``add_close_hook``).  An object of an allocator without these (a
    hand-built object) has its own range registered for the call only.

    Thread safety: every method may be called from any thread.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._by_owner: dict[int, _Region] = {}
        # Caller ranges (add_range); self._lock is taken before the table's.
        self._ranges = RangeTable()
        self._closed = False

    def ensure(self, obj: MemoryObj, address: int, nbytes: int) -> tuple[int, int] | None:
        """Register the memory of ``obj``'s pool if it is not yet.

        Args:
            obj: the object about to be read or written.
            address: where its bytes are.
            nbytes: how many.

        Returns:
            None when the pool's region covers ``obj``; else the
            ``(address, nbytes)`` registered for this call only, to be
            passed to :meth:`release_temporary` afterwards (or None when that
            registration failed: the memory may lie in a registered range).

        Raises:
            RemoteStoreError: Mooncake refused to register the pool's memory.
        """
        owner = obj.parent()
        region = self._by_owner.get(id(owner)) if owner is not None else None
        if region is not None and region.owner() is owner:
            return None
        if self.covers(address, max(nbytes, 1)) is not None:
            return None
        found = _memory_region(owner)
        if found is None:
            size = max(nbytes, 1)
            if not address or self._client.register_buffer(address, size) != 0:
                return None
            return address, size
        return self._register(owner, *found)

    def _register(self, owner: Any, address: int, nbytes: int) -> None:
        key = id(owner)
        with self._lock:
            region = self._by_owner.get(key)
            if region is not None and region.owner() is owner:
                return None
            if region is not None:  # a dead owner whose id was reused
                self._drop_locked(key)
            rc = self._client.register_buffer(address, nbytes)
            if rc != 0:
                raise codes.error_for(
                    rc,
                    f"registering the memory of {owner} ({nbytes} bytes at {address:#x}) with "
                    "Mooncake (a range that overlaps one registered already is refused)",
                )
            ref = weakref.ref(owner, lambda _ref, key=key: self._forget(key))
            region = _Region(ref, address, nbytes)
            self._by_owner[key] = region
        region.unhook = owner.add_close_hook(lambda key=key: self._forget(key))
        return None

    def covers(self, address: int, nbytes: int) -> Range | None:
        """The range of :meth:`add_range` that ``[address, address + nbytes)`` lies in, or None.

        Hold it while the bytes move (see :class:`~kvpool.remote.ranges.RangeTable`).
        """
        return self._ranges.covers(address, nbytes) if self._ranges else None

    def add_range(self, memory: object, nbytes: object, where: str) -> tuple[int, int]:
        """Register a long-lived host range once; objects inside it then need no registration.

        Args/returns/raises: :meth:`~kvpool.remote.ranges.RangeTable.add`
        (a contiguous CPU tensor, a writable buffer or an address; a range
        overlapping one registered here, a pool's included, is refused),
        and:

        Raises:
            PoolClosedError: the store was closed.
            RemoteStoreError: Mooncake refused the registration.

        Complexity: O(ranges) for the overlap check, one Mooncake call.
        """
        with self._lock:
            if self._closed:
                raise PoolClosedError(f"{where}: the store was closed")
            pools = [(r.address, r.nbytes) for r in self._by_owner.values()]
            return self._ranges.add(memory, nbytes, where, pools, self._register_range(where))

    def _register_range(self, where: str) -> Callable[[int, int], None]:
        """What registers a caller's range with Mooncake (raises its refusal)."""

        def register(address: int, nbytes: int) -> None:
            rc = self._client.register_buffer(address, nbytes)
            if rc != 0:
                raise codes.error_for(
                    rc, f"{where}: registering {nbytes} bytes at {address:#x} with Mooncake"
                )

        return register

    def remove_range(self, memory: object, where: str) -> None:
        """Deregister a range :meth:`add_range` registered (by its memory or start address).

        A call in flight over it still holds its owner until it returns,
        but Mooncake no longer moves bytes there: call it once no call in
        flight reads or writes inside it.

        Raises:
            ArgumentTypeError: a bad ``memory``.
            InvalidArgumentError: no range registered by :meth:`add_range` starts there.
        """
        with self._lock:
            dropped = self._ranges.remove(memory, where)
            if self._closed:
                return
        self._client.unregister_buffer(dropped.start)

    def release_temporary(self, reg: tuple[int, int] | None) -> None:
        """Deregister what :meth:`ensure` registered for one call."""
        if reg is not None:
            self._client.unregister_buffer(reg[0])

    def _forget(self, key: int) -> None:
        with self._lock:
            self._drop_locked(key)

    def _drop_locked(self, key: int) -> None:
        region = self._by_owner.pop(key, None)
        if region is not None and not self._closed:
            self._client.unregister_buffer(region.address)

    def registered(self) -> list[tuple[int, int]]:
        """``(address, nbytes)`` of every registered pool range."""
        with self._lock:
            return [(r.address, r.nbytes) for r in self._by_owner.values()]

    def close(self) -> None:
        """Deregister every pool range and caller range; remove the close hooks."""
        with self._lock:
            regions = list(self._by_owner.values())
            self._by_owner.clear()
            dropped = self._ranges.clear()
            self._closed = True
        for region in regions:
            if region.unhook is not None:
                region.unhook()
            self._client.unregister_buffer(region.address)
        for caller in dropped:
            self._client.unregister_buffer(caller.start)


def _memory_region(owner: object) -> tuple[int, int] | None:
    if isinstance(owner, MemoryAllocatorInterface):
        return owner.memory_region()
    return None


def address_of(obj: MemoryObj, view: memoryview) -> int:
    """Address of the bytes ``view`` covers (a pool object's own, else the buffer's)."""
    if obj.__class__ is TensorMemoryObj:
        return obj.data_ptr
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if view.nbytes else 0
