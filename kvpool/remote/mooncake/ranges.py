"""Host ranges moved straight to and from Mooncake, with no memory objects: put_ranges, get_ranges.

An engine that owns its host memory and lays its pages out itself (SGLang's
host pool) knows each page range by address and size.  Lending every range
as a memory object costs ~15 µs of Python per range (a tensor view, an
object, its checks, its header description); on a headerless store, where
an entry is a range's bytes alone, none of that is needed.  So a headerless
:class:`~kvpool.remote.mooncake.store.MooncakeStore` also takes the ranges
themselves:

* :meth:`RangeCalls.put_ranges` - one ``batch_put_from`` of the ranges
  (``replace=False``: an existing key keeps its entry, as ``batched_put``
  does, and a key twice in one batch its first range); with ``replace``
  the existing keys are replaced as ``batched_put`` replaces them
  (``upsert_parts``, the last range of a repeated key winning);
* :meth:`RangeCalls.get_ranges` - one ``batch_get_into`` into the ranges;
  True for each range read whole, False for a missing key.

Every range must lie in memory registered with the store
(:meth:`~kvpool.remote.mooncake.store.MooncakeStore.register_memory`):
Mooncake's transfer engine reads and writes only registered memory, and a
range outside it is refused before any call.  A call holds the registered
ranges it uses until it returns (a range registered by its address is the
caller's to keep mapped), and the caller does not reuse a range meanwhile.  The calls are
counted as ``put_ranges`` and ``get_ranges`` (entries, bytes, misses).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import kvpool.remote.mooncake.codes as codes
from kvpool.checks import refuse_unknown_keywords
from kvpool.errors import CorruptEntryError, InvalidArgumentError
from kvpool.remote.counters import counted_calls
from kvpool.remote.mooncake.ops import Entry, rounds, write_entries
from kvpool.remote.ranges import Range, checked_ranges

__all__ = ["RangeCalls"]

_NO_HEADER = memoryview(b"")


# A mixin is no RefusesUnknownKeywords subclass: guarded here, where its methods are
# defined, and counted around the guard (a refused keyword is an error of the call).
@counted_calls("put_ranges", "get_ranges")
@refuse_unknown_keywords
class RangeCalls:
    """``put_ranges`` and ``get_ranges`` of a headerless MooncakeStore (see the module docstring).

    A mixin of :class:`~kvpool.remote.mooncake.store.MooncakeStore`: it uses
    the store's client, registered regions, settings, ``_mkey`` (the
    Mooncake key), ``_where`` (how messages name a call) and ``_check_open``.
    """

    client: Any
    headerless: bool
    replace: bool
    timeout: float
    _writing: tuple[Any, ...]
    _regions: Any

    def _ranges(
        self,
        action: str,
        keys: Sequence[Any],
        addresses: Sequence[int],
        sizes: Sequence[int],
        held: list[Range],
    ) -> tuple[list[bytes], list[int], list[int]]:
        """The keys as bytes and the ranges as ints, checked (see :meth:`put_ranges`).

        The registered ranges they lie in are added to ``held``, which the
        caller keeps until it returns.
        """
        if not self.headerless:
            raise InvalidArgumentError(
                f"{self._where(action, None)}: only a headerless store takes ranges (an entry "
                "with kvpool's header needs an object's layout); open it with headerless=True, "
                "or put memory objects"
            )
        return checked_ranges(
            self._regions.covers,
            lambda kb: self._where(action, kb),
            keys,
            addresses,
            sizes,
            held,
            self._check_open,
        )

    def put_ranges(
        self, keys: Sequence[Any], addresses: Sequence[int], sizes: Sequence[int]
    ) -> None:
        """Store the bytes of each range under its key, in one Mooncake call.

        Args:
            keys: one key per range.
            addresses: each range's first byte, in registered memory.
            sizes: each range's length in bytes (at least 1).

        Raises:
            InvalidArgumentError: not a headerless store, the lists differ
                in length, a range outside registered memory, a bad key
                (nothing is stored).
            PoolClosedError: the store was closed.
            StoreConnectionError / StoreTimeoutError / RemoteStoreError:
                as ``batched_put`` (which entries were written is then
                unspecified).

        Complexity: one ``batch_put_from`` (one round per repeated key).
        """
        held: list[Range] = []  # until this returns: no unregister or close frees the memory
        kbs, addrs, lens = self._ranges("put_ranges", keys, addresses, sizes, held)
        if not kbs:
            return
        mkeys = [self._mkey(kb) for kb in kbs]
        if self.replace:  # existing keys are replaced atomically, through byte views
            entries = [
                Entry(self._where("put_ranges", kb), mkey, _NO_HEADER, 0, _view(a, n), a)
                for kb, mkey, a, n in zip(kbs, mkeys, addrs, lens, strict=True)
            ]
            write_entries(self.client, entries, *self._writing)
            return
        config = self._writing[0]
        errors = []
        for part in rounds(mkeys, range(len(mkeys))):
            put = self.client.batch_put_from(
                [mkeys[i] for i in part], [addrs[i] for i in part], [lens[i] for i in part], config
            )
            for i, rc in zip(part, put, strict=True):
                if rc not in (0, codes.ALREADY_EXISTS):  # an existing key keeps its entry
                    errors.append(codes.error_for(rc, self._where("put_ranges", kbs[i])))
        if errors:
            first = errors[0]
            if len(errors) > 1:
                first.add_note(f"{len(errors) - 1} more entr(ies) of the batch failed")
            raise first

    def get_ranges(
        self, keys: Sequence[Any], addresses: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        """Read each key's entry into its range, in one Mooncake call.

        Args:
            keys: one key per range.
            addresses: where each entry's bytes go, in registered memory.
            sizes: each range's length: the entry's size.

        Returns:
            Per key, True when its entry was read whole into its range,
            False when there is no such entry (the range's bytes are then
            unspecified).

        Raises:
            InvalidArgumentError: as :meth:`put_ranges` (nothing is read).
            CorruptEntryError: an entry of another size than its range
                (named; the other ranges' bytes are then unspecified).
            StoreTimeoutError: an entry stayed busy (being written) for
                ``timeout`` seconds.
            PoolClosedError / StoreConnectionError / RemoteStoreError: as
                ``batched_get``.

        Complexity: one ``batch_get_into`` (one round per repeated key,
        one more per retry of a busy entry).
        """
        held: list[Range] = []  # until this returns: no unregister or close frees the memory
        kbs, addrs, lens = self._ranges("get_ranges", keys, addresses, sizes, held)
        found = [False] * len(kbs)
        mkeys = [self._mkey(kb) for kb in kbs]
        backoff = codes.Backoff(self.timeout)
        pending = list(range(len(kbs)))
        while pending:
            busy: list[int] = []
            for part in rounds(mkeys, pending):
                got = self.client.batch_get_into(
                    [mkeys[i] for i in part], [addrs[i] for i in part], [lens[i] for i in part]
                )
                for i, rc in zip(part, got, strict=True):
                    if rc == lens[i]:
                        found[i] = True
                    elif rc in codes.RETRYABLE:
                        busy.append(i)
                    elif rc == codes.NOT_FOUND:
                        continue
                    elif rc >= 0 or rc == codes.BUFFER_TOO_SMALL:
                        stored = rc if rc >= 0 else self.client.get_size(mkeys[i])
                        raise CorruptEntryError(
                            f"{self._where('get_ranges', kbs[i])}: the entry holds {stored} "
                            f"bytes, its range {lens[i]}; a headerless entry carries no layout, "
                            "so the reader and the writer disagree on the page's size"
                        )
                    else:
                        raise codes.error_for(rc, self._where("get_ranges", kbs[i]))
            if busy and not backoff.wait():
                raise codes.error_for(codes.NOT_READY, self._where("get_ranges", kbs[busy[0]]))
            pending = busy
        return found


def _view(address: int, nbytes: int) -> memoryview:
    """The ``nbytes`` bytes at ``address`` as a memoryview (for Mooncake's upsert)."""
    return memoryview((ctypes.c_ubyte * nbytes).from_address(address)).cast("B")
