"""Pools shared between processes: the creator's indexed segment and an attacher's typed views.

The creator, ``MixedMemoryAllocator(size, shm_name="/kv")``, maps one
POSIX segment holding its ``size`` bytes followed by an object index
(:mod:`kvpool.pool.shmindex`): :class:`SharedPoolBacking`.  Another process
calls :func:`kvpool.attach_pool` and gets an :class:`AttachedPool`, which
rebuilds typed tensors of the creator's objects from that index, by byte
offset or by the key the creator published them under::

    # creator                                   # another process
    pool = MixedMemoryAllocator(1 << 30,        peer = kvpool.attach_pool("/kv")
                                shm_name="/kv") kv = peer.tensor("layer-0")
    obj = pool.allocate(shape, dtype, fmt)      same = peer.tensor(offset)
    pool.publish("layer-0", obj)                peer.close()

Why not ``multiprocessing.shared_memory``: attaching the same name with
it registers the segment with Python's resource tracker, which *unlinks*
it when the attaching process exits (CPython's behaviour), removing the
creator's segment under it.  ``attach_pool`` only maps and unmaps.
"""

from __future__ import annotations

from typing import Any

import torch

from kvpool.checks import REQUIRED, refuse_in_place
from kvpool.errors import FeatureUnavailableError, InvalidArgumentError, InvalidHandleError
from kvpool.formats import MemoryFormat, normalize_layout
from kvpool.native.spec import HostSpec
from kvpool.pool.backing import Backing, HostBacking
from kvpool.pool.handle import TensorMemoryObj
from kvpool.pool.objects import MemoryObj
from kvpool.pool.pools import MemoryPool
from kvpool.pool.shmindex import (
    IndexEntry,
    IndexReader,
    IndexWriter,
    default_slots,
    find_footer,
    segment_bytes,
)

__all__ = ["AttachedPool", "IndexedPool", "SharedPoolBacking", "index_slots"]

#: Largest ``shm_index_slots`` accepted (1.25 GiB of index).
MAX_SLOTS = 1 << 22

_EMPTY = torch.empty(0, dtype=torch.uint8)


class SharedPoolBacking(Backing):
    """A shared-memory backing whose segment also carries the object index.

    The pool sees only its ``size`` bytes (``tensor``, ``view``, ``size``);
    ``index`` writes the tail.

    Args:
        spec: the pool's mapping (its ``size`` is the pool's; the segment
            is made larger by the index, with 4 KiB pages).
        slots: index slots, > 0.

    Attributes:
        buffer: the segment's :class:`~kvpool.native.buffer.HostBuffer`.
        index: the :class:`~kvpool.pool.shmindex.IndexWriter`.

    Raises:
        The errors of :class:`~kvpool.pool.backing.HostBacking`.
    """

    def __init__(self, spec: HostSpec, slots: int) -> None:
        size = spec.size
        self._inner = HostBacking(spec.replace(size=segment_bytes(size, slots), hugepages="never"))
        try:
            self.index = IndexWriter(self._inner.view, size, slots)  # type: ignore[arg-type]
        except BaseException:
            self._inner.close()
            raise
        self.buffer = self._inner.buffer
        self.view = self._inner.view[:size]  # type: ignore[index]
        self.tensor = self._inner.tensor[:size]
        self.size = size

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._inner.closed

    def close(self) -> None:
        """Stop indexing and drop this backing's hold on the segment. Idempotent."""
        self.index.close()
        self.view = None
        self.tensor = _EMPTY
        self._inner.close()

    def registrations(self) -> list[tuple[int, int]]:
        """The segment's CUDA registrations (the pool's bytes start at its offset 0)."""
        return self._inner.registrations()

    def describe(self) -> dict[str, Any]:
        """The segment's description, with the pool's size and the index's slots."""
        info = dict(self._inner.describe())
        info["size"] = self.size
        info["shm_index_slots"] = self.index.slots
        return info


def index_slots(size: int, use_paging: bool, kwargs: dict[str, Any]) -> int:
    """Slots of a shared pool's index: ``kwargs["shm_index_slots"]``, else the default
    (:func:`~kvpool.pool.shmindex.default_slots`).

    Raises:
        InvalidArgumentError: ``shm_index_slots`` is not an int in 0..MAX_SLOTS.
    """
    slots = kwargs.get("shm_index_slots")
    if slots is None:
        page = None
        if use_paging and kwargs.get("shapes") and kwargs.get("dtypes"):
            page = normalize_layout(kwargs["shapes"], kwargs["dtypes"])[2]
        return default_slots(size, page)
    if isinstance(slots, bool) or not isinstance(slots, int) or not 0 <= slots <= MAX_SLOTS:
        raise InvalidArgumentError(
            f"shm_index_slots must be an int in 0..{MAX_SLOTS}, got {slots!r}"
        )
    return slots


def _record_or_free(index: IndexWriter, obj: MemoryObj) -> None:
    """Index a new object; if that fails, free it (nothing leaks) and raise."""
    try:
        index.record(obj)
    except BaseException:
        obj.ref_count_down()
        raise


class IndexedPool(MemoryPool):
    """A :class:`~kvpool.pool.pools.MemoryPool` that describes its objects in a shared index.

    A subclass sets ``_index`` (the backing's
    :class:`~kvpool.pool.shmindex.IndexWriter`, or None for a pool that is
    not shared) before ``MemoryPool.__init__``.  Every object placed is
    then recorded; ``free``/``batched_free`` through the pool remove the
    entries first; :meth:`publish` gives an object a key.  Costs one index
    write (a few microseconds) per allocation of a shared pool, nothing
    otherwise.
    """

    _index: IndexWriter | None = None

    def allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> MemoryObj | None:
        """Allocate one object (see :meth:`MemoryPool.allocate`) and index it."""
        if unknown or shapes is REQUIRED or dtypes is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes)
        # MemoryPool.allocate's work without its check (see MemoryPool._placer).
        obj = self._placer(fmt).allocate(shapes, dtypes, fmt)
        index = self._index
        if index is not None and obj is not None and obj.__class__ is TensorMemoryObj:
            _record_or_free(index, obj)
        return obj

    def batched_allocate(
        self,
        shapes: torch.Size | list[torch.Size] = REQUIRED,
        dtypes: torch.dtype | list[torch.dtype] = REQUIRED,
        batch_size: int = REQUIRED,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
        **unknown: Any,
    ) -> list[MemoryObj] | None:
        """Allocate ``batch_size`` objects (see :meth:`MemoryPool.batched_allocate`), indexed."""
        if unknown or shapes is REQUIRED or dtypes is REQUIRED or batch_size is REQUIRED:
            refuse_in_place(self, unknown, shapes, dtypes, batch_size)
        objs = self._placer(fmt).batched_allocate(shapes, dtypes, batch_size, fmt)
        index = self._index
        if index is not None and objs:
            for obj in objs:
                if obj.__class__ is TensorMemoryObj:
                    _record_or_free(index, obj)
        return objs

    def free(
        self, memory_obj: MemoryObj = REQUIRED, allocator_type: str | None = None, **unknown: Any
    ) -> None:
        """Free one object now (see :meth:`MemoryPool.free`); its index entry goes first."""
        if unknown or memory_obj is REQUIRED:
            refuse_in_place(self, unknown, memory_obj)
        index = self._index
        if index is not None and memory_obj.__class__ is TensorMemoryObj:
            index.forget(memory_obj)
        # MemoryPool.free's work without its check.
        if memory_obj.__class__ is not TensorMemoryObj and self._is_byte_buffer(memory_obj):
            return
        self.allocator.free(memory_obj)

    def batched_free(
        self,
        memory_objs: list[MemoryObj] = REQUIRED,
        allocator_type: str | None = None,
        update_stats: bool = True,
        **unknown: Any,
    ) -> None:
        """Free each object once (see :meth:`MemoryPool.batched_free`); index entries go first."""
        if unknown or memory_objs is REQUIRED:
            refuse_in_place(self, unknown, memory_objs)
        objs = self._pool_objects(memory_objs)
        index = self._index
        if index is not None:
            for obj in objs:
                if obj.__class__ is TensorMemoryObj:
                    index.forget(obj)
        self.allocator.batched_free(objs)

    def publish(self, key: str, memory_obj: MemoryObj) -> None:
        """Describe ``memory_obj`` under ``key`` in the shared index.

        Another process then finds it with ``attach_pool(name).tensor(key)``
        (or ``.entry(key)``).  A key names one object at a time: publishing
        it again moves it.  Every object is already described by its
        offset; the key is for readers that know names, not offsets.

        Args:
            key: 1 to 56 bytes of UTF-8.
            memory_obj: a live object of this pool.

        Raises:
            FeatureUnavailableError: the pool is not shared, or was made
                with ``shm_index_slots=0``.
            InvalidHandleError: the object is freed or not this pool's.
            InvalidArgumentError: a bad key, or a layout the index cannot
                describe.
        """
        index = self._index
        if index is None:
            raise FeatureUnavailableError(
                "publish needs a shared pool with an index: MixedMemoryAllocator(size, "
                "shm_name='/name') without shm_index_slots=0"
            )
        # The placing policy (contract field), not parent(): that is the pool.
        owner = getattr(memory_obj, "owner", None)
        if memory_obj.__class__ is not TensorMemoryObj or owner is not self.allocator:
            raise InvalidHandleError(f"{memory_obj!r} was not allocated by this pool")
        if not memory_obj.is_valid():
            raise InvalidHandleError(f"publish of a freed memory object {memory_obj!r}")
        index.record(memory_obj, key)


class AttachedPool:
    """Another process's shared pool, mapped by name (from :func:`kvpool.attach_pool`).

    Attributes:
        view: the pool's bytes as a writable ``memoryview`` (zero-copy);
            an object's bytes are ``view[obj.shm_offset :
            obj.shm_offset + obj.shm_byte_length]``.
        buffer: the same bytes as a flat ``torch.uint8`` tensor.
        size: bytes of the pool (without its index).
        indexed: True when the segment carries an object index, so that
            :meth:`tensor`, :meth:`tensors`, :meth:`entry` and
            :meth:`entries` work (False for a plain segment, or when only
            part of it was mapped).
        name: the segment's name.

    Methods ``tensor(where)``/``tensors(where)``/``entry(where)`` take a
    byte offset (``int``) or a key the creator published (``str``).
    ``close()`` (also ``with``) unmaps once no view is left; it never
    removes the segment.
    """

    def __init__(self, name: str, size: int | None = None, *, pin: str = "auto") -> None:
        self._backing = HostBacking.attach(name, size, pin=pin)
        self.name = name
        full: memoryview = self._backing.view  # type: ignore[assignment]
        self._reader: IndexReader | None = None
        footer = find_footer(full) if size is None else None
        if footer is None:
            self.size = self._backing.size
            self.view: memoryview | None = full
            self.buffer = self._backing.tensor
        else:
            start, pool_bytes = footer
            self._reader = IndexReader(full, start, pool_bytes)
            self.size = pool_bytes
            self.view = full[:pool_bytes]
            self.buffer = self._backing.tensor[:pool_bytes]

    @property
    def pinned(self) -> str:
        """How the mapping is pinned in this process ("none", "mlock", "cuda-register")."""
        return self._backing.buffer.pinned

    @property
    def indexed(self) -> bool:
        """True when the segment carries an object index."""
        return self._reader is not None

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._backing.closed

    def _index(self) -> IndexReader:
        if self._backing.closed:
            raise InvalidHandleError(f"the attached pool {self.name!r} was closed")
        if self._reader is None:
            raise FeatureUnavailableError(
                f"{self.name!r} has no object index (a segment not made by a kvpool shared "
                "pool, one made with shm_index_slots=0, or attached with a size): read its "
                "bytes from .view"
            )
        return self._reader

    def entry(self, where: int | str) -> IndexEntry:
        """What the index says about the object at offset ``where`` (or keyed ``where``).

        Raises:
            InvalidHandleError: no such object in the index, or the pool
                was closed.
            FeatureUnavailableError: the segment has no index.
            InvalidArgumentError: ``where`` is neither an int nor a str.
        """
        index = self._index()
        if isinstance(where, str):
            entry = index.entry_named(where)
            what = f"key {where!r}"
        elif isinstance(where, int) and not isinstance(where, bool):
            entry = index.entry_at(where)
            what = f"offset {where}"
        else:
            raise InvalidArgumentError(
                f"give a byte offset (int) or a published key (str), got {where!r}"
            )
        if entry is None:
            raise InvalidHandleError(
                f"no object at {what} in {self.name!r}'s index: the creator has not placed "
                "(or published) one there, or freed it"
            )
        return entry

    def entries(self) -> list[IndexEntry]:
        """Every object the index describes, by offset.

        Raises:
            FeatureUnavailableError: the segment has no index.
        """
        return self._index().entries()

    def tensors(self, where: int | str) -> list[torch.Tensor]:
        """Zero-copy tensors of each group of an object, with their shapes and dtypes.

        Raises:
            As :meth:`entry`.
        """
        entry = self.entry(where)
        view = self.view
        if view is None:
            raise InvalidHandleError(f"the attached pool {self.name!r} was closed")
        out = []
        at = entry.offset
        for shape, dtype in zip(entry.shapes, entry.dtypes, strict=True):
            count = shape.numel()
            if count:
                # frombuffer, not a slice of ``buffer``: a group need not start
                # at a multiple of its dtype's size.  The tensor holds the view.
                flat = torch.frombuffer(view, dtype=dtype, count=count, offset=at)
                out.append(flat.view(shape))
            else:
                out.append(torch.empty(shape, dtype=dtype))
            at += count * dtype.itemsize
        return out

    def tensor(self, where: int | str) -> torch.Tensor:
        """A zero-copy tensor of a one-group object, with its shape and dtype.

        Raises:
            InvalidArgumentError: the object has several groups (use
                :meth:`tensors`).
            As :meth:`entry`.
        """
        groups = self.tensors(where)
        if len(groups) != 1:
            raise InvalidArgumentError(
                f"the object at {where!r} has {len(groups)} groups; use tensors({where!r})"
            )
        return groups[0]

    def describe(self) -> dict[str, Any]:
        """Kind, size, pinning and name of the mapping."""
        info = dict(self._backing.describe())
        info["size"] = self.size
        info["indexed"] = self.indexed
        return info

    def close(self) -> None:
        """Unmap (views made earlier keep the mapping until they go).  Idempotent."""
        if self._reader is not None:
            self._reader.close()
        self.view = None
        self.buffer = _EMPTY
        self._backing.close()

    def __enter__(self) -> AttachedPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<AttachedPool {self.name!r} {state} size={self.size} indexed={self.indexed}>"
