"""kvpool's objects under LMCache's names: what a served module is filled with.

Importing this module imports kvpool's pools, allocators and the native
layer; the finder does so only when LMCache first imports one of the
replaced modules.  :func:`kvpool_names` is the one table from an LMCache
name to kvpool's object; :mod:`~kvpool.integrations.lmcache.names` says
which names each served module holds.
"""

from __future__ import annotations

from typing import Any

from kvpool.allocators import (
    AdHocMemoryAllocator,
    CuFileMemoryAllocator,
    GPUMemoryAllocator,
    HipFileMemoryAllocator,
    HostMemoryAllocator,
    MixedMemoryAllocator,
    PagedCpuGpuMemoryAllocator,
    PinMemoryAllocator,
    _allocate_cpu_memory,
    _free_cpu_memory,
    _read_hugepage_info,
)
from kvpool.devdax import (
    DevDaxArenaState,
    DevDaxArenaStatus,
    DevDaxMemoryAllocator,
    DevDaxNotMappedError,
    DevDaxRemoveMode,
)
from kvpool.formats import MemoryFormat
from kvpool.helpers import (
    PinnedAllocFree,
    _allocate_gpu_memory,
    _get_cached_ubyte_array_type,
    _resolve_pinned_alloc_free,
    align_to,
    get_numa_id,
    synchronized,
)
from kvpool.pool.address import AddressManager, FreeBlock
from kvpool.pool.extent import TensorMemoryAllocator
from kvpool.pool.handle import TensorMemoryObj
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.lazy import LazyMemoryAllocator
from kvpool.pool.metadata import MemoryObjMetadata
from kvpool.pool.objects import MemoryObj
from kvpool.pool.paged import PagedAddressManager, PagedTensorMemoryAllocator
from kvpool.pool.placeholders import BytesBufferMemoryObj, GDSMemoryObject
from kvpool.pool.pools import BufferAllocator

__all__ = ["kvpool_names"]

_NAMES: dict[str, Any] = {
    value.__name__: value
    for value in (
        AdHocMemoryAllocator,
        AddressManager,
        BufferAllocator,
        BytesBufferMemoryObj,
        CuFileMemoryAllocator,
        DevDaxArenaState,
        DevDaxArenaStatus,
        DevDaxMemoryAllocator,
        DevDaxNotMappedError,
        DevDaxRemoveMode,
        FreeBlock,
        GDSMemoryObject,
        GPUMemoryAllocator,
        HipFileMemoryAllocator,
        HostMemoryAllocator,
        LazyMemoryAllocator,
        MemoryAllocatorInterface,
        MemoryFormat,
        MemoryObj,
        MemoryObjMetadata,
        MixedMemoryAllocator,
        PagedAddressManager,
        PagedCpuGpuMemoryAllocator,
        PagedTensorMemoryAllocator,
        PinMemoryAllocator,
        PinnedAllocFree,
        TensorMemoryAllocator,
        TensorMemoryObj,
        _allocate_cpu_memory,
        _allocate_gpu_memory,
        _free_cpu_memory,
        _get_cached_ubyte_array_type,
        _read_hugepage_info,
        _resolve_pinned_alloc_free,
        align_to,
        get_numa_id,
        synchronized,
    )
}


def kvpool_names() -> dict[str, Any]:
    """A copy of the table: LMCache name -> kvpool's implementation."""
    return dict(_NAMES)
