"""Host memory regions: one owning Python object per native mapping.

:func:`allocate_host` maps memory (anonymous, hugetlb, POSIX shared memory
or CUDA host memory), makes it resident, binds it to a NUMA node and pins
it as asked; :func:`attach_shm` maps a segment another process created.
Both return a :class:`HostBuffer`, the single owner of that mapping.

Ownership rule (views keep the memory alive):
    Every :meth:`HostBuffer.memoryview` and :meth:`HostBuffer.tensor` is a
    zero-copy view that holds a reference to the mapping's owner handle.
    :meth:`HostBuffer.close` drops the buffer's own reference; the native
    free (munmap, cudaHostUnregister, cudaFreeHost...) runs when the last
    reference is gone, i.e. at close() when no view is alive, otherwise when
    the last view is garbage-collected.  Views stay valid for as long as
    they exist; nothing is ever freed twice or while a view can reach it.

Shared memory:
    The creator's close() also unlinks the segment's name at once (unless
    ``shm_unlink_on_close=False``); processes that already attached keep
    their mappings.  Attachers' close() only detaches.  The name is removed
    only while it still refers to the segment this process created, so a
    segment that replaced it (``shm_reuse=True`` elsewhere) is never
    touched.  A creator that exits without close() has its name unlinked at
    interpreter exit; a creator that is killed leaves the name behind, and
    a later ``allocate_host(..., shm_name=name, shm_reuse=True)`` or
    :func:`unlink_shm` cleans it up.

Incremental commit:
    A lazily growing pool reserves its whole range once, ``allocate_host(
    size, pin="none", populate=False)``, and then makes one range after the
    other resident and pinned with :meth:`HostBuffer.commit` -- from a
    background thread if it likes -- while the committed part is in use.
    The mapping never moves.  ``committed_bytes`` and ``pinned_bytes`` say
    how far it got; ``pinned`` names a pinning only once all of it is.

Limits checked first:
    Before a mapping is populated or pinned, and before each commit, the
    room left under every limit on this process (memory cgroup levels,
    available RAM, the memlock limit for pin="mlock"; the hugetlb cgroup
    instead of the first two for hugetlb pages, which are charged apart --
    see :mod:`kvpool.native.limits`) must hold the bytes plus their page
    tables and a small reserve (:data:`LIMIT_RESERVE`); otherwise
    :class:`~kvpool.errors.MemoryLimitError` names the limit, its file and
    the fix, and nothing is mapped.  The kernel would answer with the OOM
    killer (or SIGBUS for hugetlb), not an error.  Reserving without
    populating (``populate=False, pin="none"``) is not checked: nothing
    becomes resident.  CUDA-pinned memory is checked like any other (the
    driver's pages may not be charged to the cgroup; better refused than
    killed).  hugepages="auto" whose 2 MiB pages the hugetlb cgroup cannot
    hold uses 4 KiB pages, as libpinmem does when the pool is short.

Threads: a HostBuffer may be shared between threads; close() is safe to
call concurrently and more than once; commit() of disjoint ranges may run
in several threads at once.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

import kvpool.errors as errors
import kvpool.native.calls as _native
import kvpool.native.limits as limits
import kvpool.native.registration as _registration
from kvpool.checks import check_size
from kvpool.native.spec import HostSpec
from kvpool.native.units import format_bytes

if TYPE_CHECKING:
    import torch

__all__ = [
    "HostBuffer",
    "allocate_host",
    "allocate_spec",
    "attach_shm",
    "live_mappings",
    "unlink_shm",
]

log = logging.getLogger(__name__)

#: Bytes kept free under every limit beyond a mapping and its page tables, for
#: the rest of the process (populate threads, the interpreter's own growth).
LIMIT_RESERVE = 16 << 20
_HUGE_2M = 2 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _round_up(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def _check_room(nbytes: int, *, hugetlb: bool, locking: bool, what: str) -> limits.Headroom:
    """Raise unless ``nbytes`` more can be made resident (and locked); return the room.

    Normal pages are charged with their page tables (8 bytes per 4 KiB page)
    and :data:`LIMIT_RESERVE`; hugetlb pages exactly (their cgroup counts
    nothing else).  The memlock limit counts the locked bytes alone.
    """
    if hugetlb:
        room = limits.headroom(hugetlb=True)
        room.check(nbytes, what)
    else:
        room = limits.headroom()
        charge = nbytes + nbytes // 512 + LIMIT_RESERVE
        room.check(charge, f"{what} with its page tables and a 16 MiB reserve")
    if locking:
        limits.headroom(memory=False, locking=True).check(nbytes, f"locking {what}")
    return room


def _expect_hugetlb(spec: HostSpec) -> bool:
    """Whether libpinmem will back ``spec`` with hugetlb pages (its rule, read first)."""
    if spec.shm_name is not None or spec.hugepages not in ("auto", "required"):
        return False
    if spec.hugepages == "required":
        return True
    try:
        _total, available = _native.hugepages_2m(spec.numa_node)
    except errors.KVPoolError:  # no 2 MiB pool, or no such node: libpinmem says so
        return False
    return available >= _round_up(spec.size, _HUGE_2M) // _HUGE_2M


def _check_limits(spec: HostSpec) -> HostSpec:
    """Raise unless ``spec``'s resident memory fits; return the spec to map.

    The spec comes back with hugepages="never" (or "thp", as libpinmem's
    fallback option says) when "auto" would take hugetlb pages the hugetlb
    cgroup cannot hold.
    """
    if not spec.populate and spec.pin == "none":
        return spec  # reserved only: commits are checked one by one
    locking = spec.pin == "mlock"
    if _expect_hugetlb(spec):
        mapped = _round_up(spec.size, _HUGE_2M)
        room = limits.headroom(hugetlb=True)
        if room.fits(mapped) or spec.hugepages == "required":
            _check_room(mapped, hugetlb=True, locking=locking, what=_what(spec, mapped, True))
            return spec
        fallback = "thp" if _native.option_get("auto_fallback_thp") else "never"
        log.warning(
            "kvpool: %s; hugepages='auto' uses %s pages instead",
            room.binding.describe() if room.binding else "a hugetlb limit binds",
            "transparent huge" if fallback == "thp" else "4 KiB",
        )
        spec = spec.replace(hugepages=fallback)
    mapped = _round_up(spec.size, _PAGE)
    ram = limits.host_ram()
    if ram is not None and mapped > ram:
        return spec  # larger than the machine: libpinmem refuses it, saying so
    _check_room(mapped, hugetlb=False, locking=locking, what=_what(spec, mapped, False))
    return spec


def _what(spec: HostSpec, mapped: int, hugetlb: bool) -> str:
    pages = "2 MiB hugetlb" if hugetlb else f"{_PAGE // 1024} KiB"
    return f"a host mapping of {format_bytes(mapped)} ({pages} pages, pin={spec.pin!r})"


class _Mapping:
    """The native side of one mapping; freed once, by whoever is last."""

    __slots__ = ("address", "lock", "unmapped")

    def __init__(self, address: int) -> None:
        self.address = address
        self.unmapped = False
        self.lock = threading.Lock()

    def release(self) -> None:
        with self.lock:
            if self.unmapped:
                return
            self.unmapped = True
        try:
            _native.free(self.address)
        except errors.KVPoolError as exc:  # a finalizer cannot raise
            log.error("kvpool: freeing host mapping %#x failed: %s", self.address, exc)


def _owner_handle(mapping: _Mapping, mapped_size: int) -> Any:
    """A cdata pointer whose collection frees the mapping (ffi.gc)."""
    raw = _native.ffi.cast("uint8_t *", mapping.address)
    return _native.ffi.gc(raw, lambda _cdata: mapping.release(), size=mapped_size)


_shm_creators: weakref.WeakSet[HostBuffer] = weakref.WeakSet()


@atexit.register
def _release_shm_names_at_exit() -> None:
    for buf in list(_shm_creators):
        with contextlib.suppress(Exception):  # best effort while the interpreter exits
            buf._release_name()


class HostBuffer:
    """The one owner of a native host-memory mapping.

    Create with :func:`allocate_host` or :func:`attach_shm`, not directly.

    Attributes:
        kind: "anonymous", "hugetlb", "shm" or "cuda-host".
        size: usable bytes (exactly what was asked for, or the attached size).
        mapped_size: bytes actually mapped (rounded up to the page size).
        address: base address.
        pinned: "cuda-alloc", "cuda-register", "mlock" or "none" -- how the
            whole mapping is pinned in fact, never what was hoped for: "none"
            while any part is uncommitted or unpinned, the weakest pinning
            when committed parts differ.
        numa_node: the node asked for, or None.
        numa_bound: True when the NUMA binding took effect; False when the
            kernel refused mbind (containers) and the memory is unbound.
        hugepages: "hugetlb-2MiB", "thp" or "none".
        shm_name: the segment's name, or None.
        shm_owner: True for the creator of a segment, False for an attacher.
        populate_method: "madvise", "first-touch", "driver" or "none" (the
            allocation's, or the most recent commit's).
        threads_used: threads of that population.
        register_chunks: cudaHostRegister calls behind it (0 if none).
        page_size: page size in use, bytes.
        committed_bytes: bytes made resident by the allocation (all of
            ``mapped_size`` when it populated or pinned) or by :meth:`commit`.
        pinned_bytes: of those, bytes pinned (mlock or CUDA).

    Lifetime: see the module docstring.  close() is idempotent, ``with``
    closes on exit, and ``__del__`` is only a backstop.
    """

    kind: str
    size: int
    mapped_size: int
    address: int
    pinned: str
    numa_node: int | None
    numa_bound: bool
    hugepages: str
    shm_name: str | None
    shm_owner: bool
    populate_method: str
    threads_used: int
    register_chunks: int
    page_size: int
    committed_bytes: int
    pinned_bytes: int

    def __init__(
        self, region: _native.Region, *, shm_name: str | None = None, unlink_on_close: bool = True
    ) -> None:
        """Take ownership of a mapping libpinmem made (internal: use the factories)."""
        self.kind = region.kind
        self.size = region.size
        self.mapped_size = region.mapped_size
        self.address = region.address
        self.numa_node = region.numa_node
        self.numa_bound = region.numa_bound
        self.hugepages = region.hugepages
        self.shm_name = shm_name
        self.shm_owner = region.shm_owner
        self.page_size = region.page_size
        self._take_state(region)
        self._unlink_on_close = unlink_on_close
        self._lock = threading.Lock()
        self._mapping = _Mapping(region.address)
        self._owner: Any = _owner_handle(self._mapping, region.mapped_size)
        self._pid = os.getpid()
        if self.shm_owner and unlink_on_close:
            _shm_creators.add(self)

    # ---------------------------------------------------------------- state

    def _take_state(self, region: _native.Region) -> None:
        """Copy the fields that commits change."""
        self.pinned = region.pinned
        self.populate_method = region.populate_method
        self.threads_used = region.threads_used
        self.register_chunks = region.register_chunks
        self.committed_bytes = region.committed_bytes
        self.pinned_bytes = region.pinned_bytes

    @property
    def closed(self) -> bool:
        """True once close() was called (views may still keep the memory)."""
        return self._owner is None

    @property
    def unmapped(self) -> bool:
        """True once the native mapping is gone (after close and the last view)."""
        return self._mapping.unmapped

    def _handle(self) -> Any:
        owner = self._owner
        if self._pid != os.getpid():
            raise errors.InheritedAcrossForkError(
                f"HostBuffer at {self.address:#x} ({self.size} bytes) was inherited across "
                f"fork() by pid {os.getpid()}: it belongs to pid {self._pid} (a pinned mapping "
                "is not even mapped in the child); attach shared memory by name instead"
            )
        if owner is None:
            raise errors.PoolClosedError(
                f"HostBuffer at {self.address:#x} ({self.size} bytes) is closed; views made "
                "before close() remain valid, new ones cannot be made"
            )
        return owner

    # ---------------------------------------------------------------- views

    def memoryview(self) -> memoryview:
        """Return a writable, 1-D, format 'B' view of exactly ``size`` bytes.

        Zero-copy.  The view keeps the mapping alive: it stays valid after
        close() until the view itself is released.

        Raises:
            PoolClosedError: the buffer was closed.
        """
        return memoryview(_native.ffi.buffer(self._handle(), self.size))

    def tensor(self) -> torch.Tensor:
        """Return a zero-copy ``torch.uint8`` tensor of ``size`` elements.

        The tensor keeps the mapping alive (torch holds the buffer object),
        so it stays valid after close() until it is garbage-collected.

        Raises:
            PoolClosedError: the buffer was closed.
            FeatureUnavailableError: torch is not installed.
        """
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - torch is a dependency
            raise errors.FeatureUnavailableError(
                "HostBuffer.tensor() needs torch (pip install torch)"
            ) from exc
        view = self.memoryview()
        return torch.frombuffer(view, dtype=torch.uint8, count=self.size)

    # --------------------------------------------------------------- commit

    def commit(
        self, offset: int, length: int, *, pin: str = "auto", threads: int | None = None
    ) -> str:
        """Make ``[offset, offset + length)`` resident and pinned, in place.

        For a buffer reserved with ``allocate_host(size, pin="none",
        populate=False)``: commit it step by step as it is needed; addresses
        never move, and the contents of the range are kept.  A range is
        committed once (a buffer populated or pinned when allocated is
        committed whole).  Commits of disjoint ranges may run in several
        threads; reads and writes of committed ranges go on meanwhile.  The
        mapping stays alive until the commit returns, even if the buffer is
        closed meanwhile.  Afterwards ``committed_bytes``, ``pinned_bytes``,
        ``pinned`` and ``register_chunks`` describe the whole buffer again.

        Args:
            offset: start of the range, a multiple of ``page_size``.
            length: bytes, > 0, a multiple of ``page_size``; the range must
                end within ``mapped_size``.
            pin: "auto" (cudaHostRegister in chunks of the buffer's
                ``register_chunk`` when CUDA is usable, else mlock if
                allowed, else none), "none", "mlock" or "cuda-register"; the
                latter two raise if refused.  Each chunk is a registration
                (:meth:`registrations`), populated while the one before it
                is registered.
            threads: populate threads (default: CPUs available, at most 16).

        Returns:
            How the range ended up pinned: "cuda-register", "mlock" or "none".

        Raises:
            PoolClosedError: the buffer was closed.
            InvalidArgumentError: unaligned, out of the buffer, overlapping a
                committed range, or a bad pin/threads value.
            FeatureUnavailableError: pin="mlock" refused, or
                pin="cuda-register" without CUDA.
            MemoryLimitError: the range would not fit under a memory cgroup
                limit, the available RAM (the hugetlb cgroup for hugetlb
                pages) or, for pin="mlock", the memlock limit; checked before
                anything is touched, the range stays uncommitted.
            OutOfMemoryError: the memory (or a CUDA registration) is not
                available; the range stays uncommitted and may be retried.
            NativeError: the range overlaps a commit in progress in another
                thread, or the OS or CUDA runtime failed otherwise.
        """
        self._handle()  # closed (or inherited) buffers refuse before anything else
        if length.__class__ is int and length > 0:  # else libpinmem says what is wrong
            # Checked before the mapping is held, so that a kept error does not hold it.
            _check_room(
                length,
                hugetlb=self.kind == "hugetlb",
                locking=pin == "mlock",
                what=f"committing {format_bytes(length)} at offset {offset} of the "
                f"{format_bytes(self.mapped_size)} {self.kind} mapping at {self.address:#x}",
            )
        owner = self._handle()  # held: the mapping outlives this call
        try:
            pinned = _native.commit(self.address, offset, length, pin=pin, threads=threads)
        finally:
            # Failed commits change nothing, but a concurrent one may have.
            with self._lock:
                self._take_state(_native.query(self.address))
            del owner
        return pinned

    def registrations(self) -> list[tuple[int, int]]:
        """``(offset, length)`` of each CUDA registration of the mapping, in address order.

        A host range copied to or from a GPU must lie inside one of them
        (CUDA refuses a copy across two); a cudaHostAlloc mapping is one,
        unpinned or mlocked memory has none.  Commits add theirs.

        Raises:
            PoolClosedError: the buffer was closed.
        """
        owner = self._handle()  # the mapping stays while it is read
        try:
            return _registration.registrations(self.address)
        finally:
            del owner

    # -------------------------------------------------------------- closing

    def _release_name(self) -> bool:
        """Creator only: unlink the segment's name if it is still ours."""
        if not self.shm_owner or self._mapping.unmapped:
            return False
        try:
            return _native.shm_release_name(self.address)
        except errors.InvalidHandleError:
            return False

    def close(self) -> None:
        """Give up this buffer's hold on the mapping.  Idempotent.

        The mapping is unmapped now if no view is alive, else when the last
        view goes.  A shared-memory creator also unlinks the name now (unless
        created with ``shm_unlink_on_close=False``); an attacher only
        detaches.
        """
        with self._lock:
            owner, self._owner = self._owner, None
            if owner is None:
                return
            if self.shm_owner and self._unlink_on_close:
                self._release_name()
                _shm_creators.discard(self)
        del owner  # the last reference frees the mapping (ffi.gc)

    def __enter__(self) -> HostBuffer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # never raise from a finalizer
            self.close()

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        extra = f", shm_name={self.shm_name!r}" if self.shm_name else ""
        return (
            f"<HostBuffer {state} kind={self.kind} size={self.size} address={self.address:#x} "
            f"pinned={self.pinned} hugepages={self.hugepages} numa_node={self.numa_node}{extra}>"
        )


def allocate_host(
    size: int,
    *,
    pin: str = "auto",
    numa_node: int | None = None,
    hugepages: str = "never",
    shm_name: str | None = None,
    shm_reuse: bool = False,
    populate: bool = True,
    threads: int | None = None,
    shm_unlink_on_close: bool = True,
    register_chunk: int | None = None,
) -> HostBuffer:
    """Map ``size`` bytes of host memory and return its owner.

    Args:
        size: usable bytes, > 0.  The mapping is rounded up to the page size
            in use (4 KiB, or 2 MiB for hugetlb); ``HostBuffer.size`` stays
            ``size``.
        pin: "auto" -- with a CUDA runtime and a device, cudaHostAlloc for
            plain memory below 1 GiB (the ``register_threshold`` option),
            populate + cudaHostRegister in chunks for NUMA, hugepage or
            shared memory and from 1 GiB up; without CUDA, mlock when the
            memlock limit allows, else not pinned.
            "none", "mlock", "cuda-alloc", "cuda-register" ask for one way
            and raise if it is refused.  ``HostBuffer.pinned`` says what was
            done.  Pinning implies populating.
        numa_node: bind the pages to this node (mbind MPOL_BIND).  If the
            kernel refuses mbind the memory is kept, unbound, with
            ``numa_bound=False``.
        hugepages: "never" (4 KiB pages); "thp" (transparent hugepages
            advised); "auto" (2 MiB hugetlb pages when the pool has enough
            free pages, else 4 KiB pages -- or THP with the libpinmem
            option ``auto_fallback_thp`` / ``KVPOOL_AUTO_FALLBACK_THP=1``;
            never fails for lack of hugepages); "required" (hugetlb or
            HugePagesExhaustedError).  Not with shared memory ("auto" means
            4 KiB there).
        shm_name: create a POSIX shared-memory segment of this name ('/'
            then 1..255 characters, no other '/') for other processes to
            :func:`attach_shm`.
        shm_reuse: replace a leftover segment of the same name instead of
            raising SharedMemoryExistsError.
        populate: make every page resident now, with several threads.
        threads: populate threads (default: CPUs available, at most 16).
        shm_unlink_on_close: the creator's close() unlinks the name.
        register_chunk: bytes per cudaHostRegister call (see
            :attr:`HostSpec.register_chunk <kvpool.native.spec.HostSpec>`);
            None: as few calls as the ``register_chunk`` option (64 GiB)
            allows.  A copy to or from the GPU may not span two
            registrations; :meth:`HostBuffer.registrations` lists them.

    Returns:
        The :class:`HostBuffer` that owns the mapping.

    Raises:
        InvalidArgumentError: a bad argument (size <= 0, unknown mode, bad
            shm name...).
        OutOfMemoryError: the memory is not available (or size is absurd).
        HugePagesExhaustedError: hugepages="required" and too few free
            2 MiB pages; the message gives the command that grows the pool.
        NumaNodeError: numa_node does not exist; the message lists the nodes.
        SharedMemoryExistsError: shm_name exists and shm_reuse is False.
        FeatureUnavailableError: pin="mlock"/"cuda-*" and it was refused.
        MemoryLimitError: populating or pinning would exceed a memory
            cgroup limit, the available RAM or the memlock limit (checked
            first, so the kernel never OOM-kills the process).
        NativeError: the OS or the CUDA runtime failed otherwise.
    """
    return allocate_spec(
        HostSpec(
            size,
            pin=pin,
            numa_node=numa_node,
            hugepages=hugepages,
            shm_name=shm_name,
            shm_reuse=shm_reuse,
            shm_unlink_on_close=shm_unlink_on_close,
            populate=populate,
            threads=threads,
            register_chunk=register_chunk,
        )
    )


def allocate_spec(spec: HostSpec) -> HostBuffer:
    """Map host memory as ``spec`` describes (see :func:`allocate_host`).

    Raises:
        MemoryLimitError: the populated or pinned mapping would not fit under
            a memory cgroup limit, the available RAM or (pin="mlock") the
            memlock limit (:class:`~kvpool.errors.MemlockLimitError`); see
            "Limits checked first" in the module docstring.
        The errors of :func:`allocate_host`.
    """
    spec = _check_limits(spec)
    region = _native.alloc(
        spec.size,
        pin=spec.pin,
        hugepages=spec.hugepages,
        numa_node=spec.numa_node,
        populate=spec.populate,
        threads=spec.threads,
        shm_name=spec.shm_name,
        shm_reuse=spec.shm_reuse,
        shm_keep=not spec.shm_unlink_on_close,
        register_chunk=spec.register_chunk,
    )
    return HostBuffer(region, shm_name=spec.shm_name, unlink_on_close=spec.shm_unlink_on_close)


def attach_shm(
    name: str, size: int | None = None, *, pin: str = "auto", populate: bool = False
) -> HostBuffer:
    """Map a shared-memory segment that another process created.

    Args:
        name: the segment's name, as given to ``allocate_host(shm_name=...)``.
        size: bytes to map; None maps the whole segment (its size is the
            creator's size rounded up to a page).
        pin: "auto" (CUDA register when CUDA is usable, else mlock if
            allowed, else none), "none", "mlock" or "cuda-register".
        populate: prefault every page now (contents are left as they are).

    Returns:
        A :class:`HostBuffer` with ``shm_owner=False``; its close() detaches
        and never unlinks.

    Raises:
        SharedMemoryNotFoundError: no segment of that name.
        InvalidArgumentError: a bad name, or size larger than the segment.
    """
    if size is not None:
        size = check_size("size", size, fix="or None for the whole segment")
    region = _native.shm_attach(name, 0 if size is None else size, pin=pin, populate=populate)
    return HostBuffer(region, shm_name=name, unlink_on_close=False)


def unlink_shm(name: str) -> None:
    """Remove a shared-memory segment's name (mappings stay valid).

    Raises:
        SharedMemoryNotFoundError: no segment of that name.
        InvalidArgumentError: the name breaks the naming rule.
    """
    _native.shm_unlink(name)


def live_mappings() -> tuple[int, int]:
    """Return (count, mapped bytes) of native mappings alive in this process."""
    return _native.live()
