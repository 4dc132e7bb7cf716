"""The bare ways of making a fresh mapping resident, timed, for comparison with kvpool's pools.

Each method maps fresh private anonymous memory with libc's ``mmap`` (through
ctypes, nothing of kvpool involved), makes every page resident its own way,
and returns the seconds that took.  Residency is then checked (mincore) and
the mapping unmapped, both untimed; a method whose mapping is not fully
resident raises ``RuntimeError``.

==========================  ====================================================
name                        what it does
==========================  ====================================================
``touch``                   one write per 4 KiB page (torch's strided
                            ``fill_``, on ``threads`` threads)
``MAP_POPULATE``            ``mmap(MAP_POPULATE)``: the kernel faults it in
``madvise``                 ``MADV_POPULATE_WRITE``, one call per thread on
                            equal shares
``mlock``                   ``mlock`` of the fresh mapping (populates and locks)
``MAP_POPULATE|MAP_LOCKED`` both at ``mmap`` time
``onfault+madvise``         ``mlock2(MLOCK_ONFAULT)``, then ``madvise`` threads
==========================  ====================================================

``hugetlb=True`` maps 2 MiB hugetlb pages instead (``MAP_HUGETLB``), which
needs free pages in the hugepage pool.  :func:`torch_zeros` is the
reference every ratio is taken against.  Thread counts are explicit; none of
these adapt to the machine -- that is what kvpool's populate plan does.

Complexity: every method is O(size / page size) page faults.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import os
import threading
import time
from collections.abc import Callable

import torch

__all__ = ["MAP_POPULATE", "METHODS", "BareMethod", "bare_methods", "madvise_all", "torch_zeros"]

_PROT_RW = 0x1 | 0x2
_MAP_PRIVATE_ANON = 0x02 | 0x20
_MAP_POPULATE = 0x8000
#: ``mmap``'s MAP_POPULATE flag, for :class:`BareMethod`.
MAP_POPULATE = _MAP_POPULATE
_MAP_LOCKED = 0x2000
_MAP_HUGETLB = 0x40000
_MAP_HUGE_2MB = 21 << 26
_MADV_POPULATE_WRITE = 23
_MLOCK_ONFAULT = 1
_SYS_MLOCK2 = {"x86_64": 325, "aarch64": 284}.get(os.uname().machine)
_HUGE = 2 << 20

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.syscall.restype = ctypes.c_long
_MAP_FAILED = ctypes.c_void_p(-1).value


def _os_error(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def _mmap(size: int, flags: int) -> int:
    addr = _libc.mmap(None, size, _PROT_RW, _MAP_PRIVATE_ANON | flags, -1, 0)
    if addr is None or addr == _MAP_FAILED:
        raise _os_error(f"mmap of {size} bytes")
    return int(addr)


def _resident(addr: int, size: int) -> int:
    pages = (size + 4095) // 4096
    vec = (ctypes.c_ubyte * pages)()
    if _libc.mincore(addr, size, vec) != 0:
        raise _os_error("mincore")
    flags = torch.frombuffer(vec, dtype=torch.uint8)
    return int((flags & 1).sum()) * 4096


def _shares(addr: int, size: int, threads: int) -> list[tuple[int, int]]:
    share = -(-size // threads)
    share = -(-share // _HUGE) * _HUGE
    return [(addr + off, min(share, size - off)) for off in range(0, size, share)]


def _parallel(work: Callable[[int, int], None], addr: int, size: int, threads: int) -> None:
    """Run work(start, length) on equal shares, the first on this thread."""
    shares = _shares(addr, size, threads)
    failures: list[BaseException] = []

    def run(start: int, length: int) -> None:
        try:
            work(start, length)
        except BaseException as exc:  # re-raised below, on the caller's thread
            failures.append(exc)

    helpers = [threading.Thread(target=run, args=share) for share in shares[1:]]
    for helper in helpers:
        helper.start()
    run(*shares[0])
    for helper in helpers:
        helper.join()
    if failures:
        raise failures[0]


def _madvise(start: int, length: int) -> None:
    if _libc.madvise(start, length, _MADV_POPULATE_WRITE) != 0:
        raise _os_error("madvise(MADV_POPULATE_WRITE)")


def madvise_all(addr: int, size: int, threads: int) -> None:
    """MADV_POPULATE_WRITE of [addr, addr+size) on threads threads (equal shares)."""
    _parallel(_madvise, addr, size, threads)


def _touch(addr: int, size: int, threads: int) -> None:
    view = torch.frombuffer((ctypes.c_uint8 * size).from_address(addr), dtype=torch.uint8)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        view[::4096].fill_(1)
    finally:
        torch.set_num_threads(old)


def _mlock2_onfault(addr: int, size: int) -> None:
    if _SYS_MLOCK2 is None:
        raise OSError(errno.ENOSYS, "mlock2: unknown syscall number on this architecture")
    if _libc.syscall(_SYS_MLOCK2, ctypes.c_void_p(addr), ctypes.c_size_t(size), _MLOCK_ONFAULT):
        raise _os_error("mlock2(MLOCK_ONFAULT)")


class BareMethod:
    """One bare way of making ``size`` fresh bytes resident.

    Args:
        name: as shown in tables (``"madvise, 2 threads"``).
        map_flags: extra ``mmap`` flags (``MAP_POPULATE``, ``MAP_LOCKED``...).
        fill: what runs after ``mmap`` (``None``: nothing), given (addr, size).
        hugetlb: map 2 MiB hugetlb pages.
    """

    def __init__(
        self,
        name: str,
        map_flags: int = 0,
        fill: Callable[[int, int], None] | None = None,
        *,
        hugetlb: bool = False,
    ) -> None:
        self.name = name
        self.map_flags = map_flags | (_MAP_HUGETLB | _MAP_HUGE_2MB if hugetlb else 0)
        self.fill = fill
        self.hugetlb = hugetlb

    def __call__(self, size: int) -> float:
        """Seconds to map and populate size bytes (then checked and unmapped, untimed).

        Raises:
            OSError: the kernel refused (no hugepages, mlock limit...).
            RuntimeError: the mapping was not fully resident.
        """
        if self.hugetlb:
            size = -(-size // _HUGE) * _HUGE
        gc.collect()
        start = time.perf_counter()
        addr = _mmap(size, self.map_flags)
        try:
            if self.fill is not None:
                self.fill(addr, size)
            elapsed = time.perf_counter() - start
            resident = _resident(addr, size)
        finally:
            _libc.munmap(addr, size)
        if resident != size:
            raise RuntimeError(f"{self.name}: only {resident} of {size} bytes resident")
        return elapsed


def bare_methods(threads: int, *, hugetlb: bool = False, locking: bool = True) -> list[BareMethod]:
    """The bare methods for a machine where ``threads`` threads make sense.

    Args:
        threads: the multi-threaded variants' thread count (> 1 adds them).
        hugetlb: the 2 MiB hugetlb variants instead of 4 KiB pages.
        locking: include the mlock variants.
    """
    page = "hugetlb, " if hugetlb else ""
    methods = [
        BareMethod(f"{page}touch, 1 thread", fill=lambda a, s: _touch(a, s, 1), hugetlb=hugetlb),
        BareMethod(f"{page}MAP_POPULATE", _MAP_POPULATE, hugetlb=hugetlb),
        BareMethod(
            f"{page}madvise, 1 thread",
            fill=lambda a, s: _parallel(_madvise, a, s, 1),
            hugetlb=hugetlb,
        ),
    ]
    if threads > 1:
        methods.insert(
            1,
            BareMethod(
                f"{page}touch, {threads} threads",
                fill=lambda a, s: _touch(a, s, threads),
                hugetlb=hugetlb,
            ),
        )
        methods.append(
            BareMethod(
                f"{page}madvise, {threads} threads",
                fill=lambda a, s: _parallel(_madvise, a, s, threads),
                hugetlb=hugetlb,
            )
        )
    if locking:

        def lock(addr: int, size: int) -> None:
            if _libc.mlock(addr, size) != 0:
                raise _os_error("mlock")

        def onfault(addr: int, size: int) -> None:
            _mlock2_onfault(addr, size)
            _parallel(_madvise, addr, size, threads)

        methods += [
            BareMethod(f"{page}mlock", fill=lock, hugetlb=hugetlb),
            BareMethod(
                f"{page}MAP_POPULATE|MAP_LOCKED", _MAP_POPULATE | _MAP_LOCKED, hugetlb=hugetlb
            ),
            BareMethod(f"{page}onfault+madvise, {threads} threads", fill=onfault, hugetlb=hugetlb),
        ]
    return methods


#: The names of the 4 KiB-page methods without locking, for two threads (documentation).
METHODS = [m.name for m in bare_methods(2, locking=False)]


def torch_zeros(size: int) -> float:
    """Seconds for ``torch.zeros(size, dtype=torch.uint8)`` (torch's own threads)."""
    gc.collect()
    start = time.perf_counter()
    t = torch.zeros(size, dtype=torch.uint8)
    elapsed = time.perf_counter() - start
    del t
    return elapsed
