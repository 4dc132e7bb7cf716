"""A pool backing over a mapped Device-DAX device (or a file or memfd standing in for one).

A Device-DAX device exposes persistent or CXL memory as a character device
that is mapped with ``mmap(MAP_SHARED)``.  :class:`DevDaxBacking` maps one
(for tests and emulation: a regular file, or ``/proc/self/fd/N`` of a
memfd) and hands it to a pool like any other backing.

Capacity is checked before mapping: a regular file must be at least as
large as the mapping (beyond its end a touch would raise SIGBUS); for a
character device the size comes from ``/sys/dev/char/MAJ:MIN/size`` where
sysfs has it.

CUDA: the mapping is registered through libpinmem, the one path of every
``cudaHostRegister`` of kvpool (:func:`kvpool.native.registration.register_host`:
chunked, rolled back when refused part-way, the runtime's last error
cleared so no later CUDA call of the thread fails with it).  Whether the
driver accepts it depends on the kernel, not on kvpool: the NVIDIA driver
pins the pages with ``pin_user_pages(FOLL_LONGTERM | FOLL_WRITE)``, which
Linux refuses for a shared mapping of a file whose file system tracks dirty
pages (ext4, xfs... since Linux 6.5) and for file-system DAX; a Device-DAX
character device, a memfd and a tmpfs file register.  With ``pin="auto"`` a
refusal leaves the arena usable and unpinned (copies to and from the GPU are
pageable, slower) with one warning that names the CUDA error; with
``pin="cuda-register"`` it raises.  Views keep the mapping alive:
``close()`` unregisters, closes the device and drops the backing's hold,
and the mapping goes with the last view.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import stat
from typing import Any

import torch

from kvpool.checks import check_choice, check_size
from kvpool.errors import (
    DeviceNotFoundError,
    FeatureUnavailableError,
    InvalidArgumentError,
    NativeError,
    OutOfMemoryError,
)
from kvpool.native.registration import register_host
from kvpool.pool.backing import Backing

__all__ = ["DEVDAX_PIN_CHOICES", "DevDaxBacking", "check_device_path", "device_identity"]

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


#: What ``pin`` a Device-DAX backing takes.
DEVDAX_PIN_CHOICES = ("auto", "none", "cuda-register")

# Mappings whose unregistration failed: the driver may still use their pages,
# so they are never unmapped (a leak, not a crash).
_UNREGISTER_FAILED: list[mmap.mmap] = []


def _register(address: int, size: int, path: str, pin: str, chunk: int | None) -> Any:
    """Register the mapping with CUDA as ``pin`` says; the Registration, or None."""
    if pin == "none":
        return None
    try:
        return register_host(address, size, chunk=chunk)
    except FeatureUnavailableError:
        if pin == "cuda-register":
            raise
        return None  # no CUDA here: used as is, like any host pool without CUDA
    except (NativeError, OutOfMemoryError) as exc:
        if pin == "cuda-register":
            raise
        logger.warning(
            "kvpool: CUDA refused to register the Device-DAX mapping of %s (%d bytes): %s. "
            "The arena works unpinned (GPU copies are pageable, slower). A shared mapping of "
            "a file on ext4/xfs cannot be pinned for the GPU since Linux 6.5; a Device-DAX "
            "device, a memfd or a tmpfs file can (see docs/troubleshooting.md)",
            path,
            size,
            getattr(exc, "detail", "") or exc,
        )
        return None


class DevDaxBacking(Backing):
    """A pool backing over a mapped Device-DAX device (or file, or memfd).

    Args:
        device_path: the device (``/dev/dax0.0``), a regular file, or
            ``/proc/self/fd/N`` of a memfd.
        size: bytes to map, > 0, at most the device's capacity.
        pin: "auto" (register with CUDA when a runtime and a device are
            there; a refusal leaves it unpinned, with one warning), "none",
            or "cuda-register" (a refusal raises).
        register_chunk: bytes per ``cudaHostRegister`` call (a pool passes
            a multiple of its alignment); None: the ``register_chunk`` option.

    Raises:
        InvalidArgumentError: bad size or pin, a size beyond the capacity, or
            a path that is neither a character device nor a regular file.
        OSError: the device cannot be opened or mapped.
        FeatureUnavailableError: ``pin="cuda-register"`` without CUDA.
        NativeError: ``pin="cuda-register"`` and the driver refused (the
            message names the CUDA error); nothing stays registered.
    """

    def __init__(
        self,
        device_path: str,
        size: int,
        *,
        pin: str = "auto",
        register_chunk: int | None = None,
    ) -> None:
        self.device_path = check_device_path(device_path)
        self.size = check_size("size", size)
        check_choice("pin", pin, dict.fromkeys(DEVDAX_PIN_CHOICES))
        self._closed = False
        self._registration: Any = None
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
        try:
            self._registration = _register(
                self.base_address, size, device_path, pin, register_chunk
            )
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    @property
    def pinned(self) -> str:
        """ "cuda-register" when registered with CUDA, else "none"."""
        return "cuda-register" if self._registration is not None else "none"

    def registrations(self) -> list[tuple[int, int]]:
        """``(offset, length)`` of each CUDA registration call (see ``Backing.registrations``)."""
        registration = self._registration
        return registration.spans() if registration is not None else []

    def contains(self, address: int) -> bool:
        """True when ``address`` lies in the mapping."""
        return self.base_address <= address < self.base_address + self.size

    def close(self) -> None:
        """Unregister, close the device and drop this hold; views keep the mapping. Idempotent."""
        if self._closed:
            return
        self._closed = True
        registration, self._registration = self._registration, None
        mapping, self._mmap = self._mmap, None
        if registration is not None:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()  # no copy from the arena may still be in flight
            try:
                registration.close()
            except NativeError as exc:
                logger.error("kvpool: %s; the mapping of %s is kept", exc, self.device_path)
                _UNREGISTER_FAILED.append(mapping)  # type: ignore[arg-type]
        os.close(self._fd)
        self.view = None
        self.tensor = _EMPTY
        # With a view alive the mapping goes with the last one instead.
        with contextlib.suppress(BufferError):
            if mapping is not None and mapping not in _UNREGISTER_FAILED:
                mapping.close()

    def describe(self) -> dict[str, Any]:
        """Kind, size, path and pinning."""
        return {
            "kind": "devdax",
            "size": self.size,
            "device_path": self.device_path,
            "pinned": self.pinned,
        }
