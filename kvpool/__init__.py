"""kvpool: host memory for LLM KV-cache offloading.

Pinned, NUMA-local, hugepage or shared host memory, carved into KV chunks
by an extent or paged placement policy and handed out as memory objects
whose bytes move without copies.  The public names follow LMCache's
memory-management module, so code written against it works with
``import kvpool``.
"""

from kvpool.checks import refuse_unknown_keywords_in
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
from kvpool.native.numa import NUMAMapping
from kvpool.native.spec import HostSpec
from kvpool.pool.address import AddressManager, FreeBlock
from kvpool.pool.extent import TensorMemoryAllocator
from kvpool.pool.handle import TensorMemoryObj
from kvpool.pool.interface import MemoryAllocatorInterface, PoolStats
from kvpool.pool.metadata import MemoryObjMetadata
from kvpool.pool.monitor import PinMonitor, PinnedReport, StatsMonitor
from kvpool.pool.objects import MemoryObj
from kvpool.pool.paged import PagedAddressManager, PagedTensorMemoryAllocator
from kvpool.pool.placeholders import BytesBufferMemoryObj, GDSMemoryObject

__version__ = "0.1.0"

# Names whose modules load libpinmem: imported on first use, so that the
# core (placement, objects) works even where the native layer is not built.
_NATIVE_NAMES = {
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


def __getattr__(name: str) -> object:
    module = _NATIVE_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'kvpool' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    refuse_unknown_keywords_in(globals(), (name,))
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NATIVE_NAMES))


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
    "set_strict_mode",
    "strict_mode",
    "synchronized",
    "unlink_shm",
]

# Every public call refuses a misspelt keyword naming the closest known one
# (kvpool.checks.refuse_unknown_keywords); the lazy names get it as they load.
refuse_unknown_keywords_in(globals(), __all__)
