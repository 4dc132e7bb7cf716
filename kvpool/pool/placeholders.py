"""Memory objects that no pool hands out: a Python byte buffer, a GDS slab placeholder."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kvpool.errors import InvalidArgumentError, RefCountError
from kvpool.formats import MemoryFormat
from kvpool.misuse import report
from kvpool.pool.metadata import MemoryObjMetadata
from kvpool.pool.objects import MemoryObj

if TYPE_CHECKING:
    from kvpool.pool.interface import MemoryAllocatorInterface

__all__ = ["BytesBufferMemoryObj", "GDSMemoryObject"]

logger = logging.getLogger("kvpool")


class BytesBufferMemoryObj(MemoryObj):
    """A memory object over an ordinary Python bytes-like buffer.

    Reference counting does nothing (the buffer is garbage-collected);
    pins are counted.

    Args:
        raw_bytes: the bytes (``bytes``, ``bytearray`` or ``memoryview``).
        metadata: optional metadata; by default a ``BINARY_BUFFER`` record.
    """

    __slots__ = ("meta", "raw_data", "valid")

    def __init__(self, raw_bytes: bytes, metadata: MemoryObjMetadata | None = None) -> None:
        if not isinstance(raw_bytes, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(
                f"raw_bytes must be bytes-like, got {type(raw_bytes).__name__}"
            )
        self.raw_data = raw_bytes
        if metadata is None:
            metadata = MemoryObjMetadata(
                shape=torch.Size([len(raw_bytes), 0, 0, 0]),
                dtype=None,
                address=0,
                phy_size=0,
                ref_count=1,
                pin_count=0,
                fmt=MemoryFormat.BINARY_BUFFER,
            )
        super().__init__(metadata)
        self.valid = True

    def invalidate(self) -> None:
        """Mark the object invalid."""
        self.valid = False

    def is_valid(self) -> bool:
        """True until :meth:`invalidate`."""
        return self.valid

    def get_size(self) -> int:
        """Length of the buffer in bytes."""
        return len(self.raw_data)

    def get_shape(self) -> torch.Size:
        """``[len, 0, 0, 0]``, as in the reference API."""
        return torch.Size([len(self.raw_data), 0, 0, 0])

    def get_dtype(self) -> torch.dtype | None:
        """None: a byte buffer has no dtype."""
        return None

    def get_shapes(self) -> list[torch.Size]:
        """One shape, :meth:`get_shape`."""
        return [self.get_shape()]

    def get_dtypes(self) -> list[torch.dtype]:
        """Empty: a byte buffer has no dtype."""
        return []

    def get_memory_format(self) -> MemoryFormat:
        """The metadata's format (``BINARY_BUFFER`` by default)."""
        return self.meta.fmt

    def get_physical_size(self) -> int:
        """The metadata's ``phy_size``."""
        return self.meta.phy_size

    def pin(self) -> bool:
        """Count a pin."""
        self.meta.pin_count += 1
        return True

    def unpin(self) -> bool:
        """Drop a pin; below zero is reported and ignored."""
        if self.meta.pin_count <= 0:
            report(RefCountError, f"unpin of an unpinned byte buffer object {self!r}")
            return False
        self.meta.pin_count -= 1
        return True

    def ref_count_up(self) -> None:
        """No-op: the buffer is garbage-collected."""

    def ref_count_down(self) -> None:
        """No-op: the buffer is garbage-collected."""

    def get_ref_count(self) -> int:
        """Always 1."""
        return 1

    def get_num_tokens(self) -> int:
        """Always 1 (the number of tokens is not recorded)."""
        return 1

    @property
    def metadata(self) -> MemoryObjMetadata:
        """The metadata."""
        return self.meta

    @property
    def tensor(self) -> torch.Tensor | None:
        """None: a byte buffer has no tensor view."""
        if not self.valid:
            logger.warning("tensor of an invalidated memory object %s", repr(self))
        return None

    @property
    def byte_array(self) -> Any:
        """The buffer itself."""
        return self.raw_data

    @property
    def data_ptr(self) -> int:
        """Address of the buffer's first byte."""
        # numpy reads the address through the buffer protocol, read-only
        # buffers included, without copying.
        return int(np.frombuffer(self.raw_data, dtype=np.uint8).ctypes.data)

    @property
    def is_pinned(self) -> bool:
        """True while pinned."""
        return self.meta.pin_count > 0

    @property
    def can_evict(self) -> bool:
        """True when not pinned."""
        return not self.is_pinned

    @property
    def raw_tensor(self) -> torch.Tensor | None:
        """None: a byte buffer has no tensor."""
        return None

    def get_tensor(self, index: int) -> torch.Tensor | None:
        """None: a byte buffer has no tensor."""
        return None

    def parent(self) -> MemoryAllocatorInterface | None:
        """None: byte buffers belong to no allocator."""
        return None

    def __repr__(self) -> str:
        return f"<BytesBufferMemoryObj {len(self.raw_data)} bytes>"


def _gds_unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"GDSMemoryObject.{what} is not supported: the bytes live in the GDS slab file, "
        "only (slab offset, size) is tracked"
    )


class GDSMemoryObject(MemoryObj):
    """A placeholder object for a chunk stored in a GPUDirect-Storage slab file.

    Only ``(offset, size)`` in the slab is tracked (``meta.address`` and
    ``meta.phy_size``); ``tensor`` is always None and the byte views,
    counting and pinning raise ``NotImplementedError``.
    """

    __slots__ = ("meta", "valid")

    def __init__(self, metadata: MemoryObjMetadata) -> None:
        if not isinstance(metadata, MemoryObjMetadata):
            raise InvalidArgumentError(
                f"metadata must be a MemoryObjMetadata, got {type(metadata).__name__}"
            )
        super().__init__(metadata)
        self.valid = True

    @property
    def slab_offset(self) -> int:
        """Byte offset of the chunk in the slab file (``meta.address``)."""
        return self.meta.address

    def invalidate(self) -> None:
        """Mark the object invalid."""
        self.valid = False

    def is_valid(self) -> bool:
        """True until :meth:`invalidate`."""
        return self.valid

    def get_size(self) -> int:
        """Bytes of the layout (``meta.get_size()``), as in LMCache 0.5.6."""
        return self.meta.get_size()

    def get_shape(self) -> torch.Size:
        """``meta.shape``."""
        return self.meta.shape

    def get_dtype(self) -> torch.dtype | None:
        """``meta.dtype``."""
        return self.meta.dtype

    def get_shapes(self) -> list[torch.Size]:
        """``meta.shapes``, else ``[meta.shape]``."""
        meta = self.meta
        return list(meta.shapes) if meta.shapes is not None else [meta.shape]

    def get_dtypes(self) -> list[torch.dtype]:
        """``meta.dtypes``, else ``[meta.dtype]``.

        Raises:
            InvalidArgumentError: the metadata has no dtype.
        """
        meta = self.meta
        if meta.dtypes is not None:
            return list(meta.dtypes)
        if meta.dtype is None:
            raise InvalidArgumentError("this GDS object's metadata has no dtype")
        return [meta.dtype]

    def get_memory_format(self) -> MemoryFormat:
        """``meta.fmt``."""
        return self.meta.fmt

    def get_physical_size(self) -> int:
        """``meta.phy_size``."""
        return self.meta.phy_size

    def ref_count_up(self) -> None:
        """Not used on the GDS path."""
        raise _gds_unsupported("ref_count_up")

    def ref_count_down(self) -> None:
        """Not used on the GDS path."""
        raise _gds_unsupported("ref_count_down")

    def get_ref_count(self) -> int:
        """Not used on the GDS path."""
        raise _gds_unsupported("get_ref_count")

    def get_num_tokens(self) -> int:
        """Not used on the GDS path."""
        raise _gds_unsupported("get_num_tokens")

    def pin(self) -> bool:
        """Not used on the GDS path."""
        raise _gds_unsupported("pin")

    def unpin(self) -> bool:
        """Not used on the GDS path."""
        raise _gds_unsupported("unpin")

    @property
    def metadata(self) -> MemoryObjMetadata:
        """The metadata."""
        return self.meta

    @property
    def tensor(self) -> torch.Tensor | None:
        """Always None."""
        return None

    @property
    def byte_array(self) -> Any:
        """Not supported: the bytes are in the slab file."""
        raise _gds_unsupported("byte_array")

    @property
    def data_ptr(self) -> int:
        """Not supported: the bytes are in the slab file."""
        raise _gds_unsupported("data_ptr")

    @property
    def is_pinned(self) -> bool:
        """Not used on the GDS path."""
        raise _gds_unsupported("is_pinned")

    @property
    def can_evict(self) -> bool:
        """Not used on the GDS path."""
        raise _gds_unsupported("can_evict")

    @property
    def raw_tensor(self) -> torch.Tensor | None:
        """Always None."""
        return None

    def get_tensor(self, index: int) -> torch.Tensor | None:
        """Always None."""
        return None

    def parent(self) -> MemoryAllocatorInterface | None:
        """None: the slab is not an allocator."""
        return None
