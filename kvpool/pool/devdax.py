"""A pool backing over a mapped Device-DAX device (or a file or memfd standing in for one).

A Device-DAX device exposes persistent or CXL memory as a character device
that is mapped with ``mmap(MAP_SHARED)``.  :class:`DevDaxBacking` maps one
(for tests and emulation: a regular file, or ``/proc/self/fd/N`` of a
memfd) and hands it to a pool like any other backing.

Capacity is checked before mapping: a regular file must be at least as
large as the mapping (beyond its end a touch would raise SIGBUS); for a
character device the size comes from ``/sys/dev/char/MAJ:MIN/size`` where
sysfs has it.  With CUDA the mapping is registered with
``cudaHostRegister`` (and unregistered at close); without it the memory is
used as is.  Views keep the mapping alive: ``close()`` closes the device
and drops the backing's hold, and the mapping goes with the last view.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import stat
from typing import Any

import torch

from kvpool.checks import check_size
from kvpool.errors import DeviceNotFoundError, InvalidArgumentError, NativeError
from kvpool.pool.backing import Backing

__all__ = ["DevDaxBacking", "check_device_path", "device_identity"]

logger = logging.getLogger("kvpool")

_EMPTY = torch.empty(0, dtype=torch.uint8)


def check_device_path(device_path: object) -> str:
    """Return ``device_path`` if it is a non-empty string.

    Raises:
        InvalidArgumentError: anything else.
    """
    if not isinstance(device_path, str) or not device_path or "\x00" in device_path:
        raise InvalidArgumentError(
            f"device_path must be a non-empty path such as /dev/dax0.0 (no NUL byte), got "
            f"{device_path!r}"
        )
    return device_path


def device_identity(source: str | int) -> tuple[bool, int, int] | None:
    """What physical device a path or an open fd is.

    Returns:
        ``(True, st_rdev, 0)`` for a character device, ``(False, st_dev,
        st_ino)`` for a regular file, None for anything else or an error.
    """
    try:
        info = os.fstat(source) if isinstance(source, int) else os.stat(source)
    except (OSError, ValueError, TypeError, OverflowError):
        return None
    if stat.S_ISCHR(info.st_mode):
        return True, info.st_rdev, 0
    if stat.S_ISREG(info.st_mode):
        return False, info.st_dev, info.st_ino
    return None


def _capacity(fd: int, info: os.stat_result) -> int | None:
    """Bytes the device or file can map, or None when unknown."""
    if stat.S_ISREG(info.st_mode):
        return info.st_size
    sysfs = f"/sys/dev/char/{os.major(info.st_rdev)}:{os.minor(info.st_rdev)}/size"
    try:
        with open(sysfs) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return info.st_size or None


def _cuda_register(address: int, size: int) -> bool:
    if not torch.cuda.is_available():
        return False
    status = torch.cuda.cudart().cudaHostRegister(address, size, 0)
    if int(status) != 0:
        logger.warning(
            "cudaHostRegister of the Device-DAX mapping at %#x (%d bytes) failed (%s); "
            "copies to the GPU will be pageable",
            address,
            size,
            status,
        )
        return False
    return True


class DevDaxBacking(Backing):
    """A pool backing over a mapped Device-DAX device (or file, or memfd).

    Args:
        device_path: the device (``/dev/dax0.0``), a regular file, or
            ``/proc/self/fd/N`` of a memfd.
        size: bytes to map, > 0, at most the device's capacity.

    Raises:
        InvalidArgumentError: bad size, a size beyond the capacity, or a path
            that is neither a character device nor a regular file.
        OSError: the device cannot be opened or mapped.
    """

    def __init__(self, device_path: str, size: int) -> None:
        self.device_path = check_device_path(device_path)
        self.size = check_size("size", size)
        self._closed = False
        self._registered = False
        try:
            fd = os.open(device_path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            error = DeviceNotFoundError if isinstance(exc, FileNotFoundError) else NativeError
            raise error(exc.errno, f"cannot open {device_path!r}: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not (stat.S_ISCHR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                raise InvalidArgumentError(
                    f"{device_path} is neither a Device-DAX character device nor a regular file"
                )
            capacity = _capacity(fd, info)
            if capacity is not None and size > capacity:
                raise InvalidArgumentError(
                    f"cannot map {size} bytes of {device_path}: it holds {capacity} bytes; "
                    "ask for less (or grow the file with truncate -s)"
                )
            self.identity = device_identity(fd)
            try:
                self._mmap: mmap.mmap | None = mmap.mmap(
                    fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
                )
            except (OSError, ValueError, OverflowError) as exc:
                raise NativeError(
                    getattr(exc, "errno", None), f"cannot map {size} bytes of {device_path}: {exc}"
                ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.view: memoryview | None = memoryview(self._mmap)
        self.tensor = torch.frombuffer(self.view, dtype=torch.uint8)
        self.base_address = self.tensor.data_ptr()
        self._registered = _cuda_register(self.base_address, size)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    @property
    def pinned(self) -> str:
        """ "cuda-register" when registered with CUDA, else "none"."""
        return "cuda-register" if self._registered else "none"

    def contains(self, address: int) -> bool:
        """True when ``address`` lies in the mapping."""
        return self.base_address <= address < self.base_address + self.size

    def close(self) -> None:
        """Unregister, close the device and drop this hold; views keep the mapping. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._registered:
            self._registered = False
            if torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.cudart().cudaHostUnregister(self.base_address)
        os.close(self._fd)
        mapping, self._mmap = self._mmap, None
        self.view = None
        self.tensor = _EMPTY
        # With a view alive the mapping goes with the last one instead.
        with contextlib.suppress(BufferError):
            mapping.close()  # type: ignore[union-attr]

    def describe(self) -> dict[str, Any]:
        """Kind, size, path and pinning."""
        return {
            "kind": "devdax",
            "size": self.size,
            "device_path": self.device_path,
            "pinned": self.pinned,
        }
