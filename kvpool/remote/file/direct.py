"""A FileStore's O_DIRECT mode: page-sized headers, the probe at open, the check of a read.

With ``direct_io=True`` a :class:`~kvpool.remote.file.store.FileStore`
moves an entry's bytes with ``O_DIRECT``: a disk directory then bypasses
the page cache, as vLLM's own file tier does on a file system that takes it.
``O_DIRECT`` needs the memory address, the length and the file offset of
every transfer aligned to :data:`ALIGN` (4096), so:

* the entry keeps kvpool's header, padded to a multiple of :data:`ALIGN`
  (:func:`padded`): the payload then starts at an aligned offset.  The
  header format allows any padding (its ``header_size`` field says where
  the payload starts), so a store opened without ``direct_io`` reads these
  entries, and a direct store reads entries written without it (through
  its careful path, which reads any header size);
* a payload whose address or length is not aligned is moved buffered
  (libpinmem decides per call; the store counts them);
* :func:`probe` checks once, at open, that the directory's file system
  takes ``O_DIRECT`` (tmpfs does from Linux 6.6, ext4 and xfs do; some
  overlay and network file systems do not).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import struct

from kvpool.errors import FeatureUnavailableError
from kvpool.formats import MemoryFormat
from kvpool.native.entry import ALIGN
from kvpool.remote.file.io import CLOEXEC, current_pid
from kvpool.remote.header import (
    FLAG_PAYLOAD_CRC,
    Layout,
    fixed_fields,
    header_crc,
    is_full_entry,
)

__all__ = ["ALIGN", "is_full_padded", "padded", "probe"]

# The header fields a padding changes (see kvpool.remote.header): the
# header's size at byte 8 and its CRC at byte 12.
_SIZE_AT = 8
_CRC_AT = 12
_U32 = struct.Struct("<I")
_O_DIRECT = getattr(os, "O_DIRECT", 0)

# Padded headers by the header they pad.  The headers of full-size entries
# are cached bytes objects of their layout (which cache their hash), so the
# common put and get find theirs in one dictionary lookup.
_padded: dict[bytes, bytes] = {}
_PADDED_MAX = 256


def padded(header: bytes) -> bytes:
    """``header`` grown to a multiple of :data:`ALIGN` bytes (zero padding), CRC redone.

    The same entry as ``header`` announces, its payload starting at the
    next aligned offset.  Cached (at most 256 headers; emptied when full),
    except a header that records its payload's CRC: each is one entry's own,
    and caching it would only push out the shared ones.
    """
    out = _padded.get(header)
    if out is None:
        size = -(-len(header) // ALIGN) * ALIGN
        grown = bytearray(header) + bytes(size - len(header))
        _U32.pack_into(grown, _SIZE_AT, size)
        _U32.pack_into(grown, _CRC_AT, header_crc(grown, size))
        out = bytes(grown)
        if fixed_fields(header)[0] & FLAG_PAYLOAD_CRC:
            return out
        if len(_padded) >= _PADDED_MAX:
            _padded.clear()
        _padded[header] = out
    return out


def is_full_padded(
    header: bytearray, layout: Layout, fmt: MemoryFormat, payload: memoryview
) -> bool:
    """True when the padded ``header`` announces a full-size ``layout`` entry that ``payload`` is.

    The padded form of the plain header byte for byte (the common case),
    else :func:`~kvpool.remote.header.is_full_entry`'s check of a header
    grown to ``len(header)``.  False means "look closer" (the careful path
    says what differs), not necessarily an error.
    """
    if header == padded(layout.plain_header(fmt)):
        return True
    return is_full_entry(header, layout, fmt, payload, header_size=len(header))


def probe(directory: str) -> None:
    """Check that ``directory``'s file system takes ``O_DIRECT`` (one aligned page written).

    Raises:
        FeatureUnavailableError: it does not (or this platform has no
            ``O_DIRECT``), naming the directory and the fix.
    """
    path = os.path.join(directory, f".tmp-{current_pid()}-direct-probe")
    page = mmap.mmap(-1, ALIGN)  # page-aligned memory
    refused: OSError | None = None
    try:
        if not _O_DIRECT:
            raise OSError(errno.EINVAL, "this platform has no O_DIRECT")
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | CLOEXEC | _O_DIRECT, 0o600)
        try:
            os.write(fd, page)
        finally:
            os.close(fd)
    except OSError as exc:
        refused = exc
    finally:
        page.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
    if refused is not None:
        raise FeatureUnavailableError(
            refused.errno,
            f"direct_io=True: the file system of {directory!r} refuses O_DIRECT "
            f"({refused.strerror or refused}); open the store without direct_io (its bytes then "
            "go through the page cache), or put it on a file system that takes O_DIRECT "
            "(ext4, xfs; tmpfs from Linux 6.6)",
        )
