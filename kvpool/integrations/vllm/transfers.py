"""What one job does with the store: rows put from vLLM's primary tier, rows read back into it.

Both run in the tier's I/O threads through the *blocking* store, a job's
chunks in calls of at most :data:`~kvpool.integrations.vllm.config.CALL_BYTES`
(so each call stays well inside its store's deadline):

* :meth:`RowTransfers.store` - the chunks the store has already are not
  written again (one ``batched_exists``, unless the store itself leaves an
  existing key as it is); the rest are put in place: lent row objects in one
  ``batched_put`` per call, or, on a directory or a headerless Mooncake store
  over the registered region, the rows' address ranges (``put_ranges``: no
  object per row);
* :meth:`RowTransfers.load` - each chunk is read into its row in place (a
  :class:`~kvpool.remote.placement.Placement` for ``batched_get``, or
  ``get_ranges``).  An entry that cannot be the chunk's - corrupt, truncated,
  of another size - is a miss: it is removed from the store and named in the
  outcome, and its row is reported as not loaded, so vLLM never uses its bytes.

An error of the store as a whole (unreachable, timing out) propagates: the
tier turns it into a failed job and an outage report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kvpool.errors import CorruptEntryError, InvalidArgumentError
from kvpool.formats import MemoryFormat
from kvpool.integrations.vllm.config import CALL_BYTES
from kvpool.integrations.vllm.rows import PrimaryRows
from kvpool.remote.objects import discard
from kvpool.remote.placement import Placement

__all__ = ["LoadOutcome", "RowTransfers"]

_FMT = MemoryFormat.UNDEFINED
# What makes one entry unusable (rather than the store unreachable).
_UNUSABLE = (CorruptEntryError, InvalidArgumentError)


@dataclass
class LoadOutcome:
    """What a load read.

    Attributes:
        found: per chunk, whether its row now holds the chunk's bytes.
        nbytes: the bytes read.
        unusable: ``(index, error)`` of each entry that could not be the chunk's
            (removed from the store).
    """

    found: list[bool]
    nbytes: int = 0
    unusable: list[tuple[int, BaseException]] = field(default_factory=list)


class RowTransfers:
    """A job's store calls over the primary rows (see the module docstring).

    Args:
        rows: the primary tier's rows.
        ranges: move address ranges (``put_ranges``/``get_ranges``) instead of
            lent objects: for a directory or a headerless Mooncake store over the
            registered region.
        skips_existing: the store's put leaves an existing key as it is
            (Mooncake with ``replace`` off), so no existence check is needed.
        call_bytes: most bytes of rows per store call.
    """

    def __init__(
        self,
        rows: PrimaryRows,
        *,
        ranges: bool = False,
        skips_existing: bool = False,
        call_bytes: int = CALL_BYTES,
    ) -> None:
        self.rows = rows
        self.ranges = ranges
        self.skips_existing = skips_existing
        self.per_call = max(1, call_bytes // max(rows.row_bytes, 1))
        self._shape = [torch.Size([rows.row_bytes])]
        self._dtype = [torch.uint8]

    def store(self, store: Any, names: Sequence[str], addresses: Sequence[int]) -> int:
        """Put the rows at ``addresses`` under ``names``, skipping those the store has.

        Returns:
            The bytes written.

        Raises:
            whatever the store raises (the job fails as a whole).
        """
        todo = list(range(len(names)))
        if not self.skips_existing and todo:
            present = store.batched_exists(list(names))
            todo = [i for i in todo if not present[i]]
        size = self.rows.row_bytes
        for part in _parts(todo, self.per_call):
            part_names = [names[i] for i in part]
            if self.ranges:
                store.put_ranges(part_names, [addresses[i] for i in part], [size] * len(part))
                continue
            objs = [self.rows.lend(addresses[i]) for i in part]
            try:
                store.batched_put(part_names, objs)
            finally:
                for obj in objs:
                    discard(obj)
        return len(todo) * size

    def load(
        self,
        store: Any,
        names: Sequence[str],
        addresses: Sequence[int],
        remove: Callable[[str], None],
    ) -> LoadOutcome:
        """Read each entry into the row at its address.

        Args:
            store: the blocking store.
            names: the chunks' store keys.
            addresses: their rows.
            remove: called with the key of each unusable entry (the tier removes it).

        Raises:
            whatever the store raises for the call as a whole.
        """
        outcome = LoadOutcome([False] * len(names))
        for part in _parts(list(range(len(names))), self.per_call):
            try:
                found = self._read(store, [names[i] for i in part], [addresses[i] for i in part])
            except _UNUSABLE:
                found = self._read_one_by_one(store, names, addresses, part, outcome, remove)
            for i, hit in zip(part, found, strict=True):
                outcome.found[i] = hit
        outcome.nbytes = outcome.found.count(True) * self.rows.row_bytes
        return outcome

    def _read(self, store: Any, names: list[str], addresses: list[int]) -> list[bool]:
        size = self.rows.row_bytes
        if self.ranges:
            return list(store.get_ranges(names, addresses, [size] * len(names)))
        place = Placement()
        lender = self.rows.lender
        for name, address in zip(names, addresses, strict=True):
            place.add(name, lender, address, size)
        objs = store.batched_get(names, place, self._shape, self._dtype, _FMT)
        found = []
        for obj in objs:
            found.append(obj is not None)
            if obj is not None:
                obj.ref_count_down()  # frees nothing: the row is vLLM's
        return found

    def _read_one_by_one(
        self,
        store: Any,
        names: Sequence[str],
        addresses: Sequence[int],
        part: list[int],
        outcome: LoadOutcome,
        remove: Callable[[str], None],
    ) -> list[bool]:
        """After a call failed on one entry: each chunk alone, the unusable ones removed."""
        found = []
        for i in part:
            try:
                hit = self._read(store, [names[i]], [addresses[i]])[0]
            except _UNUSABLE as exc:
                outcome.unusable.append((i, exc))
                remove(names[i])
                hit = False
            found.append(hit)
        return found


def _parts(indices: list[int], per: int) -> list[list[int]]:
    return [indices[i : i + per] for i in range(0, len(indices), per)]
