"""The real CUDA runtime's last error, as the GPU tests check it.

libpinmem reports which runtime it loaded (``capabilities().cuda_runtime_path``,
torch's own ``libcudart`` where torch loaded one); opening that path again
with ctypes gives the same loaded copy, whose per-thread last error is the
one a failed CUDA call leaves for the next, unrelated call of the thread
(torch's kernel launch, say).
"""

from __future__ import annotations

import ctypes


class CudaRuntime:
    """``cudaGetLastError`` / ``cudaPeekAtLastError`` / ``cudaGetErrorName`` of one runtime."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.lib.cudaGetErrorName.restype = ctypes.c_char_p

    def peek(self) -> int:
        """The calling thread's last error, left in place."""
        return int(self.lib.cudaPeekAtLastError())

    def take(self) -> int:
        """The calling thread's last error, cleared."""
        return int(self.lib.cudaGetLastError())

    def name(self, error: int) -> str:
        """``cudaGetErrorName(error)``."""
        raw = self.lib.cudaGetErrorName(error)
        return raw.decode() if raw else f"cudaError {error}"
