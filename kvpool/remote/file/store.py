"""FileStore: one file per entry in a directory (the embedded default store).

Each entry is a file holding the header (:mod:`kvpool.remote.header`) and
the object's bytes.  On ``/dev/shm`` (tmpfs) the store lives in memory and
is shared by every process of the machine; on a disk directory it
survives restarts (``durable=True`` adds the fsyncs that make it survive
a power cut).

How the bytes move (the system calls of a put, and of a get whose layout
is given, are made by one libpinmem call each - ``pinmem_entry_write`` and
``pinmem_entry_read``, see :mod:`kvpool.native.entry` - with the GIL
released; the steps are these):

* ``put``: ``open(O_CREAT|O_EXCL)`` of a temporary file, one
  ``writev([header, byte_array])`` (the kernel copies from the pool
  memory into the file: no copy in Python), ``close``, then ``rename``
  onto the entry's name.  The rename is atomic: a reader sees the old
  entry or the new one, never part of one.  A writer killed before the
  rename leaves only a temporary file, which no reader looks at and
  :meth:`FileStore.cleanup_temp` removes.
* Reused files (``reuse_files=True``, the default): creating a file on
  tmpfs allocates its pages and replacing one frees the old pages, which
  costs about as much as copying the bytes.  So a put replaces an entry
  with ``renameat2(RENAME_EXCHANGE)`` instead of ``rename``: the replaced
  file keeps its pages under the temporary name and becomes a *spare* that
  the next put overwrites (``pwritev`` + ``ftruncate``) and swaps in the
  same way.  Safety for readers: a writer rewrites a spare only while it
  holds ``flock(LOCK_EX | LOCK_NB)`` on it (else it drops the spare and
  writes a new file), and a reader takes ``LOCK_SH`` after ``open`` and then
  checks that its file is still the one under the entry's name (if not -
  swapped out, perhaps rewritten for another key - it opens the name
  again).  So a reader always reads one whole entry of its key.  Spares are
  ``.tmp-`` files: invisible to readers, removed by ``close`` and by
  :meth:`FileStore.cleanup_temp` once their process is gone.
* ``get`` with the layout given: allocate, then one ``preadv([header,
  byte_array, 1 spare byte])`` (the kernel copies from the file into the
  new object: the one copy), then the header, sizes and optional CRC are
  checked; anything unusual goes the careful way, step by step in Python
  (:mod:`kvpool.remote.file.reads`, the read side).

Hostile files: every entry and spare is opened with ``O_NOFOLLOW |
O_NONBLOCK`` (a symlink is refused, a FIFO or device cannot block the
call) and used only when ``fstat`` shows a regular file with exactly one
link, owned by this process's user.  Anything else at an entry's name is
a :class:`~kvpool.errors.CorruptEntryError`; anything else at a spare's
name is discarded (the name is unlinked, the file it points to is never
written).  So neither a symlink nor a hard link planted in the directory
makes a store read or write a file outside it.

Key to file name: ``"k"`` + the key percent-encoded, or ``"h"`` + its
SHA-256 for a long key (:mod:`kvpool.remote.file.names`: no key can reach
outside the directory).  Temporary files start with ``.tmp-``.

A bounded store (``max_bytes``) keeps an index of its entries, least
recently used first (:mod:`kvpool.remote.file.bound`): built at open
from the directory, updated by its puts, deletes and ``delete_prefix``,
and by the hits of ``get``, ``batched_get``, ``exists`` and
``batched_exists``.  A put that takes the total over the bound evicts the
least recently used entries (:mod:`kvpool.remote.file.evict`).  With
``direct_io`` the bytes move with ``O_DIRECT`` (:mod:`kvpool.remote.file.direct`).
Rows of registered host memory move by address, with no memory objects
(``put_ranges``, ``get_ranges``: :mod:`kvpool.remote.file.ranges`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from kvpool.checks import check_bool, check_callable, check_seconds, check_size
from kvpool.errors import (
    CorruptEntryError,
    InvalidArgumentError,
    KVPoolError,
    RemoteStoreError,
)
from kvpool.native import entry as entry_calls
from kvpool.pool.objects import MemoryObj
from kvpool.remote.base import (
    Key,
    RemoteStore,
    check_pairs,
    key_bytes,
    key_list,
    prefix_bytes,
    raise_first,
)
from kvpool.remote.file.bound import Bound, scan
from kvpool.remote.file.careful import read_header
from kvpool.remote.file.direct import padded, probe
from kvpool.remote.file.directory import make_store_directory
from kvpool.remote.file.evict import Evictor
from kvpool.remote.file.io import CLOEXEC
from kvpool.remote.file.names import entry_name, plain_name, remove_prefix
from kvpool.remote.file.parts import batch_nbytes, run_parts, split_bounds
from kvpool.remote.file.ranges import RangeCalls
from kvpool.remote.file.reads import ReadCalls
from kvpool.remote.file.spares import Spares, remove_dead_temp, temp_name
from kvpool.remote.header import EntryInfo
from kvpool.remote.objects import encode_entry, hold, release
from kvpool.remote.ranges import RangeTable

__all__ = ["FileStore"]

_R = TypeVar("_R")


# ReadCalls before RemoteStore: its get and batched_get are the store's.
class FileStore(ReadCalls, RemoteStore, RangeCalls):
    """A store of one file per entry in ``directory``.

    Args:
        directory: where the entries live; created if missing when its
            parent exists (see ``make_parents``).  ``/dev/shm/...`` keeps
            them in memory.
        checksum: record a CRC-32 of every payload on ``put`` (and check
            it on ``get`` whenever an entry has one).  It costs a pass over
            the bytes (about 2.5 GB/s on the development VM); without it,
            truncation and header damage are still detected, but not a
            flipped payload byte.
        durable: fsync each file before its rename and the directory
            after it (for disk directories; pointless on tmpfs).
        io_threads: threads for the batched forms (1: the caller's thread).
        reuse_files: let ``put`` overwrite the file of an entry it replaced
            earlier instead of creating a new one (tmpfs then allocates and
            frees no pages: puts are about twice as fast).  Readers stay
            safe (see the module notes).  Off with ``durable``.
        cleanup_temp_age_s: at start, remove temporary files of dead
            writers older than this many seconds (None: leave them).
        make_parents: also create the directory's missing parents.  Off by
            default, so a mistyped path (``/srv/kvcahce/x``) is an error
            naming the missing parent rather than a new tree of folders.
        max_bytes: bound the bytes of the entries (their files, headers
            included): a put that takes the total over it evicts the least
            recently used entries (see "Bounded stores" below).  None
            (default): no bound, no index.
        on_evict: with ``max_bytes``, called with the list of keys (bytes)
            whose entries an eviction removed, once per call that evicted,
            in the thread that evicted (a put's, or an I/O thread of a
            batch); it should be quick and must not call the store.  An
            exception it raises is counted and logged once, and does not
            fail the put.
        direct_io: move the bytes with ``O_DIRECT`` (the page cache
            bypassed, for a disk directory; see "Direct I/O" below).  The
            file system is probed at open.

    Raises:
        InvalidArgumentError: ``directory`` is not a path, exists and is
            not a directory, or its parent is missing (without
            ``make_parents``); ``max_bytes`` is not a positive int;
            ``on_evict`` is not callable or comes without ``max_bytes``.
        FeatureUnavailableError: ``direct_io`` on a file system that
            refuses ``O_DIRECT`` (the message names the directory and the fix).
        RemoteStoreError: the directory cannot be created or listed.

    Thread safety: all methods may run in several threads and processes
    at once; concurrent ``put`` of one key leaves one of the entries whole.

    Bounded stores: the index holds the entries found in the directory at
    open (oldest first by their files' times) and those this store wrote
    since; hits move an entry to the most recently used end; a put that
    takes the total over ``max_bytes`` evicts from the other end, never
    an entry that a batched put in flight is writing, and never an entry
    another process rewrote since this one recorded it (that one is left
    in place and leaves this index).  A directory found over the bound is
    brought under it by the next put, so a store that only reads never
    removes anything.  An entry larger than ``max_bytes`` is refused
    (``InvalidArgumentError``).  Each process keeps its own index, so
    with several processes writing one directory the bound holds per
    process: the directory holds at most the sum of their bounds (give
    each its share for one bound over all).  While puts are in flight the
    directory also holds their new files, and up to ``io_threads + 1``
    spare files of ``reuse_files`` (neither counted).  Evictions and the
    entries ``on_evict`` got are counted under ``evict`` in ``counters``.

    Direct I/O: a put or get whose payload's address and length are
    multiples of 4096 (page-aligned rows) moves it with ``O_DIRECT``; the
    header is padded to 4096 bytes so the payload stays aligned in the
    file (entries stay readable by stores opened without ``direct_io``,
    and the other way round).  Unaligned payloads go through the page
    cache, counted as ``put_buffered`` and ``get_buffered``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        checksum: bool = False,
        durable: bool = False,
        io_threads: int = 1,
        reuse_files: bool = True,
        cleanup_temp_age_s: float | None = 60.0,
        make_parents: bool = False,
        max_bytes: int | None = None,
        on_evict: Callable[[list[bytes]], object] | None = None,
        direct_io: bool = False,
    ) -> None:
        checksum = check_bool("checksum", checksum)
        durable = check_bool("durable", durable)
        reuse_files = check_bool("reuse_files", reuse_files)
        direct_io = check_bool("direct_io", direct_io)
        if cleanup_temp_age_s is not None:
            cleanup_temp_age_s = check_seconds(
                "cleanup_temp_age_s", cleanup_temp_age_s, allow_none=True, allow_zero=True
            )
        if max_bytes is not None:
            max_bytes = check_size(
                "max_bytes", max_bytes, fix="give the bound in bytes, or None for no bound"
            )
        check_callable("on_evict", on_evict, allow_none=True)
        if on_evict is not None and max_bytes is None:
            raise InvalidArgumentError(
                "on_evict is called when a bounded store evicts, and this store has no bound; "
                "give max_bytes too, or leave on_evict out"
            )
        super().__init__(io_threads)
        try:
            path = os.fspath(directory)
        except TypeError:
            raise InvalidArgumentError(
                f"directory must be a path, got {type(directory).__name__}"
            ) from None
        if not isinstance(path, str) or not path:
            raise InvalidArgumentError(f"directory must be a non-empty str path, got {path!r}")
        if "\0" in path:
            raise InvalidArgumentError(f"directory {path!r} contains a NUL byte; no path can")
        make_store_directory(path, check_bool("make_parents", make_parents))
        self.directory = os.path.abspath(path)
        self._prefix = self.directory + os.sep
        self._bprefix = os.fsencode(self._prefix)
        self._checksum = checksum
        self._durable = durable
        self._seq = itertools.count()
        # Spare files: replaced entries kept to be overwritten by later puts.
        self._reuse = reuse_files and not self._durable
        self._spares = Spares(io_threads + 1)
        if cleanup_temp_age_s is not None:
            self.cleanup_temp(cleanup_temp_age_s)
        self._registered = RangeTable()
        self._direct = direct_io
        if direct_io:
            probe(self.directory)
        self._bound: Bound | None = None
        self._evictor: Evictor | None = None
        if max_bytes is not None:
            self._bound = Bound(max_bytes)
            self._bound.load(scan(self.directory))
            self._evictor = Evictor(
                self._bound,
                self._bprefix,
                self._seq,
                self._spares,
                self.counters,
                on_evict,
                repr(self),
            )

    @property
    def bound(self) -> Bound | None:
        """The index of a bounded store (``max_bytes``), or None.

        Its ``used`` bytes, ``max_bytes``, ``len()`` (entries) and
        ``problems()`` (broken invariants, for tests) describe what this
        process knows of the directory (see "Bounded stores").
        """
        return self._bound

    # -- names -------------------------------------------------------

    def path(self, key: Key) -> str:
        """The file that holds (or would hold) the entry ``key``.

        Raises:
            InvalidArgumentError: bad key.
        """
        return self._path(key_bytes(key))

    def _path(self, kb: bytes) -> str:
        return self._prefix + entry_name(kb)

    def _bpath(self, kb: bytes) -> bytes:
        """``_path(kb)`` as bytes, for the C calls (no decode for a plain key)."""
        return self._bprefix + self._bname(kb)

    @staticmethod
    def _bname(kb: bytes) -> bytes:
        """The entry's file name as bytes (the bound's index is keyed by it)."""
        if plain_name(kb):
            return b"k" + kb
        return os.fsencode(entry_name(kb))

    def _where(self, action: str, kb: bytes | None) -> str:
        if kb is None:
            return f"{action} on {self!r}"
        return f"{action} {kb!r} ({self._path(kb)})"

    def _os_error(self, exc: OSError, action: str, kb: bytes) -> RemoteStoreError:
        return RemoteStoreError(
            exc.errno,
            f"{self._where(action, kb)}: {exc.strerror or exc} ({type(exc).__name__})",
        )

    # -- put ---------------------------------------------------------

    def put(self, key: Key, memory_obj: MemoryObj) -> None:
        """Store ``memory_obj`` under ``key`` (see :meth:`RemoteStore.put`).

        One ``writev`` of header and bytes into a new temporary file (or
        one ``pwritev`` into a reused spare file), then one atomic rename
        (or exchange) onto the entry's name; no copy in Python.

        Raises:
            InvalidArgumentError: bad key or object.
            InvalidHandleError: the object was freed.
            PoolClosedError: the store was closed.
            RemoteStoreError: the file system refused (full, read-only...).
        """
        kb = key_bytes(key)
        self._check_open()
        evicted: list[bytes] = []
        hold(memory_obj, "put")
        try:
            header, view = encode_entry(memory_obj, self._checksum)
            self._write(self._bname(kb), header, view, kb, evicted)
        finally:
            release(memory_obj)
            if evicted:
                self._evictor.report(evicted)  # type: ignore[union-attr]

    def batched_put(self, keys: Sequence[Key], memory_objs: Sequence[MemoryObj]) -> None:
        """``put`` of each pair (see :meth:`RemoteStore.batched_put`).

        Every pair is prepared first - the object held, its layout
        described, its header encoded - and then the entries are written
        back to back, one C call each, in order (a key named twice ends
        with its last object): the Python work is not interleaved with the
        copies, which evict it from the CPU caches.  With ``io_threads`` > 1
        a large batch of distinct keys is split into parts written at once,
        the first in the caller's thread (:mod:`kvpool.remote.file.parts`);
        the call returns once every part has ended.  A pair that cannot be
        prepared (a freed object, a device object) is skipped; the others
        are still written, then the first error in the batch's order is
        raised.

        Raises:
            InvalidArgumentError: the lists differ in length (nothing is
                stored), or as :meth:`put`.

        It raises any error of :meth:`put`.
        """
        check_pairs(keys, memory_objs)
        if len(memory_objs) < 2:
            return super().batched_put(keys, memory_objs)
        self._check_open()
        keys, objs = list(keys), list(memory_objs)
        with self._guard(keys):
            bounds = self._bounds(keys, batch_nbytes(objs))
            if len(bounds) < 2:
                raise_first(self._write_batch(keys, objs))
                return None
            parts = [(keys[a:b], objs[a:b]) for a, b in bounds]
            outcomes = run_parts(self._get_executor(), self._nested(self._write_batch), parts)
            flat = [r for part in outcomes for r in (part if isinstance(part, list) else [part])]
            raise_first(flat)
        return None

    @contextlib.contextmanager
    def _guard(self, keys: Sequence[Key]) -> Iterator[None]:
        """Keep a batched put's entries from eviction while it runs (a bounded store).

        When it ends, the entries then over the bound are evicted and
        reported in this thread (:meth:`_protect`, :meth:`_release`).
        """
        names = self._protect(keys)
        try:
            yield
        finally:
            self._release(names)

    def _protect(self, keys: Sequence[Key]) -> list[bytes]:
        """Keep the entries of ``keys`` from eviction; their names, for :meth:`_release`.

        :class:`~kvpool.remote.file.aio.AsyncFileStore` guards the batches
        it splits this way, releasing them in a worker thread.
        """
        bound = self._bound
        if bound is None:
            return []
        names = []
        for key in keys:
            with contextlib.suppress(KVPoolError):  # a bad key fails its own pair
                names.append(self._bname(key_bytes(key)))
        bound.protect(names)
        return names

    def _release(self, names: list[bytes]) -> None:
        """End :meth:`_protect`: evict the entries then over the bound and report them, here."""
        bound = self._bound
        if bound is None:
            return
        evicted: list[bytes] = []
        try:
            self._evictor.remove(bound.release(names), self._reuse, evicted)  # type: ignore[union-attr]
        finally:
            self._evictor.report(evicted)  # type: ignore[union-attr]

    def _bounds(self, keys: Sequence[Key], nbytes: int) -> list[tuple[int, int]]:
        """The parts a batch is split into: one without I/O threads or with a repeated key."""
        if self._io_threads < 2 or len(set(keys)) != len(keys):
            return [(0, len(keys))]
        return split_bounds(len(keys), nbytes, self._io_threads)

    def _nested(self, fn: Callable[..., _R]) -> Callable[..., _R]:
        """``fn`` for a part in another thread: its calls count as the batch's (not again)."""
        return lambda *args: self.counters.run_nested(lambda a: fn(*a), args)

    def _write_batch(self, keys: Sequence[Key], objs: Sequence[MemoryObj]) -> list[Any]:
        """Prepare every pair, then write them back to back; each pair's error or None."""
        held: list[MemoryObj] = []
        results: list[Exception | None] = [None] * len(objs)
        ready: list[tuple[int, bytes, bytes, bytes, memoryview]] = []
        evicted: list[bytes] = []
        try:
            for i, (key, obj) in enumerate(zip(keys, objs, strict=True)):
                try:
                    kb = key_bytes(key)
                    hold(obj, "batched_put")
                except Exception as exc:
                    results[i] = exc
                    continue
                held.append(obj)
                try:
                    header, view = encode_entry(obj, self._checksum)
                except Exception as exc:
                    results[i] = exc
                    continue
                ready.append((i, kb, self._bname(kb), header, view))
            for i, kb, name, header, view in ready:
                try:
                    self._write(name, header, view, kb, evicted)
                except Exception as exc:
                    results[i] = exc
        finally:
            for obj in held:
                release(obj)
            if evicted:
                self._evictor.report(evicted)  # type: ignore[union-attr]
        return results

    def _write(
        self,
        name: bytes,
        header: bytes,
        data: memoryview | int,
        kb: bytes,
        evicted: list[bytes],
        nbytes: int | None = None,
    ) -> None:
        """Write the entry (one C call: ``pinmem_entry_write``) into a spare or a new file.

        ``data`` is the payload's bytes, or with ``nbytes`` its address
        (a registered range).  A bounded store then records the entry and
        evicts what no longer fits, adding the keys evicted to ``evicted``
        (the caller reports them).
        """
        path = self._bprefix + name
        size = data.nbytes if nbytes is None else nbytes  # type: ignore[union-attr]
        direct = entry_calls.DIRECT if self._direct else 0
        if direct:
            header = padded(header)
        bound = self._bound
        if bound is None:
            stamp = entry_calls.new_stamp() if direct else None
            self._place(path, header, data, nbytes, kb, direct, stamp)
        else:
            if len(header) + size > bound.max_bytes:
                raise InvalidArgumentError(
                    f"{self._where('put', kb)}: the entry takes {len(header) + size} "
                    f"bytes (header included), more than the store's max_bytes of "
                    f"{bound.max_bytes}; raise max_bytes, or store smaller chunks"
                )
            stamp = entry_calls.new_stamp()
            # The key's lock: the index records one key's files in the order
            # they got its name, and a delete of the key is not in between.
            with bound.lock_for(name):
                self._place(path, header, data, nbytes, kb, direct, stamp)
                victims = bound.stored(name, kb, entry_calls.stamp_of(stamp))
            self._evictor.remove(victims, self._reuse, evicted)  # type: ignore[union-attr]
        if direct and not stamp.direct:
            self.counters.observe("put_buffered", 0.0, nbytes=size)
        if self._durable:
            # Once the entry is recorded: a failed fsync still leaves the
            # renamed file in place, and the bound must count it.
            self._sync_directory(kb)

    def _place(
        self,
        path: bytes,
        header: bytes,
        data: memoryview | int,
        nbytes: int | None,
        kb: bytes,
        direct: int,
        stamp: Any,
    ) -> None:
        """The C write of :meth:`_write`: into a spare, or a new temporary file, then renamed.

        With ``durable`` the caller then syncs the directory (see :meth:`_write`).
        """
        write = entry_calls.write_entry
        try:
            if self._reuse:
                spare = self._spares.take()
                if spare is not None:
                    flags = entry_calls.SPARE | entry_calls.EXCHANGE | direct
                    outcome = write(spare, path, header, data, flags, stamp, nbytes)
                    if outcome != entry_calls.SPARE_UNUSABLE:
                        if outcome == entry_calls.SWAPPED:
                            self._spares.give(spare)  # it now names the entry this put replaced
                        return
                    # Missing, not ours to write, or a reader still on it: discarded.
            tmp = temp_name(self._bprefix, next(self._seq))
            flags = (
                (entry_calls.EXCHANGE if self._reuse else 0)
                | (entry_calls.SYNC if self._durable else 0)
                | direct
            )
            outcome = write(tmp, path, header, data, flags, stamp, nbytes)
        except OSError as exc:
            if isinstance(exc, KVPoolError):
                raise
            raise self._os_error(exc, "put", kb) from exc
        if outcome == entry_calls.SWAPPED:
            self._spares.give(tmp)  # tmp now names the replaced entry
        elif outcome == entry_calls.RENAMED_NO_EXCHANGE:
            self._reuse = False  # this file system cannot exchange

    def _close(self) -> None:
        self._spares.close()
        self._registered.clear()  # the store no longer keeps registered memory alive

    def _sync_directory(self, kb: bytes) -> None:
        try:
            dfd = os.open(self.directory, os.O_RDONLY | CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            raise self._os_error(exc, "put (directory fsync)", kb) from exc

    # -- the rest ----------------------------------------------------

    def exists(self, key: Key) -> bool:
        """True when a file for ``key`` exists (see :meth:`RemoteStore.exists`).

        In a bounded store a hit makes the entry the most recently used.
        """
        kb = key_bytes(key)
        self._check_open()
        found = self._exists(kb)
        if self._bound is not None and found:
            self._bound.touch((self._bname(kb),), (True,))
        return found

    def _exists(self, kb: bytes) -> bool:
        try:
            os.stat(self._bpath(kb), follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._os_error(exc, "exists", kb) from exc
        return True

    def batched_exists(self, keys: Sequence[Key]) -> list[bool]:
        """``exists`` of each key, in order (one ``stat`` each).

        In a bounded store the hits become the most recently used, in the
        keys' order.

        It raises what :meth:`exists` raises.
        """
        kbs = key_list(keys)
        self._check_open()
        found = [self._exists(kb) for kb in kbs]
        if self._bound is not None:
            self._bound.touch([self._bname(kb) for kb in kbs], found)
        return found

    def delete(self, key: Key) -> bool:
        """Remove the file of ``key`` (see :meth:`RemoteStore.delete`).

        A reader that already opened the file still reads the whole entry.
        """
        kb = key_bytes(key)
        self._check_open()
        try:
            if self._bound is None:
                os.unlink(self._bpath(kb))
            else:
                self._unlink_recorded(self._bpath(kb), self._bname(kb))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._os_error(exc, "delete", kb) from exc
        return True

    def delete_prefix(self, prefix: Key) -> int:
        """Remove every entry whose key starts with ``prefix``; how many were removed.

        As :meth:`RemoteStore.delete_prefix`: one pass over the directory's
        names, unlinking the matching files (a reader that opened one still
        reads it whole).  O(files in the directory), no timeout: local
        I/O.  An entry stored under a digest name (a key over about 199
        characters once percent-encoded) is not matched
        (:mod:`kvpool.remote.file.names`).

        Raises:
            RemoteStoreError: the directory cannot be listed or a file unlinked.
        """
        pb = prefix_bytes(prefix)
        self._check_open()
        if self._bound is None:
            return remove_prefix(self.directory, pb)
        return remove_prefix(
            self.directory, pb, lambda path, name: self._unlink_recorded(path, os.fsencode(name))
        )

    def _unlink_recorded(self, path: str | bytes, name: bytes) -> None:
        """Unlink an entry's file and drop its record: one step for the key's other calls."""
        bound: Bound = self._bound  # type: ignore[assignment]
        with bound.lock_for(name):
            try:
                os.unlink(path)
            except FileNotFoundError:
                bound.forget((name,))  # gone already: counted no longer
                raise
            bound.forget((name,))

    def head(self, key: Key) -> EntryInfo | None:
        """The stored header of ``key`` (see :meth:`RemoteStore.head`).

        Also checks that the file is exactly as long as the header says.

        Raises:
            CorruptEntryError: damaged header, or a file of the wrong length.
        """
        kb = key_bytes(key)
        self._check_open()
        fd = self._open_entry(kb, "head")
        if fd is None:
            return None
        try:
            info = read_header(fd, self._where("head", kb))
            file_size = os.fstat(fd).st_size
        except OSError as exc:
            if isinstance(exc, KVPoolError):
                raise
            raise self._os_error(exc, "head", kb) from exc
        finally:
            os.close(fd)
        if file_size != info.header_size + info.size:
            raise CorruptEntryError(
                f"{self._where('head', kb)}: the file has {file_size} bytes, its header "
                f"announces {info.header_size + info.size}"
            )
        return info

    def cleanup_temp(self, min_age_s: float = 60.0) -> int:
        """Remove temporary files left by writers that died before their rename.

        A temporary file is removed when the process that created it (its
        pid is in the name) no longer exists here and the file is at least
        ``min_age_s`` seconds old (a writer in another pid namespace may
        still be working on a younger one).

        Returns:
            The number of files removed.

        Raises:
            InvalidArgumentError: ``min_age_s`` is not a finite number >= 0.
            RemoteStoreError: the directory cannot be listed.
        """
        min_age_s = check_seconds("min_age_s", min_age_s, allow_zero=True)  # type: ignore[assignment]
        return remove_dead_temp(self.directory, min_age_s)

    def __repr__(self) -> str:
        return f"<FileStore {self.directory!r}{' closed' if self._closed else ''}>"
