"""Memory objects that no pool hands out: a Python byte buffer, a GDS slab placeholder."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kvpool.errors import (
    ArgumentTypeError,
    FeatureUnavailableError,
    InvalidArgumentError,
    InvalidHandleError,
    RefCountError,
)
from kvpool.formats import MemoryFormat
from kvpool.misuse import report
from kvpool.pool.metadata import MemoryObjMetadata
from kvpool.pool.objects import MemoryObj

if TYPE_CHECKING:
    from kvpool.pool.interface import MemoryAllocatorInterface

__all__ = ["GDS_UNSUPPORTED", "BytesBufferMemoryObj", "GDSMemoryObject"]


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
        """None: a byte buffer has no tensor view (invalidated: warns, raises in strict mode)."""
        if not self.valid:
            report(InvalidHandleError, f"tensor of an invalidated memory object {self!r}")
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


class GDSMemoryObject(MemoryObj):
    """A placeholder object for a chunk stored in a GPUDirect-Storage slab file.

    Only ``(offset, size)`` in the slab is tracked (``meta.address`` and
    ``meta.phy_size``), with the shape, dtype and format of the metadata.
    ``tensor``, ``raw_tensor`` and ``get_tensor`` are always None; the byte
    views, the token count, counting and pinning raise
    :class:`~kvpool.errors.FeatureUnavailableError` (see
    :data:`GDS_UNSUPPORTED` for each one and why).

    Args:
        metadata: where the chunk lies in the slab, and its layout.

    Raises:
        InvalidArgumentError: ``metadata`` is not a MemoryObjMetadata.
    """

    __slots__ = ("meta", "valid")

    def __init__(self, metadata: MemoryObjMetadata) -> None:
        if not isinstance(metadata, MemoryObjMetadata):
            raise ArgumentTypeError(
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

    @property
    def metadata(self) -> MemoryObjMetadata:
        """The metadata."""
        return self.meta

    @property
    def tensor(self) -> torch.Tensor | None:
        """Always None: the bytes are in the slab file."""
        return None

    @property
    def raw_tensor(self) -> torch.Tensor | None:
        """Always None: the bytes are in the slab file."""
        return None

    def get_tensor(self, index: int) -> torch.Tensor | None:
        """Always None: the bytes are in the slab file."""
        return None

    def parent(self) -> MemoryAllocatorInterface | None:
        """None: the slab is not an allocator."""
        return None

    def __repr__(self) -> str:
        return f"<GDSMemoryObject slab offset {self.meta.address}, {self.meta.phy_size} bytes>"


#: What a :class:`GDSMemoryObject` does not support: name -> (a property?, why).
#: Each raises :class:`~kvpool.errors.FeatureUnavailableError` saying why.
GDS_UNSUPPORTED: dict[str, tuple[bool, str]] = {
    "get_num_tokens": (False, "the token count is not tracked"),
    "ref_count_up": (False, "slab chunks are not reference counted"),
    "ref_count_down": (False, "slab chunks are not reference counted"),
    "get_ref_count": (False, "slab chunks are not reference counted"),
    "pin": (False, "slab chunks are not pinned"),
    "unpin": (False, "slab chunks are not pinned"),
    "is_pinned": (True, "slab chunks are not pinned"),
    "can_evict": (True, "eviction of slab chunks is the slab's business"),
    "byte_array": (True, "the bytes are in the slab file, not in memory"),
    "raw_data": (True, "the bytes are in the slab file, not in memory"),
    "data_ptr": (True, "the bytes are in the slab file, not in memory"),
}


def _gds_unsupported(name: str, is_property: bool, why: str) -> Any:
    def refuse(self: GDSMemoryObject) -> Any:
        raise FeatureUnavailableError(
            f"GDSMemoryObject.{name} is not supported: {why}; only the chunk's (slab offset, "
            "size) and layout are tracked. Read the chunk from the slab file into a pool "
            "object first"
        )

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Not supported on the GDS path ({why}): raises FeatureUnavailableError."
    return property(refuse, doc=refuse.__doc__) if is_property else refuse


for _name, (_is_property, _why) in GDS_UNSUPPORTED.items():
    setattr(GDSMemoryObject, _name, _gds_unsupported(_name, _is_property, _why))
abc.update_abstractmethods(GDSMemoryObject)
