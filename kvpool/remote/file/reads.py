"""The read side of FileStore: ``get`` and ``batched_get``, and the reads they stand on.

A get whose layout is given allocates, then ``open`` (+ ``fstat``,
``flock``, ``stat``) and one ``preadv([header, byte_array, 1 spare
byte])`` - one ``pinmem_entry_read`` call (:mod:`kvpool.native.entry`),
with the GIL released: the kernel copies from the file into the new
object, the one copy - then the header, sizes and optional CRC are
checked.  Anything unusual (no room in the allocator, something other
than an entry at the name, a header that differs) frees the object and
goes the careful way (:mod:`kvpool.remote.file.careful`): the same steps
one by one in Python, which name what is wrong (or accept an entry
shorter than its layout).  Without the layout the header is read first
(one more ``pread``) and the stored layout is allocated.

A ``direct_io`` store reads a padded header and moves the payload with
``O_DIRECT`` (:mod:`kvpool.remote.file.direct`).  :class:`ReadCalls`, a
mixin of :class:`~kvpool.remote.file.store.FileStore`, holds these calls.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvpool.checks import refuse_unknown_keywords
from kvpool.errors import KVPoolError
from kvpool.formats import MemoryFormat
from kvpool.native import entry as entry_calls
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.base import Key, get_request, key_bytes, key_list
from kvpool.remote.counters import counted_calls
from kvpool.remote.file.careful import read_entry
from kvpool.remote.file.direct import ALIGN, is_full_padded
from kvpool.remote.file.io import open_entry
from kvpool.remote.file.parts import run_parts
from kvpool.remote.header import Layout, is_full_entry
from kvpool.remote.objects import allocator_for, destination, discard

__all__ = ["ReadCalls"]

# _get_direct's answer for "ask _get_careful".
_CAREFUL = object()


# A mixin is no RefusesUnknownKeywords subclass: guarded and counted here (counted_calls).
@counted_calls("get", "batched_get")
@refuse_unknown_keywords
class ReadCalls:
    """``get`` and ``batched_get`` of a FileStore, and the reads they stand on.

    A mixin of :class:`~kvpool.remote.file.store.FileStore` (see the module
    docstring), before :class:`~kvpool.remote.base.RemoteStore` among its
    bases: it uses the store's file names (``_path``, ``_bpath``,
    ``_bname``), messages (``_where``, ``_os_error``), settings, bound,
    batch parts and counters.
    """

    _direct: bool
    _bound: Any
    _path: Callable[[bytes], str]
    _bpath: Callable[[bytes], bytes]
    _bname: Callable[[bytes], bytes]
    _where: Callable[[str, bytes], str]
    _os_error: Callable[..., Exception]
    _bounds: Callable[[Sequence[Any], int], list[tuple[int, int]]]
    _nested: Callable[[Callable[..., Any]], Callable[..., Any]]
    _get_executor: Callable[[], Any]
    _check_open: Callable[[], None]
    counters: Any

    def get(
        self,
        key: Key,
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> MemoryObj | None:
        """Read ``key`` into a new object (see :meth:`RemoteStore.get`).

        With ``shapes``, ``dtypes`` and ``fmt`` all given: one ``preadv``
        reads the header into a small buffer and the bytes straight into
        the new object.  Otherwise the header is read first.

        Raises:
            InvalidArgumentError: bad key or arguments; the stored layout
                or format differs from the requested one.
            CorruptEntryError: truncated, trailing bytes, damaged header,
                payload CRC mismatch, or not a kvpool entry.
            OutOfMemoryError: the allocator is full.
            PoolClosedError: the allocator or the store was closed.
            RemoteStoreError: the file system refused.
        """
        kb = key_bytes(key)
        self._check_open()
        layout, fmt = get_request(allocator, shapes, dtypes, fmt)
        got: Any = _CAREFUL
        if layout is not None and fmt is not None:
            got = self._get_direct(kb, allocator, layout, fmt)
        if got is _CAREFUL:
            got = self._get_careful(kb, allocator, layout, fmt)
        if self._bound is not None and got is not None:
            self._bound.touch((self._bname(kb),), (True,))
        return got  # type: ignore[no-any-return]

    def _get_direct(
        self, kb: bytes, allocator: MemoryAllocatorInterface, layout: Layout, fmt: MemoryFormat
    ) -> MemoryObj | object | None:
        """The common get: allocate, then one C call (``pinmem_entry_read``) reads it all.

        Returns:
            The object, None (no entry), or ``_CAREFUL``: anything unusual -
            the allocator refused, something other than an entry is at the
            name, the header or size differs - is left to
            :meth:`_get_careful`, which opens the entry again and says what
            is wrong (or accepts a narrowed entry).
        """
        try:
            obj, view = destination(
                allocator_for(allocator, kb), layout, fmt, lambda: self._where("get", kb)
            )
        except KVPoolError:
            return _CAREFUL  # e.g. a full pool: a missing key must still give None
        return self._read_direct(kb, obj, view, layout, fmt)

    def _read_direct(
        self, kb: bytes, obj: MemoryObj, view: memoryview, layout: Layout, fmt: MemoryFormat
    ) -> MemoryObj | object | None:
        """Read ``kb``'s entry into ``obj`` (one C call); as :meth:`_get_direct`.

        ``obj`` is freed unless it is returned.
        """
        try:
            if self._direct:
                return self._read_aligned(kb, obj, view, layout, fmt)
            header = bytearray(layout.header_size)
            outcome, n = entry_calls.read_entry(self._bpath(kb), header, view)
            if outcome == entry_calls.READ:
                if n == layout.header_size + layout.nbytes and is_full_entry(
                    header, layout, fmt, view
                ):
                    return obj
            elif outcome == entry_calls.MISSING:
                discard(obj, view)
                return None
        except BaseException as exc:
            discard(obj, view)
            if isinstance(exc, OSError) and not isinstance(exc, KVPoolError):
                raise self._os_error(exc, "get", kb) from exc
            raise
        discard(obj, view)
        return _CAREFUL

    def _read_aligned(
        self, kb: bytes, obj: MemoryObj, view: memoryview, layout: Layout, fmt: MemoryFormat
    ) -> MemoryObj | object | None:
        """:meth:`_read_direct` of a ``direct_io`` store: a padded header, ``O_DIRECT``.

        Raises what the read raises; the caller frees ``obj`` then.
        """
        header = bytearray(-(-layout.header_size // ALIGN) * ALIGN)
        stamp = entry_calls.new_stamp()
        outcome, n = entry_calls.read_entry(
            self._bpath(kb), header, view, entry_calls.DIRECT, stamp
        )
        if outcome == entry_calls.READ:
            if not stamp.direct:
                self.counters.observe("get_buffered", 0.0, nbytes=view.nbytes)
            whole = n == len(header) + layout.nbytes
            if whole and is_full_padded(header, layout, fmt, view):
                return obj
        elif outcome == entry_calls.MISSING:
            discard(obj, view)
            return None
        discard(obj, view)
        return _CAREFUL

    def batched_get(
        self,
        keys: Sequence[Key],
        allocator: MemoryAllocatorInterface,
        shapes: torch.Size | Sequence[torch.Size] | None = None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None = None,
        fmt: MemoryFormat | None = None,
    ) -> list[MemoryObj | None]:
        """``get`` of each key (see :meth:`RemoteStore.batched_get`).

        With the layout given, every destination is allocated first, then
        the entries are read one after the other, one C call each: the
        pool's Python work is not interleaved with the copies, which evict
        it from the CPU caches.  A pool that fills up part way leaves the
        rest to single gets, so a batch needs no more room than its
        entries.  With ``io_threads`` > 1 a large batch is split into
        parts read at once, as :meth:`batched_put` splits.

        It raises what :meth:`get` raises; every object this call allocated is freed first.
        """
        kbs = key_list(keys)
        self._check_open()
        layout, req_fmt = get_request(allocator, shapes, dtypes, fmt)
        if layout is None or req_fmt is None or len(kbs) < 2:
            return super().batched_get(keys, allocator, shapes, dtypes, fmt)
        request = (allocator, layout, req_fmt, shapes, dtypes, fmt)
        bounds = self._bounds(kbs, len(kbs) * layout.nbytes)
        if len(bounds) < 2:
            out = self._read_batch(kbs, *request)
        else:
            parts = [(kbs[a:b], *request) for a, b in bounds]
            outcomes = run_parts(self._get_executor(), self._nested(self._read_batch), parts)
            failed = [o for o in outcomes if isinstance(o, BaseException)]
            if failed:
                for part in outcomes:
                    for obj in part if isinstance(part, list) else ():
                        discard(obj)
                raise failed[0]
            out = [obj for part in outcomes for obj in part]
        if self._bound is not None:
            self._bound.touch([self._bname(kb) for kb in kbs], [o is not None for o in out])
        return out

    def _read_batch(
        self,
        kbs: list[bytes],
        allocator: MemoryAllocatorInterface,
        layout: Layout,
        req_fmt: MemoryFormat,
        shapes: torch.Size | Sequence[torch.Size] | None,
        dtypes: torch.dtype | Sequence[torch.dtype] | None,
        fmt: MemoryFormat | None,
    ) -> list[MemoryObj | None]:
        """Allocate every destination, then read the entries back to back (see batched_get)."""
        # Destinations waiting for their read.  Each leaves the deque when it
        # goes to _read_direct (which frees it unless it returns it), and no
        # local keeps its view: a freed destination's bytes are reusable at
        # once by the single gets that follow.
        ready: deque[tuple[MemoryObj, memoryview]] = deque()
        out: list[MemoryObj | None] = []
        try:
            for kb in kbs:
                try:
                    ready.append(
                        destination(
                            allocator_for(allocator, kb),
                            layout,
                            req_fmt,
                            lambda kb=kb: self._where("get", kb),
                        )
                    )
                except KVPoolError:
                    break  # no room (or another refusal): single gets say what
            for kb in kbs:
                if ready:
                    got = self._read_direct(kb, *ready.popleft(), layout, req_fmt)
                    if got is _CAREFUL:
                        got = self._get_careful(kb, allocator, layout, req_fmt)
                else:
                    got = self.get(kb, allocator, shapes, dtypes, fmt)
                out.append(got)  # type: ignore[arg-type]
        except BaseException:
            for obj, view in ready:
                discard(obj, view)
            for got in out:
                discard(got)
            raise
        return out

    def _get_careful(
        self,
        kb: bytes,
        allocator: MemoryAllocatorInterface,
        layout: Layout | None,
        fmt: MemoryFormat | None,
    ) -> MemoryObj | None:
        """A get step by step in Python (:mod:`kvpool.remote.file.careful`): every error named.

        It reads through the page cache, also in a ``direct_io`` store
        (counted there as ``get_buffered``).
        """
        fd = self._open_entry(kb, "get")
        if fd is None:
            return None
        try:
            keyed = allocator_for(allocator, kb)
            got = read_entry(fd, keyed, layout, fmt, lambda: self._where("get", kb))
        except OSError as exc:
            if isinstance(exc, KVPoolError):
                raise
            raise self._os_error(exc, "get", kb) from exc
        finally:
            os.close(fd)
        if self._direct:
            self.counters.observe("get_buffered", 0.0, nbytes=got.get_size())
        return got

    def _open_entry(self, kb: bytes, action: str) -> int | None:
        """The careful open of ``kb``'s entry (:func:`~kvpool.remote.file.io.open_entry`).

        Returns:
            The descriptor, under ``LOCK_SH`` (the caller closes it), or
            None: no entry.

        Raises:
            CorruptEntryError: something other than an entry is at the name.
            RemoteStoreError: the file system refused, or the entry kept
                being replaced.
        """
        try:
            return open_entry(self._path(kb), lambda: self._where(action, kb))
        except OSError as exc:
            if isinstance(exc, KVPoolError):
                raise
            raise self._os_error(exc, action, kb) from exc
