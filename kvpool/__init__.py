"""kvpool: host memory for LLM KV-cache offloading.

Pinned, NUMA-local, hugepage or shared host memory, carved into KV chunks
by an extent or paged placement policy and handed out as memory objects
whose bytes move without copies.  The public names follow LMCache's
memory-management module, so code written against it works with
``import kvpool``.
"""

from kvpool.address import AddressManager, FreeBlock
from kvpool.errors import (
    AddressSpaceExhaustedError,
    FeatureUnavailableError,
    HugePagesExhaustedError,
    InvalidArgumentError,
    InvalidHandleError,
    KVPoolError,
    NativeError,
    NumaNodeError,
    OutOfMemoryError,
    PoolClosedError,
    RefCountError,
    SharedMemoryExistsError,
    SharedMemoryNotFoundError,
)
from kvpool.extent import TensorMemoryAllocator
from kvpool.formats import MemoryFormat, get_size_bytes
from kvpool.interface import MemoryAllocatorInterface, PoolStats
from kvpool.misuse import set_strict_mode, strict_mode
from kvpool.monitor import PinMonitor
from kvpool.objects import (
    BytesBufferMemoryObj,
    GDSMemoryObject,
    MemoryObj,
    MemoryObjMetadata,
    TensorMemoryObj,
)
from kvpool.paged import PagedAddressManager, PagedTensorMemoryAllocator

__version__ = "0.1.0"

__all__ = [
    "AddressManager",
    "AddressSpaceExhaustedError",
    "BytesBufferMemoryObj",
    "FeatureUnavailableError",
    "FreeBlock",
    "GDSMemoryObject",
    "HugePagesExhaustedError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "KVPoolError",
    "MemoryAllocatorInterface",
    "MemoryFormat",
    "MemoryObj",
    "MemoryObjMetadata",
    "NativeError",
    "NumaNodeError",
    "OutOfMemoryError",
    "PagedAddressManager",
    "PagedTensorMemoryAllocator",
    "PinMonitor",
    "PoolClosedError",
    "PoolStats",
    "RefCountError",
    "SharedMemoryExistsError",
    "SharedMemoryNotFoundError",
    "TensorMemoryAllocator",
    "TensorMemoryObj",
    "get_size_bytes",
    "set_strict_mode",
    "strict_mode",
]
