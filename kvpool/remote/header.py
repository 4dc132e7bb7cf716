"""The header that precedes every stored object (file or Redis value).

Layout (little-endian; version 1)::

    offset size  field
         0    4  magic          b"KVPS"
         4    2  version        1
         6    2  flags          bit 0: ``payload_crc`` is valid;
                                bit 1: a key tag follows the group records
         8    4  header_size    bytes of the header, padding included; the
                                payload starts here (a multiple of 64)
        12    4  header_crc     CRC-32 of the header with this field skipped
        16    8  payload_size   bytes of payload that follow the header
        24    4  payload_crc    CRC-32 of the payload (0 without flag bit 0)
        28    2  fmt            MemoryFormat value
        30    2  groups         number of (shape, dtype) groups, >= 1
        32    .  per group:     u8 ndim, u8 len(dtype name), the dtype name
                                in ASCII (``"float16"``), ndim x i64 dims
         .    4  key tag        only with flag bit 1: CRC-32 of the key
                                the entry was written under
         .    .  zero padding up to header_size

``payload_size`` may be smaller than the layout's byte size: an object
narrowed with ``set_used_size`` stores only its used bytes, and ``get``
narrows the new object the same way.

The key tag lets a reader prove that the entry it received is the one it
asked for: RedisStore writes it, and a reply that carries another key's
tag (a duplicated or reordered reply frame) is refused instead of being
read into the wrong object.  Readers that do not know bit 1 ignore it.

The header CRC makes any damaged header a :class:`CorruptEntryError`
rather than a misleading layout mismatch; the payload CRC is optional (it
costs a pass over the bytes; see ``kvpool.cli.bench.store_rounds``).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvpool.errors import CorruptEntryError, InvalidArgumentError
from kvpool.formats import MAX_LAYOUT_BYTES, MemoryFormat, layout_bytes

__all__ = [
    "FLAG_KEY_TAG",
    "FLAG_PAYLOAD_CRC",
    "HEADER_ALIGN",
    "MAGIC",
    "MAX_HEADER_SIZE",
    "VERSION",
    "EntryInfo",
    "Layout",
    "decode_header",
    "encode_header",
    "is_full_entry",
    "layout_for",
]

MAGIC = b"KVPS"
VERSION = 1
#: Flag bit: the header's ``payload_crc`` holds the CRC-32 of the payload.
FLAG_PAYLOAD_CRC = 1
#: Flag bit: a 4-byte key tag (CRC-32 of the key) follows the group records.
FLAG_KEY_TAG = 2
#: The header is padded to a multiple of this, so the payload is aligned.
HEADER_ALIGN = 64
#: Largest header accepted when reading (a bound against garbage lengths).
MAX_HEADER_SIZE = 1 << 20

_FIXED = struct.Struct("<4sHHIIQIHH")
FIXED_SIZE = _FIXED.size  # 32
_PREFIX = struct.Struct("<4sHHII")
_GROUP = struct.Struct("<BB")
_TAG = struct.Struct("<I")
_MAX_GROUPS = 0xFFFF
_MAX_NDIM = 0xFF


@dataclass(frozen=True)
class EntryInfo:
    """What the header of a stored entry says.

    Attributes:
        shapes: shape of every group.
        dtypes: dtype of every group.
        fmt: the :class:`MemoryFormat` the object had.
        size: payload bytes (the object's ``get_size()`` when stored).
        layout_size: bytes of the full layout (``>= size``).
        header_size: header bytes before the payload.
        payload_crc: CRC-32 of the payload, or None when not recorded.
        key_tag: CRC-32 of the key the entry was written under, or None
            when not recorded (see :func:`key_tag`).
    """

    shapes: list[torch.Size]
    dtypes: list[torch.dtype]
    fmt: MemoryFormat
    size: int
    layout_size: int
    header_size: int
    payload_crc: int | None
    key_tag: int | None = None


def key_tag(key: bytes) -> int:
    """The tag an entry written under ``key`` records (CRC-32 of the key bytes)."""
    return zlib.crc32(key)


class Layout:
    """The encoded group records of one (shapes, dtypes) layout.

    Built by :func:`layout_for` (cached); treat as immutable.

    Attributes:
        shapes: the shapes (a tuple of ``torch.Size``).
        dtypes: the dtypes.
        record: the encoded group records (what follows the fixed part).
        nbytes: bytes of the layout.
        header_size: size of a header carrying this layout.
        tagged_header_size: size of such a header with a key tag.
        alloc_shapes: ``shapes`` as an allocator takes them (a bare
            ``torch.Size`` for one group: the allocators' fast path).
        alloc_dtypes: ``dtypes`` likewise.
    """

    __slots__ = (
        "_plain",
        "_tagged",
        "alloc_dtypes",
        "alloc_shapes",
        "dtypes",
        "header_size",
        "nbytes",
        "record",
        "shapes",
        "tagged_header_size",
    )

    def __init__(
        self,
        shapes: tuple[torch.Size, ...],
        dtypes: tuple[torch.dtype, ...],
        record: bytes,
        nbytes: int,
        header_size: int,
    ) -> None:
        self.shapes = shapes
        self.dtypes = dtypes
        self.record = record
        self.nbytes = nbytes
        self.header_size = header_size
        used = FIXED_SIZE + len(record) + _TAG.size
        self.tagged_header_size = -(-used // HEADER_ALIGN) * HEADER_ALIGN
        single = len(shapes) == 1
        self.alloc_shapes: torch.Size | list[torch.Size] = shapes[0] if single else list(shapes)
        self.alloc_dtypes: torch.dtype | list[torch.dtype] = dtypes[0] if single else list(dtypes)
        self._plain: dict[MemoryFormat, bytes] = {}
        self._tagged: dict[MemoryFormat, bytes] = {}

    def plain_header(self, fmt: MemoryFormat) -> bytes:
        """The header of a full-size entry of this layout without payload CRC (cached).

        A ``get`` whose header equals it byte for byte needs no other check.
        """
        header = self._plain.get(fmt)
        if header is None:
            header = self._plain[fmt] = _build_header(self, fmt, self.nbytes, None)
        return header

    def tagged_header(self, fmt: MemoryFormat, tag: int) -> bytes:
        """The header of a full-size entry without payload CRC, with key tag ``tag``.

        Built from a cached template: only the tag and the header CRC are
        computed per call.
        """
        template = self._tagged.get(fmt)
        if template is None:
            template = self._tagged[fmt] = _build_header(self, fmt, self.nbytes, None, 0)
        return _retag(template, len(self.record), tag)

    def __repr__(self) -> str:
        return f"<Layout {list(self.shapes)} {list(self.dtypes)} {self.nbytes} bytes>"


def _dtype_name(dtype: torch.dtype) -> bytes:
    return str(dtype).removeprefix("torch.").encode("ascii")


def _encode_layout(shapes: Sequence[torch.Size], dtypes: Sequence[torch.dtype]) -> Layout:
    if len(shapes) != len(dtypes) or not shapes:
        raise InvalidArgumentError(
            f"a stored layout needs one dtype per shape and at least one group, got "
            f"{len(shapes)} shapes and {len(dtypes)} dtypes"
        )
    if len(shapes) > _MAX_GROUPS:
        raise InvalidArgumentError(f"{len(shapes)} groups; a header holds at most {_MAX_GROUPS}")
    parts = []
    nbytes = 0
    for shape, dtype in zip(shapes, dtypes, strict=True):
        if not isinstance(dtype, torch.dtype):
            raise InvalidArgumentError(f"expected a torch.dtype, got {dtype!r}")
        if len(shape) > _MAX_NDIM:
            raise InvalidArgumentError(f"shape {tuple(shape)} has more than {_MAX_NDIM} dims")
        name = _dtype_name(dtype)
        parts.append(_GROUP.pack(len(shape), len(name)))
        parts.append(name)
        parts.append(struct.pack(f"<{len(shape)}q", *shape))
        numel = 1
        for d in shape:
            numel *= d
        nbytes += numel * dtype.itemsize
    record = b"".join(parts)
    used = FIXED_SIZE + len(record)
    header_size = -(-used // HEADER_ALIGN) * HEADER_ALIGN
    return Layout(tuple(shapes), tuple(dtypes), record, nbytes, header_size)


_cache: dict[tuple[tuple[torch.Size, ...], tuple[torch.dtype, ...]], Layout] = {}
_CACHE_MAX = 256


def layout_for(shapes: Sequence[torch.Size], dtypes: Sequence[torch.dtype]) -> Layout:
    """The encoded :class:`Layout` of ``shapes``/``dtypes`` (cached).

    The cache holds at most 256 layouts (it is emptied when full), so a
    stream of distinct layouts costs no memory growth.

    Raises:
        InvalidArgumentError: lengths differ, no groups, or a bad entry.
    """
    key = (tuple(shapes), tuple(dtypes))
    layout = _cache.get(key)
    if layout is None:
        layout = _encode_layout(*key)
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[key] = layout
    return layout


_requests: dict[tuple[Any, Any], Layout] = {}


def requested(shapes: Any, dtypes: Any) -> Layout | None:
    """The cached :class:`Layout` of a ``get``'s raw ``shapes``/``dtypes`` arguments.

    Returns None when this exact request was not seen before (or is not
    hashable); the caller then normalizes it and calls :func:`remember`.
    """
    try:
        key = (
            shapes if shapes.__class__ is not list else tuple(shapes),
            dtypes if dtypes.__class__ is not list else tuple(dtypes),
        )
        return _requests.get(key)
    except TypeError:
        return None


def remember(shapes: Any, dtypes: Any, layout: Layout) -> None:
    """Cache ``layout`` for the raw request (bounded like :func:`layout_for`)."""
    try:
        key = (
            shapes if shapes.__class__ is not list else tuple(shapes),
            dtypes if dtypes.__class__ is not list else tuple(dtypes),
        )
        if len(_requests) >= _CACHE_MAX:
            _requests.clear()
        _requests[key] = layout
    except TypeError:
        pass


def encode_header(
    layout: Layout,
    fmt: MemoryFormat,
    size: int,
    payload_crc: int | None,
    key_tag: int | None = None,
) -> bytes:
    """Build the header of an entry.

    Args:
        layout: the object's layout, from :func:`layout_for`.
        fmt: the object's format.
        size: payload bytes (``<= layout.nbytes``).
        payload_crc: CRC-32 of the payload, or None to record none.
        key_tag: the key's tag (:func:`key_tag`), or None to record none.

    Returns:
        ``layout.header_size`` bytes (``layout.tagged_header_size`` with a tag).
    """
    if payload_crc is None and size == layout.nbytes:
        if key_tag is None:
            return layout.plain_header(fmt)
        return layout.tagged_header(fmt, key_tag)
    return _build_header(layout, fmt, size, payload_crc, key_tag)


def _build_header(
    layout: Layout,
    fmt: MemoryFormat,
    size: int,
    payload_crc: int | None,
    key_tag: int | None = None,
) -> bytes:
    flags = 0 if payload_crc is None else FLAG_PAYLOAD_CRC
    record = layout.record
    header_size = layout.header_size
    if key_tag is not None:
        flags |= FLAG_KEY_TAG
        record += _TAG.pack(key_tag)
        header_size = layout.tagged_header_size
    fixed = _FIXED.pack(
        MAGIC,
        VERSION,
        flags,
        header_size,
        0,
        size,
        payload_crc or 0,
        fmt.value,
        len(layout.shapes),
    )
    pad = bytes(header_size - FIXED_SIZE - len(record))
    body = fixed[16:] + record + pad
    crc = zlib.crc32(body, zlib.crc32(fixed[:12]))
    return fixed[:12] + crc.to_bytes(4, "little") + body


def _retag(template: bytes, record_len: int, tag: int) -> bytes:
    """``template`` (a tagged header) with its key tag set to ``tag`` and the CRC redone."""
    at = FIXED_SIZE + record_len
    out = bytearray(template)
    _TAG.pack_into(out, at, tag)
    crc = zlib.crc32(memoryview(out)[16:], zlib.crc32(memoryview(out)[:12]))
    _TAG.pack_into(out, 12, crc)
    return bytes(out)


def header_crc(buf: bytes | bytearray | memoryview, header_size: int) -> int:
    """CRC-32 of a header of ``header_size`` bytes, skipping its CRC field."""
    view = memoryview(buf)
    return zlib.crc32(view[16:header_size], zlib.crc32(view[:12]))


def peek_header_size(buf: bytes | bytearray | memoryview, where: str) -> int:
    """Read ``header_size`` from the fixed part, checking magic and version.

    Args:
        buf: at least the first 32 bytes of the entry.
        where: names the entry in error messages.

    Raises:
        CorruptEntryError: too short, bad magic, unknown version, or a
            header size out of range.
    """
    if len(buf) < FIXED_SIZE:
        raise CorruptEntryError(
            f"{where}: truncated: {len(buf)} bytes, shorter than the {FIXED_SIZE}-byte header"
        )
    magic, version, _flags, header_size = struct.unpack_from("<4sHHI", buf)
    if magic != MAGIC:
        raise CorruptEntryError(
            f"{where}: not a kvpool entry (magic {magic!r}, expected {MAGIC!r})"
        )
    if version != VERSION:
        raise CorruptEntryError(
            f"{where}: header version {version} is not supported (this kvpool reads {VERSION})"
        )
    if not FIXED_SIZE < header_size <= MAX_HEADER_SIZE or header_size % HEADER_ALIGN:
        raise CorruptEntryError(f"{where}: corrupted header (header size {header_size})")
    return header_size


def decode_header(buf: bytes | bytearray | memoryview, where: str) -> EntryInfo:
    """Parse and verify a header.

    Args:
        buf: the header (at least ``header_size`` bytes; more is ignored).
        where: names the entry in error messages.

    Returns:
        The :class:`EntryInfo`.

    Raises:
        CorruptEntryError: truncated, bad magic/version, CRC mismatch or
            malformed group records.
    """
    header_size = peek_header_size(buf, where)
    if len(buf) < header_size:
        raise CorruptEntryError(f"{where}: truncated header: {len(buf)} of {header_size} bytes")
    (_, _, flags, _, crc, size, payload_crc, fmt_value, groups) = _FIXED.unpack_from(buf)
    if header_crc(buf, header_size) != crc:
        raise CorruptEntryError(f"{where}: corrupted header (header CRC mismatch)")
    try:
        fmt = MemoryFormat(fmt_value)
    except ValueError:
        raise CorruptEntryError(f"{where}: unknown memory format {fmt_value}") from None
    shapes: list[torch.Size] = []
    dtypes: list[torch.dtype] = []
    pos = FIXED_SIZE
    nbytes = 0
    try:
        for _ in range(groups):
            ndim, name_len = _GROUP.unpack_from(buf, pos)
            pos += _GROUP.size
            name = bytes(buf[pos : pos + name_len]).decode("ascii")
            pos += name_len
            dims = struct.unpack_from(f"<{ndim}q", buf, pos)
            pos += 8 * ndim
            dtype = getattr(torch, name, None)
            if not isinstance(dtype, torch.dtype) or any(d < 0 for d in dims):
                raise ValueError(f"group {len(shapes)}: dtype {name!r}, dims {dims}")
            shape = torch.Size(dims)
            shapes.append(shape)
            dtypes.append(dtype)
            # Exact (Python ints): torch's int64 numel() wraps around, and a
            # wrapped size could pass for the payload's.
            nbytes += layout_bytes(shape, dtype)
            if nbytes > MAX_LAYOUT_BYTES:
                raise ValueError(
                    f"the layout needs {nbytes} bytes, more than {MAX_LAYOUT_BYTES} "
                    "(the int64 limit)"
                )
        tag = None
        if flags & FLAG_KEY_TAG:
            (tag,) = _TAG.unpack_from(buf, pos)
            pos += _TAG.size
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise CorruptEntryError(f"{where}: malformed layout in the header ({exc})") from None
    if pos > header_size or not groups:
        raise CorruptEntryError(f"{where}: malformed layout in the header")
    if size > nbytes:
        raise CorruptEntryError(
            f"{where}: payload of {size} bytes is larger than its layout ({nbytes} bytes)"
        )
    return EntryInfo(
        shapes,
        dtypes,
        fmt,
        size,
        nbytes,
        header_size,
        payload_crc if flags & FLAG_PAYLOAD_CRC else None,
        tag,
    )


def matches(
    buf: bytes | bytearray | memoryview, layout: Layout, header_size: int | None = None
) -> bool:
    """True when ``buf`` starts with a valid header carrying ``layout``.

    The fast check of ``get``: magic, version, header size, header CRC and
    the group records, without building an :class:`EntryInfo`.  Payload
    size, format and CRC are left to the caller.  ``header_size``: the size
    the header declares when it was grown past the layout's own (a direct
    I/O store pads it to the alignment); default the layout's.
    """
    size = layout.header_size if header_size is None else header_size
    if len(buf) < size:
        return False
    magic, version, _flags, header_size, crc = _PREFIX.unpack_from(buf)
    if magic != MAGIC or version != VERSION or header_size != size:
        return False
    view = memoryview(buf)
    end = FIXED_SIZE + len(layout.record)
    if view[FIXED_SIZE:end] != layout.record:
        return False
    return header_crc(view, size) == crc


def is_full_entry(
    header: bytes | bytearray | memoryview,
    layout: Layout,
    fmt: MemoryFormat,
    payload: bytes | bytearray | memoryview,
    header_size: int | None = None,
) -> bool:
    """True when ``header`` announces a full-size ``layout`` entry in ``fmt`` that ``payload`` is.

    The whole check of a ``get`` that read header and payload in one go:
    the plain header byte for byte (the common case), else a valid header
    of this layout, size and format whose payload CRC, if it records one,
    matches ``payload``.  False means "look closer" (a narrowed entry,
    another layout, damage), not necessarily an error.  ``header_size``: as
    for :func:`matches` (a grown header is never the plain one).
    """
    if header_size is None and header == layout.plain_header(fmt):
        return True
    if not matches(header, layout, header_size):
        return False
    flags, size, crc, fmt_value = fixed_fields(header)
    return (
        size == layout.nbytes
        and fmt_value == fmt.value
        and (not flags & FLAG_PAYLOAD_CRC or zlib.crc32(payload) == crc)
    )


def fixed_fields(buf: bytes | bytearray | memoryview) -> tuple[int, int, int, int]:
    """``(flags, payload_size, payload_crc, fmt_value)`` of a header."""
    flags = struct.unpack_from("<H", buf, 6)[0]
    size, crc, fmt_value = struct.unpack_from("<QIH", buf, 16)
    return flags, size, crc, fmt_value
