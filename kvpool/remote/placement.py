"""Reading entries into memory the caller chose, per key: the allocator of a placed get.

A store's ``get``/``batched_get`` allocates each destination from an
allocator.  An engine that keeps its own pages (SGLang's host pool) wants
each entry read *into a given page* instead.  :class:`Placement` is such
an allocator: it maps every key to a range of borrowed memory
(:class:`~kvpool.pool.borrowed.BorrowedMemory`), and the stores, which
ask :func:`~kvpool.remote.objects.allocator_for` for the allocator of
each key they read, get a lent object over that key's range.  So one
batched store call (pipelined, threaded or one Mooncake batch) fills the
engine's pages in place::

    place = Placement()
    for key, address in zip(keys, page_addresses):
        place.add(key, lender, address, page_bytes)
    objs = store.batched_get(keys, place, shapes, dtypes, fmt)
    hits = [o is not None for o in objs]
    for o in objs:
        if o is not None:
            o.ref_count_down()          # frees nothing: the pages are the engine's

A stored entry of another size than its key's range is refused (the
store's layout check, ``InvalidArgumentError``).  A key read twice in one
call is read into the same range twice.  A get that fails may leave its
range partly written: the caller treats that page as not loaded.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvpool.errors import InvalidArgumentError
from kvpool.formats import MemoryFormat
from kvpool.pool.borrowed import BorrowedMemory
from kvpool.pool.handle import TensorMemoryObj
from kvpool.remote.base import Key, key_bytes

__all__ = ["Placement"]


class _Place:
    """The allocator of one key: lends its range, once per allocation."""

    __slots__ = ("address", "lender", "nbytes")

    def __init__(self, lender: BorrowedMemory, address: int, nbytes: int) -> None:
        self.lender = lender
        self.address = address
        self.nbytes = nbytes

    def allocate(
        self,
        shapes: torch.Size | Sequence[torch.Size],
        dtypes: torch.dtype | Sequence[torch.dtype],
        fmt: MemoryFormat | None = None,
    ) -> TensorMemoryObj:
        if isinstance(shapes, torch.Size):
            shapes = [shapes]
        if isinstance(dtypes, torch.dtype):
            dtypes = [dtypes]
        need = sum(torch.Size(s).numel() * d.itemsize for s, d in zip(shapes, dtypes, strict=True))
        if need != self.nbytes:
            raise InvalidArgumentError(
                f"the stored entry holds {need} bytes, the range placed for it {self.nbytes}; "
                "it was written by an engine of another page geometry"
            )
        return self.lender.lend(
            self.address, self.nbytes, shapes, dtypes, fmt or MemoryFormat.UNDEFINED
        )


class Placement:
    """An allocator that reads each key's entry into the range placed for it (see the module).

    Thread safety: fill it (:meth:`add`) before the store call; the store
    may then read it from several threads.
    """

    __slots__ = ("_places",)

    def __init__(self) -> None:
        self._places: dict[bytes, _Place] = {}

    def add(self, key: Key, lender: BorrowedMemory, address: int, nbytes: int) -> None:
        """Place ``key``'s entry at ``nbytes`` bytes at ``address`` of ``lender``'s buffer.

        Raises:
            InvalidArgumentError: a bad key, or a range outside the buffer.
        """
        if not lender.contains(address, nbytes) or nbytes < 1:
            raise InvalidArgumentError(
                f"cannot place {nbytes} bytes at {address:#x}: outside {lender!r}"
            )
        self._places[key_bytes(key)] = _Place(lender, address, nbytes)

    def for_key(self, key: bytes) -> _Place:
        """The allocator of ``key`` (what the stores call per key).

        Raises:
            InvalidArgumentError: no range was placed for ``key``.
        """
        place = self._places.get(key)
        if place is None:
            raise InvalidArgumentError(
                f"no memory was placed for key {key!r}; add() every key before the get"
            )
        return place

    def allocate(
        self,
        shapes: torch.Size | Sequence[torch.Size],
        dtypes: torch.dtype | Sequence[torch.dtype],
        fmt: MemoryFormat | None = None,
    ) -> TensorMemoryObj:
        """Refused: a placement knows where to read only per key.

        Raises:
            InvalidArgumentError: always (a store that does not ask per key).
        """
        raise InvalidArgumentError(
            "a Placement allocates per key: this store did not ask for the key's range"
        )

    def __len__(self) -> int:
        return len(self._places)

    def __repr__(self) -> str:
        return f"<Placement of {len(self._places)} keys>"
