"""A shared pool's object index: shapes, dtypes and format of each object, in the segment.

A shared pool (``MixedMemoryAllocator(size, shm_name=...)``) keeps, after
its ``size`` bytes and in the same POSIX segment, a small index of the
objects placed in it, so that a process that attaches the segment
(:func:`kvpool.attach_pool`) can rebuild typed views of them by offset
or by key, with no layout sent out of band.  Nothing here allocates pool
memory: the creator writes with :class:`IndexWriter`, an attacher reads
with :class:`IndexReader`.

Layout of the tail (little-endian; every size below is in the segment)::

    [pool bytes][pad][header 64 B][names 1 KiB][slot 0 ... slot n-1][pad][footer 64 B]

* footer (the segment's last 64 bytes): magic ``KVPIDX\\0\\1``, version,
  the header's offset and the pool's size.  A segment without it (a
  plain ``allocate_host`` segment, or one mapped partially) has no index.
* header: magic ``KVPIDXHD``, version, slot size, slot count.
* names: the dtype names (32 x 16 bytes) and format names (32 x 16
  bytes) the slots' codes refer to, so the index describes itself.
* slot (320 bytes): ``seq`` u64, ``crc`` u32 (CRC-32 of the rest), state
  u16, format code u16, offset u64, layout bytes u64, group count u8,
  key length u8, then 4 groups of (dtype code u8, ndim u8, 6 dims u64)
  and a UTF-8 key of up to 56 bytes.

Concurrency: the creator writes under its own lock, one slot at a time:
``seq`` odd, the body, then ``seq`` even.  A reader takes a slot whose
``seq`` is even and the same before and after it read, and whose CRC
matches; otherwise it retries (a bounded number of times).  An attacher
never writes.

What an entry means: the latest object the creator placed at that
offset.  It is replaced when another object is placed over any of its
bytes, removed when the creator frees the object through the pool
(``free``/``batched_free``), and evicted oldest-first when every slot
is taken.  It does not say whether the object is still alive; as with
any shared memory, the creator's protocol (send the offset or key once
the bytes are written, keep the object until the reader answers)
decides when a reader may look.

Limits: 4 groups, 6 dimensions, the dtypes of :data:`DTYPE_NAMES`, keys
of 56 bytes; an object beyond them is not described (a ``publish`` of it
raises).
"""

from __future__ import annotations

import struct
import threading
import zlib
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvpool.errors import InvalidArgumentError, InvalidHandleError
from kvpool.formats import MemoryFormat

__all__ = [
    "DTYPE_NAMES",
    "MAX_DIMS",
    "MAX_GROUPS",
    "MAX_KEY_BYTES",
    "IndexEntry",
    "IndexReader",
    "IndexWriter",
    "default_slots",
    "find_footer",
    "segment_bytes",
    "tail_bytes",
]

VERSION = 1
FOOTER_MAGIC = b"KVPIDX\x00\x01"
HEADER_MAGIC = b"KVPIDXHD"
MAX_GROUPS = 4
MAX_DIMS = 6
MAX_KEY_BYTES = 56
NAME_BYTES = 16
NAME_COUNT = 32
PAGE = 4096

#: dtypes an index can describe; the code of a dtype is its position + 1.
DTYPE_NAMES = (
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "bool",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "uint16",
    "uint32",
    "uint64",
)
_FORMAT_NAMES = tuple(f.name for f in MemoryFormat)

_FOOTER = struct.Struct("<8sIxxxxQQ32x")  # magic, version, header offset, pool bytes
_HEADER = struct.Struct("<8sIIQ40x")  # magic, version, slot size, slots
_GROUP = "BB6x6Q"
_SLOT = struct.Struct("<QIHHQQBB6x" + _GROUP * MAX_GROUPS + f"{MAX_KEY_BYTES}s")
_SEQ = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_BODY = struct.Struct("<HHQQBB6x" + _GROUP * MAX_GROUPS + f"{MAX_KEY_BYTES}s")
_HEAD = struct.Struct("<HHQQBB6x")  # the body's fields before the groups
_GROUPS = struct.Struct("<" + _GROUP * MAX_GROUPS)
SLOT_BYTES = _SLOT.size
_BODY_AT = 12  # seq (8) + crc (4)
_KEYLEN_AT = 21  # in the body: state, format, offset, bytes, groups, then the key's length
_NAMES_AT = _HEADER.size
_SLOTS_AT = _NAMES_AT + 2 * NAME_COUNT * NAME_BYTES
_LIVE = 1
_RETRIES = 1000
_LAYOUT_CACHE = 1024

if SLOT_BYTES != 320 or _FOOTER.size != 64 or _HEADER.size != 64:  # pragma: no cover
    raise ImportError("kvpool.shmindex: unexpected struct sizes on this platform")

_DTYPE_CODE: dict[torch.dtype, int] = {}
for _i, _name in enumerate(DTYPE_NAMES):
    _dt = getattr(torch, _name, None)
    if isinstance(_dt, torch.dtype):
        _DTYPE_CODE[_dt] = _i + 1
# By identity: enum members are singletons, and Enum.__hash__ is slow Python code.
_FORMAT_CODE = {id(f): i + 1 for i, f in enumerate(MemoryFormat)}


def _pages(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


def tail_bytes(slots: int) -> int:
    """Bytes the index of ``slots`` slots adds after the pool (whole pages)."""
    return _pages(_SLOTS_AT + slots * SLOT_BYTES + _FOOTER.size)


def segment_bytes(pool_bytes: int, slots: int) -> int:
    """Bytes of a segment holding a pool of ``pool_bytes`` and an index of ``slots``."""
    return _pages(pool_bytes) + tail_bytes(slots)


def default_slots(size: int, page_bytes: int | None = None) -> int:
    """Slots for a pool of ``size`` bytes: one per page of a paged pool,
    else one per 64 KiB (at least 256, at most 65,536).
    """
    if page_bytes:
        return max(1, min(size // page_bytes, 1 << 18))
    return max(256, min(size // (64 << 10), 1 << 16))


@dataclass(frozen=True)
class IndexEntry:
    """What the index says about one object.

    Attributes:
        offset: byte offset of the object in the pool.
        nbytes: bytes of its layout (all groups).
        shapes: the shape of each group.
        dtypes: the dtype of each group.
        fmt: its :class:`~kvpool.formats.MemoryFormat`.
        key: the key it was published under, or None.
    """

    offset: int
    nbytes: int
    shapes: tuple[torch.Size, ...]
    dtypes: tuple[torch.dtype, ...]
    fmt: MemoryFormat
    key: str | None


def _describe(
    shapes: tuple[torch.Size, ...], dtypes: tuple[torch.dtype, ...]
) -> tuple[bytes, int, int] | None:
    """(packed groups, layout bytes, group count), or None beyond the index's limits."""
    if not shapes or len(shapes) > MAX_GROUPS or len(shapes) != len(dtypes):
        return None
    fields: list[int] = []
    nbytes = 0
    for shape, dtype in zip(shapes, dtypes, strict=True):
        code = _DTYPE_CODE.get(dtype)
        if len(shape) > MAX_DIMS or code is None:
            return None
        fields += [code, len(shape), *shape, *[0] * (MAX_DIMS - len(shape))]
        nbytes += shape.numel() * dtype.itemsize
    fields += [0] * ((2 + MAX_DIMS) * (MAX_GROUPS - len(shapes)))
    return _GROUPS.pack(*fields), nbytes, len(shapes)


def _names_block() -> bytes:
    def table(names: Sequence[str]) -> bytes:
        rows = [n.encode().ljust(NAME_BYTES, b"\0") for n in names]
        return b"".join(rows).ljust(NAME_COUNT * NAME_BYTES, b"\0")

    return table(DTYPE_NAMES) + table(_FORMAT_NAMES)


class IndexWriter:
    """The creator's side: records objects into the tail of a shared segment.

    Args:
        segment: a writable memoryview of the whole segment.
        pool_bytes: bytes of the pool at the start of the segment.
        slots: slot count (the tail must hold :func:`tail_bytes` of it).

    Thread safety: every method takes the writer's lock (never the
    pool's), so it may be called from any thread.
    """

    def __init__(self, segment: memoryview, pool_bytes: int, slots: int) -> None:
        total = len(segment)
        start = _pages(pool_bytes)
        if slots < 1 or total < start + _SLOTS_AT + slots * SLOT_BYTES + _FOOTER.size:
            raise InvalidArgumentError(
                f"a segment of {total} bytes cannot hold a pool of {pool_bytes} bytes "
                f"and an index of {slots} slots"
            )
        self._lock = threading.Lock()
        self._mv: memoryview | None = segment[start:]
        self._slots = slots
        self._pool_bytes = pool_bytes
        _HEADER.pack_into(self._mv, 0, HEADER_MAGIC, VERSION, SLOT_BYTES, slots)
        self._mv[_NAMES_AT:_SLOTS_AT] = _names_block()
        self._mv[_SLOTS_AT : _SLOTS_AT + slots * SLOT_BYTES] = bytes(slots * SLOT_BYTES)
        _FOOTER.pack_into(segment, total - _FOOTER.size, FOOTER_MAGIC, VERSION, start, pool_bytes)
        self._free = list(range(slots - 1, -1, -1))
        self._layouts: dict[tuple[Any, Any], Any] = {}  # (shapes, dtypes) -> described
        self._seq = [0] * slots
        # offset -> (slot, end, id of the handle, slot body); dict order = age, oldest first.
        self._entries: dict[int, tuple[int, int, int, bytes]] = {}
        self._starts: list[int] = []  # sorted offsets of _entries
        self._keys: dict[str, int] = {}  # key -> offset
        self._key_at: dict[int, str] = {}  # offset -> key

    @property
    def slots(self) -> int:
        """Slot count."""
        return self._slots

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def record(self, obj: Any, key: str | None = None) -> bool:
        """Describe ``obj`` (just placed) in the index, under ``key`` if given.

        Entries that overlap its bytes are removed first.

        Returns:
            True when it was recorded; False when its layout is beyond the
            index's limits (it is then not described).

        Raises:
            InvalidArgumentError: ``key`` is given and too long, or the
                object cannot be described.
        """
        kb = _key_bytes(key)
        shapes = tuple(obj.get_shapes())
        dtypes = tuple(obj.get_dtypes())
        fmt_code = _FORMAT_CODE.get(id(obj.get_memory_format()))
        off = obj.shm_offset
        layout = self._layouts.get((shapes, dtypes))
        if layout is None:
            layout = _describe(shapes, dtypes) or False
            if len(self._layouts) >= _LAYOUT_CACHE:
                self._layouts.clear()
            self._layouts[shapes, dtypes] = layout
        if layout is False or fmt_code is None:
            if key is not None:
                raise InvalidArgumentError(
                    f"{obj!r} cannot be described in the shared index (at most {MAX_GROUPS} "
                    f"groups of {MAX_DIMS} dimensions, dtypes among {', '.join(DTYPE_NAMES)})"
                )
            with self._lock:
                self._remove_overlaps_locked(off, off + max(1, obj.get_size()))
            return False
        groups, nbytes, ngroups = layout
        end = off + nbytes
        if off < 0 or end > self._pool_bytes:
            raise InvalidArgumentError(
                f"{obj!r} at {off} (+{nbytes} bytes) is outside the pool's {self._pool_bytes} bytes"
            )
        head = _HEAD.pack(_LIVE, fmt_code, off, nbytes, ngroups, len(kb))
        packed = head + groups + kb.ljust(MAX_KEY_BYTES, b"\0")
        with self._lock:
            if self._mv is None:
                return False
            entries = self._entries
            old = entries.get(off)
            if old is not None and end <= old[1]:
                # The common case (a slot's memory placed again): nothing else
                # can overlap, so the entry's slot is rewritten in place.
                del entries[off]  # re-inserted below: it becomes the youngest
                slot = old[0]
                old_key = self._key_at.pop(off, None)
                if old_key is not None:
                    del self._keys[old_key]
            else:
                self._remove_overlaps_locked(off, end)
                if not self._free:
                    self._remove_locked(next(iter(entries)))  # evict the oldest
                slot = self._free.pop()
                self._starts.insert(bisect_left(self._starts, off), off)
            if key is not None:
                moved = self._keys.get(key)
                if moved is not None:  # the key moves: the old object keeps its entry
                    self._unkey_locked(moved)
                self._keys[key] = off
                self._key_at[off] = key
            self._write_locked(slot, packed)
            entries[off] = (slot, end, id(obj), packed)
        return True

    def forget(self, obj: Any) -> None:
        """Remove ``obj``'s entry (before the creator frees it), if it is the one recorded."""
        off = obj.shm_offset
        with self._lock:
            entry = self._entries.get(off)
            if entry is not None and entry[2] == id(obj):
                self._remove_locked(off)

    def close(self) -> None:
        """Stop writing and drop the view of the segment.  Idempotent."""
        with self._lock:
            self._mv = None

    # -- under the lock --------------------------------------------------

    def _write_locked(self, slot: int, packed: bytes) -> None:
        mv = self._mv
        at = _SLOTS_AT + slot * SLOT_BYTES
        seq = self._seq[slot] + 1
        checked = _CRC.pack(zlib.crc32(packed)) + packed
        _SEQ.pack_into(mv, at, seq)  # odd: being written
        mv[at + 8 : at + SLOT_BYTES] = checked
        _SEQ.pack_into(mv, at, seq + 1)  # even: stable
        self._seq[slot] = seq + 1

    def _unkey_locked(self, off: int) -> None:
        """Rewrite the entry at ``off`` without its key."""
        slot, end, ident, packed = self._entries[off]
        del self._keys[self._key_at.pop(off)]
        packed = packed[:_KEYLEN_AT] + b"\0" + packed[_KEYLEN_AT + 1 : -MAX_KEY_BYTES]
        packed += bytes(MAX_KEY_BYTES)
        self._entries[off] = (slot, end, ident, packed)
        self._write_locked(slot, packed)

    def _remove_locked(self, off: int) -> None:
        slot, _end, _ident, _packed = self._entries.pop(off)
        del self._starts[bisect_left(self._starts, off)]
        key = self._key_at.pop(off, None)
        if key is not None:
            del self._keys[key]
        if self._mv is not None:
            self._write_locked(slot, bytes(SLOT_BYTES - _BODY_AT))
        self._free.append(slot)

    def _remove_overlaps_locked(self, start: int, end: int) -> None:
        # Entries never overlap each other, so sorted by offset they are
        # sorted by end too: walk back from the first one starting at or
        # after ``end`` while they end after ``start``.
        i = bisect_left(self._starts, end) - 1
        while i >= 0:
            off = self._starts[i]
            if self._entries[off][1] <= start:
                break
            self._remove_locked(off)
            i -= 1


def _key_bytes(key: str | None) -> bytes:
    if key is None:
        return b""
    if not isinstance(key, str):
        raise InvalidArgumentError(f"a shared-index key must be a str, got {type(key).__name__}")
    kb = key.encode("utf-8")
    if not 0 < len(kb) <= MAX_KEY_BYTES:
        raise InvalidArgumentError(
            f"a shared-index key must have 1 to {MAX_KEY_BYTES} UTF-8 bytes, got {len(kb)}"
        )
    return kb


def find_footer(segment: memoryview) -> tuple[int, int] | None:
    """(header offset, pool bytes) from a segment's footer, or None when it has none.

    Raises:
        InvalidHandleError: a footer is there but points outside the segment.
    """
    total = len(segment)
    if total < _FOOTER.size:
        return None
    magic, version, start, pool_bytes = _FOOTER.unpack_from(segment, total - _FOOTER.size)
    if magic != FOOTER_MAGIC:
        return None
    if version != VERSION:
        raise InvalidHandleError(
            f"the segment's index is version {version}; this kvpool reads version {VERSION}"
        )
    if not 0 < pool_bytes <= start <= total - _SLOTS_AT - _FOOTER.size:
        raise InvalidHandleError(
            f"the segment's index footer is damaged (index at {start}, pool of {pool_bytes} "
            f"bytes, segment of {total})"
        )
    return start, pool_bytes


class IndexReader:
    """An attacher's side: looks entries up in a segment another process writes.

    Args:
        segment: a memoryview of the whole segment (read only).
        start: the header's offset (from :func:`find_footer`).
        pool_bytes: bytes of the pool (from :func:`find_footer`).

    Raises:
        InvalidHandleError: the header or the names are damaged.
    """

    def __init__(self, segment: memoryview, start: int, pool_bytes: int) -> None:
        total = len(segment)
        magic, version, slot_bytes, slots = _HEADER.unpack_from(segment, start)
        room = total - _FOOTER.size - start - _SLOTS_AT
        if (
            magic != HEADER_MAGIC
            or version != VERSION
            or slot_bytes != SLOT_BYTES
            or not 0 < slots <= room // SLOT_BYTES
        ):
            raise InvalidHandleError(
                f"the segment's index header is damaged (magic {magic!r}, version {version}, "
                f"slot size {slot_bytes}, {slots} slots)"
            )
        self._mv: memoryview | None = segment[start : start + _SLOTS_AT + slots * SLOT_BYTES]
        self.slots = slots
        self.pool_bytes = pool_bytes
        names = bytes(self._mv[_NAMES_AT:_SLOTS_AT])
        self._dtypes = [_dtype_named(n) for n in _split_names(names[: NAME_COUNT * NAME_BYTES])]
        self._formats = [_format_named(n) for n in _split_names(names[NAME_COUNT * NAME_BYTES :])]
        import numpy as np  # the scan of the offsets and states is vectorized

        table = np.frombuffer(self._mv, dtype=np.uint8, offset=_SLOTS_AT)
        rows = table.reshape(slots, SLOT_BYTES)
        self._states = rows[:, 12:14].view("<u2")[:, 0]
        self._offsets = rows[:, 16:24].view("<u8")[:, 0]
        self._np = np

    def close(self) -> None:
        """Drop the views of the segment.  Idempotent."""
        self._mv = None
        self._states = self._offsets = None  # type: ignore[assignment]

    def entry_at(self, offset: int) -> IndexEntry | None:
        """The entry of the object at byte ``offset``, or None."""
        np = self._np
        for _ in range(_RETRIES):
            hits = np.flatnonzero((self._offsets == offset) & (self._states == _LIVE))
            if not len(hits):
                return None
            for slot in hits:
                entry = self._read(int(slot))
                if entry is not None and entry.offset == offset:
                    return entry
        return None

    def entry_named(self, key: str) -> IndexEntry | None:
        """The entry published under ``key``, or None."""
        kb = _key_bytes(key)
        for slot in self._live_slots():
            entry = self._read(slot)
            if entry is not None and entry.key is not None and entry.key.encode() == kb:
                return entry
        return None

    def entries(self) -> list[IndexEntry]:
        """Every entry, by offset."""
        found = [self._read(slot) for slot in self._live_slots()]
        return sorted((e for e in found if e is not None), key=lambda e: e.offset)

    def _live_slots(self) -> list[int]:
        if self._mv is None:
            raise InvalidHandleError("the attached pool was closed")
        return [int(s) for s in self._np.flatnonzero(self._states == _LIVE)]

    def _read(self, slot: int) -> IndexEntry | None:
        """One stable, checked copy of a slot (None: empty, or never stable)."""
        mv = self._mv
        if mv is None:
            raise InvalidHandleError("the attached pool was closed")
        at = _SLOTS_AT + slot * SLOT_BYTES
        for _ in range(_RETRIES):
            (seq,) = _SEQ.unpack_from(mv, at)
            if seq & 1:
                continue
            raw = bytes(mv[at : at + SLOT_BYTES])
            (again,) = _SEQ.unpack_from(mv, at)
            if again != seq:
                continue
            (crc,) = _CRC.unpack_from(raw, 8)
            body = raw[_BODY_AT:]
            if zlib.crc32(body) != crc:
                continue
            return self._decode(_BODY.unpack(body))
        return None

    def _decode(self, fields: tuple[Any, ...]) -> IndexEntry | None:
        state, fmt_code, off, nbytes, ngroups, keylen = fields[:6]
        if state != _LIVE:
            return None
        where = f"shared-index entry at offset {off}"
        if not 0 < ngroups <= MAX_GROUPS or keylen > MAX_KEY_BYTES:
            raise InvalidHandleError(f"{where}: {ngroups} groups, key of {keylen} bytes")
        if not 0 < fmt_code <= len(self._formats) or self._formats[fmt_code - 1] is None:
            raise InvalidHandleError(f"{where}: unknown format code {fmt_code}")
        shapes: list[torch.Size] = []
        dtypes: list[torch.dtype] = []
        total = 0
        per = 2 + MAX_DIMS
        for g in range(ngroups):
            code, ndim, *dims = fields[6 + g * per : 6 + (g + 1) * per]
            if not 0 < code <= len(self._dtypes) or self._dtypes[code - 1] is None:
                raise InvalidHandleError(f"{where}: unknown dtype code {code}")
            if ndim > MAX_DIMS:
                raise InvalidHandleError(f"{where}: {ndim} dimensions")
            shape = torch.Size(dims[:ndim])
            dtype = self._dtypes[code - 1]
            shapes.append(shape)
            dtypes.append(dtype)  # type: ignore[arg-type]
            total += shape.numel() * dtype.itemsize  # type: ignore[union-attr]
        if total != nbytes or off + nbytes > self.pool_bytes:
            raise InvalidHandleError(
                f"{where}: {nbytes} bytes announced, {total} described, pool of "
                f"{self.pool_bytes} bytes"
            )
        key_raw = fields[-1][:keylen]
        key = key_raw.decode("utf-8", errors="replace") if keylen else None
        return IndexEntry(
            off, nbytes, tuple(shapes), tuple(dtypes), self._formats[fmt_code - 1], key
        )  # type: ignore[arg-type]


def _split_names(block: bytes) -> list[str]:
    rows = [block[i : i + NAME_BYTES] for i in range(0, len(block), NAME_BYTES)]
    return [r.rstrip(b"\0").decode("ascii", errors="replace") for r in rows]


def _dtype_named(name: str) -> torch.dtype | None:
    value = getattr(torch, name, None) if name else None
    return value if isinstance(value, torch.dtype) else None


def _format_named(name: str) -> MemoryFormat | None:
    return MemoryFormat.__members__.get(name) if name else None
