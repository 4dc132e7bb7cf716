"""The Mooncake calls behind MooncakeStore: writing entries, reading a header alone.

Writing (:func:`write_entries`): one ``batch_is_exist`` splits a batch
into new keys and existing ones.  The new keys are written in one
``batch_put_from_multi_buffers``, two buffers each - the header slot and
the object's memory - as one Mooncake object (a put of a key that appeared
meanwhile keeps the other writer's entry: Mooncake's put keeps the first
value).  The existing keys are replaced with ``upsert_parts``, Mooncake's
atomic replace, which copies the entry once through the client's local
buffer.  A key repeated in one batch is written in rounds, in order, so
the last one wins.  (Measured: a put session - reserve, ranged send, seal
- detects existing keys without the extra call but was 15-20 % slower.)
Without ``replace`` (content-named keys) there is no ``batch_is_exist``:
every entry goes to the one put call, and a key that exists keeps its
entry (Mooncake answers 0 for it; ``OBJECT_ALREADY_EXISTS`` would be taken
as stored too).

Reading a header alone (:func:`read_header`): ``get_size``, then a ranged
read (``get_into_ranges``) of the first 4 KiB (or of the whole header
when it is longer) into a header slot.  A header read together with the
bytes is checked by :func:`check_read_header`.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import kvpool.remote.mooncake.codes as codes
from kvpool.errors import CorruptEntryError, RemoteStoreError
from kvpool.formats import MemoryFormat
from kvpool.remote.base import check_stored
from kvpool.remote.header import FIXED_SIZE, EntryInfo, Layout, decode_header, peek_header_size
from kvpool.remote.mooncake.memory import HeaderSlabs, Slab

__all__ = ["FIRST_READ", "Entry", "check_read_header", "read_header", "rounds", "write_entries"]

#: Bytes read first when the header's size is not known yet.
FIRST_READ = 4096


class Entry:
    """One entry to write: its Mooncake key, header (in a slot) and bytes.

    Attributes:
        where: names the operation and key in error messages.
        mkey: the Mooncake key.
        header: the header, a view of its slot; empty for a headerless
            entry (:mod:`kvpool.remote.mooncake.raw`): the bytes alone.
        header_ptr: the slot's address.
        view: the object's bytes (``byte_array``).
        data_ptr: their address.
        total: bytes of the Mooncake object (header + bytes).
    """

    __slots__ = ("data_ptr", "header", "header_ptr", "mkey", "total", "view", "where")

    def __init__(
        self,
        where: str,
        mkey: str,
        header: memoryview,
        header_ptr: int,
        view: memoryview,
        data_ptr: int,
    ) -> None:
        self.where = where
        self.mkey = mkey
        self.header = header
        self.header_ptr = header_ptr
        self.view = view
        self.data_ptr = data_ptr
        self.total = header.nbytes + view.nbytes

    def buffers(self) -> tuple[list[int], list[int]]:
        """Addresses and sizes of its buffers (no empty one)."""
        hs = self.header.nbytes
        if not hs:
            return [self.data_ptr], [self.view.nbytes]
        if not self.view.nbytes:
            return [self.header_ptr], [hs]
        return [self.header_ptr, self.data_ptr], [hs, self.view.nbytes]


def rounds(mkeys: Sequence[str], indices: Sequence[int]) -> list[list[int]]:
    """Split ``indices`` into rounds in which no key repeats, keeping their order.

    Mooncake serves a key named twice in one batch call once, so each
    repeat goes into the next round.
    """
    out: list[list[int]] = []
    seen: dict[str, int] = {}
    for i in indices:
        n = seen.get(mkeys[i], 0)
        seen[mkeys[i]] = n + 1
        if n == len(out):
            out.append([])
        out[n].append(i)
    return out


def write_entries(
    client: Any,
    entries: list[Entry],
    config: Any,
    timeout: float,
    local_buffer_size: int,
    replace: bool = True,
) -> None:
    """Write every entry (see the module docstring).

    Args:
        client: the Mooncake client.
        entries: what to write.
        config: its ``ReplicateConfig``.
        timeout: seconds an upsert retries a busy entry.
        local_buffer_size: the client's local buffer (the largest upsert).
        replace: replace existing entries (True) or leave them, unchecked.

    Raises:
        The first error (with a note counting the others):
        StoreConnectionError, StoreTimeoutError or RemoteStoreError.
    """
    errors: list[BaseException] = []
    for part in rounds([e.mkey for e in entries], range(len(entries))):
        batch = [entries[i] for i in part]
        if replace:
            _write_round(client, config, batch, errors, timeout, local_buffer_size)
        else:
            _put_new(client, config, batch, errors, keep=(0, codes.ALREADY_EXISTS))
    if errors:
        first = errors[0]
        if len(errors) > 1:
            first.add_note(f"{len(errors) - 1} more entr(ies) of the batch failed")
        raise first


def _write_round(
    client: Any,
    config: Any,
    part: list[Entry],
    errors: list[BaseException],
    timeout: float,
    local_buffer_size: int,
) -> None:
    found = client.batch_is_exist([e.mkey for e in part])
    fresh: list[Entry] = []
    existing: list[Entry] = []
    for entry, rc in zip(part, found, strict=True):
        if rc == 0:
            fresh.append(entry)
        elif rc == 1:
            existing.append(entry)
        else:
            errors.append(codes.error_for(rc if rc < -1 else -1, entry.where))
    if fresh:
        _put_new(client, config, fresh, errors, keep=(0,))
    for entry in existing:
        try:
            _upsert(client, config, entry, timeout, local_buffer_size)
        except BaseException as exc:
            errors.append(exc)


def _put_new(
    client: Any, config: Any, fresh: list[Entry], errors: list[BaseException], keep: tuple[int, ...]
) -> None:
    """One put call for ``fresh`` (zero-copy); a code outside ``keep`` is an error of its entry."""
    bufs = [e.buffers() for e in fresh]
    if all(len(b[0]) == 1 for b in bufs):  # headerless: one buffer each, the plain call
        put = client.batch_put_from(
            [e.mkey for e in fresh], [b[0][0] for b in bufs], [b[1][0] for b in bufs], config
        )
    else:
        put = client.batch_put_from_multi_buffers(
            [e.mkey for e in fresh], [b[0] for b in bufs], [b[1] for b in bufs], config
        )
    for entry, rc in zip(fresh, put, strict=True):
        if rc not in keep:
            errors.append(codes.error_for(rc, entry.where))


def _upsert(client: Any, config: Any, entry: Entry, timeout: float, local_buffer_size: int) -> None:
    """Replace an existing entry atomically (Mooncake copies it through its local buffer)."""
    if entry.total > local_buffer_size:
        raise RemoteStoreError(
            f"{entry.where}: replacing an existing entry of {entry.total} bytes goes through the "
            f"Mooncake client's local buffer of {local_buffer_size} bytes; open the store with "
            f"local_buffer_size >= {entry.total}, or delete the entry first"
        )
    parts = tuple(part for part in (entry.header, entry.view) if part.nbytes)
    backoff = codes.Backoff(timeout)
    while True:
        rc = client.upsert_parts(entry.mkey, *parts, config=config)
        if rc == 0:
            return
        # INVALID_PARAMS here also means: the local buffer is taken by other calls.
        if not (rc in codes.RETRYABLE or rc == codes.BUFFER_TOO_SMALL) or not backoff.wait():
            raise codes.error_for(rc, entry.where)


def read_header(
    client: Any, slabs: HeaderSlabs, slab: Slab, mkey: str, where: str
) -> tuple[EntryInfo, bytes, int] | None:
    """``(info, header bytes, entry size)`` of ``mkey``, or None when it does not exist.

    Raises:
        Busy: the entry is being written (retry).
        CorruptEntryError: the object is not a whole kvpool entry.
        StoreConnectionError / RemoteStoreError: Mooncake failed.
    """
    total = client.get_size(mkey)
    if total == codes.NOT_FOUND:
        return None
    if total in codes.RETRYABLE:
        raise codes.Busy(total)
    if total < 0:
        raise codes.error_for(total, where)
    if total < FIXED_SIZE:
        raise CorruptEntryError(
            f"{where}: truncated: {total} bytes, shorter than the {FIXED_SIZE}-byte header"
        )
    n = min(total, FIRST_READ, slab.size)
    if not _ranged_read(client, slab, mkey, n, where):
        return None
    header_size = peek_header_size(slab.view[:n], where)
    if header_size > total:
        raise CorruptEntryError(
            f"{where}: truncated: {total} bytes, the header alone announces {header_size}"
        )
    if header_size <= n:
        header = bytes(slab.view[:header_size])
    else:
        big = slabs.take(header_size)
        try:
            if not _ranged_read(client, big, mkey, header_size, where):
                return None
            header = bytes(big.view[:header_size])
        finally:
            slabs.give(big)
    info = decode_header(header, where)
    if total != header_size + info.size:
        raise CorruptEntryError(
            f"{where}: the entry holds {total} bytes, its header announces "
            f"{header_size} + {info.size}"
        )
    return info, header, total


def _ranged_read(client: Any, slab: Slab, mkey: str, n: int, where: str) -> bool:
    """Read the first ``n`` bytes of ``mkey`` into ``slab``; False when it is gone."""
    rc = client.get_into_ranges([slab.ptr], [[mkey]], [[[0]]], [[[0]]], [[[n]]])[0][0][0]
    if rc == codes.NOT_FOUND:
        return False
    if rc in codes.RETRYABLE:
        raise codes.Busy(rc)
    if rc != n:
        raise codes.error_for(rc if rc < 0 else codes.TRANSFER_FAIL, where)
    return True


def check_read_header(
    header: memoryview, layout: Layout, fmt: MemoryFormat, view: memoryview, where: str
) -> None:
    """Check a header read together with the bytes (one that is not ``layout``'s plain header).

    Raises:
        InvalidArgumentError: the stored layout or format differs from the requested one.
        CorruptEntryError: a damaged header, other sizes, a payload CRC mismatch.
    """
    info = decode_header(header, where)
    check_stored(info, layout, fmt, where)
    if info.size != layout.nbytes or info.header_size != layout.header_size:
        raise CorruptEntryError(
            f"{where}: the header announces {info.header_size} + {info.size} bytes, the "
            f"entry holds {layout.header_size} + {layout.nbytes}"
        )
    if info.payload_crc is not None and zlib.crc32(view) != info.payload_crc:
        raise CorruptEntryError(f"{where}: payload CRC mismatch")
