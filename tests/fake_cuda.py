"""The fake CUDA runtime (libpinmem/tests/fake_cudart.c) as the tests drive it.

:func:`build_fake_cudart` finds or builds the library; :class:`FakeCuda` reads
its books and makes the calls a test needs through ctypes -- the same loaded
copy libpinmem uses (``dlopen`` of one path gives one library), so what
libpinmem registered is what the copies are checked against:

* ``copy_h2d`` / ``copy_d2h``: ``cudaMemcpyAsync`` between a host range and
  fake device memory (``cudaMalloc``); the fake refuses, as CUDA does, a host
  range that is not inside ONE registration or ``cudaHostAlloc`` allocation;
* ``check_copy``: the same rule without copying;
* ``last_error`` / ``peek_last_error``: ``cudaGetLastError`` (reads and
  clears) and ``cudaPeekAtLastError`` of the calling thread.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "libpinmem" / "tests" / "fake_cudart.c"
BUILT = ROOT / "libpinmem" / "build" / "libfakecudart.so"
H2D, D2H = 1, 2


def build_fake_cudart(scratch: Path) -> Path | None:
    """Path of the fake runtime: ``make fake-cudart``'s if fresh, else built into ``scratch``.

    Returns None when it is not built and there is no C compiler.
    """
    if BUILT.exists() and BUILT.stat().st_mtime >= SOURCE.stat().st_mtime:
        return BUILT
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        return None
    out = scratch / "libfakecudart.so"
    cmd = [cc, "-O2", "-Wall", "-fPIC", "-shared", "-pthread", "-o", str(out), str(SOURCE)]
    subprocess.run(cmd, check=True)
    return out


class FakeCuda:
    """The fake runtime's books and calls (same loaded copy as libpinmem's)."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        lib.fake_cuda_is_registered.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.fake_cuda_check_copy.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaMemcpyAsync.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_void_p,
        ]
        lib.cudaGetErrorName.restype = ctypes.c_char_p
        self.lib = lib

    def reset(self) -> None:
        """Zero the call counters (live ranges stay)."""
        self.lib.fake_cuda_reset()

    def stats(self) -> dict[str, int]:
        """Live registrations and allocations, calls, the largest registration."""
        lr, la, regs, unregs = (ctypes.c_int() for _ in range(4))
        largest = ctypes.c_size_t()
        self.lib.fake_cuda_stats(
            ctypes.byref(lr),
            ctypes.byref(la),
            ctypes.byref(regs),
            ctypes.byref(unregs),
            ctypes.byref(largest),
        )
        return {
            "live_registrations": lr.value,
            "live_allocations": la.value,
            "registers": regs.value,
            "unregisters": unregs.value,
            "largest": largest.value,
        }

    def registered(self, address: int, size: int) -> bool:
        """True when one live registration covers ``[address, address + size)``."""
        return bool(self.lib.fake_cuda_is_registered(address, size))

    def check_copy(self, address: int, size: int) -> int:
        """0 when CUDA would copy the host range, else the error (1: invalid value)."""
        return int(self.lib.fake_cuda_check_copy(address, size))

    def last_error(self) -> int:
        """``cudaGetLastError()`` of this thread (clears it)."""
        return int(self.lib.cudaGetLastError())

    def peek_last_error(self) -> int:
        """``cudaPeekAtLastError()`` of this thread (leaves it)."""
        return int(self.lib.cudaPeekAtLastError())

    def error_name(self, error: int) -> str:
        """``cudaGetErrorName(error)``."""
        return self.lib.cudaGetErrorName(error).decode()

    def register_flags(self) -> int:
        """The flags of the most recent ``cudaHostRegister``."""
        flags, refused = ctypes.c_uint(), ctypes.c_int()
        self.lib.fake_cuda_register_info(ctypes.byref(flags), ctypes.byref(refused))
        return flags.value

    def device_alloc(self, size: int) -> int:
        """``cudaMalloc``: fake device memory (host memory the fake copies to)."""
        ptr = ctypes.c_void_p()
        rc = self.lib.cudaMalloc(ctypes.byref(ptr), size)
        if rc != 0:
            raise MemoryError(f"fake cudaMalloc({size}) failed: {rc}")
        return int(ptr.value or 0)

    def device_free(self, address: int) -> None:
        """``cudaFree``."""
        self.lib.cudaFree(address)

    def copy_h2d(self, device: int, host: int, size: int) -> int:
        """``cudaMemcpyAsync(device, host, size, HostToDevice)``: 0 or the CUDA error."""
        return int(self.lib.cudaMemcpyAsync(device, host, size, H2D, None))

    def copy_d2h(self, host: int, device: int, size: int) -> int:
        """``cudaMemcpyAsync(host, device, size, DeviceToHost)``: 0 or the CUDA error."""
        return int(self.lib.cudaMemcpyAsync(host, device, size, D2H, None))
