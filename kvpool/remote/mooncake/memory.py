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

import bisect
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import kvpool.remote.mooncake.codes as codes
from kvpool.checks import check_int
from kvpool.errors import ArgumentTypeError, InvalidArgumentError, PoolClosedError
from kvpool.pool.handle import TensorMemoryObj
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj

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
        # Caller ranges (add_range): start -> (nbytes, what keeps the memory
        # alive); the starts sorted, for a bisect (the ranges never overlap).
        self._ranges: dict[int, tuple[int, object]] = {}
        self._starts: list[int] = []
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
        if self._starts and self._covered(address, max(nbytes, 1)):
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

    def covers(self, address: int, nbytes: int) -> bool:
        """True when ``[address, address + nbytes)`` lies in one range of :meth:`add_range`."""
        return bool(self._starts) and self._covered(address, nbytes)

    def _covered(self, address: int, nbytes: int) -> bool:
        with self._lock:
            i = bisect.bisect_right(self._starts, address) - 1
            if i < 0:
                return False
            start = self._starts[i]
            return address + nbytes <= start + self._ranges[start][0]

    def add_range(self, memory: object, nbytes: object, where: str) -> tuple[int, int]:
        """Register a long-lived host range once; objects inside it then need no registration.

        Args:
            memory: a contiguous CPU ``torch.Tensor`` (kept alive until the
                range is removed), or the range's address as an ``int``.
            nbytes: bytes from the start; default (None) the tensor's size;
                required with an address.
            where: names the store, for error messages.

        Returns:
            ``(address, nbytes)`` registered.

        Raises:
            ArgumentTypeError: ``memory`` is neither a tensor nor an int.
            InvalidArgumentError: a non-CPU, non-contiguous or empty tensor;
                a bad ``nbytes``; a range overlapping one registered here.
            PoolClosedError: the store was closed.
            RemoteStoreError: Mooncake refused the registration.

        Complexity: O(ranges) for the overlap check, one Mooncake call.
        """
        address, nbytes, keep = _range_of(memory, nbytes)
        with self._lock:
            if self._closed:
                raise PoolClosedError(f"{where}: the store was closed")
            taken = [(a, n) for a, (n, _) in self._ranges.items()]
            taken += [(r.address, r.nbytes) for r in self._by_owner.values()]
            for start, size in taken:
                if address < start + size and start < address + nbytes:
                    raise InvalidArgumentError(
                        f"{where}: {nbytes} bytes at {address:#x} overlap the {size} bytes at "
                        f"{start:#x} registered already; unregister that range first, or "
                        "register the memory once"
                    )
            rc = self._client.register_buffer(address, nbytes)
            if rc != 0:
                raise codes.error_for(
                    rc, f"{where}: registering {nbytes} bytes at {address:#x} with Mooncake"
                )
            self._ranges[address] = (nbytes, keep)
            bisect.insort(self._starts, address)
        return address, nbytes

    def remove_range(self, memory: object, where: str) -> None:
        """Deregister a range :meth:`add_range` registered (by its tensor or start address).

        Call it only once no call in flight reads or writes objects inside it.

        Raises:
            ArgumentTypeError: ``memory`` is neither a tensor nor an int.
            InvalidArgumentError: no range registered by :meth:`add_range` starts there.
        """
        address = _start_of(memory)
        with self._lock:
            if address not in self._ranges:
                raise InvalidArgumentError(
                    f"{where}: no range registered with register_memory starts at "
                    f"{address:#x}; pass the tensor or address given to register_memory"
                )
            del self._ranges[address]
            self._starts.remove(address)
            if self._closed:
                return
        self._client.unregister_buffer(address)

    def ranges(self) -> list[tuple[int, int]]:
        """``(address, nbytes)`` of every range registered by :meth:`add_range`, by address."""
        with self._lock:
            return [(a, self._ranges[a][0]) for a in self._starts]

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
            starts, self._starts = self._starts, []
            self._ranges.clear()
            self._closed = True
        for region in regions:
            if region.unhook is not None:
                region.unhook()
            self._client.unregister_buffer(region.address)
        for start in starts:
            self._client.unregister_buffer(start)


def _start_of(memory: object) -> int:
    if isinstance(memory, torch.Tensor):
        return int(memory.data_ptr())
    if isinstance(memory, bool) or not isinstance(memory, int):
        raise ArgumentTypeError(
            f"memory must be a CPU torch.Tensor or an int address, got {type(memory).__name__}"
        )
    return memory


def _range_of(memory: object, nbytes: object) -> tuple[int, int, object]:
    """``(address, nbytes, what to keep alive)`` of a range to register, checked."""
    address = _start_of(memory)
    if isinstance(memory, torch.Tensor):
        if memory.device.type != "cpu":
            raise InvalidArgumentError(
                f"memory must be host memory, got a tensor on {memory.device}; register the "
                "CPU buffer objects are copied through"
            )
        if not memory.is_contiguous():
            raise InvalidArgumentError(
                "memory must be a contiguous tensor (one range); pass .contiguous() storage or "
                "its address and size"
            )
        size = memory.numel() * memory.element_size()
        if size == 0:
            raise InvalidArgumentError("memory is an empty tensor: nothing to register")
        if nbytes is not None:
            size = check_int("nbytes", nbytes, low=1, high=size, fix="at most the tensor's size")
        return address, size, memory
    if address <= 0:
        raise InvalidArgumentError(f"address must be positive, got {address}")
    if nbytes is None:
        raise InvalidArgumentError("nbytes is required with an int address (the range's size)")
    size = check_int("nbytes", nbytes, low=1, high=(1 << 64) - address)
    return address, size, None


def _memory_region(owner: object) -> tuple[int, int] | None:
    if isinstance(owner, MemoryAllocatorInterface):
        return owner.memory_region()
    return None


def address_of(obj: MemoryObj, view: memoryview) -> int:
    """Address of the bytes ``view`` covers (a pool object's own, else the buffer's)."""
    if obj.__class__ is TensorMemoryObj:
        return obj.data_ptr
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if view.nbytes else 0
