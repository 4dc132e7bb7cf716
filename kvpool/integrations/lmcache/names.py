"""Which names each replaced LMCache module serves, and where they come from.

The bridge replaces exactly the modules listed in :data:`SERVED`: LMCache's
``lmcache.v1.memory_management`` and every ``lmcache.v1.memory_allocators.*``
module of the tested versions.  Each served module holds

* kvpool's implementation of the LMCache names listed for it (taken from the
  :mod:`kvpool` facade, so ``import kvpool`` offers the same names);
* the core names (:data:`CORE`) that LMCache's own module re-exports, so
  ``from lmcache.v1.memory_allocators.x import MemoryObj`` keeps working;
* the LMCache objects the original module imported from the rest of LMCache
  (:data:`LMCACHE_IMPORTS`: its device handle, monitors, NUMA mapping type,
  logger), which stay LMCache's.
"""

from __future__ import annotations

__all__ = ["ALLOCATORS", "CORE", "LMCACHE_IMPORTS", "MEMORY_MANAGEMENT", "SERVED"]

#: The LMCache module holding the memory objects and the address manager.
MEMORY_MANAGEMENT = "lmcache.v1.memory_management"

#: The LMCache package whose every module is an allocator.
ALLOCATORS = "lmcache.v1.memory_allocators"

#: Names of ``lmcache.v1.memory_management`` that every served module carries.
CORE: tuple[str, ...] = (
    "AddressManager",
    "BytesBufferMemoryObj",
    "FreeBlock",
    "GDSMemoryObject",
    "MemoryAllocatorInterface",
    "MemoryFormat",
    "MemoryObj",
    "MemoryObjMetadata",
    "TensorMemoryObj",
)

#: LMCache's ``__all__`` of ``lmcache.v1.memory_management`` (0.5.6).
MEMORY_MANAGEMENT_ALL: tuple[str, ...] = (*CORE, "torch_device_type")

#: served module -> the kvpool names it holds besides :data:`CORE`.
SERVED: dict[str, tuple[str, ...]] = {
    MEMORY_MANAGEMENT: (
        "PinnedAllocFree",
        "_allocate_cpu_memory",
        "_allocate_gpu_memory",
        "_free_cpu_memory",
        "_get_cached_ubyte_array_type",
        "_read_hugepage_info",
        "_resolve_pinned_alloc_free",
        "synchronized",
    ),
    f"{ALLOCATORS}.ad_hoc_memory_allocator": ("AdHocMemoryAllocator",),
    f"{ALLOCATORS}.buffer_allocator": ("BufferAllocator",),
    f"{ALLOCATORS}.cu_file_memory_allocator": ("CuFileMemoryAllocator", "GPUMemoryAllocator"),
    f"{ALLOCATORS}.devdax_memory_allocator": (
        "DevDaxArenaState",
        "DevDaxArenaStatus",
        "DevDaxMemoryAllocator",
        "DevDaxNotMappedError",
        "DevDaxRemoveMode",
        "BufferAllocator",
        "MixedMemoryAllocator",
        "TensorMemoryAllocator",
    ),
    f"{ALLOCATORS}.gpu_memory_allocator": (
        "GPUMemoryAllocator",
        "PagedTensorMemoryAllocator",
        "TensorMemoryAllocator",
    ),
    f"{ALLOCATORS}.hip_file_memory_allocator": ("HipFileMemoryAllocator", "GPUMemoryAllocator"),
    f"{ALLOCATORS}.host_memory_allocator": (
        "HostMemoryAllocator",
        "PagedTensorMemoryAllocator",
        "TensorMemoryAllocator",
    ),
    f"{ALLOCATORS}.lazy_memory_allocator": (
        "LazyMemoryAllocator",
        "TensorMemoryAllocator",
        "align_to",
        "get_numa_id",
    ),
    f"{ALLOCATORS}.mixed_memory_allocator": (
        "MixedMemoryAllocator",
        "BufferAllocator",
        "PagedTensorMemoryAllocator",
        "TensorMemoryAllocator",
    ),
    f"{ALLOCATORS}.paged_cpu_gpu_memory_allocator": (
        "PagedCpuGpuMemoryAllocator",
        "PagedTensorMemoryAllocator",
    ),
    f"{ALLOCATORS}.paged_tensor_memory_allocator": (
        "PagedAddressManager",
        "PagedTensorMemoryAllocator",
    ),
    f"{ALLOCATORS}.pin_memory_allocator": (
        "PinMemoryAllocator",
        "PagedTensorMemoryAllocator",
        "TensorMemoryAllocator",
    ),
    f"{ALLOCATORS}.tensor_memory_allocator": ("TensorMemoryAllocator",),
}

#: Objects the original modules import from the rest of LMCache:
#: name -> (LMCache module, attribute).  They stay LMCache's.
LMCACHE_IMPORTS: dict[str, tuple[str, str]] = {
    "torch_dev": ("lmcache", "torch_dev"),
    "torch_device_type": ("lmcache", "torch_device_type"),
    "device_ops": ("lmcache", "device_ops"),
    "current_device_spec": ("lmcache.v1.platform", "current_device_spec"),
    "init_logger": ("lmcache.logging", "init_logger"),
    "LMCStatsMonitor": ("lmcache.observability", "LMCStatsMonitor"),
    "PinMonitor": ("lmcache.v1.pin_monitor", "PinMonitor"),
    "NUMAMapping": ("lmcache.v1.system_detection", "NUMAMapping"),
    "get_size_bytes": ("lmcache.utils", "get_size_bytes"),
    "_lmcache_nvtx_annotate": ("lmcache.utils", "_lmcache_nvtx_annotate"),
}
