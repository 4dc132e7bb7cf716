"""Where a pool's bytes come from: native host regions or torch device memory.

A backing owns one flat range of memory and exposes it as a ``uint8``
tensor (``tensor``), as a memoryview for host memory (``view``) and a
``close()`` that releases it.  Pools combine a backing with a placement
policy; the backing never knows about objects.

* :class:`HostBacking` - a :class:`~kvpool.native.buffer.HostBuffer` from
  libpinmem: pageable or pinned, NUMA-bound, hugepage or shared memory.
* :class:`TorchBacking` - ``torch.empty`` on any device (GPU pools, and
  the CPU fallback of GPU pools on machines without one).
"""

from __future__ import annotations

import os
from typing import Any

import torch

import kvpool.native.buffer as host
from kvpool.checks import check_size
from kvpool.errors import (
    ArgumentTypeError,
    FeatureUnavailableError,
    InvalidArgumentError,
    OutOfMemoryError,
)
from kvpool.formats import MAX_LAYOUT_BYTES
from kvpool.native.registration import register_plan
from kvpool.native.spec import HostSpec

__all__ = [
    "HUGEPAGES_ENV",
    "Backing",
    "DeviceOutOfMemoryError",
    "HostBacking",
    "TorchBacking",
    "default_hugepages",
    "pool_register_chunk",
    "torch_allocation_error",
]

_EMPTY = torch.empty(0, dtype=torch.uint8)

#: Environment variable with the hugepage policy of pools that do not ask
#: for hugepages: "never" (default), "auto" (2 MiB pages when enough are
#: free), "thp".
HUGEPAGES_ENV = "KVPOOL_HUGEPAGES"


def default_hugepages() -> str:
    """Hugepage policy for pools that were not asked for hugepages.

    Returns ``$KVPOOL_HUGEPAGES`` when it is "never", "auto" or "thp", else
    "never".  The default leaves the hugepage pool to the pools that ask
    for it (``use_hugepages=True``): were pools that did not ask to take free
    2 MiB pages, a pool that needs them could find none left.
    ``KVPOOL_HUGEPAGES=auto`` lets every pool use them when enough are free
    (a 4 GiB pool then becomes ready several times faster).

    Raises:
        InvalidArgumentError: the variable holds anything else.
    """
    value = os.environ.get(HUGEPAGES_ENV, "never").strip().lower() or "never"
    if value not in ("auto", "never", "thp"):
        raise InvalidArgumentError(
            f"{HUGEPAGES_ENV}={value!r} is not one of 'never', 'auto', 'thp'"
        )
    return value


class Backing:
    """A flat range of memory owned by a pool.

    Attributes:
        tensor: the bytes as a flat ``uint8`` tensor.
        view: the bytes as a writable memoryview (None for device memory).
        size: bytes.
        device: the torch device holding the bytes.
    """

    tensor: torch.Tensor
    view: memoryview | None
    size: int

    @property
    def device(self) -> torch.device:
        """The torch device holding the bytes."""
        return self.tensor.device

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the memory (views made earlier keep it alive). Idempotent."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """What the memory is (kind, pinning, pages, node...), for reports."""
        raise NotImplementedError

    def registrations(self) -> list[tuple[int, int]]:
        """``(offset, length)`` of each CUDA registration of the memory, in address order.

        A GPU copy of a range must stay inside one (see
        :mod:`kvpool.pool.barriers`): the pool's placement keeps every
        object inside one.  Empty for memory with no registration
        boundary inside it (unpinned, mlocked, device memory).
        """
        return []


def pool_register_chunk(size: int, unit: int) -> int:
    """The ``register_chunk`` a pool of ``size`` bytes asks for: a multiple of its ``unit``.

    See :func:`kvpool.native.registration.register_plan`: about a sixteenth
    of the pool (so population and registration overlap), at least 256 MiB,
    at most the ``register_chunk`` option, and a power of two times
    ``lcm(unit, 2 MiB)``, so that objects of ``unit`` bytes pack with no loss.
    """
    return register_plan(size, unit)


class HostBacking(Backing):
    """Host memory from libpinmem, made as a :class:`~kvpool.native.spec.HostSpec` says.

    Args:
        spec: the mapping: size, pinning, NUMA node, pages, shared memory,
            population.

    Raises:
        The errors of :func:`kvpool.native.buffer.allocate_host`.
    """

    def __init__(self, spec: HostSpec) -> None:
        if not isinstance(spec, HostSpec):
            raise ArgumentTypeError(f"spec must be a HostSpec, got {type(spec).__name__}")
        self.spec = spec
        self.buffer = host.allocate_spec(spec)
        self._init_views()

    @classmethod
    def attach(cls, name: str, size: int | None = None, *, pin: str = "auto") -> HostBacking:
        """Map a shared-memory segment another process created.

        Args:
            name: the segment's name.
            size: bytes to map (None: the whole segment).
            pin: how to pin the mapping here (see :func:`kvpool.native.buffer.attach_shm`).

        Raises:
            SharedMemoryNotFoundError: no segment of that name.
        """
        self = cls.__new__(cls)
        self.buffer = host.attach_shm(name, size, pin=pin)
        self._init_views()
        return self

    def _init_views(self) -> None:
        self.view = self.buffer.memoryview()
        self.tensor = torch.frombuffer(self.view, dtype=torch.uint8)
        self.size = self.buffer.size

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self.buffer.closed

    def close(self) -> None:
        """Drop this backing's hold on the mapping (views keep it alive). Idempotent."""
        self.view = None
        self.tensor = _EMPTY
        self.buffer.close()

    def registrations(self) -> list[tuple[int, int]]:
        """The mapping's CUDA registrations (see :meth:`Backing.registrations`); [] once closed."""
        if self.buffer.closed:
            return []
        return self.buffer.registrations()

    def describe(self) -> dict[str, Any]:
        """Kind, size, pinning, pages, NUMA node and shm name of the mapping."""
        b = self.buffer
        return {
            "kind": b.kind,
            "size": b.size,
            "pinned": b.pinned,
            "hugepages": b.hugepages,
            "numa_node": b.numa_node,
            "numa_bound": b.numa_bound,
            "shm_name": b.shm_name,
        }


class DeviceOutOfMemoryError(OutOfMemoryError):
    """A device (GPU) has not enough free memory for a pool."""


def torch_allocation_error(exc: BaseException, size: int, device: object) -> Exception:
    """kvpool's error for torch's refusal to allocate ``size`` bytes on ``device``.

    An unknown device or backend is a :class:`FeatureUnavailableError`; out
    of device (or host) memory a :class:`DeviceOutOfMemoryError`.
    """
    text = str(exc).lower()
    if "out of memory" in text or "can't allocate memory" in text:
        return DeviceOutOfMemoryError(
            f"{size} bytes on {device!r}: the device is out of memory ({exc})"
        )
    return FeatureUnavailableError(f"cannot allocate {size} bytes on device {device!r}: {exc}")


class TorchBacking(Backing):
    """``torch.empty`` memory on a device.

    Args:
        size: bytes, > 0.
        device: a torch device (string or ``torch.device``).

    Raises:
        InvalidArgumentError: size not a positive int.
    """

    def __init__(self, size: int, device: str | torch.device = "cpu") -> None:
        size = check_size("size", size, high=MAX_LAYOUT_BYTES)
        try:
            self.tensor = torch.empty(size, dtype=torch.uint8, device=device)
        except (RuntimeError, TypeError, ValueError, AssertionError) as exc:  # torch: no CUDA
            raise torch_allocation_error(exc, size, device) from exc
        host = self.tensor.device.type == "cpu"
        self.view: memoryview | None = memoryview(self.tensor.numpy()) if host else None
        self.size = size
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    def close(self) -> None:
        """Forget the tensor (torch frees it with its last view). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.tensor.device.type == "cuda":
            torch.cuda.synchronize(self.tensor.device)
        self.view = None
        self.tensor = torch.empty(0, dtype=torch.uint8, device=self.tensor.device)

    def describe(self) -> dict[str, Any]:
        """Kind, size and device."""
        return {"kind": "torch", "size": self.size, "device": str(self.tensor.device)}
