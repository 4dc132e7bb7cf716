"""CUDA registrations: where they lie, the chunk a pool registers in, and memory kvpool did not map.

CUDA copies a host range to or from a GPU only when the range lies inside
ONE registration -- one ``cudaHostRegister`` call, or one ``cudaHostAlloc``
allocation.  A copy across two fails with ``cudaErrorInvalidValue``.  Large
memory is registered in chunks (drivers from r580 refuse one call of 512 GiB
or more, and population overlaps registration chunk by chunk), so its
chunk boundaries are places no object may straddle:

* :func:`registrations` says where a libpinmem mapping's registrations lie;
* :func:`register_plan` gives the chunk a pool should register in: a
  multiple of its unit (a paged pool's page), so full objects pack with no
  loss;
* :func:`register_host` registers memory kvpool did not map -- a Device-DAX
  arena, or a host buffer another library allocated (SGLang's host pool,
  say) -- through the same path as libpinmem's own mappings: chunked, rolled
  back when refused part-way, the runtime's last error cleared after every
  refusal (so the next, unrelated CUDA call of the thread does not fail
  with it), errors named as ``cudaGetErrorName`` names them.  Every
  ``cudaHostRegister`` kvpool makes goes through libpinmem.

Using :func:`register_host` for a buffer kvpool does not own::

    reg = register_host(t.data_ptr(), t.nbytes, keep_alive=t)  # t: a CPU tensor
    ...                               # copies inside one of reg.spans()
    torch.cuda.synchronize()          # no copy from the range may be in flight
    reg.close()                       # unregisters; then t may be freed

Memory that is pinned already (``torch.empty(..., pin_memory=True)`` is
``cudaHostAlloc`` memory) cannot be registered again: CUDA refuses it
(``cudaErrorHostMemoryAlreadyRegistered``).

Where the driver refuses (kernel rules, not kvpool's): the NVIDIA driver
pins registered pages with ``pin_user_pages(FOLL_LONGTERM)``, plus
``FOLL_WRITE`` unless ``read_only``.  Since Linux 6.5 the kernel refuses a
long-term writable pin of a shared mapping of a file whose file system
tracks dirty pages (ext4, xfs, btrfs... -- not tmpfs, hugetlbfs or a
memfd), and it always refuses long-term pins of file-system DAX (a file on
a ``-o dax`` mount).  A Device-DAX character device and shared memory
register.

Thread safety: the functions may be called from any thread; a
:class:`Registration` may be shared, and its ``close()`` is safe to call
concurrently and more than once.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import kvpool.errors as errors
from kvpool.checks import check_bool, check_int
from kvpool.native.loader import POPULATE_METHODS, check, ffi, lib

__all__ = ["Registration", "register_host", "register_plan", "registrations"]

log = logging.getLogger(__name__)

_SIZE_MAX = (1 << (8 * ffi.sizeof("size_t"))) - 1
_MAX_SPANS = 1 << 20


def register_plan(length: int, unit: int = 0) -> int:
    """The chunk a pool of ``length`` bytes should register in (``pinmem_register_plan``).

    About ``length / 16`` (so population and registration overlap), at least
    256 MiB, at most the ``register_chunk`` option (64 GiB), and a multiple
    of ``lcm(unit, 2 MiB)``: then objects of ``unit`` bytes never straddle a
    boundary.  A unit whose multiples cannot fit under the option is not
    honoured (the chunk is then a multiple of 2 MiB, and a pool leaves out
    what would straddle).

    Args:
        length: bytes to register.
        unit: the pool's unit (a paged pool's page bytes, an extent pool's
            alignment), or 0.

    Raises:
        InvalidArgumentError: a negative or non-int argument.
    """
    n = check_int("length", length, low=0, high=_SIZE_MAX)
    u = check_int("unit", unit, low=0, high=_SIZE_MAX)
    out = ffi.new("size_t *")
    check(lib.pinmem_register_plan(n, u, out), "plan the register chunk")
    return int(out[0])


def registrations(address: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each CUDA registration of a live mapping, in address order.

    Args:
        address: the base of a libpinmem mapping or of a :func:`register_host`
            registration.

    Raises:
        InvalidHandleError: no live mapping starts at ``address``.
    """
    base = ffi.cast("void *", check_int("address", address, low=0, high=(1 << 64) - 1))
    count = ffi.new("size_t *")
    room = 16
    while True:
        spans = ffi.new("pinmem_span[]", room)
        check(lib.pinmem_registrations(base, spans, room, count), f"registrations of {address:#x}")
        n = int(count[0])
        if n <= room:
            return [(int(spans[i].offset), int(spans[i].len)) for i in range(n)]
        room = min(n, _MAX_SPANS)


class Registration:
    """The owner of one CUDA registration of memory kvpool did not map.

    Made by :func:`register_host`, not directly.

    Attributes:
        address: the first byte registered.
        size: bytes registered.
        register_chunks: ``cudaHostRegister`` calls behind it.
        populate_method: "madvise", "first-touch" or "none" (``populate``).
    """

    def __init__(
        self, address: int, size: int, register_chunks: int, method: str, keep_alive: Any
    ) -> None:
        """Take ownership of a registration libpinmem made (internal)."""
        self.address = address
        self.size = size
        self.register_chunks = register_chunks
        self.populate_method = method
        self._keep_alive = keep_alive
        self._lock = threading.Lock()
        self._open = True

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return not self._open

    def spans(self) -> list[tuple[int, int]]:
        """``(offset, length)`` of each registration call, from :attr:`address`.

        A copy to or from a GPU must lie inside one of them.

        Raises:
            PoolClosedError: the registration was closed.
        """
        if not self._open:
            raise errors.PoolClosedError(
                f"the registration of {self.size} bytes at {self.address:#x} is closed"
            )
        return registrations(self.address)

    def close(self) -> None:
        """Unregister every chunk, once; then let go of ``keep_alive``.  Idempotent.

        Make sure first that no copy from or to the range is in flight
        (synchronise the streams that use it).  In a forked child the
        parent's registration is only forgotten.

        Raises:
            NativeError: the driver refused to unregister a chunk (the
                registration is forgotten all the same).
        """
        with self._lock:
            if not self._open:
                return
            self._open = False
        try:
            check(
                lib.pinmem_unregister(ffi.cast("void *", self.address)),
                f"unregister {self.size} bytes at {self.address:#x}",
            )
        finally:
            self._keep_alive = None

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A backstop only: close() is the contract (and a finalizer cannot raise).
        if getattr(self, "_open", False):
            try:
                self.close()
            except errors.KVPoolError as exc:
                log.error("kvpool: unregistering %#x failed: %s", self.address, exc)

    def __repr__(self) -> str:
        state = "closed" if not self._open else "open"
        return (
            f"<Registration {state} address={self.address:#x} size={self.size} "
            f"chunks={self.register_chunks}>"
        )


def register_host(
    address: int,
    length: int,
    *,
    chunk: int | None = None,
    read_only: bool = False,
    io_memory: bool = False,
    populate: bool = False,
    keep_alive: Any = None,
) -> Registration:
    """Register host memory kvpool did not map with CUDA (``pinmem_register``).

    Args:
        address: its first byte (need not be page-aligned unless ``populate``).
        length: bytes, > 0.
        chunk: bytes per ``cudaHostRegister`` call (rounded down to 4 KiB,
            capped by the ``register_chunk`` option); None: that option.
            A refused call is retried in halves down to the
            ``register_min_chunk`` option.
        read_only: ``cudaHostRegisterReadOnly``: the GPU only reads it (the
            driver then pins without ``FOLL_WRITE``, which the kernel allows
            on shared file mappings that refuse a writable pin).
        io_memory: ``cudaHostRegisterIoMemory``: the range maps I/O memory
            (a PCIe BAR), not RAM.
        populate: make the range resident first, keeping its contents,
            overlapped with the registration of its chunks.
        keep_alive: an object that owns the memory (a tensor, a mmap),
            held until :meth:`Registration.close`, so the memory cannot go
            while it is registered.

    Returns:
        The :class:`Registration`; close it to unregister.

    Raises:
        InvalidArgumentError: a bad argument, or a range that overlaps a
            live libpinmem mapping or registration.
        FeatureUnavailableError: no usable CUDA runtime or device.
        OutOfMemoryError: the driver refused with ``cudaErrorMemoryAllocation``.
        NativeError: the driver refused otherwise (the message names the
            CUDA error); nothing stays registered.
    """
    start = check_int("address", address, low=1, high=(1 << 64) - 1)
    nbytes = check_int("length", length, low=1, high=_SIZE_MAX)
    per_call = 0 if chunk is None else check_int("chunk", chunk, low=1, high=_SIZE_MAX)
    flags = (
        (lib.PINMEM_REGISTER_READ_ONLY if check_bool("read_only", read_only) else 0)
        | (lib.PINMEM_REGISTER_IO_MEMORY if check_bool("io_memory", io_memory) else 0)
        | (lib.PINMEM_REGISTER_POPULATE if check_bool("populate", populate) else 0)
    )
    out = ffi.new("pinmem_region *")
    check(
        lib.pinmem_register(ffi.cast("void *", start), nbytes, per_call, flags, out),
        f"register {nbytes} bytes at {start:#x} with CUDA",
    )
    method = POPULATE_METHODS.get(out.populate_method, "none")
    return Registration(start, nbytes, int(out.register_chunks), method, keep_alive)
