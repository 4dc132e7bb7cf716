"""Headerless Mooncake entries: an object's bytes alone, one buffer per entry.

Mooncake charges per buffer moved, not per byte: a default kvpool entry
is two buffers (the header slot and the object's memory), which cost
0.87x (put) and 0.94x (get) of one buffer in interleaved raw calls over
TCP (README, "Mooncake").  A caller that knows the layout of what it
stores - as LMCache does with ``save_chunk_meta: False`` - can open
:class:`~kvpool.remote.mooncake.store.MooncakeStore` with
``headerless=True``: each entry is then the object's bytes only, written
with ``batch_put_from`` (replaced with ``upsert_parts`` when the key
exists, as the default entries are; :func:`raw_entry` is what the store
writes in place of a header) and read with ``batch_get_into`` straight
into the new object (:func:`raw_get`).

What a headerless entry gives up, against a default one:

* **no layout or format check**: ``get`` must be told the shapes, dtypes
  and format, and an entry written with another layout of the same byte
  size is read as if it had the requested one (only the size is checked:
  a different size is a :class:`~kvpool.errors.CorruptEntryError`);
* **no CRC**: ``checksum=True`` is refused, a damaged payload is not
  detected;
* **no proof of origin**: any Mooncake object of the right size under
  the key is read (a default entry's magic and header CRC refuse foreign
  objects);
* **no narrowed objects**: an object whose used size is below its
  layout (``set_used_size``) is refused by ``put``, since a ``get`` could
  not restore the narrowing; nor are objects of 0 bytes (Mooncake refuses
  empty objects);
* **no** ``head``: there is no header to read (``exists`` still works).

Headerless and default entries must not share a prefix: each kind of
store refuses the other's entries (a size mismatch one way, a missing
magic the other), but only after reading them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import kvpool.remote.mooncake.codes as codes
from kvpool.errors import CorruptEntryError, InvalidArgumentError, OutOfMemoryError
from kvpool.formats import MemoryFormat
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.header import Layout
from kvpool.remote.mooncake.memory import PoolRegions, address_of
from kvpool.remote.mooncake.ops import rounds
from kvpool.remote.objects import describe, destination, discard

__all__ = ["raw_entry", "raw_get"]


def raw_entry(obj: MemoryObj, checksum: bool = False) -> tuple[bytes, memoryview]:
    """What a headerless store writes for ``obj``: no header, its bytes (as ``encode_entry``).

    Args:
        obj: the object to store (held by the caller).
        checksum: must be False (a headerless store has nowhere to put a CRC).

    Raises:
        InvalidArgumentError: a narrowed or empty object, or ``checksum``.
        As :func:`~kvpool.remote.objects.describe`.
    """
    if checksum:
        raise InvalidArgumentError("a headerless entry has no header to record a CRC in")
    layout, _fmt, view = describe(obj)
    if view.nbytes != layout.nbytes or not view.nbytes:
        raise InvalidArgumentError(
            f"put of {obj!r}: a headerless store keeps whole objects of at least one byte; "
            f"this one holds {view.nbytes} of its layout's {layout.nbytes} bytes (narrowed or "
            "empty); store it in a MooncakeStore with headers (headerless=False)"
        )
    return b"", view


def raw_get(
    client: Any,
    regions: PoolRegions,
    names: list[tuple[str, str]],
    allocators: Sequence[MemoryAllocatorInterface],
    layout: Layout | None,
    fmt: MemoryFormat | None,
    out: list[MemoryObj | None],
    timeout: float,
) -> None:
    """Read each headerless entry into ``out`` (None for a missing one), one call per round.

    Args:
        client: the Mooncake client.
        regions: the store's registered pool memory.
        names: per key, its Mooncake key and how messages name the call on it.
        allocators: per key, where its object comes from (see
            :func:`~kvpool.remote.objects.allocator_for`).
        layout: the entries' layout (required).
        fmt: their format (required).
        out: one slot per key, filled in place; the caller frees it on error.
        timeout: seconds an entry being written is waited for.

    Raises:
        InvalidArgumentError: no layout or format given.
        CorruptEntryError: an entry of another size.
        OutOfMemoryError: no room for an entry that exists.
        StoreTimeoutError: an entry stayed busy past ``timeout``.
        StoreConnectionError / RemoteStoreError: Mooncake failed.
    """
    if layout is None or fmt is None:
        raise InvalidArgumentError(
            f"{names[0][1]}: a headerless store has no header to learn the layout from; pass "
            "shapes, dtypes and fmt"
        )
    nbytes = layout.nbytes
    ptrs: dict[int, int] = {}
    full: list[int] = []
    for i, (_mkey, where) in enumerate(names):
        try:
            obj, view = destination(allocators[i], layout, fmt, where)
        except OutOfMemoryError:
            full.append(i)  # an error only if the entry exists (a miss is no error)
            continue
        out[i] = obj
        ptrs[i] = address_of(obj, view)
        del view  # only the address is needed; a view alive at a discard holds the bytes
    if full:
        found = client.batch_is_exist([names[i][0] for i in full])
        for i, rc in zip(full, found, strict=True):
            if rc != 0:
                raise OutOfMemoryError(
                    f"{names[i][1]}: the allocator {allocators[i]!r} has no room for an object of "
                    f"{nbytes} bytes; free objects or use a larger pool"
                )
    temporary = []
    try:
        for i, ptr in ptrs.items():
            temporary.append(regions.ensure(out[i], ptr, nbytes))  # type: ignore[arg-type]
        _read_all(client, names, ptrs, nbytes, out, timeout)
    finally:
        for reg in temporary:
            regions.release_temporary(reg)


def _read_all(
    client: Any,
    names: list[tuple[str, str]],
    ptrs: dict[int, int],
    nbytes: int,
    out: list[MemoryObj | None],
    timeout: float,
) -> None:
    mkeys = [mkey for mkey, _ in names]
    backoff = codes.Backoff(timeout)
    pending = list(ptrs)
    while pending:
        busy: list[int] = []
        # A key twice in one Mooncake batch is read once: one round per repeat.
        for part in rounds(mkeys, pending):
            got = client.batch_get_into(
                [mkeys[i] for i in part], [ptrs[i] for i in part], [nbytes] * len(part)
            )
            for i, rc in zip(part, got, strict=True):
                if rc == nbytes:
                    continue
                if rc in codes.RETRYABLE:
                    busy.append(i)
                    continue
                obj, out[i] = out[i], None
                discard(obj)
                if rc == codes.NOT_FOUND:
                    continue
                if rc >= 0 or rc == codes.BUFFER_TOO_SMALL:
                    stored = rc if rc >= 0 else client.get_size(mkeys[i])
                    raise CorruptEntryError(
                        f"{names[i][1]}: the entry holds {stored} bytes, the requested layout "
                        f"{nbytes}; a headerless entry carries no layout, so either the "
                        "request or the entry is not what the other side thinks"
                    )
                raise codes.error_for(rc, names[i][1])
        if busy and not backoff.wait():
            raise codes.error_for(codes.NOT_READY, names[busy[0]][1])
        pending = busy
