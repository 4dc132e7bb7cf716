"""Host memory a store reads and writes by address: its table of registered ranges, and call checks.

Two stores take host ranges by address (``register_memory``, then
``put_ranges`` / ``get_ranges``):
:class:`~kvpool.remote.file.store.FileStore` and a headerless
:class:`~kvpool.remote.mooncake.store.MooncakeStore` (which also registers
each range with Mooncake's transfer engine).  What they share lives here:

* :class:`RangeTable` - the registered ranges: added with their owner
  (the memory's tensor or buffer, kept alive while registered), never
  overlapping, found by address with a bisect;
* :func:`checked_ranges` - the check of a call's keys, addresses and
  sizes: every range inside one registered range, which the call holds
  (:class:`Range`) until it returns.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvpool.checks import check_int
from kvpool.errors import ArgumentTypeError, InvalidArgumentError
from kvpool.pool.borrowed import BorrowedMemory
from kvpool.remote.base import check_list, key_list

__all__ = ["Range", "RangeTable", "checked_ranges"]


class Range:
    """One registered range: ``start``, ``nbytes`` and ``owner`` (what keeps its memory alive).

    ``owner`` is the :class:`~kvpool.pool.borrowed.BorrowedMemory` over
    the tensor or buffer given (which holds a buffer exported: its owner
    cannot close or resize it meanwhile), or None for a range given by its
    address.
    """

    __slots__ = ("nbytes", "owner", "start")

    def __init__(self, start: int, nbytes: int, owner: object) -> None:
        self.start = start
        self.nbytes = nbytes
        self.owner = owner


class RangeTable:
    """The host ranges a store reads and writes by address (``register_memory``).

    A call that reads or writes a range holds the :class:`Range` that
    :meth:`covers` returned until it returns (:func:`checked_ranges`), so
    removing the range or clearing the table meanwhile cannot free or
    unmap memory under it: its owner stays alive and a buffer stays
    exported (the owner's own ``close`` raises ``BufferError`` until the
    call returned).  A range given by its address is the caller's to keep
    mapped.

    Thread safety: every method may be called from any thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # start -> its Range; starts sorted for a bisect (ranges never overlap).
        self._ranges: dict[int, Range] = {}
        self._starts: list[int] = []

    def __len__(self) -> int:
        """How many ranges are registered (read without the lock: a hint for fast paths)."""
        return len(self._starts)

    def add(
        self,
        memory: object,
        nbytes: object,
        where: str,
        taken: Iterable[tuple[int, int]] = (),
        register: Callable[[int, int], None] | None = None,
    ) -> tuple[int, int]:
        """Register a long-lived host range.

        Args:
            memory: a contiguous CPU ``torch.Tensor`` or a writable buffer
                (kept alive until the range is removed or the table
                cleared), or the range's address as an ``int`` (then the
                caller keeps the memory mapped).
            nbytes: bytes from the start; default (None) all of the tensor
                or buffer; required with an address.
            where: names the store and the call, for messages.
            taken: other ``(address, nbytes)`` spans the range must not
                overlap (a store's own registrations).
            register: called with ``(address, nbytes)`` once the range is
                checked, under the table's lock (a store's registration
                elsewhere); what it raises leaves nothing added.

        Returns:
            ``(address, nbytes)`` registered.

        Raises:
            ArgumentTypeError: ``memory`` is neither a tensor, a buffer nor an int.
            InvalidArgumentError: device memory, a non-contiguous or
                read-only or empty buffer; a bad ``nbytes``; a range that
                overlaps one registered already.

        Complexity: O(ranges) for the overlap check.
        """
        address, size, owner = _range_of(memory, nbytes, where)
        with self._lock:
            spans = [(r.start, r.nbytes) for r in self._ranges.values()]
            for start, length in [*spans, *taken]:
                if address < start + length and start < address + size:
                    raise InvalidArgumentError(
                        f"{where}: {size} bytes at {address:#x} overlap the {length} "
                        f"bytes at {start:#x} registered already; unregister that range first, "
                        "or register the memory once"
                    )
            if register is not None:
                register(address, size)
            self._ranges[address] = Range(address, size, owner)
            bisect.insort(self._starts, address)
        return address, size

    def remove(self, memory: object, where: str) -> Range:
        """Drop the range that starts where ``memory`` (a tensor, buffer or address) starts.

        Returns:
            The range dropped.

        Raises:
            ArgumentTypeError: a bad ``memory``.
            InvalidArgumentError: no registered range starts there.
        """
        address = _start_of(memory, where)
        with self._lock:
            found = self._ranges.pop(address, None)
            if found is None:
                raise InvalidArgumentError(
                    f"{where}: no range registered with register_memory starts at "
                    f"{address:#x}; pass the memory or address given to register_memory"
                )
            self._starts.remove(address)
        return found

    def covers(self, address: int, nbytes: int) -> Range | None:
        """The registered range that ``[address, address + nbytes)`` lies in, or None.

        Hold it while the bytes are read or written (see the class docstring).
        """
        with self._lock:
            i = bisect.bisect_right(self._starts, address) - 1
            if i < 0:
                return None
            found = self._ranges[self._starts[i]]
            return found if address + nbytes <= found.start + found.nbytes else None

    def clear(self) -> list[Range]:
        """Drop every range (and the references that kept their memory alive); those dropped."""
        with self._lock:
            dropped = list(self._ranges.values())
            self._ranges.clear()
            self._starts.clear()
        return dropped


def checked_ranges(
    covers: Callable[[int, int], Range | None],
    where: Callable[[bytes | None], str],
    keys: Sequence[Any],
    addresses: Sequence[int],
    sizes: Sequence[int],
    held: list[Range],
    check_open: Callable[[], None],
) -> tuple[list[bytes], list[int], list[int]]:
    """The keys of a ranges call as bytes and its ranges as ints, checked.

    Args:
        covers: the store's :meth:`RangeTable.covers`.
        where: names the call (None) or the call on one key, for messages.
        keys: one key per range.
        addresses: each range's first byte.
        sizes: each range's length in bytes.
        held: gets the registered range each range lies in; the caller
            keeps it until it returns (see :class:`RangeTable`).
        check_open: raises when the store was closed (called once the
            arguments are checked, before ``covers`` is).

    Raises:
        ArgumentTypeError / InvalidArgumentError: bad keys, addresses or
            sizes, lists of different lengths, a range outside registered
            memory.
    """
    kbs = key_list(keys)
    addrs = [check_int("an address", a, low=1) for a in check_list("addresses", addresses)]
    lens = [
        check_int("a size", n, low=1, fix="give ranges of at least one byte")
        for n in check_list("sizes", sizes)
    ]
    if not len(kbs) == len(addrs) == len(lens):
        raise InvalidArgumentError(
            f"{where(None)}: {len(kbs)} keys, {len(addrs)} addresses and {len(lens)} sizes; "
            "give one address and one size per key"
        )
    check_open()
    for kb, address, nbytes in zip(kbs, addrs, lens, strict=True):
        inside = covers(address, nbytes)
        if inside is None:
            raise InvalidArgumentError(
                f"{where(kb)}: the range of {nbytes} bytes at {address:#x} is not inside "
                "memory registered with this store; register the buffer first (register_memory)"
            )
        held.append(inside)
    return kbs, addrs, lens


def _lender(memory: object, where: str) -> BorrowedMemory:
    try:
        return BorrowedMemory(memory)
    except ArgumentTypeError as exc:
        raise ArgumentTypeError(
            f"{where}: memory must be a CPU torch.Tensor, a writable buffer or an int address, "
            f"got {type(memory).__name__} ({exc})"
        ) from None


def _start_of(memory: object, where: str) -> int:
    """Where a range given by its memory or its address starts."""
    if isinstance(memory, int) and not isinstance(memory, bool):
        return memory
    return _lender(memory, where).address


def _range_of(memory: object, nbytes: object, where: str) -> tuple[int, int, object]:
    """``(address, nbytes, what to keep alive)`` of a range to register, checked."""
    if isinstance(memory, bool):
        raise ArgumentTypeError(
            f"{where}: memory must be a CPU torch.Tensor, a writable buffer or an int address, "
            "got bool"
        )
    if isinstance(memory, int):
        if memory <= 0:
            raise InvalidArgumentError(f"{where}: an address must be positive, got {memory}")
        if nbytes is None:
            raise InvalidArgumentError(
                f"{where}: nbytes is required with an int address (the range's size)"
            )
        size = check_int("nbytes", nbytes, low=1, high=(1 << 64) - memory)
        return memory, size, None
    lender = _lender(memory, where)
    if lender.nbytes == 0:
        raise InvalidArgumentError(f"{where}: the memory is empty: nothing to register")
    size = lender.nbytes
    if nbytes is not None:
        size = check_int("nbytes", nbytes, low=1, high=size, fix="at most the memory's size")
    return lender.address, size, lender
