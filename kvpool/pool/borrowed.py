"""Memory objects over host memory kvpool does not own: lent views of an owner's buffer.

An engine that keeps its own host buffers (SGLang's HiCache host pool,
LMCache's CPU allocator) can still hand their bytes to kvpool's stores
without a staging copy: :class:`BorrowedMemory` wraps the owner's buffer
once, and :meth:`BorrowedMemory.lend` makes a :class:`~kvpool.TensorMemoryObj`
over any range of it, which every store puts and reads into like a pool's
object.

Contracts:

* **No copy.**  A lent object's bytes *are* the owner's: a store's put
  sends them, a store's get writes them in place.
* **The owner keeps the memory alive.**  A lent object holds a slice of
  the owner's buffer (a tensor view of the same storage), never a raw
  address, so its views cannot outlive the memory.
* **Nothing is freed.**  A lent object has no pool: its last
  ``ref_count_down`` only ends it (later views raise
  ``InvalidHandleError``); the owner's memory is untouched.
* **Ranges are checked.**  A range outside the buffer is refused with
  :class:`~kvpool.errors.InvalidArgumentError`, never read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvpool.checks import check_int
from kvpool.errors import ArgumentTypeError, InvalidArgumentError
from kvpool.formats import MemoryFormat
from kvpool.pool.handle import TensorMemoryObj
from kvpool.pool.metadata import MemoryObjMetadata

__all__ = ["BorrowedMemory", "borrow"]


def _flat_bytes(memory: object) -> torch.Tensor:
    """A flat ``uint8`` tensor over ``memory``'s bytes (no copy), or a typed refusal."""
    if isinstance(memory, torch.Tensor):
        if memory.device.type != "cpu":
            raise InvalidArgumentError(
                f"borrowed memory must be host memory, got a tensor on {memory.device}; "
                "lend the host buffer the engine copies through"
            )
        if not memory.is_contiguous():
            raise InvalidArgumentError(
                f"borrowed memory must be one contiguous range, got a tensor of shape "
                f"{tuple(memory.shape)} with strides {memory.stride()}; lend its base tensor"
            )
        return memory.reshape(-1).view(torch.uint8)
    try:
        view = memoryview(memory)  # type: ignore[arg-type]
    except TypeError:
        raise ArgumentTypeError(
            f"borrowed memory must be a CPU torch.Tensor or a buffer (bytearray, numpy "
            f"array, mmap...), got {type(memory).__name__}"
        ) from None
    if view.readonly:
        raise InvalidArgumentError(
            f"borrowed memory must be writable (a get writes into it), got a read-only "
            f"{type(memory).__name__}; lend a bytearray or a writable array"
        )
    if not view.c_contiguous:
        raise InvalidArgumentError("borrowed memory must be one contiguous buffer")
    if view.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(view.cast("B"), dtype=torch.uint8)


class BorrowedMemory:
    """A host buffer someone else owns, lent out as memory objects (see the module docstring).

    Args:
        memory: a contiguous CPU ``torch.Tensor`` (any dtype) or a writable
            contiguous buffer.  The caller keeps it alive and unchanged in
            size for as long as objects lent from it are in use; this
            wrapper (and every lent object) also holds a reference to it.

    Raises:
        ArgumentTypeError: ``memory`` is neither a tensor nor a buffer.
        InvalidArgumentError: device memory, a non-contiguous tensor, a
            read-only buffer.

    Attributes:
        address: the buffer's first byte.
        nbytes: its size in bytes.
    """

    __slots__ = ("_bytes", "address", "memory", "nbytes")

    def __init__(self, memory: object) -> None:
        self._bytes = _flat_bytes(memory)
        self.memory = memory
        self.nbytes = int(self._bytes.numel())
        self.address = int(self._bytes.data_ptr()) if self.nbytes else 0

    def contains(self, address: int, nbytes: int) -> bool:
        """True when ``[address, address + nbytes)`` lies inside the buffer."""
        return self.address <= address and address + nbytes <= self.address + self.nbytes

    def lend(
        self,
        address: int,
        nbytes: int,
        shapes: Sequence[torch.Size] | None = None,
        dtypes: Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat = MemoryFormat.UNDEFINED,
    ) -> TensorMemoryObj:
        """A memory object over ``nbytes`` bytes at ``address`` (no copy; it frees nothing).

        Args:
            address: the range's first byte (an engine's ``data_ptr()`` arithmetic).
            nbytes: its length, at least 1.
            shapes: the object's group shapes; default one group of
                ``[nbytes]`` bytes.
            dtypes: their dtypes; default ``uint8``.  The groups must cover
                exactly ``nbytes`` bytes.
            fmt: the object's :class:`~kvpool.MemoryFormat`.

        Returns:
            A live object, reference count 1: end it with ``ref_count_down()``
            once the store call returned.

        Raises:
            InvalidArgumentError: a range outside the buffer, an empty one,
                or shapes and dtypes that do not cover ``nbytes`` bytes.

        Complexity: O(groups); one tensor slice.
        """
        check_int("nbytes", nbytes, low=1)
        check_int("address", address, low=0)
        if not self.contains(address, nbytes):
            raise InvalidArgumentError(
                f"cannot lend {nbytes} bytes at {address:#x}: the borrowed buffer holds "
                f"{self.nbytes} bytes at {self.address:#x}; pass a range inside it"
            )
        start = address - self.address
        obj = _lent(self._bytes[start : start + nbytes], nbytes, shapes, dtypes, fmt, start)
        obj.parent_allocator = self  # type: ignore[assignment]
        return obj

    def free(self, obj: TensorMemoryObj) -> None:
        """End a lent object (its last ``ref_count_down`` calls this): nothing is freed.

        Args:
            obj: the object; later views of it raise ``InvalidHandleError``.
        """
        obj.invalidate()

    def __repr__(self) -> str:
        return f"<BorrowedMemory {self.nbytes} bytes at {self.address:#x}>"


def _lent(
    raw: torch.Tensor,
    nbytes: int,
    shapes: Sequence[torch.Size] | None,
    dtypes: Sequence[torch.dtype] | None,
    fmt: MemoryFormat,
    offset: int,
) -> TensorMemoryObj:
    if shapes is None and dtypes is None:
        group_shapes, group_dtypes = [torch.Size([nbytes])], [torch.uint8]
    elif shapes is None or dtypes is None:
        raise InvalidArgumentError("give both shapes and dtypes, or neither (one byte group)")
    else:
        group_shapes = [torch.Size(s) for s in shapes]
        group_dtypes = list(dtypes)
        if len(group_shapes) != len(group_dtypes) or not group_shapes:
            raise InvalidArgumentError(
                f"one dtype per shape, at least one group: got {len(group_shapes)} shapes "
                f"and {len(group_dtypes)} dtypes"
            )
        covered = sum(
            s.numel() * d.itemsize for s, d in zip(group_shapes, group_dtypes, strict=True)
        )
        if covered != nbytes:
            raise InvalidArgumentError(
                f"shapes {[tuple(s) for s in group_shapes]} of "
                f"{[str(d).removeprefix('torch.') for d in group_dtypes]} cover {covered} "
                f"bytes, the lent range {nbytes}; describe exactly the range's bytes"
            )
    record = MemoryObjMetadata(
        shape=group_shapes[0],
        dtype=group_dtypes[0],
        address=offset,
        phy_size=nbytes,
        ref_count=1,
        fmt=fmt,
        shapes=group_shapes,
        dtypes=group_dtypes,
    )
    return TensorMemoryObj(raw, record, None)


def borrow(
    memory: Any,
    shapes: Sequence[torch.Size] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    fmt: MemoryFormat = MemoryFormat.UNDEFINED,
    nbytes: int | None = None,
) -> TensorMemoryObj:
    """One memory object over ``memory``'s first ``nbytes`` bytes (all of them by default).

    The one-off form of :meth:`BorrowedMemory.lend`, for a buffer lent
    once (e.g. an LMCache object's tensor about to be put).

    Args:
        memory: a contiguous CPU tensor or a writable buffer (see :class:`BorrowedMemory`).
        shapes: group shapes (default one byte group).
        dtypes: their dtypes.
        fmt: the object's format.
        nbytes: how many leading bytes to lend (default all).

    Returns:
        The lent object (reference count 1; ``ref_count_down()`` ends it).

    Raises:
        ArgumentTypeError: ``memory`` is neither a tensor nor a buffer.
        InvalidArgumentError: device memory, a non-contiguous tensor, a
            read-only buffer, or an ``nbytes``, shapes or dtypes that do
            not fit it (as :meth:`BorrowedMemory.lend`).
    """
    lender = BorrowedMemory(memory)
    size = lender.nbytes if nbytes is None else nbytes
    return lender.lend(lender.address, size, shapes, dtypes, fmt)
