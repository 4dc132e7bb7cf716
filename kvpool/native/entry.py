"""libpinmem's entry-file calls: one FileStore put, get or eviction in one C call.

A put of a 512 KiB chunk to tmpfs is about 130 us of kernel copy; done
from Python it also paid 15-18 us of interpreter work (measured against
the same calls made bare from Python) around its seven system calls
(open, fstat, flock, pwritev, ftruncate, renameat2, close).
:func:`write_entry` and :func:`read_entry` make those calls in C, with the
GIL released: each ran at 0.96-0.97x bare ``pwritev``/``preadv`` on the
development VM, the difference being the system calls that keep an entry
atomic and safe against hostile files (see ``pinmem_entry_write`` and
``pinmem_entry_read`` in pinmem.h).  :func:`evict_entry` removes an entry
only if it is still the file a store recorded (a bounded FileStore's
eviction), in one call too.

Each call can say which file it wrote or read (a :class:`Stamp`: inode,
mtime, size, and whether the bytes moved with ``O_DIRECT``): pass a stamp
from :func:`new_stamp` and read it after the call.

These are internal fast paths for :mod:`kvpool.remote.file.store`, which
checks every argument before it calls them; they check only what C needs
(types come from the store).  A failed system call raises a plain
:class:`OSError` with the OS's errno, as the ``os`` functions they replace
did, so the store reports it the same way.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from kvpool.native.loader import check, ffi, lib

__all__ = [
    "ALIGN",
    "CHANGED",
    "DIRECT",
    "EVICTED",
    "EXCHANGE",
    "GONE",
    "KEEP",
    "MISSING",
    "READ",
    "RENAMED",
    "RENAMED_NO_EXCHANGE",
    "SPARE",
    "SPARE_UNUSABLE",
    "SWAPPED",
    "SYNC",
    "Stamp",
    "evict_entry",
    "new_stamp",
    "read_entry",
    "stamp_of",
    "write_entry",
]

#: ``write_entry`` flags (``PINMEM_ENTRY_*``); :data:`DIRECT` is ``read_entry``'s too.
SPARE: int = lib.PINMEM_ENTRY_SPARE
EXCHANGE: int = lib.PINMEM_ENTRY_EXCHANGE
SYNC: int = lib.PINMEM_ENTRY_SYNC
DIRECT: int = lib.PINMEM_ENTRY_DIRECT
#: ``evict_entry`` flag: keep the evicted file at its temporary name (a spare).
KEEP: int = lib.PINMEM_ENTRY_KEEP
#: What :data:`DIRECT` needs aligned: the data's address and length, the header's length.
ALIGN: int = lib.PINMEM_ENTRY_ALIGN
#: ``write_entry`` outcomes.
RENAMED: int = lib.PINMEM_ENTRY_RENAMED
SWAPPED: int = lib.PINMEM_ENTRY_SWAPPED
RENAMED_NO_EXCHANGE: int = lib.PINMEM_ENTRY_RENAMED_NO_EXCHANGE
SPARE_UNUSABLE: int = lib.PINMEM_ENTRY_SPARE_UNUSABLE
#: ``read_entry`` outcomes (anything else: refused, see :func:`read_entry`).
READ: int = lib.PINMEM_ENTRY_READ
MISSING: int = lib.PINMEM_ENTRY_MISSING
#: ``evict_entry`` outcomes.
EVICTED: int = lib.PINMEM_ENTRY_EVICTED
GONE: int = lib.PINMEM_ENTRY_GONE
CHANGED: int = lib.PINMEM_ENTRY_CHANGED

_OK = lib.PINMEM_OK
_ESYS = lib.PINMEM_ESYS
_write = lib.pinmem_entry_write
_read = lib.pinmem_entry_read
_evict = lib.pinmem_entry_evict
_new = ffi.new
_from_buffer = ffi.from_buffer
_cast = ffi.cast
_NULL = ffi.NULL


class Stamp(NamedTuple):
    """Which file an entry is: what a bounded store records to evict only that file.

    Attributes:
        inode: its inode number.
        mtime_ns: its modification time, in nanoseconds.
        size: its size in bytes.
    """

    inode: int
    mtime_ns: int
    size: int


def new_stamp() -> Any:
    """A C ``pinmem_entry_stamp`` for one call to fill (see :func:`stamp_of`)."""
    return _new("pinmem_entry_stamp *")


def stamp_of(c_stamp: Any) -> Stamp:
    """The :class:`Stamp` a call left in ``c_stamp`` (from :func:`new_stamp`)."""
    return Stamp(int(c_stamp.inode), int(c_stamp.mtime_ns), int(c_stamp.size))


def _raise(status: int, what: str) -> None:
    """A plain OSError for a failed system call (as ``os`` raises), else the typed error."""
    err = lib.pinmem_last_errno()
    if status == _ESYS and err:
        raise OSError(err, os.strerror(err))
    check(status, what)


def write_entry(
    temp: bytes,
    path: bytes,
    header: bytes,
    data: Any,
    flags: int,
    stamp: Any = None,
    nbytes: int | None = None,
) -> int:
    """Write ``header`` + ``data`` to ``temp`` and give it the name ``path`` atomically.

    Args:
        temp: the temporary file (created) or, with :data:`SPARE`, a spare
            to overwrite (see ``pinmem_entry_write``).
        path: the entry's file.
        header: the entry's header.
        data: the payload, any C-contiguous buffer (a memoryview of a
            pool object's bytes: the kernel copies from pool memory); with
            ``nbytes``, the payload's address (an int the caller vouches for).
        flags: :data:`SPARE`, :data:`EXCHANGE`, :data:`SYNC`,
            :data:`DIRECT` or'ed.
        stamp: None, or a :func:`new_stamp` that receives the written
            file's identity and whether ``O_DIRECT`` was used (its ``direct``).
        nbytes: the payload's length when ``data`` is an address.

    Returns:
        The outcome: :data:`RENAMED`, :data:`SWAPPED` (``temp`` now names
        the replaced file), :data:`RENAMED_NO_EXCHANGE` or
        :data:`SPARE_UNUSABLE` (nothing written).  ``temp`` exists
        afterwards only after :data:`SWAPPED`.

    Raises:
        OSError: a create, write, truncate, fsync, stat or rename failed (errno).
        InvalidArgumentError: sizes beyond a file's.
    """
    out = _new("int *")
    if nbytes is None:
        buf = _from_buffer(data)
        nbytes = len(buf)
    else:
        buf = _cast("char *", data)
    into = _NULL if stamp is None else stamp
    status = _write(temp, path, header, len(header), buf, nbytes, flags, out, into)
    if status != _OK:
        _raise(status, "write an entry")
    return int(out[0])


def read_entry(
    path: bytes,
    header: bytearray,
    data: Any,
    flags: int = 0,
    stamp: Any = None,
    nbytes: int | None = None,
) -> tuple[int, int]:
    """Read the entry at ``path`` into ``header`` then ``data`` (one more byte: trailing data).

    Args:
        path: the entry's file.
        header: receives the first ``len(header)`` bytes.
        data: a writable buffer that receives the next ``len(data)`` bytes;
            with ``nbytes``, the address of ``nbytes`` writable bytes (an
            int the caller vouches for).
        flags: 0, or :data:`DIRECT` (``O_DIRECT`` when aligned and the file
            is exactly as long as asked; no trailing byte is read then).
        stamp: None, or a :func:`new_stamp` for the identity of the file read.
        nbytes: the destination's length when ``data`` is an address.

    Returns:
        ``(outcome, nread)``: :data:`READ` with the bytes read (header +
        data + 1 means trailing bytes, fewer a short file), :data:`MISSING`,
        or any other value: something other than an entry is at ``path``
        (nothing read; the store's own checks say what).

    Raises:
        OSError: the OS refused an open, lock, stat or read (errno).
    """
    outcome = _new("int *")
    nread = _new("uint64_t *")
    hbuf = _from_buffer(header, require_writable=True)
    if nbytes is None:
        dbuf = _from_buffer(data, require_writable=True)
        nbytes = len(dbuf)
    else:
        dbuf = _cast("char *", data)
    into = _NULL if stamp is None else stamp
    status = _read(path, hbuf, len(hbuf), dbuf, nbytes, flags, outcome, nread, into)
    if status != _OK:
        _raise(status, "read an entry")
    return int(outcome[0]), int(nread[0])


def evict_entry(path: bytes, temp: bytes, expected: Stamp, keep: bool) -> int:
    """Remove the entry at ``path`` if it is still the file ``expected`` describes.

    Args:
        path: the entry's file.
        temp: a new temporary name in the same directory (the file goes
            there first, to be checked).
        expected: the file's stamp, as a write or a stat recorded it.
        keep: leave the evicted file at ``temp`` (a spare) instead of unlinking it.

    Returns:
        :data:`EVICTED` (gone from ``path``; at ``temp`` with ``keep``),
        :data:`GONE` (nothing was at ``path``) or :data:`CHANGED` (another
        file, written since, is left at ``path``).

    Raises:
        OSError: a rename or unlink failed (errno).
    """
    want = _new("pinmem_entry_stamp *")
    want.inode, want.mtime_ns, want.size = expected
    outcome = _new("int *")
    status = _evict(path, temp, want, KEEP if keep else 0, outcome)
    if status != _OK:
        _raise(status, "evict an entry")
    return int(outcome[0])
