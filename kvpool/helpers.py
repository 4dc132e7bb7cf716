"""The reference API's small helpers: locking decorator, alignment, pinned buffers.

These are the module-level functions LMCache 0.5.6 offers next to its
allocators (``lmcache.v1.memory_management`` and
``lmcache.v1.memory_allocators.lazy_memory_allocator``), implemented on
kvpool's native buffers:

* :func:`synchronized` - run a method under a lock attribute of its instance;
* :func:`align_to`, :func:`get_numa_id` - size rounding and the current
  GPU's NUMA node;
* :class:`PinnedAllocFree` / :func:`_resolve_pinned_alloc_free` - an
  alloc/free pair for pinned host memory, chosen by NUMA, shared-memory and
  hugepage wishes; the pointer's memory is owned by a kvpool
  :class:`~kvpool.host.HostBuffer` until ``free`` (never a bare address);
* :func:`_allocate_gpu_memory` - a page-aligned byte tensor on a device;
* :func:`_get_cached_ubyte_array_type` - ``ctypes.c_ubyte * n`` types,
  cached in a bounded LRU so that memory stays flat whatever sizes come.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from kvpool.checks import check_bool, check_int, check_optional_str, check_power_of_two, check_size
from kvpool.errors import ArgumentTypeError, InvalidArgumentError, InvalidHandleError
from kvpool.formats import MAX_LAYOUT_BYTES
from kvpool.pool.backing import torch_allocation_error

__all__ = [
    "UBYTE_TYPE_CACHE_SIZE",
    "PinnedAllocFree",
    "_allocate_gpu_memory",
    "_get_cached_ubyte_array_type",
    "_resolve_pinned_alloc_free",
    "align_to",
    "get_numa_id",
    "synchronized",
]

F = TypeVar("F", bound=Callable[..., Any])

#: Array types kept by :func:`_get_cached_ubyte_array_type` (least recently used go).
UBYTE_TYPE_CACHE_SIZE = 256


def synchronized(lock_attr_name: str) -> Callable[[F], F]:
    """Decorate a method so that it runs holding ``getattr(self, lock_attr_name)``.

    Args:
        lock_attr_name: the instance attribute holding the lock (any context
            manager: ``threading.Lock``, ``RLock``...).

    Returns:
        The decorator.

    Raises:
        InvalidArgumentError: ``lock_attr_name`` is not a string.
        AttributeError: at call time, the instance has no such attribute.
    """
    if not isinstance(lock_attr_name, str):
        raise InvalidArgumentError(
            f"lock_attr_name must be the name of a lock attribute, got {lock_attr_name!r}"
        )

    def decorator(method: F) -> F:
        @functools.wraps(method)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            with getattr(self, lock_attr_name):
                return method(self, *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator


def align_to(size: int, align_size: int) -> int:
    """Round ``size`` up to a multiple of ``align_size`` (a power of two).

    Raises:
        InvalidArgumentError: ``size`` < 0 or ``align_size`` not a power of two.
    """
    size = check_int("size", size, low=0)
    align_size = check_power_of_two("align_size", align_size)
    return (size + align_size - 1) & ~(align_size - 1)


def get_numa_id(numa_mapping: Any) -> int:
    """The NUMA node ``numa_mapping`` gives for the current GPU (GPU 0 without CUDA).

    Args:
        numa_mapping: a :class:`~kvpool.NUMAMapping` (or any object with a
            ``gpu_to_numa_mapping`` dict, such as LMCache's).

    Raises:
        KeyError: the current GPU is not in the mapping (as in the reference).
        InvalidArgumentError: ``numa_mapping`` has no ``gpu_to_numa_mapping`` dict.
    """
    table = getattr(numa_mapping, "gpu_to_numa_mapping", None)
    if not isinstance(table, dict):
        raise InvalidArgumentError(
            f"numa_mapping must have a gpu_to_numa_mapping dict, got {type(numa_mapping).__name__}"
        )
    gpu = torch.cuda.current_device() if torch.cuda.is_available() else 0
    if gpu not in table:
        raise KeyError(
            f"GPU {gpu} is not in the NUMA mapping (it maps GPUs {sorted(table)}); "
            "add it or use NUMAMapping.detect()"
        )
    return table[gpu]


@functools.lru_cache(maxsize=UBYTE_TYPE_CACHE_SIZE)
def _cached_array_type(num_bytes: int) -> type[ctypes.Array[ctypes.c_ubyte]]:
    return ctypes.c_ubyte * num_bytes


def _get_cached_ubyte_array_type(num_bytes: int) -> type[ctypes.Array[ctypes.c_ubyte]]:
    """``ctypes.c_ubyte * num_bytes``, from a bounded LRU cache.

    The reference caches every size forever (about 3 KB per distinct size,
    the "W5b" growth); here at most :data:`UBYTE_TYPE_CACHE_SIZE` types are
    kept, so memory stays flat.  kvpool's own ``byte_array`` needs no ctypes
    type at all (it slices a memoryview).  Like LMCache's (a ``functools``
    cache) it has ``cache_info()`` and ``cache_clear()``.

    Raises:
        InvalidArgumentError: ``num_bytes`` is not an int in ``[0, 2**63 - 1]``
            (what a ctypes array can count).
    """
    return _cached_array_type(check_int("num_bytes", num_bytes, low=0, high=MAX_LAYOUT_BYTES))


# LMCache's helper is a functools cache, whose cache_info() its tests read to
# prove that byte_array creates no array types: the same cache API here.
_get_cached_ubyte_array_type.cache_info = _cached_array_type.cache_info  # type: ignore[attr-defined]
_get_cached_ubyte_array_type.cache_clear = _cached_array_type.cache_clear  # type: ignore[attr-defined]


# -- pinned alloc/free pairs -------------------------------------------

_buffers: dict[int, Any] = {}
_buffers_lock = threading.Lock()


def _alloc_pinned(
    size: int,
    numa_node: int | None = None,
    hugepages: str = "never",
    shm_name: str | None = None,
) -> int:
    from kvpool.native.buffer import allocate_host

    buffer = allocate_host(
        check_size("size", size),
        pin="auto",
        numa_node=numa_node,
        hugepages=hugepages,
        shm_name=shm_name,
    )
    with _buffers_lock:
        _buffers[buffer.address] = buffer
    return buffer.address


def _free_pinned(ptr: int, *_ignored: Any) -> None:
    ptr = check_int("ptr", ptr, low=0)
    with _buffers_lock:
        buffer = _buffers.pop(ptr, None)
    if buffer is None:
        raise InvalidHandleError(
            f"no pinned buffer at {ptr:#x}: it was freed already or did not come "
            "from PinnedAllocFree.alloc()"
        )
    buffer.close()


@dataclass
class PinnedAllocFree:
    """An alloc/free function pair for pinned host memory, with their arguments.

    ``ptr = pair.alloc()`` maps the memory and returns its address;
    ``pair.free(ptr)`` releases it.  Pairs come from
    :func:`_resolve_pinned_alloc_free`.

    Attributes:
        alloc_fn, alloc_args: called as ``alloc_fn(*alloc_args)``.
        free_fn, free_args: called as ``free_fn(ptr, *free_args)``.
    """

    alloc_fn: Any
    alloc_args: tuple
    free_fn: Any
    free_args: tuple

    def alloc(self) -> int:
        """Allocate the memory; returns its address."""
        return self.alloc_fn(*self.alloc_args)

    def free(self, ptr: int) -> None:
        """Release memory ``alloc()`` returned.

        Raises:
            InvalidHandleError: ``ptr`` is not live memory of this kind.
        """
        self.free_fn(ptr, *self.free_args)


def _resolve_pinned_alloc_free(
    numa_mapping: Any = None,
    shm_name: str | None = None,
    size: int | None = None,
    use_hugepages: bool = False,
) -> PinnedAllocFree:
    """The pinned alloc/free pair for the memory asked for.

    Args:
        numa_mapping: bind to the node it gives the current GPU (see
            :func:`get_numa_id`).
        shm_name: put the memory in this POSIX shared-memory segment.
        size: bytes to allocate.
        use_hugepages: require 2 MiB hugepages.

    Raises:
        InvalidArgumentError: hugepages with shared memory, or a flag or
            name of the wrong type.
        KeyError: the current GPU is not in ``numa_mapping``.
    """
    use_hugepages = check_bool("use_hugepages", use_hugepages)
    hugepages = "required" if use_hugepages else "never"
    if check_optional_str("shm_name", shm_name):
        if use_hugepages:
            raise InvalidArgumentError(
                "hugepages are not supported with shared memory (shm_name); "
                "drop use_hugepages or shm_name"
            )
        return PinnedAllocFree(_alloc_pinned, (size, None, "never", shm_name), _free_pinned, ())
    if numa_mapping is not None:
        node = get_numa_id(numa_mapping)
        return PinnedAllocFree(_alloc_pinned, (size, node, hugepages), _free_pinned, ())
    return PinnedAllocFree(_alloc_pinned, (size, None, hugepages), _free_pinned, ())


def _allocate_gpu_memory(size: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``size``-byte tensor on ``device`` whose address is page-aligned.

    Returns:
        ``(base, aligned)``: keep ``base`` alive for as long as ``aligned``
        is used (``aligned`` is a view of it).

    Raises:
        InvalidArgumentError: ``size`` is not an int >= 0, or a bad device.
        OutOfMemoryError: the device has no room.
        FeatureUnavailableError: torch cannot allocate on that device.
    """
    size = check_int("size", size, low=0, high=MAX_LAYOUT_BYTES)
    if not isinstance(device, (str, torch.device)):
        raise ArgumentTypeError(f"device must be a str or torch.device, got {device!r}")
    page = os.sysconf("SC_PAGESIZE")
    try:
        base = torch.empty(size + page, dtype=torch.uint8, device=device)
    except (RuntimeError, TypeError, ValueError, AssertionError) as exc:  # torch: no CUDA
        raise torch_allocation_error(exc, size, device) from exc
    offset = -base.data_ptr() % page
    return base, base[offset : offset + size]
