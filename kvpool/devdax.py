"""Device-DAX allocation: KV objects in DRAM first, then in mapped ``/dev/daxX.Y`` arenas.

:class:`DevDaxMemoryAllocator` (LMCache 0.5.6's name) keeps a list of
*arenas*, each a pool over a :class:`~kvpool.pool.devdax.DevDaxBacking`
(a Device-DAX device, or a file or memfd standing in for one), optionally
behind a DRAM pool that is tried first, and grows or shrinks at run time:

* :meth:`~DevDaxMemoryAllocator.add_device` maps another device as overflow;
* :meth:`~DevDaxMemoryAllocator.remove_device` stops an arena from taking new
  allocations and unmaps it once its last object is gone (``DRAIN``); the
  first arena of a DAX-only allocator is *primary* and cannot be removed.

Ownership is kvpool's: an arena's views (tensors, ``byte_array``) keep its
mapping alive, so ``close()`` is safe with objects still alive (they become
dead handles; LMCache raises ``BufferError`` instead).

Thread safety: one lock (``host_mem_lock``) covers the arena list and the
arenas' states; each arena's pool has its own lock for its objects.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from kvpool.allocators import MixedMemoryAllocator
from kvpool.checks import REQUIRED, TypedEnumLookup, check_choice, check_int, refuse_in_place
from kvpool.errors import ArgumentTypeError, InvalidArgumentError, PoolClosedError
from kvpool.formats import MemoryFormat, normalize_layout
from kvpool.pool.address import AddressManager
from kvpool.pool.backing import pool_register_chunk
from kvpool.pool.devdax import DEVDAX_PIN_CHOICES, DevDaxBacking, device_identity
from kvpool.pool.handle import TensorMemoryObj
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.pool.policy import PlacementSpec
from kvpool.pool.pools import TENSOR_FORMATS, BufferAllocator, MemoryPool

__all__ = [
    "DevDaxArenaState",
    "DevDaxArenaStatus",
    "DevDaxMemoryAllocator",
    "DevDaxNotMappedError",
    "DevDaxRemoveMode",
]

_EMPTY = torch.empty(0, dtype=torch.uint8)


class DevDaxNotMappedError(InvalidArgumentError):
    """No Device-DAX arena is mapped at the path asked for."""


class DevDaxArenaState(enum.Enum, metaclass=TypedEnumLookup):
    """Where an arena is in its life: taking allocations, draining, or gone."""

    ACTIVE = "active"
    DRAINING = "draining"
    REMOVED = "removed"


class DevDaxRemoveMode(enum.Enum, metaclass=TypedEnumLookup):
    """How an arena is retired: ``DRAIN`` (unmapped once its objects are freed)."""

    DRAIN = "drain"


def _check_path(device_path: object) -> str:
    if not isinstance(device_path, str):
        raise ArgumentTypeError(
            f"device_path must be a str path, got {type(device_path).__name__} {device_path!r}"
        )
    return device_path


def _check_obj(memory_obj: object) -> MemoryObj:
    if not isinstance(memory_obj, MemoryObj):
        raise ArgumentTypeError(f"expected a memory object, got {type(memory_obj).__name__}")
    return memory_obj


@dataclass(frozen=True)
class DevDaxArenaStatus:
    """A snapshot of one arena.

    Attributes:
        device_path: the path it was mapped from.
        size_in_bytes: bytes mapped.
        used_bytes: bytes held by live objects.
        free_bytes: bytes free for new objects.
        active_allocations: live objects.
        state: its :class:`DevDaxArenaState`.
        is_primary: the first arena of a DAX-only allocator (not removable).
    """

    device_path: str
    size_in_bytes: int
    used_bytes: int
    free_bytes: int
    active_allocations: int
    state: DevDaxArenaState
    is_primary: bool


class _Arena:
    """One mapped device: its backing, its pool and its state."""

    def __init__(
        self, device_path: str, size: int, align_bytes: int, is_primary: bool, pin: str
    ) -> None:
        # Registered in chunks that are multiples of the alignment: no object
        # straddles two registrations.
        chunk = pool_register_chunk(size, align_bytes)
        backing = DevDaxBacking(device_path, size, pin=pin, register_chunk=chunk)
        self.pool = MemoryPool(
            backing, PlacementSpec("extent", align_bytes=align_bytes), name="DevDaxMemoryAllocator"
        )
        self.backing = backing
        self.device_path = device_path
        self.size = size
        self.is_primary = is_primary
        self.state = DevDaxArenaState.ACTIVE

    def status(self) -> DevDaxArenaStatus:
        if self.pool.closed:
            used = active = 0
        else:
            stats = self.pool.stats()
            used, active = stats.used_bytes, stats.active_objects
        return DevDaxArenaStatus(
            self.device_path,
            self.size,
            used,
            self.size - used,
            active,
            self.state,
            self.is_primary,
        )

    def owns(self, obj: MemoryObj) -> bool:
        return (
            isinstance(obj, TensorMemoryObj)
            and obj.is_valid()
            and self.backing.contains(obj.data_ptr)
        )


class DevDaxMemoryAllocator(MemoryAllocatorInterface):
    """KV objects in DRAM first (optional), then in Device-DAX arenas.

    Args:
        size: bytes to map from ``device_path`` (the first arena).
        device_path: the first Device-DAX device (or file).
        local_allocator: a DRAM :class:`~kvpool.MixedMemoryAllocator` tried
            first (not with ``local_size``).
        local_size: make such a DRAM pool of this many bytes.
        shm_name: for that DRAM pool (POSIX shared memory of this name).
        use_hugepages: for that DRAM pool (2 MiB pages).
        align_bytes: alignment of objects (a power of two).
        pin: how arenas are pinned: "auto" (registered with CUDA when it is
            there; a refusal leaves the arena unpinned, with one warning),
            "none", or "cuda-register" (a refusal raises); see
            :class:`~kvpool.pool.devdax.DevDaxBacking`.

    Objects' ``parent()`` is this allocator for arena objects and the DRAM
    pool for DRAM objects (:meth:`is_devdax_obj` tells them apart).

    Raises:
        InvalidArgumentError: bad sizes, alignment, path, or both
            ``local_size`` and ``local_allocator``.
        OSError: the device cannot be opened or mapped.
    """

    def __init__(
        self,
        size: int,
        device_path: str,
        *,
        local_allocator: MixedMemoryAllocator | None = None,
        local_size: int = 0,
        shm_name: str | None = None,
        align_bytes: int = AddressManager.ALIGN_BYTES,
        use_hugepages: bool = False,
        pin: str = "auto",
    ) -> None:
        if not isinstance(device_path, str) or not device_path:
            raise InvalidArgumentError(f"device_path must be a non-empty path, got {device_path!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise InvalidArgumentError(f"size must be a positive number of bytes, got {size!r}")
        if isinstance(local_size, bool) or not isinstance(local_size, int) or local_size < 0:
            raise InvalidArgumentError(f"local_size must be an int >= 0, got {local_size!r}")
        if local_size and local_allocator is not None:
            raise InvalidArgumentError(
                "pass local_size or local_allocator, not both (local_size makes the DRAM pool)"
            )
        self.size = size
        self.device_path = device_path
        self.align_bytes = align_bytes
        self.pin = check_choice("pin", pin, {c: c for c in DEVDAX_PIN_CHOICES})
        self.host_mem_lock = threading.Lock()
        self.buffer_allocator = BufferAllocator("cpu")
        self._arenas: list[_Arena] = []
        self._closed = False
        self.local_allocator = local_allocator
        if local_size:
            self.local_allocator = MixedMemoryAllocator(
                local_size, align_bytes=align_bytes, shm_name=shm_name, use_hugepages=use_hugepages
            )
        try:
            self._arenas.append(
                _Arena(
                    device_path,
                    size,
                    align_bytes,
                    is_primary=self.local_allocator is None,
                    pin=self.pin,
                )
            )
        except BaseException:
            if local_size and self.local_allocator is not None:
                self.local_allocator.close()
            raise

    # -- the reference's attributes ---------------------------------------

    @property
    def buffer(self) -> torch.Tensor:
        """The primary memory: the DRAM pool's if there is one, else the first arena's."""
        if self.local_allocator is not None:
            return self.local_allocator.buffer
        return self._arenas[0].pool.buffer if self._arenas else _EMPTY

    @property
    def devdax_buffer(self) -> torch.Tensor:
        """The first arena's memory (empty once closed)."""
        return self._arenas[0].pool.buffer if self._arenas else _EMPTY

    @property
    def devdax_allocator(self) -> Any:
        """The first arena's placement policy, or None once closed."""
        return self._arenas[0].pool.allocator if self._arenas else None

    @property
    def address_manager(self) -> AddressManager | None:
        """The first arena's address manager, or None once closed."""
        return self._arenas[0].pool.address_manager if self._arenas else None

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    # -- arenas -----------------------------------------------------------

    def _reap_locked(self) -> None:
        """Unmap the draining arenas that have no live object left."""
        for arena in list(self._arenas):
            if arena.state is DevDaxArenaState.DRAINING and not arena.pool.num_active_allocations:
                arena.pool.close()
                arena.state = DevDaxArenaState.REMOVED
                self._arenas.remove(arena)

    def _find_locked(self, device_path: str) -> _Arena:
        _check_path(device_path)
        for arena in self._arenas:
            if arena.device_path == device_path:
                return arena
        raise DevDaxNotMappedError(
            f"no Device-DAX arena is mapped at {device_path!r}; mapped: "
            f"{[a.device_path for a in self._arenas]}"
        )

    def owns_device(self, device_path: str) -> bool:
        """True when an arena (active or draining) maps the device at ``device_path``.

        Raises:
            ArgumentTypeError: ``device_path`` is not a str.
        """
        _check_path(device_path)
        wanted = device_identity(device_path)
        if wanted is None:
            return False
        with self.host_mem_lock:
            return any(a.backing.identity == wanted for a in self._arenas)

    def add_device(self, device_path: str, size_in_bytes: int) -> DevDaxArenaStatus:
        """Map another device as overflow; returns its status.

        Raises:
            InvalidArgumentError: bad path or size, a size beyond its capacity,
                a device that cannot be identified or is already mapped.
            PoolClosedError: the allocator was closed.
            OSError: the device cannot be opened or mapped.
        """
        if not isinstance(device_path, str) or not device_path:
            raise InvalidArgumentError(f"device_path must be a non-empty path, got {device_path!r}")
        if isinstance(size_in_bytes, bool) or not isinstance(size_in_bytes, int):
            raise InvalidArgumentError(f"size_in_bytes must be an int, got {size_in_bytes!r}")
        if size_in_bytes <= 0:
            raise InvalidArgumentError(f"size_in_bytes must be > 0, got {size_in_bytes}")
        wanted = device_identity(device_path)
        if wanted is None:
            raise InvalidArgumentError(
                f"cannot identify {device_path!r} as a Device-DAX device or a regular file"
            )
        with self.host_mem_lock:
            if self._closed:
                raise PoolClosedError("add_device on a closed DevDaxMemoryAllocator")
            for arena in self._arenas:
                if arena.device_path == device_path or arena.backing.identity == wanted:
                    raise InvalidArgumentError(
                        f"Device-DAX device {device_path} is already mapped (as "
                        f"{arena.device_path})"
                    )
            arena = _Arena(
                device_path, size_in_bytes, self.align_bytes, is_primary=False, pin=self.pin
            )
            self._arenas.append(arena)
            return arena.status()

    def remove_device(
        self, device_path: str, mode: DevDaxRemoveMode = DevDaxRemoveMode.DRAIN
    ) -> DevDaxArenaStatus:
        """Stop an arena from taking objects; unmap it once it is empty.

        Returns:
            Its status: ``REMOVED`` when it was empty, else ``DRAINING``.

        Raises:
            InvalidArgumentError: an unsupported mode, or the primary arena.
            DevDaxNotMappedError: nothing is mapped at ``device_path``.
        """
        if mode is not DevDaxRemoveMode.DRAIN:
            raise InvalidArgumentError(
                f"unsupported Device-DAX remove mode {mode!r}; only DevDaxRemoveMode.DRAIN is"
            )
        with self.host_mem_lock:
            arena = self._find_locked(device_path)
            if arena.is_primary:
                raise InvalidArgumentError(
                    f"the primary Device-DAX arena {device_path} backs the L1 memory and "
                    "cannot be removed"
                )
            arena.state = DevDaxArenaState.DRAINING
            self._reap_locked()
            return arena.status()

    def arena_statuses(self) -> list[DevDaxArenaStatus]:
        """A status per mapped arena, first arena first."""
        with self.host_mem_lock:
            self._reap_locked()
            return [a.status() for a in self._arenas]

    def arena_status(self, device_path: str) -> DevDaxArenaStatus:
        """The status of the arena mapped at ``device_path``.

        Raises:
            DevDaxNotMappedError: nothing is mapped there.
        """
        with self.host_mem_lock:
            self._reap_locked()
            return self._find_locked(device_path).status()

    def memory_region_count(self) -> int:
        """Regions backing the allocator: the DRAM pool (if any) plus every arena."""
        with self.host_mem_lock:
            self._reap_locked()
            return (self.local_allocator is not None) + len(self._arenas)

    def is_devdax_obj(self, memory_obj: MemoryObj) -> bool:
        """True for an object of an arena, False for one of the DRAM pool.

        Raises:
            ArgumentTypeError: ``memory_obj`` is not a memory object.
        """
        return _check_obj(memory_obj).parent() is self

    def _is_local(self, memory_obj: MemoryObj) -> bool:
        local = self.local_allocator
        return local is not None and memory_obj.parent() is local

    # -- allocation ---------------------------------------------------------

    def _check_format(self, fmt: object) -> bool:
        """True for a byte buffer request; raise for an unsupported format."""
        if fmt is MemoryFormat.BINARY_BUFFER:
            return True
        if fmt.__class__ is not MemoryFormat or fmt not in TENSOR_FORMATS:
            error = InvalidArgumentError if fmt.__class__ is MemoryFormat else ArgumentTypeError
            raise error(
                f"unsupported memory format {fmt!r} for DevDaxMemoryAllocator; supported: "
                + ", ".join(sorted(f.name for f in TENSOR_FORMATS))
                + ", BINARY_BUFFER"
            )
        return False

    def _adopt(self, objs: Iterable[MemoryObj]) -> None:
        for obj in objs:
            obj.parent_allocator = self  # type: ignore[attr-defined]

    def _active_locked(self) -> list[_Arena]:
        if self._closed:
            raise PoolClosedError("allocate on a closed DevDaxMemoryAllocator")
        self._reap_locked()
        return [a for a in self._arenas if a.state is DevDaxArenaState.ACTIVE]

    def allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> MemoryObj | None:
        """One object: from the DRAM pool if it has room, else the first arena that has.

        Returns:
            The object, or None when everything is full.

        Raises:
            InvalidArgumentError: bad layout or format.
            PoolClosedError: the allocator was closed.
        """
        if unknown or shapes is REQUIRED or dtypes is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes)
        if self._check_format(fmt):
            return self.buffer_allocator.allocate(shapes, dtypes, fmt)
        if self.local_allocator is not None:
            obj = self.local_allocator.allocate(shapes, dtypes, fmt)
            if obj is not None:
                return obj
        with self.host_mem_lock:
            for arena in self._active_locked():
                obj = arena.pool.allocate(shapes, dtypes, fmt)
                if obj is not None:
                    self._adopt((obj,))
                    return obj
        return None

    @staticmethod
    def _take(pool: Any, shapes: Any, dtypes: Any, count: int, fmt: MemoryFormat) -> list[Any]:
        """Up to ``count`` objects from ``pool`` (a batch, else one at a time)."""
        objs = pool.batched_allocate(shapes, dtypes, count, fmt)
        if objs is not None:
            return objs
        objs = []
        while len(objs) < count:
            obj = pool.allocate(shapes, dtypes, fmt)
            if obj is None:
                break
            objs.append(obj)
        return objs

    def batched_allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        batch_size: int = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> list[MemoryObj] | None:
        """``batch_size`` objects, DRAM first, then arena by arena; all or nothing.

        Returns:
            The objects, or None (nothing kept) when they do not all fit.

        Raises:
            InvalidArgumentError: bad layout, format or batch size.
            PoolClosedError: the allocator was closed.
        """
        if unknown or shapes is REQUIRED or dtypes is REQUIRED or batch_size is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes, batch_size)
        if self._check_format(fmt):
            return self.buffer_allocator.batched_allocate(  # type: ignore[return-value]
                shapes, dtypes, batch_size, fmt
            )
        batch_size = check_int("batch_size", batch_size, low=0)
        normalize_layout(shapes, dtypes)  # a bad layout raises before anything is taken
        taken: list[tuple[Any, list[Any]]] = []
        remaining = batch_size
        if self.local_allocator is not None and remaining:
            objs = self._take(self.local_allocator, shapes, dtypes, remaining, fmt)
            taken.append((self.local_allocator, objs))
            remaining -= len(objs)
        with self.host_mem_lock:
            for arena in self._active_locked():
                if not remaining:
                    break
                objs = self._take(arena.pool, shapes, dtypes, remaining, fmt)
                self._adopt(objs)
                taken.append((arena.pool, objs))
                remaining -= len(objs)
            if remaining:
                for pool, objs in taken:
                    if objs:
                        pool.batched_free(objs)
                return None
        return [obj for _, objs in taken for obj in objs]

    def _owner_locked(self, memory_obj: MemoryObj) -> Any:
        if self._is_local(memory_obj):
            return self.local_allocator
        for arena in self._arenas:
            if arena.owns(memory_obj):
                return arena.pool
        raise InvalidArgumentError(f"{memory_obj!r} does not belong to this DevDaxMemoryAllocator")

    def free(
        self, memory_obj: MemoryObj = REQUIRED, allocator_type: str | None = None, **unknown: Any
    ) -> None:
        """Give an object back now (normally its last ``ref_count_down`` does).

        Raises:
            InvalidArgumentError: the object is not this allocator's.
        """
        if unknown or memory_obj is REQUIRED:
            refuse_in_place(self, unknown, memory_obj)
        if _check_obj(memory_obj).get_memory_format() is MemoryFormat.BINARY_BUFFER:
            return
        with self.host_mem_lock:
            self._owner_locked(memory_obj).free(memory_obj)
            self._reap_locked()

    def batched_free(
        self,
        memory_objs: list[MemoryObj] = REQUIRED,
        allocator_type: str | None = None,
        update_stats: bool = True,
        **unknown: Any,
    ) -> None:
        """Free every object of the list into the pool it came from.

        Raises:
            InvalidArgumentError: an object is not this allocator's (nothing
                is freed then).
        """
        if unknown or memory_objs is REQUIRED:
            refuse_in_place(self, unknown, memory_objs)
        if not isinstance(memory_objs, (list, tuple)):
            raise InvalidArgumentError(
                f"batched_free takes a list of memory objects, got {type(memory_objs).__name__}"
            )
        objs = [
            o
            for o in memory_objs
            if _check_obj(o).get_memory_format() is not MemoryFormat.BINARY_BUFFER
        ]
        with self.host_mem_lock:
            groups: dict[int, tuple[Any, list[MemoryObj]]] = {}
            for obj in objs:
                pool = self._owner_locked(obj)
                groups.setdefault(id(pool), (pool, []))[1].append(obj)
            for pool, group in groups.values():
                pool.batched_free(group)
            self._reap_locked()

    # -- state ----------------------------------------------------------------

    def get_memory_usage(self) -> tuple[int, int]:
        """``(used, total)`` bytes: DRAM pool plus arenas (draining ones count as used only)."""
        used = total = 0
        local = self.local_allocator
        if local is not None and not local.closed:
            stats = local.stats()
            used, total = stats.used_bytes, stats.total_bytes
        with self.host_mem_lock:
            self._reap_locked()
            for arena in self._arenas:
                status = arena.status()
                used += status.used_bytes
                if arena.state is DevDaxArenaState.ACTIVE:
                    total += status.size_in_bytes
        return used, total

    def memcheck(self) -> bool:
        """True when the DRAM pool's and every arena's invariants hold."""
        ok = self.local_allocator.memcheck() if self.local_allocator is not None else True
        with self.host_mem_lock:
            return ok and all(a.pool.memcheck() for a in self._arenas if not a.pool.closed)

    def close(self) -> None:
        """Close every arena and the DRAM pool it made.  Idempotent.

        Live objects become dead handles; views made earlier keep their
        mapping until they are released (LMCache raises ``BufferError``
        here instead).
        """
        with self.host_mem_lock:
            if self._closed:
                return
            self._closed = True
            arenas, self._arenas = self._arenas, []
        for arena in arenas:
            arena.pool.close()
        if self.local_allocator is not None:
            self.local_allocator.close()

    def __enter__(self) -> DevDaxMemoryAllocator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A backstop only: close() is the contract.
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):  # never raise from a finalizer
                self.close()

    def __str__(self) -> str:
        return "DevDaxMemoryAllocator"
