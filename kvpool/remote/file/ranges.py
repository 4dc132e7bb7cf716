"""Host ranges moved straight to and from a FileStore's files: the memory and entries of ranges.

An engine that owns its host memory and lays its rows out itself (vLLM's
``/dev/shm`` primary tier) knows each row by address and size.  Lending
every row as a memory object costs Python work per row (a tensor view, an
object, its checks, its header description; a fifth of a 256 KiB get on
/dev/shm), none of which a row of plain bytes needs.  So
:class:`~kvpool.remote.file.store.FileStore` also takes the ranges
themselves (``put_ranges`` / ``get_ranges``, the names and meaning of
:class:`~kvpool.remote.mooncake.store.MooncakeStore`'s), and this module
holds what they stand on (the registered memory is a
:class:`~kvpool.remote.ranges.RangeTable`, as Mooncake's: a range outside
it is refused before any I/O, and a call in flight holds the ranges it
uses until it returned):

* :func:`bytes_header` - the header of a range's entry: one ``uint8``
  group of the range's size, format ``UNDEFINED`` - the entry
  ``batched_put`` writes for a row lent whole by
  :meth:`~kvpool.pool.borrowed.BorrowedMemory.lend`, so either call
  reads what the other wrote;
* :func:`read_range` - the careful read of one range's entry (any valid
  entry of the range's size, whatever layout it records);
* :class:`RangeCalls` - ``register_memory``, ``unregister_memory``,
  ``put_ranges`` and ``get_ranges``, a mixin of the store.

A range's put and get are the store's own put and get (one libpinmem call
each, the same spares, bound, ``direct_io`` and ``io_threads`` parts),
minus the memory object.  The calls are counted as ``put_ranges`` and
``get_ranges`` (entries, bytes, misses).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvpool.checks import refuse_unknown_keywords
from kvpool.errors import CorruptEntryError, KVPoolError
from kvpool.formats import MemoryFormat
from kvpool.native import entry as entry_calls
from kvpool.native.loader import ffi
from kvpool.remote.base import raise_first
from kvpool.remote.counters import counted_calls
from kvpool.remote.file.careful import read_header
from kvpool.remote.file.direct import is_full_padded, padded
from kvpool.remote.file.parts import run_parts
from kvpool.remote.header import encode_header, is_full_entry, layout_for
from kvpool.remote.ranges import Range, RangeTable, checked_ranges

__all__ = ["RangeCalls", "bytes_header", "range_header", "read_range", "span"]

_headers: dict[tuple[int, bool], bytes] = {}
_HEADERS_MAX = 256


def bytes_header(nbytes: int, direct: bool) -> bytes:
    """The header of a range's entry of ``nbytes`` bytes (padded for ``direct_io``); cached."""
    header = _headers.get((nbytes, direct))
    if header is None:
        layout = layout_for([torch.Size([nbytes])], [torch.uint8])
        header = layout.plain_header(MemoryFormat.UNDEFINED)
        if direct:
            header = padded(header)
        if len(_headers) >= _HEADERS_MAX:
            _headers.clear()
        _headers[(nbytes, direct)] = header
    return header


def range_header(address: int, nbytes: int, checksum: bool) -> bytes:
    """The header of the range's entry (:func:`bytes_header`), with its CRC-32 with ``checksum``."""
    if not checksum:
        return bytes_header(nbytes, False)
    layout = layout_for([torch.Size([nbytes])], [torch.uint8])
    return encode_header(layout, MemoryFormat.UNDEFINED, nbytes, zlib.crc32(span(address, nbytes)))


def _is_full(header: bytearray, address: int, nbytes: int, direct: bool) -> bool:
    """True when a header read with the range's bytes announces them whole (its CRC checked).

    The check of a fast read whose header is not the plain one byte for
    byte: an entry written with ``checksum`` records its payload's CRC-32.
    """
    layout = layout_for([torch.Size([nbytes])], [torch.uint8])
    payload = span(address, nbytes)
    if direct:
        return is_full_padded(header, layout, MemoryFormat.UNDEFINED, payload)
    return is_full_entry(header, layout, MemoryFormat.UNDEFINED, payload)


def span(address: int, nbytes: int) -> Any:
    """The ``nbytes`` bytes at ``address`` as a writable buffer (for ``os.preadv``)."""
    return ffi.buffer(ffi.cast("char *", address), nbytes)


def read_range(fd: int, address: int, nbytes: int, where: str) -> None:
    """Read the open entry ``fd`` into the range: any valid entry of ``nbytes`` payload bytes.

    Raises:
        CorruptEntryError: another payload size (named with the range's),
            a damaged header, a truncated file, trailing bytes, or a
            payload CRC mismatch.
    """
    info = read_header(fd, where)
    if info.size != nbytes:
        raise CorruptEntryError(
            f"{where}: the entry holds {info.size} bytes, its range {nbytes}; the reader and "
            "the writer disagree on the row's size"
        )
    file_size = os.fstat(fd).st_size
    expected = info.header_size + info.size
    if file_size != expected:
        fault = "truncated" if file_size < expected else "trailing bytes"
        raise CorruptEntryError(
            f"{where}: {fault}: the file has {file_size} bytes, its header announces {expected}"
        )
    into = span(address, nbytes)
    got = os.preadv(fd, (into,), info.header_size)
    if got != nbytes:
        raise CorruptEntryError(f"{where}: read {got} of {nbytes} payload bytes")
    if info.payload_crc is not None and zlib.crc32(into) != info.payload_crc:
        raise CorruptEntryError(f"{where}: payload CRC mismatch")


# A mixin is no RefusesUnknownKeywords subclass: guarded and counted here (counted_calls).
@counted_calls("put_ranges", "get_ranges")
@refuse_unknown_keywords
class RangeCalls:
    """``register_memory``, ``unregister_memory``, ``put_ranges``, ``get_ranges`` of a FileStore.

    A mixin of :class:`~kvpool.remote.file.store.FileStore` (see the module
    docstring): it uses the store's registered memory (``_registered``),
    its write and read of one entry, its batch parts and its bound.
    """

    _registered: RangeTable
    _checksum: bool
    _direct: bool
    _bound: Any
    _io_threads: int
    _write: Callable[..., None]
    _evictor: Any
    _bname: Callable[[bytes], bytes]
    _bpath: Callable[[bytes], bytes]
    _where: Callable[[str, bytes | None], str]
    _os_error: Callable[..., Exception]
    _open_entry: Callable[[bytes, str], int | None]
    _guard: Callable[[Sequence[Any]], Any]
    _bounds: Callable[[Sequence[Any], int], list[tuple[int, int]]]
    _nested: Callable[[Callable[..., Any]], Callable[..., Any]]
    _get_executor: Callable[[], Any]
    _check_open: Callable[[], None]
    counters: Any

    def register_memory(self, memory: Any, nbytes: int | None = None) -> tuple[int, int]:
        """Register a long-lived host range that ``put_ranges`` and ``get_ranges`` may use.

        Args:
            memory: a contiguous CPU ``torch.Tensor`` or a writable buffer
                (a memoryview, mmap, numpy array: the store holds it until
                :meth:`unregister_memory` or ``close``, so release it there
                before the owner unmaps it), or the range's address as an
                ``int`` (then the caller keeps it mapped).
            nbytes: bytes from the start; default all of the tensor or
                buffer; required with an address.

        Returns:
            ``(address, nbytes)`` registered.

        Raises:
            ArgumentTypeError / InvalidArgumentError: as
                :meth:`~kvpool.remote.ranges.RangeTable.add` (an overlap with a
                registered range included).
            PoolClosedError: the store was closed.
        """
        self._check_open()
        return self._registered.add(memory, nbytes, f"register_memory on {self!r}")

    def unregister_memory(self, memory: Any) -> None:
        """Forget a range :meth:`register_memory` registered (by its memory or address).

        A call in flight over the range still holds its owner until it
        returns (a buffer stays exported: its ``close`` raises
        ``BufferError`` meanwhile); a range registered by its address must
        stay mapped until no call in flight uses it.

        Raises:
            InvalidArgumentError: no such range; ArgumentTypeError: a bad ``memory``.
        """
        self._registered.remove(memory, f"unregister_memory on {self!r}")

    def put_ranges(
        self, keys: Sequence[Any], addresses: Sequence[int], sizes: Sequence[int]
    ) -> None:
        """Store the bytes of each range under its key, as ``batched_put`` of lent rows would.

        Each entry is the range's bytes behind a plain-bytes header
        (:func:`bytes_header`; with ``checksum`` it records the payload's
        CRC-32); an existing entry is replaced (a key twice in one call
        ends with its last range).  With ``io_threads`` > 1 a
        large call is split into parts written at once, as ``batched_put``
        splits.  Every range is written even when another fails; then the
        first error is raised.

        Args:
            keys: one key per range.
            addresses: each range's first byte, in registered memory.
            sizes: each range's length in bytes (at least 1).

        Raises:
            InvalidArgumentError: the lists differ in length, a range
                outside registered memory, a bad key (nothing is stored);
                an entry larger than a bounded store's ``max_bytes``.
            PoolClosedError: the store was closed.
            RemoteStoreError: the file system refused (full, read-only...).
        """
        held: list[Range] = []  # until this returns: no unregister or close frees the memory
        kbs, addrs, lens = checked_ranges(
            self._registered.covers,
            lambda kb: self._where("put_ranges", kb),
            keys,
            addresses,
            sizes,
            held,
            self._check_open,
        )
        if not kbs:
            return
        with self._guard(kbs):
            bounds = self._bounds(kbs, sum(lens))
            if len(bounds) < 2:
                raise_first(self._write_ranges(kbs, addrs, lens))
                return
            parts = [(kbs[a:b], addrs[a:b], lens[a:b]) for a, b in bounds]
            outcomes = run_parts(self._get_executor(), self._nested(self._write_ranges), parts)
            raise_first(
                [r for part in outcomes for r in (part if isinstance(part, list) else [part])]
            )

    def _write_ranges(self, kbs: list[bytes], addrs: list[int], lens: list[int]) -> list[Any]:
        """Write each range's entry, back to back; each one's error or None."""
        results: list[Exception | None] = [None] * len(kbs)
        evicted: list[bytes] = []
        try:
            for i, (kb, address, nbytes) in enumerate(zip(kbs, addrs, lens, strict=True)):
                try:
                    # Padded by _write for direct_io.
                    header = range_header(address, nbytes, self._checksum)
                    self._write(self._bname(kb), header, address, kb, evicted, nbytes)
                except Exception as exc:
                    results[i] = exc
        finally:
            if evicted:
                self._evictor.report(evicted)
        return results

    def get_ranges(
        self, keys: Sequence[Any], addresses: Sequence[int], sizes: Sequence[int]
    ) -> list[bool]:
        """Read each key's entry into its range.

        Any valid entry whose payload is as long as its range is read,
        whatever layout its header records (a row written by ``put_ranges``,
        or by ``batched_put`` of lent rows): one libpinmem call each, a
        careful read in Python for anything unusual.  A bounded store
        counts the hits as uses.

        Args:
            keys: one key per range.
            addresses: where each entry's bytes go, in registered memory.
            sizes: each range's length: the entry's payload size.

        Returns:
            Per key, True when its entry was read whole into its range,
            False when there is no such entry.  A range whose entry was
            missing from the start is unchanged; one whose entry was read
            but not accepted as is (another header, a torn or damaged read)
            and then removed before the careful read found it holds
            unspecified bytes.

        Raises:
            InvalidArgumentError: as :meth:`put_ranges` (nothing is read).
            CorruptEntryError: an entry of another size than its range, or
                a damaged one (named; the other ranges' bytes are then
                unspecified).
            PoolClosedError: the store was closed.
            RemoteStoreError: the file system refused.
        """
        held: list[Range] = []  # until this returns: no unregister or close frees the memory
        kbs, addrs, lens = checked_ranges(
            self._registered.covers,
            lambda kb: self._where("get_ranges", kb),
            keys,
            addresses,
            sizes,
            held,
            self._check_open,
        )
        bounds = self._bounds(kbs, sum(lens))
        if len(bounds) < 2:
            found = self._read_ranges(kbs, addrs, lens)
        else:
            parts = [(kbs[a:b], addrs[a:b], lens[a:b]) for a, b in bounds]
            outcomes = run_parts(self._get_executor(), self._nested(self._read_ranges), parts)
            raise_first(outcomes)
            found = [hit for part in outcomes for hit in part]
        if self._bound is not None:
            self._bound.touch([self._bname(kb) for kb in kbs], found)
        return found

    def _read_ranges(self, kbs: list[bytes], addrs: list[int], lens: list[int]) -> list[bool]:
        """Read each range's entry, back to back; per range whether it was found."""
        direct = self._direct
        flags = entry_calls.DIRECT if direct else 0
        read = entry_calls.read_entry
        found: list[bool] = []
        for kb, address, nbytes in zip(kbs, addrs, lens, strict=True):
            expected = bytes_header(nbytes, direct)
            header = bytearray(len(expected))
            stamp = entry_calls.new_stamp() if direct else None
            try:
                outcome, got = read(self._bpath(kb), header, address, flags, stamp, nbytes)
            except OSError as exc:
                if isinstance(exc, KVPoolError):
                    raise
                raise self._os_error(exc, "get_ranges", kb) from exc
            if outcome == entry_calls.MISSING:
                found.append(False)
                continue
            whole = outcome == entry_calls.READ and got == len(expected) + nbytes
            if whole and (header == expected or _is_full(header, address, nbytes, direct)):
                if direct and not stamp.direct:
                    self.counters.observe("get_buffered", 0.0, nbytes=nbytes)
                found.append(True)
                continue
            found.append(self._read_range_careful(kb, address, nbytes))
        return found

    def _read_range_careful(self, kb: bytes, address: int, nbytes: int) -> bool:
        """The careful read of one range (:func:`read_range`); False when the entry is gone."""
        fd = self._open_entry(kb, "get_ranges")
        if fd is None:
            return False
        try:
            read_range(fd, address, nbytes, self._where("get_ranges", kb))
        except OSError as exc:
            if isinstance(exc, KVPoolError):
                raise
            raise self._os_error(exc, "get_ranges", kb) from exc
        finally:
            os.close(fd)
        if self._direct:
            self.counters.observe("get_buffered", 0.0, nbytes=nbytes)
        return True
