"""HostSpec: the one description of a host mapping, validated once and passed down the layers.

Every way of asking for host memory - :func:`kvpool.native.buffer.allocate_host`,
:class:`kvpool.pool.backing.HostBacking`, the pools of :mod:`kvpool.allocators`
and :class:`kvpool.pool.lazy.LazyMemoryAllocator` - builds one
:class:`HostSpec` and hands it down, so each option is named, defaulted,
documented and checked in exactly one place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvpool.checks import check_bool, check_choice, check_int, check_optional_int, check_size
from kvpool.errors import ArgumentTypeError

__all__ = ["HUGEPAGE_CHOICES", "PIN_CHOICES", "HostSpec"]

#: What ``pin`` may be (see :class:`HostSpec`).
PIN_CHOICES = ("auto", "none", "mlock", "cuda-alloc", "cuda-register")
#: What ``hugepages`` may be (see :class:`HostSpec`).
HUGEPAGE_CHOICES = ("never", "thp", "auto", "required")
_SIZE_MAX = (1 << 64) - 1


@dataclass(frozen=True)
class HostSpec:
    """How a host mapping should be made.

    Attributes:
        size: usable bytes, > 0 (the mapping is rounded up to the page size).
        pin: "auto" (CUDA pinning when a runtime and a device are there,
            else mlock when the memlock limit allows, else none), "none",
            "mlock", "cuda-alloc" or "cuda-register" (those raise when refused).
        numa_node: bind the pages to this node, or None.
        hugepages: "never" (4 KiB pages), "thp" (transparent hugepages
            advised), "auto" (2 MiB hugetlb pages when enough are free, else
            4 KiB), "required" (hugetlb, or HugePagesExhaustedError).
        shm_name: create a named POSIX shared-memory segment ('/' and 1..255
            characters, no other '/'), or None for private memory.
        shm_reuse: replace a leftover segment of that name.
        shm_unlink_on_close: the creator's close() removes the name.
        populate: make every page resident now (pinning always does).
        threads: populate threads, or None for the default (CPUs, at most 16).
        register_chunk: bytes per ``cudaHostRegister`` call when the mapping
            (or a commit of it) is registered with CUDA, or None for as few
            calls as the ``register_chunk`` option allows.  A copy may not
            span two registrations, so a pool passes a multiple of its unit
            (:func:`kvpool.native.registration.register_plan`) and keeps
            its objects inside one.

    Raises:
        InvalidArgumentError: any field of the wrong type or out of range
            (``ArgumentTypeError``, also a ``TypeError``, for a wrong type).
    """

    size: int
    pin: str = "auto"
    numa_node: int | None = None
    hugepages: str = "never"
    shm_name: str | None = None
    shm_reuse: bool = False
    shm_unlink_on_close: bool = True
    populate: bool = True
    threads: int | None = None
    register_chunk: int | None = None

    def __post_init__(self) -> None:
        # Plain ints from here on (a numpy integer would overflow in arithmetic).
        object.__setattr__(self, "size", check_size("size", self.size, high=_SIZE_MAX))
        check_choice("pin", self.pin, dict.fromkeys(PIN_CHOICES))
        node = check_optional_int("numa_node", self.numa_node, low=0, high=(1 << 31) - 1)
        object.__setattr__(self, "numa_node", node)
        check_choice("hugepages", self.hugepages, dict.fromkeys(HUGEPAGE_CHOICES))
        if self.shm_name is not None and not isinstance(self.shm_name, str):
            raise ArgumentTypeError(
                f"shm_name must be a str or None, got {type(self.shm_name).__name__}"
            )
        for flag in ("shm_reuse", "shm_unlink_on_close", "populate"):
            object.__setattr__(self, flag, check_bool(flag, getattr(self, flag)))
        if self.threads is not None:
            object.__setattr__(
                self, "threads", check_int("threads", self.threads, low=1, high=1024)
            )
        if self.register_chunk is not None:
            chunk = check_int("register_chunk", self.register_chunk, low=1, high=_SIZE_MAX)
            object.__setattr__(self, "register_chunk", chunk)

    def replace(self, **changes: Any) -> HostSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
