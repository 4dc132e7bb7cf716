"""vLLM's primary rows lent to the stores in place: one borrowed buffer, one range per chunk.

vLLM's primary tier is one ``/dev/shm`` region seen as a 2-D memoryview
``(num_chunks, row_stride)``; chunk ``c`` is row ``c``.  :class:`PrimaryRows`
wraps the region once (:class:`~kvpool.pool.borrowed.BorrowedMemory`), so a
store's put reads a row's bytes where they are and a get writes them there:
no staging copy.

The wrapper holds a buffer export of the region, and every object lent from
it holds the wrapper's memory: while any exists, vLLM cannot unmap the region
(it keeps it mapped, warning "buffers are still exported"), so no store call
can ever touch unmapped memory.  A store that moves rows by address
(``put_ranges``) lends no objects: it registers :meth:`PrimaryRows.region`,
which holds the export the same way until the store unregisters it.
:meth:`PrimaryRows.release` drops the tier's export at shutdown; objects
still lent to a call in flight, and a registration, drop theirs when the
last call ends.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvpool.errors import InvalidArgumentError, PoolClosedError
from kvpool.pool.borrowed import BorrowedMemory
from kvpool.pool.handle import TensorMemoryObj

__all__ = ["PrimaryRows"]


class PrimaryRows:
    """The rows of vLLM's primary tier, lent by chunk id (see the module docstring).

    Args:
        view: ``primary_kv_view``: a C-contiguous 2-D memoryview, one row per chunk.

    Raises:
        InvalidArgumentError: a view that is not 2-D, not contiguous or read-only.

    Attributes:
        row_bytes: bytes per row (the view's first stride).
        rows: how many rows.

    Thread safety: any thread may lend; :meth:`release` once, when no call
    will lend again.
    """

    def __init__(self, view: memoryview) -> None:
        if view.ndim != 2 or not view.c_contiguous or view.strides is None:
            raise InvalidArgumentError(
                f"the primary tier's view must be a contiguous 2-D memoryview (chunks x row "
                f"bytes), got {view.ndim} dimensions, shape {view.shape}; this vLLM's primary "
                "tier is not the CPU tier kvpool's tier was made for"
            )
        self.row_bytes = int(view.strides[0])
        self.rows = int(view.shape[0])
        self._lender: BorrowedMemory | None = BorrowedMemory(view.cast("B"))

    @property
    def lender(self) -> BorrowedMemory:
        """The borrowed buffer over every row.

        Raises:
            PoolClosedError: after :meth:`release`.
        """
        lender = self._lender
        if lender is None:
            raise PoolClosedError("the tier released vLLM's primary rows (it was shut down)")
        return lender

    @property
    def base(self) -> int:
        """The address of row 0."""
        return self.lender.address

    def addresses(self, chunk_ids: Sequence[int]) -> list[int]:
        """The first byte of each chunk's row.

        Raises:
            InvalidArgumentError: a chunk id outside the view.
            PoolClosedError: after :meth:`release`.
        """
        base, size, rows = self.base, self.row_bytes, self.rows
        out = []
        for cid in chunk_ids:
            c = int(cid)
            if not 0 <= c < rows:
                raise InvalidArgumentError(
                    f"chunk id {c} is outside vLLM's primary tier of {rows} rows"
                )
            out.append(base + c * size)
        return out

    def region(self) -> torch.Tensor:
        """Every row as one flat ``uint8`` tensor, for a store to register.

        The tensor holds the region's buffer export: while a store holds it,
        vLLM cannot unmap the region.

        Raises:
            PoolClosedError: after :meth:`release`.
        """
        return torch.frombuffer(self.lender.memory, dtype=torch.uint8)

    def lend(self, address: int) -> TensorMemoryObj:
        """A memory object over the row at ``address`` (one ``uint8`` group of ``row_bytes``).

        Returns:
            A lent object: end it with ``ref_count_down()`` once its store call returned.
        """
        return self.lender.lend(address, self.row_bytes)

    def release(self) -> None:
        """Drop the tier's hold on the region (objects lent to calls in flight keep theirs)."""
        self._lender = None

    @property
    def released(self) -> bool:
        """True after :meth:`release`."""
        return self._lender is None
