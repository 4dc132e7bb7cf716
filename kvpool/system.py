"""Old import path of the capability probe; it lives in :mod:`kvpool.native.machine`."""

from kvpool.native.machine import (
    Capabilities,
    HugePagePool,
    capabilities,
    current_numa_node,
    numa_nodes,
    read_hugepage_info,
)

__all__ = [
    "Capabilities",
    "HugePagePool",
    "capabilities",
    "current_numa_node",
    "numa_nodes",
    "read_hugepage_info",
]
