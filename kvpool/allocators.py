"""The reference API's allocator classes, as named constructions of one pool.

Each class here only chooses a backing and a policy for
:class:`~kvpool.pool.pools.MemoryPool`; none re-implements allocation, locking
or freeing.

=========================  ==============================================
class                      backing
=========================  ==============================================
HostMemoryAllocator        pageable host memory (libpinmem, not pinned)
PinMemoryAllocator         pinned host memory
MixedMemoryAllocator       pinned host memory, optionally NUMA-bound,
                           hugepage or shared; plus byte buffers for
                           ``BINARY_BUFFER``
GPUMemoryAllocator         ``torch.empty`` on a CUDA device (CPU fallback)
XPUMemoryAllocator         ``torch.empty`` on an XPU device
CuFile/HipFileMemoryAllocator  GPU memory registered with cuFile/hipFile
=========================  ==============================================

Every class takes ``use_paging=True`` plus ``shapes``, ``dtypes`` and
``fmt`` for a paged policy, the extent policy otherwise.  Also here:
:class:`PagedCpuGpuMemoryAllocator`, the helpers ``_allocate_cpu_memory`` /
``_free_cpu_memory``, and :class:`AdHocMemoryAllocator` (from
:mod:`kvpool.pool.adhoc`).
"""

from __future__ import annotations

import ctypes
import importlib
import threading
from typing import Any

import torch

from kvpool.checks import (
    REQUIRED,
    check_bool,
    check_int,
    check_optional_str,
    check_power_of_two,
    refuse_in_place,
    takes_keywords,
)
from kvpool.errors import (
    ArgumentTypeError,
    FeatureUnavailableError,
    InvalidArgumentError,
    InvalidHandleError,
)
from kvpool.formats import MemoryFormat
from kvpool.native.machine import read_hugepage_info
from kvpool.native.numa import NUMAMapping, resolve_numa_node
from kvpool.native.spec import HostSpec
from kvpool.pool.address import AddressManager
from kvpool.pool.adhoc import AdHocMemoryAllocator
from kvpool.pool.backing import (
    Backing,
    HostBacking,
    TorchBacking,
    default_hugepages,
    pool_register_chunk,
)
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.pool.paged import PagedTensorMemoryAllocator
from kvpool.pool.policy import PlacementSpec, check_object_list
from kvpool.pool.pools import MemoryPool
from kvpool.pool.shared import AttachedPool, IndexedPool, SharedPoolBacking, index_slots
from kvpool.pool.shmindex import IndexWriter

__all__ = [
    "AdHocMemoryAllocator",
    "CuFileMemoryAllocator",
    "GPUMemoryAllocator",
    "HipFileMemoryAllocator",
    "HostMemoryAllocator",
    "MixedMemoryAllocator",
    "PagedCpuGpuMemoryAllocator",
    "PinMemoryAllocator",
    "XPUMemoryAllocator",
    "_allocate_cpu_memory",
    "_free_cpu_memory",
    "_read_hugepage_info",
]


#: Keywords every pool takes for its placement (the reference's ``**kwargs``).
PLACEMENT_KEYWORDS = frozenset({"shapes", "dtypes", "fmt", "align_bytes"})
#: Keywords a host pool takes for where its memory lives.
NUMA_KEYWORDS = frozenset({"numa_mapping", "numa_node"})
#: Keywords of :class:`MixedMemoryAllocator` beyond those.
MIXED_KEYWORDS = frozenset({"shm_name", "shm_reuse", "shm_index_slots", "config", "pin"})


def _numa_node(kwargs: dict[str, Any]) -> int | None:
    """The node to bind to: an explicit ``numa_node`` wins over ``numa_mapping``."""
    numa_node = kwargs.get("numa_node")
    if numa_node is None:
        return resolve_numa_node(kwargs.get("numa_mapping"))
    return check_int("numa_node", numa_node, low=0, high=(1 << 31) - 1)


def _register_chunk(size: object, placement: PlacementSpec) -> int | None:
    """The chunk a host pool registers in: a multiple of its unit (see ``pool_register_chunk``)."""
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        return None  # HostSpec names the bad size
    return pool_register_chunk(size, placement.unit())


class _HostPool(MemoryPool):
    """A pool in host memory pinned per the class's ``_pin`` policy."""

    _pin = "none"

    @takes_keywords(PLACEMENT_KEYWORDS, NUMA_KEYWORDS)
    def __init__(self, size: int, use_paging: bool = False, **kwargs: Any) -> None:
        name = type(self).__name__
        placement = PlacementSpec.from_reference(use_paging, kwargs)
        spec = HostSpec(
            size,
            pin=self._pin,
            numa_node=_numa_node(kwargs),
            hugepages=default_hugepages(),
            register_chunk=_register_chunk(size, placement),
        )
        super().__init__(HostBacking(spec), placement, name=name)


class HostMemoryAllocator(_HostPool):
    """A pool in pageable (not pinned) host memory.

    Args:
        size: bytes, > 0.
        use_paging: paged placement (needs ``shapes``, ``dtypes``, ``fmt``).
        **kwargs: ``shapes``, ``dtypes``, ``fmt`` for paging;
            ``align_bytes`` for the extent policy; ``numa_mapping`` or
            ``numa_node`` to bind the memory to a node.

    Raises:
        ArgumentTypeError: an unknown keyword (named, with the closest one).
        InvalidArgumentError: a bad size or option.
    """

    _pin = "none"


class PinMemoryAllocator(_HostPool):
    """A pool in pinned host memory (CUDA-pinned, else mlocked when allowed).

    Args:
        size: bytes, > 0.
        use_paging: paged placement (needs ``shapes``, ``dtypes``, ``fmt``).
        **kwargs: as :class:`HostMemoryAllocator`.

    Raises:
        ArgumentTypeError: an unknown keyword (named, with the closest one).
        InvalidArgumentError: a bad size or option.
    """

    _pin = "auto"


class MixedMemoryAllocator(IndexedPool):
    """Pinned host memory for KV formats plus byte buffers for ``BINARY_BUFFER``.

    Args:
        size: bytes of pinned memory, > 0.
        use_paging: paged placement (needs ``shapes``, ``dtypes``, ``fmt``).
        use_hugepages: require 2 MiB hugepages (an actionable error when the
            pool is short).  Without it the pool uses 4 KiB pages, leaving
            the hugepages to pools that ask (``KVPOOL_HUGEPAGES=auto`` lets
            it take them when enough are free).
        **kwargs: ``numa_mapping`` (a :class:`NUMAMapping`: bind to the
            current GPU's node, or the calling CPU's node without GPUs),
            ``numa_node`` (bind to this node, overriding ``numa_mapping``),
            ``align_bytes`` (a power of two), ``shm_name`` (share the pool
            with other processes; also read from ``config``'s extra config
            as in the reference), ``shm_reuse`` (replace a leftover segment),
            ``pin`` (how to pin, as :class:`~kvpool.native.spec.HostSpec`;
            default "auto"), ``shm_index_slots`` (objects a shared pool's
            index describes at once; 0: no index; default one per 64 KiB,
            or one per page of a paged pool) and ``shapes``/``dtypes``/``fmt``
            for paging.

    A shared pool describes each object it places (shapes, dtypes,
    format, and the key given to ``publish``) in an index inside its
    segment, so a process that attaches it (:func:`attach_pool`) rebuilds
    typed views with ``attached.tensor(offset_or_key)``; see
    :class:`~kvpool.pool.shared.IndexedPool` for ``publish``.

    Raises:
        ArgumentTypeError: an unknown keyword (named, with the closest one).
        InvalidArgumentError: bad size, alignment or paging arguments, or
            hugepages together with shared memory.
        HugePagesExhaustedError: ``use_hugepages`` and the pool is short.
        NumaNodeError: the mapping names a node this machine lacks.
    """

    @takes_keywords(PLACEMENT_KEYWORDS, NUMA_KEYWORDS, MIXED_KEYWORDS)
    def __init__(
        self, size: int, use_paging: bool = False, use_hugepages: bool = False, **kwargs: Any
    ) -> None:
        self.numa_mapping: NUMAMapping | None = kwargs.get("numa_mapping")
        self.align_bytes = check_power_of_two(
            "align_bytes", kwargs.get("align_bytes", AddressManager.ALIGN_BYTES)
        )
        config = kwargs.get("config")
        if config is not None and hasattr(config, "get_extra_config_value"):
            self.shm_name: str | None = config.get_extra_config_value("shm_name", None)
        else:
            self.shm_name = kwargs.get("shm_name")
        check_optional_str("shm_name", self.shm_name)
        if check_bool("use_hugepages", use_hugepages) and self.shm_name:
            raise InvalidArgumentError(
                "hugepages are not supported with shared memory (shm_name); "
                "drop use_hugepages or shm_name"
            )
        if use_hugepages:
            hugepages = "required"
        elif self.shm_name:
            hugepages = "never"
        else:
            hugepages = default_hugepages()
        placement = PlacementSpec.from_reference(use_paging, kwargs, align_bytes=self.align_bytes)
        spec = HostSpec(
            size,
            pin=kwargs.get("pin", "auto"),
            numa_node=_numa_node(kwargs),
            hugepages=hugepages,
            shm_name=self.shm_name,
            shm_reuse=kwargs.get("shm_reuse", False),
            register_chunk=_register_chunk(size, placement),
        )
        slots = index_slots(spec.size, use_paging, kwargs) if self.shm_name else 0
        backing: Backing = SharedPoolBacking(spec, slots) if slots else HostBacking(spec)
        self._index: IndexWriter | None = getattr(backing, "index", None)
        super().__init__(backing, placement, byte_buffers=True, name="MixedMemoryAllocator")

    @property
    def pin_allocator(self) -> Any:
        """The placement policy over the pinned memory (reference name)."""
        return self.allocator


def attach_pool(shm_name: str, size: int | None = None, *, pin: str = "auto") -> AttachedPool:
    """Map the shared memory of a pool another process created with ``shm_name``.

    The result, an :class:`~kvpool.pool.shared.AttachedPool`, has:

    * ``tensor(where)`` / ``tensors(where)`` - zero-copy tensors of the
      creator's object at byte offset ``where`` (an ``int``, its
      ``shm_offset``) or published under key ``where`` (a ``str``, see
      ``MixedMemoryAllocator.publish``), with the shapes and dtypes
      the creator gave it: nothing needs to be sent out of band;
    * ``entry(where)`` / ``entries()`` - what the index says (offset,
      bytes, shapes, dtypes, format, key);
    * ``view`` - the pool's bytes as a memoryview: an object's bytes are
      ``view[obj.shm_offset : obj.shm_offset + obj.shm_byte_length]``;
    * ``buffer`` (a flat ``uint8`` tensor), ``size``, ``indexed``,
      ``describe()``, and ``close()`` (also ``with``), which unmaps and
      never removes the segment.

    Do not attach with ``multiprocessing.shared_memory.SharedMemory(name)``
    instead: Python's resource tracker unlinks a segment it attached when
    that process exits, removing the creator's segment.

    Args:
        shm_name: the pool's ``shm_name``.
        size: bytes to map (default: the whole segment; a pool mapped in
            part has no index, only ``view``).
        pin: as :func:`kvpool.attach_shm` takes it: "auto" (default: pin when CUDA or
            the memlock limit allows), "none" (lock nothing), "mlock", "cuda-register".

    Returns:
        The :class:`~kvpool.pool.shared.AttachedPool`; close it to detach.

    Raises:
        SharedMemoryNotFoundError: no pool of that name exists.
        InvalidArgumentError: a bad name, a size that is not positive
            or exceeds the segment, or a bad pin mode.
        InvalidHandleError: the segment's index is damaged.
    """
    return AttachedPool(shm_name, size, pin=pin)


class _DevicePool(MemoryPool):
    """A pool in device memory (``torch.empty`` on ``device``)."""

    @takes_keywords(PLACEMENT_KEYWORDS - {"align_bytes"})  # a named parameter here
    def __init__(
        self,
        size: int,
        device: str | torch.device,
        align_bytes: int | None = None,
        use_paging: bool = False,
        **kwargs: Any,
    ) -> None:
        align = AddressManager.ALIGN_BYTES if align_bytes is None else align_bytes
        placement = PlacementSpec.from_reference(use_paging, kwargs, align_bytes=align)
        super().__init__(TorchBacking(size, device), placement, name=type(self).__name__)

    @property
    def tensor(self) -> torch.Tensor:
        """The device memory (reference name)."""
        return self.backing.tensor


class GPUMemoryAllocator(_DevicePool):
    """A pool in device memory (``torch.empty`` on ``device``).

    Without CUDA the pool falls back to CPU memory, as in the reference.

    Args:
        size: bytes, > 0.
        device: the torch device ("cuda", "cuda:1"...).
        align_bytes: extent alignment (default 4096).
        use_paging: paged placement (needs ``shapes``, ``dtypes``, ``fmt``).
    """

    @takes_keywords(PLACEMENT_KEYWORDS - {"align_bytes"})
    def __init__(
        self,
        size: int,
        device: str = "cuda",
        align_bytes: int | None = None,
        use_paging: bool = False,
        **kwargs: Any,
    ) -> None:
        if not torch.cuda.is_available() and str(device).startswith("cuda"):
            device = "cpu"
        super().__init__(size, device, align_bytes, use_paging, **kwargs)


class XPUMemoryAllocator(_DevicePool):
    """A pool in Intel XPU memory.

    Raises:
        FeatureUnavailableError: torch has no usable XPU device here.
    """

    @takes_keywords(PLACEMENT_KEYWORDS - {"align_bytes"})
    def __init__(
        self,
        size: int,
        device: str = "xpu",
        align_bytes: int | None = None,
        use_paging: bool = False,
        **kwargs: Any,
    ) -> None:
        xpu = getattr(torch, "xpu", None)
        if xpu is None or not xpu.is_available():
            raise FeatureUnavailableError(
                "XPUMemoryAllocator needs an Intel XPU and a torch build with XPU support "
                "(torch.xpu.is_available() is False here)"
            )
        super().__init__(size, device, align_bytes, use_paging, **kwargs)

    def close(self) -> None:
        """Synchronize the XPU, then close (idempotent)."""
        if not self.closed:
            torch.xpu.synchronize()
        super().close()


def _import_driver(module: str, names: tuple[str, ...], install: str) -> tuple[Any, ...]:
    try:
        mod = importlib.import_module(module)
        return tuple(getattr(mod, n) for n in names)
    except (ImportError, AttributeError) as exc:
        raise FeatureUnavailableError(
            f"{module} is not available ({exc}); install it with {install} on a machine "
            "with GPUDirect Storage"
        ) from None


class CuFileMemoryAllocator(GPUMemoryAllocator):
    """GPU memory registered with cuFile (GPUDirect Storage).

    Raises:
        FeatureUnavailableError: the ``cufile`` bindings are missing.
    """

    _driver = (
        "cufile.bindings",
        ("cuFileBufRegister", "cuFileBufDeregister"),
        "pip install cufile-python",
    )

    def __init__(self, size: int, device: str | None = None) -> None:
        register, self._deregister = _import_driver(*self._driver)
        if device is None:
            device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
        super().__init__(size, device, align_bytes=4096)
        self.base_pointer = self.backing.tensor.data_ptr()
        register(ctypes.c_void_p(self.base_pointer), size, flags=0)
        self._registered = True

    def close(self) -> None:
        """Deregister the buffer, then close (idempotent)."""
        if getattr(self, "_registered", False):
            self._registered = False
            self._deregister(ctypes.c_void_p(self.base_pointer))
        super().close()


class HipFileMemoryAllocator(CuFileMemoryAllocator):
    """GPU memory registered with hipFile (ROCm GPUDirect Storage).

    Raises:
        FeatureUnavailableError: the ``hipfile`` bindings are missing.
    """

    _driver = (
        "hipfile.bindings",
        ("hipFileBufRegister", "hipFileBufDeregister"),
        "the hipFile Python bindings",
    )


class PagedCpuGpuMemoryAllocator(MemoryAllocatorInterface):
    """A paged CPU pool and a paged GPU pool behind one interface.

    Call :meth:`init_cpu_memory_allocator` and/or
    :meth:`init_gpu_memory_allocator` first; ``allocator_type`` ("cpu" or
    "gpu") picks the pool.  Frees go to the pool the object came from.

    Attributes:
        cpu_buffer: the CPU pool's memory (None before
            :meth:`init_cpu_memory_allocator`, empty after :meth:`close`).
        cpu_size: its bytes (0 before and after).
        cpu_numa_mapping: the NUMA mapping it was made with.
    """

    def __init__(self) -> None:
        self.cpu_pool: MemoryPool | None = None
        self.gpu_pool: MemoryPool | None = None
        self.cpu_buffer: torch.Tensor | None = None
        self.cpu_size = 0
        self.cpu_numa_mapping: NUMAMapping | None = None

    def init_gpu_memory_allocator(
        self,
        size: int,
        shapes: list[torch.Size],
        dtypes: list[torch.dtype],
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        device: str = "cuda",
    ) -> None:
        """Create the GPU pool (CPU memory when CUDA is absent)."""
        self.gpu_pool = GPUMemoryAllocator(
            size, device, use_paging=True, shapes=shapes, dtypes=dtypes, fmt=fmt
        )

    def init_cpu_memory_allocator(
        self,
        size: int,
        shapes: list[torch.Size],
        dtypes: list[torch.dtype],
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        numa_mapping: NUMAMapping | None = None,
    ) -> None:
        """Create the pinned CPU pool."""
        self.cpu_pool = MixedMemoryAllocator(
            size, use_paging=True, shapes=shapes, dtypes=dtypes, fmt=fmt, numa_mapping=numa_mapping
        )
        self.cpu_buffer = self.cpu_pool.buffer
        self.cpu_size = size
        self.cpu_numa_mapping = numa_mapping

    @property
    def gpu_allocator(self) -> PagedTensorMemoryAllocator:
        """The GPU pool's paged policy (reference name)."""
        return self._pool("gpu").allocator  # type: ignore[return-value]

    @property
    def cpu_allocator(self) -> PagedTensorMemoryAllocator:
        """The CPU pool's paged policy (reference name)."""
        return self._pool("cpu").allocator  # type: ignore[return-value]

    @property
    def align_bytes(self) -> int:
        """Page size of the CPU pool."""
        return self.cpu_allocator.align_bytes

    def _pool(self, allocator_type: str | None) -> MemoryPool:
        if not isinstance(allocator_type, str) or allocator_type not in ("cpu", "gpu"):
            raise InvalidArgumentError(
                f"allocator_type must be 'cpu' or 'gpu', got {allocator_type!r}"
            )
        pool = self.cpu_pool if allocator_type == "cpu" else self.gpu_pool
        if pool is None:
            raise InvalidArgumentError(
                f"the {allocator_type} pool is not set up; call "
                f"init_{allocator_type}_memory_allocator() first"
            )
        return pool

    def _owner(self, obj: MemoryObj, allocator_type: str | None) -> MemoryPool:
        if allocator_type is not None:
            self._pool(allocator_type)  # validates the argument
        for pool in (self.cpu_pool, self.gpu_pool):
            if pool is not None and getattr(obj, "parent_allocator", None) is pool:
                return pool
        raise InvalidHandleError(f"{obj!r} was not allocated by this PagedCpuGpuMemoryAllocator")

    def allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.UNDEFINED,
        allocator_type: str | None = "cpu",
        **unknown: Any,
    ) -> MemoryObj | None:
        """Allocate a page from the ``allocator_type`` pool (None when full)."""
        if unknown or shapes is REQUIRED or dtypes is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes)
        return self._pool(allocator_type).allocator.allocate(shapes, dtypes, fmt)

    def batched_allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        batch_size: int = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.UNDEFINED,
        allocator_type: str | None = "gpu",
        **unknown: Any,
    ) -> list[MemoryObj] | None:
        """Allocate pages from the ``allocator_type`` pool, all or nothing."""
        if unknown or shapes is REQUIRED or dtypes is REQUIRED or batch_size is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes, batch_size)
        return self._pool(allocator_type).allocator.batched_allocate(  # type: ignore[return-value]
            shapes, dtypes, batch_size, fmt
        )

    def free(
        self, memory_obj: MemoryObj = REQUIRED, allocator_type: str | None = "cpu", **unknown: Any
    ) -> None:
        """Free an object into the pool it came from."""
        if unknown or memory_obj is REQUIRED:
            refuse_in_place(self, unknown, memory_obj)
        self._owner(memory_obj, allocator_type).free(memory_obj)

    def batched_free(
        self,
        memory_objs: list[MemoryObj] = REQUIRED,
        allocator_type: str | None = None,
        update_stats: bool = True,
        **unknown: Any,
    ) -> None:
        """Free each object into the pool it came from."""
        if unknown or memory_objs is REQUIRED:
            refuse_in_place(self, unknown, memory_objs)
        check_object_list(memory_objs, "batched_free")
        by_pool: dict[int, tuple[MemoryPool, list[MemoryObj]]] = {}
        for obj in memory_objs:
            pool = self._owner(obj, allocator_type)
            by_pool.setdefault(id(pool), (pool, []))[1].append(obj)
        for pool, objs in by_pool.values():
            pool.batched_free(objs)

    def memcheck(self) -> bool:
        """True when both pools' invariants hold."""
        return all(p.memcheck() for p in (self.cpu_pool, self.gpu_pool) if p is not None)

    def close(self) -> None:
        """Close both pools (idempotent); ``cpu_buffer`` becomes empty, ``cpu_size`` 0."""
        for pool in (self.cpu_pool, self.gpu_pool):
            if pool is not None:
                pool.close()
        if self.cpu_buffer is not None:
            self.cpu_buffer = torch.empty(0, dtype=torch.uint8)
            self.cpu_size = 0
            self.cpu_numa_mapping = None

    def __str__(self) -> str:
        return "PDMemoryAllocator"


# ---------------------------------------------------------------------------
# the reference's pinned-memory helpers
# ---------------------------------------------------------------------------

_cpu_buffers: dict[int, Backing] = {}
_cpu_buffers_lock = threading.Lock()


def _allocate_cpu_memory(
    size: int,
    numa_mapping: NUMAMapping | None = None,
    shm_name: str | None = None,
    use_hugepages: bool = False,
) -> torch.Tensor:
    """Pinned host memory as a flat ``uint8`` tensor (reference helper).

    The tensor keeps its memory alive; :func:`_free_cpu_memory` releases
    the pool's hold, and the memory goes when the last view does.

    Args:
        size: bytes (0 gives an empty tensor).
        numa_mapping: bind to the node it gives for this process.
        shm_name: put the memory in a named shared-memory segment.
        use_hugepages: require 2 MiB hugepages (not with ``shm_name``).

    Raises:
        InvalidArgumentError: bad size, or hugepages with shared memory.
        HugePagesExhaustedError: hugepages required and the pool is short.
    """
    if size.__class__ is int and size == 0:
        return torch.empty(0, dtype=torch.uint8)
    hugepages = check_bool("use_hugepages", use_hugepages)
    if hugepages and check_optional_str("shm_name", shm_name):
        raise InvalidArgumentError("hugepages are not supported with shared memory (shm_name)")
    spec = HostSpec(
        size,
        pin="auto",
        numa_node=resolve_numa_node(numa_mapping),
        hugepages="required" if hugepages else "never",
        shm_name=shm_name,
    )
    backing = HostBacking(spec)
    tensor = backing.tensor
    with _cpu_buffers_lock:
        _cpu_buffers[tensor.data_ptr()] = backing
    return tensor


def _free_cpu_memory(
    buffer: torch.Tensor,
    size: int | None = None,
    numa_mapping: NUMAMapping | None = None,
    shm_name: str | None = None,
    use_hugepages: bool = False,
) -> None:
    """Release memory from :func:`_allocate_cpu_memory` (reference helper).

    The mapping goes when the last view of it (``buffer`` included) is
    released, so nothing dangles.

    Raises:
        InvalidHandleError: ``buffer`` did not come from _allocate_cpu_memory,
            or was already freed.
    """
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    if not isinstance(buffer, torch.Tensor) or buffer.layout is not torch.strided:
        raise ArgumentTypeError(f"buffer must be a dense tensor, got {type(buffer).__name__}")
    if buffer.numel() == 0:
        return
    with _cpu_buffers_lock:
        backing = _cpu_buffers.pop(buffer.data_ptr(), None)
    if backing is None:
        raise InvalidHandleError(
            f"_free_cpu_memory: no live buffer at {buffer.data_ptr():#x}; "
            "it was freed already or did not come from _allocate_cpu_memory"
        )
    backing.close()


def _read_hugepage_info() -> tuple[int, int, int] | None:
    """``(nr_hugepages, free_hugepages, 2)`` for the 2 MiB pool, or None."""
    return read_hugepage_info()
