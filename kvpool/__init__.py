"""kvpool: host memory for LLM KV-cache offloading.

Pinned, NUMA-local, hugepage or shared host memory, carved into KV chunks
by an extent or paged placement policy and handed out as memory objects
whose bytes move without copies.  The public names follow LMCache's
memory-management module, so code written against it works with
``import kvpool``.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Every public name is imported on first use: ``import kvpool`` (and so the
# ``kvpool`` command's ``--version`` and ``--help``) loads neither torch nor
# libpinmem, and the core (placement, objects) works where the native layer
# is not built.  Each name maps to the module that defines it.
_LAZY_NAMES = {
    "AddressSpaceExhaustedError": "kvpool.errors",
    "ArgumentTypeError": "kvpool.errors",
    "BatchSizeError": "kvpool.errors",
    "FeatureUnavailableError": "kvpool.errors",
    "GroupIndexError": "kvpool.errors",
    "HugePagesExhaustedError": "kvpool.errors",
    "InheritedAcrossForkError": "kvpool.errors",
    "InvalidArgumentError": "kvpool.errors",
    "InvalidHandleError": "kvpool.errors",
    "KVPoolError": "kvpool.errors",
    "LeakedHandleError": "kvpool.errors",
    "LeakedHandleWarning": "kvpool.errors",
    "MemlockLimitError": "kvpool.errors",
    "MemoryLimitError": "kvpool.errors",
    "NativeError": "kvpool.errors",
    "NumaNodeError": "kvpool.errors",
    "OutOfMemoryError": "kvpool.errors",
    "PoolClosedError": "kvpool.errors",
    "RefCountError": "kvpool.errors",
    "SharedMemoryExistsError": "kvpool.errors",
    "SharedMemoryNotFoundError": "kvpool.errors",
    "ViewsOutliveHandleError": "kvpool.errors",
    "MemoryFormat": "kvpool.formats",
    "get_size_bytes": "kvpool.formats",
    "PinnedAllocFree": "kvpool.helpers",
    "_allocate_gpu_memory": "kvpool.helpers",
    "_get_cached_ubyte_array_type": "kvpool.helpers",
    "_resolve_pinned_alloc_free": "kvpool.helpers",
    "align_to": "kvpool.helpers",
    "get_numa_id": "kvpool.helpers",
    "synchronized": "kvpool.helpers",
    "set_strict_mode": "kvpool.misuse",
    "strict_mode": "kvpool.misuse",
    "NUMAMapping": "kvpool.native.numa",
    "HostSpec": "kvpool.native.spec",
    "parse_size": "kvpool.native.units",
    "AddressManager": "kvpool.pool.address",
    "FreeBlock": "kvpool.pool.address",
    "TensorMemoryAllocator": "kvpool.pool.extent",
    "TensorMemoryObj": "kvpool.pool.handle",
    "MemoryAllocatorInterface": "kvpool.pool.interface",
    "PoolStats": "kvpool.pool.interface",
    "MemoryObjMetadata": "kvpool.pool.metadata",
    "PinMonitor": "kvpool.pool.monitor",
    "PinnedReport": "kvpool.pool.monitor",
    "StatsMonitor": "kvpool.pool.monitor",
    "MemoryObj": "kvpool.pool.objects",
    "PagedAddressManager": "kvpool.pool.paged",
    "PagedTensorMemoryAllocator": "kvpool.pool.paged",
    "BytesBufferMemoryObj": "kvpool.pool.placeholders",
    "GDSMemoryObject": "kvpool.pool.placeholders",
    "AdHocMemoryAllocator": "kvpool.allocators",
    "CuFileMemoryAllocator": "kvpool.allocators",
    "GPUMemoryAllocator": "kvpool.allocators",
    "HipFileMemoryAllocator": "kvpool.allocators",
    "HostMemoryAllocator": "kvpool.allocators",
    "MixedMemoryAllocator": "kvpool.allocators",
    "PagedCpuGpuMemoryAllocator": "kvpool.allocators",
    "PinMemoryAllocator": "kvpool.allocators",
    "XPUMemoryAllocator": "kvpool.allocators",
    "_allocate_cpu_memory": "kvpool.allocators",
    "_free_cpu_memory": "kvpool.allocators",
    "_read_hugepage_info": "kvpool.allocators",
    "attach_pool": "kvpool.allocators",
    "BufferAllocator": "kvpool.pool.pools",
    "MemoryPool": "kvpool.pool.pools",
    "LazyMemoryAllocator": "kvpool.pool.lazy",
    "HostBuffer": "kvpool.native.buffer",
    "allocate_host": "kvpool.native.buffer",
    "attach_shm": "kvpool.native.buffer",
    "unlink_shm": "kvpool.native.buffer",
    "Registration": "kvpool.native.registration",
    "register_host": "kvpool.native.registration",
    "capabilities": "kvpool.native.machine",
    "DevDaxArenaState": "kvpool.devdax",
    "DevDaxArenaStatus": "kvpool.devdax",
    "DevDaxBacking": "kvpool.pool.devdax",
    "DevDaxMemoryAllocator": "kvpool.devdax",
    "DevDaxNotMappedError": "kvpool.devdax",
    "DevDaxRemoveMode": "kvpool.devdax",
}

if TYPE_CHECKING:  # the same names, for type checkers and editors
    from kvpool.allocators import (
        AdHocMemoryAllocator,
        CuFileMemoryAllocator,
        GPUMemoryAllocator,
        HipFileMemoryAllocator,
        HostMemoryAllocator,
        MixedMemoryAllocator,
        PagedCpuGpuMemoryAllocator,
        PinMemoryAllocator,
        XPUMemoryAllocator,
        _allocate_cpu_memory,
        _free_cpu_memory,
        _read_hugepage_info,
        attach_pool,
    )
    from kvpool.devdax import (
        DevDaxArenaState,
        DevDaxArenaStatus,
        DevDaxMemoryAllocator,
        DevDaxNotMappedError,
        DevDaxRemoveMode,
    )
    from kvpool.errors import (
        AddressSpaceExhaustedError,
        ArgumentTypeError,
        BatchSizeError,
        FeatureUnavailableError,
        GroupIndexError,
        HugePagesExhaustedError,
        InheritedAcrossForkError,
        InvalidArgumentError,
        InvalidHandleError,
        KVPoolError,
        LeakedHandleError,
        LeakedHandleWarning,
        MemlockLimitError,
        MemoryLimitError,
        NativeError,
        NumaNodeError,
        OutOfMemoryError,
        PoolClosedError,
        RefCountError,
        SharedMemoryExistsError,
        SharedMemoryNotFoundError,
        ViewsOutliveHandleError,
    )
    from kvpool.formats import MemoryFormat, get_size_bytes
    from kvpool.helpers import (
        PinnedAllocFree,
        _allocate_gpu_memory,
        _get_cached_ubyte_array_type,
        _resolve_pinned_alloc_free,
        align_to,
        get_numa_id,
        synchronized,
    )
    from kvpool.misuse import set_strict_mode, strict_mode
    from kvpool.native.buffer import HostBuffer, allocate_host, attach_shm, unlink_shm
    from kvpool.native.machine import capabilities
    from kvpool.native.numa import NUMAMapping
    from kvpool.native.registration import Registration, register_host
    from kvpool.native.spec import HostSpec
    from kvpool.native.units import parse_size
    from kvpool.pool.address import AddressManager, FreeBlock
    from kvpool.pool.devdax import DevDaxBacking
    from kvpool.pool.extent import TensorMemoryAllocator
    from kvpool.pool.handle import TensorMemoryObj
    from kvpool.pool.interface import MemoryAllocatorInterface, PoolStats
    from kvpool.pool.lazy import LazyMemoryAllocator
    from kvpool.pool.metadata import MemoryObjMetadata
    from kvpool.pool.monitor import PinMonitor, PinnedReport, StatsMonitor
    from kvpool.pool.objects import MemoryObj
    from kvpool.pool.paged import PagedAddressManager, PagedTensorMemoryAllocator
    from kvpool.pool.placeholders import BytesBufferMemoryObj, GDSMemoryObject
    from kvpool.pool.pools import BufferAllocator, MemoryPool


def __getattr__(name: str) -> object:
    """Import a public name (or a subpackage, as ``kvpool.remote``) on first use."""
    import importlib.util

    module = _LAZY_NAMES.get(name)
    if module is None:
        if not name.startswith("_") and importlib.util.find_spec(f"kvpool.{name}") is not None:
            return importlib.import_module(f"kvpool.{name}")
        raise AttributeError(f"module 'kvpool' has no attribute {name!r}")
    from kvpool.checks import refuse_unknown_keywords_in

    # Every public call refuses a misspelt keyword naming the closest known
    # one (kvpool.checks.refuse_unknown_keywords): a function is replaced by
    # its wrapper here, a class is guarded in place.
    globals()[name] = getattr(importlib.import_module(module), name)
    refuse_unknown_keywords_in(globals(), (name,))
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_NAMES))


__all__ = [
    "ViewsOutliveHandleError",
    "MemoryLimitError",
    "LeakedHandleWarning",
    "LeakedHandleError",
    "InheritedAcrossForkError",
    "HostSpec",
    "GroupIndexError",
    "ArgumentTypeError",
    "AdHocMemoryAllocator",
    "AddressManager",
    "AddressSpaceExhaustedError",
    "BatchSizeError",
    "BufferAllocator",
    "BytesBufferMemoryObj",
    "CuFileMemoryAllocator",
    "DevDaxArenaState",
    "DevDaxArenaStatus",
    "DevDaxBacking",
    "DevDaxMemoryAllocator",
    "DevDaxNotMappedError",
    "DevDaxRemoveMode",
    "FeatureUnavailableError",
    "FreeBlock",
    "GDSMemoryObject",
    "GPUMemoryAllocator",
    "HipFileMemoryAllocator",
    "HostBuffer",
    "Registration",
    "HostMemoryAllocator",
    "HugePagesExhaustedError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "KVPoolError",
    "LazyMemoryAllocator",
    "MemoryAllocatorInterface",
    "MemlockLimitError",
    "MemoryFormat",
    "MemoryObj",
    "MemoryObjMetadata",
    "MemoryPool",
    "MixedMemoryAllocator",
    "NUMAMapping",
    "NativeError",
    "NumaNodeError",
    "OutOfMemoryError",
    "PagedAddressManager",
    "PagedCpuGpuMemoryAllocator",
    "PagedTensorMemoryAllocator",
    "PinMemoryAllocator",
    "PinMonitor",
    "PinnedAllocFree",
    "PinnedReport",
    "PoolClosedError",
    "PoolStats",
    "RefCountError",
    "SharedMemoryExistsError",
    "SharedMemoryNotFoundError",
    "StatsMonitor",
    "TensorMemoryAllocator",
    "TensorMemoryObj",
    "XPUMemoryAllocator",
    "_allocate_cpu_memory",
    "_allocate_gpu_memory",
    "_free_cpu_memory",
    "_get_cached_ubyte_array_type",
    "_read_hugepage_info",
    "_resolve_pinned_alloc_free",
    "align_to",
    "allocate_host",
    "register_host",
    "attach_pool",
    "attach_shm",
    "capabilities",
    "get_numa_id",
    "get_size_bytes",
    "parse_size",
    "set_strict_mode",
    "strict_mode",
    "synchronized",
    "unlink_shm",
]
