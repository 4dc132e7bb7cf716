"""libpinmem's entry-file calls: one FileStore put or get in one C call.

A put of a 512 KiB chunk to tmpfs is about 130 us of kernel copy; done
from Python it also paid 15-18 us of interpreter work (measured against
the same calls made bare from Python) around its seven system calls
(open, fstat, flock, pwritev, ftruncate, renameat2, close).
:func:`write_entry` and :func:`read_entry` make those calls in C, with the
GIL released: each ran at 0.96-0.97x bare ``pwritev``/``preadv`` on the
development VM, the difference being the system calls that keep an entry
atomic and safe against hostile files (see ``pinmem_entry_write`` and
``pinmem_entry_read`` in pinmem.h).

These are internal fast paths for :mod:`kvpool.remote.file.store`, which
checks every argument before it calls them; they check only what C needs
(types come from the store).  A failed system call raises a plain
:class:`OSError` with the OS's errno, as the ``os`` functions they replace
did, so the store reports it the same way.
"""

from __future__ import annotations

import os
from typing import Any

from kvpool.native.loader import check, ffi, lib

__all__ = [
    "EXCHANGE",
    "MISSING",
    "READ",
    "RENAMED",
    "RENAMED_NO_EXCHANGE",
    "SPARE",
    "SPARE_UNUSABLE",
    "SWAPPED",
    "SYNC",
    "read_entry",
    "write_entry",
]

#: ``write_entry`` flags (``PINMEM_ENTRY_*``).
SPARE: int = lib.PINMEM_ENTRY_SPARE
EXCHANGE: int = lib.PINMEM_ENTRY_EXCHANGE
SYNC: int = lib.PINMEM_ENTRY_SYNC
#: ``write_entry`` outcomes.
RENAMED: int = lib.PINMEM_ENTRY_RENAMED
SWAPPED: int = lib.PINMEM_ENTRY_SWAPPED
RENAMED_NO_EXCHANGE: int = lib.PINMEM_ENTRY_RENAMED_NO_EXCHANGE
SPARE_UNUSABLE: int = lib.PINMEM_ENTRY_SPARE_UNUSABLE
#: ``read_entry`` outcomes (anything else: refused, see :func:`read_entry`).
READ: int = lib.PINMEM_ENTRY_READ
MISSING: int = lib.PINMEM_ENTRY_MISSING

_OK = lib.PINMEM_OK
_ESYS = lib.PINMEM_ESYS
_write = lib.pinmem_entry_write
_read = lib.pinmem_entry_read
_new = ffi.new
_from_buffer = ffi.from_buffer


def _raise(status: int, what: str) -> None:
    """A plain OSError for a failed system call (as ``os`` raises), else the typed error."""
    err = lib.pinmem_last_errno()
    if status == _ESYS and err:
        raise OSError(err, os.strerror(err))
    check(status, what)


def write_entry(temp: bytes, path: bytes, header: bytes, data: Any, flags: int) -> int:
    """Write ``header`` + ``data`` to ``temp`` and give it the name ``path`` atomically.

    Args:
        temp: the temporary file (created) or, with :data:`SPARE`, a spare
            to overwrite (see ``pinmem_entry_write``).
        path: the entry's file.
        header: the entry's header.
        data: the payload, any C-contiguous buffer (a memoryview of a
            pool object's bytes: the kernel copies from pool memory).
        flags: :data:`SPARE`, :data:`EXCHANGE`, :data:`SYNC` or'ed.

    Returns:
        The outcome: :data:`RENAMED`, :data:`SWAPPED` (``temp`` now names
        the replaced file), :data:`RENAMED_NO_EXCHANGE` or
        :data:`SPARE_UNUSABLE` (nothing written).  ``temp`` exists
        afterwards only after :data:`SWAPPED`.

    Raises:
        OSError: a create, write, truncate, fsync or rename failed (errno).
        InvalidArgumentError: sizes beyond a file's.
    """
    out = _new("int *")
    buf = _from_buffer(data)
    status = _write(temp, path, header, len(header), buf, len(buf), flags, out)
    if status != _OK:
        _raise(status, "write an entry")
    return int(out[0])


def read_entry(path: bytes, header: bytearray, data: Any) -> tuple[int, int]:
    """Read the entry at ``path`` into ``header`` then ``data`` (one more byte: trailing data).

    Args:
        path: the entry's file.
        header: receives the first ``len(header)`` bytes.
        data: a writable buffer that receives the next ``len(data)`` bytes.

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
    dbuf = _from_buffer(data, require_writable=True)
    status = _read(path, hbuf, len(hbuf), dbuf, len(dbuf), outcome, nread)
    if status != _OK:
        _raise(status, "read an entry")
    return int(outcome[0]), int(nread[0])
