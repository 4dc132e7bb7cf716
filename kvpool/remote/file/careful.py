"""FileStore's careful read: an entry read step by step in Python, every fault named.

The common get is one libpinmem call (:mod:`kvpool.native.entry`).  When
anything is unusual - the allocator refused, something other than an entry
is at the name, the header or the size differs - FileStore opens the entry
again (:func:`~kvpool.remote.file.io.open_entry`) and reads it here, which
says what is wrong or accepts an entry shorter than its layout (a narrowed
object):

* :func:`read_into` - with the layout given: one ``preadv`` of header and
  bytes, then :func:`diagnose` when they do not match;
* :func:`read_stored` - without it: the header first, then the stored layout;
* :func:`read_header` - the header alone (also ``head``'s).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable

from kvpool.errors import CorruptEntryError
from kvpool.formats import MemoryFormat
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.base import check_stored
from kvpool.remote.header import (
    EntryInfo,
    Layout,
    decode_header,
    is_full_entry,
    layout_for,
    peek_header_size,
)
from kvpool.remote.objects import destination, discard

__all__ = ["diagnose", "read_entry", "read_header"]

_HEAD_READ = 4096


def read_header(fd: int, where: str) -> EntryInfo:
    """The header of the open entry ``fd`` (``where`` names the call in errors).

    Raises:
        CorruptEntryError: not a kvpool header, or a damaged one.
    """
    head = os.pread(fd, _HEAD_READ, 0)
    header_size = peek_header_size(head, where)
    if header_size > len(head) and len(head) == _HEAD_READ:
        head += os.pread(fd, header_size - len(head), len(head))
    return decode_header(head, where)


def _finish(obj: MemoryObj, view: memoryview, info: EntryInfo, where: str) -> None:
    """Check the payload CRC and narrow a partial entry; raise on a mismatch."""
    if info.payload_crc is not None and zlib.crc32(view[: info.size]) != info.payload_crc:
        raise CorruptEntryError(f"{where}: payload CRC mismatch")
    if info.size != info.layout_size:
        obj.set_used_size(info.size)


def diagnose(
    fd: int, n: int, layout: Layout, fmt: MemoryFormat, where: str, payload: memoryview
) -> EntryInfo:
    """Explain why a read of ``n`` bytes did not match ``layout``, or accept the entry.

    A valid entry is accepted when its payload is shorter than its layout
    (a narrowed object: ``set_used_size``), or when its header has another
    padding than ``layout``'s (an entry of a ``direct_io`` store, read by
    one without, or the other way round): its payload is then read again
    into ``payload`` from where its header says it starts.

    Returns:
        The header of the valid entry, its payload in ``payload``.

    Raises:
        CorruptEntryError / InvalidArgumentError: what is wrong.
    """
    file_size = os.fstat(fd).st_size
    info = read_header(fd, where)
    check_stored(info, layout, fmt, where)
    expected = info.header_size + info.size
    if file_size < expected:
        raise CorruptEntryError(
            f"{where}: truncated: the file has {file_size} bytes, its header announces {expected}"
        )
    if file_size > expected:
        raise CorruptEntryError(f"{where}: {file_size - expected} trailing bytes after the payload")
    if info.header_size != layout.header_size:
        n = info.header_size + os.preadv(fd, (payload[: info.size],), info.header_size)
    if n != expected:
        raise CorruptEntryError(f"{where}: read {n} of {expected} bytes")
    return info


def read_entry(
    fd: int,
    allocator: MemoryAllocatorInterface,
    layout: Layout | None,
    fmt: MemoryFormat | None,
    where: Callable[[], str],
) -> MemoryObj:
    """Read the open entry ``fd`` into a new object from ``allocator`` (its key's allocator).

    With ``layout`` and ``fmt``: one ``preadv`` of header, bytes and one
    spare byte, then :func:`diagnose` if they do not match.  Without: the
    header first, checked against what was asked, then the stored layout.
    The object is freed on any error.

    Raises:
        CorruptEntryError, InvalidArgumentError, OutOfMemoryError, OSError.
    """
    obj = view = None
    try:
        if layout is not None and fmt is not None:
            obj, view = destination(allocator, layout, fmt, where)
            header = bytearray(layout.header_size)
            n = os.preadv(fd, (header, view, bytearray(1)), 0)
            if n == layout.header_size + layout.nbytes and is_full_entry(header, layout, fmt, view):
                return obj
            # Something differs: find out what (or accept a narrowed or padded entry).
            info = diagnose(fd, n, layout, fmt, where(), view)
            _finish(obj, view, info, where())
            return obj
        info = read_header(fd, where())
        check_stored(info, layout, fmt, where())
        if layout is None:
            layout = layout_for(info.shapes, info.dtypes)
        obj, view = destination(allocator, layout, fmt or info.fmt, where())
        n = os.preadv(fd, (view[: info.size], bytearray(1)), info.header_size)
        if n != info.size:
            fault = (
                f"truncated: {n} of {info.size} payload bytes"
                if n < info.size
                else "trailing bytes after the payload"
            )
            raise CorruptEntryError(f"{where()}: {fault}")
        _finish(obj, view, info, where())
        return obj
    except BaseException:
        discard(obj, view)
        raise
