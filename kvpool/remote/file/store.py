"""FileStore: one file per entry in a directory (the embedded default store).

Each entry is a file holding the header (:mod:`kvpool.remote.header`) and
the object's bytes.  On ``/dev/shm`` (tmpfs) the store lives in memory and
is shared by every process of the machine; on a disk directory it
survives restarts (``durable=True`` adds the fsyncs that make it survive
a power cut).

How the bytes move:

* ``put``: ``open(O_CREAT|O_EXCL)`` of a temporary file, one
  ``os.writev([header, byte_array])`` (the kernel copies from the pool
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
* ``get`` with the layout given: ``open`` (+ ``flock``, ``fstat``, ``stat``),
  allocate, one
  ``os.preadv([header, byte_array, 1 spare byte])`` (the kernel copies
  from the file into the new object: the one copy), then the header,
  sizes and optional CRC are checked; anything wrong frees the object
  and raises.  Without the layout the header is read first (one more
  ``pread``) and the stored layout is allocated.

Hostile files: every entry and spare is opened with ``O_NOFOLLOW |
O_NONBLOCK`` (a symlink is refused, a FIFO or device cannot block the
call) and used only when ``fstat`` shows a regular file with exactly one
link, owned by this process's user.  Anything else at an entry's name is
a :class:`~kvpool.errors.CorruptEntryError`; anything else at a spare's
name is discarded (the name is unlinked, the file it points to is never
written).  So neither a symlink nor a hard link planted in the directory
makes a store read or write a file outside it.

Key to file name: ``"k"`` + the key percent-encoded (every byte but
``A-Z a-z 0-9 _ . - ~``), or ``"h"`` + the SHA-256 of the key when that
name would be longer than 200 characters.  Names never contain ``/``,
never start with ``.`` and cannot be ``.``/``..``: no key can reach
outside the directory.  Temporary files start with ``.tmp-``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import os
import re
import stat
import threading
import time
import zlib
from collections.abc import Sequence
from urllib.parse import quote_from_bytes

import torch

from kvpool.checks import check_bool, check_seconds
from kvpool.errors import (
    CorruptEntryError,
    InvalidArgumentError,
    KVPoolError,
    RemoteStoreError,
)
from kvpool.formats import MemoryFormat
from kvpool.pool.interface import MemoryAllocatorInterface
from kvpool.pool.objects import MemoryObj
from kvpool.remote.base import (
    Key,
    RemoteStore,
    check_stored,
    describe,
    destination,
    discard,
    get_request,
    hold,
    key_bytes,
    release,
)
from kvpool.remote.file.io import (
    CLOEXEC,
    NOT_A_FILE,
    READ_FLAGS,
    SPARE_FLAGS,
    WRITE_FLAGS,
    current_pid,
    pid_alive,
    renameat2,
    unsafe_file,
    write_all,
)
from kvpool.remote.file.io import exchange as _exchange
from kvpool.remote.header import (
    FLAG_PAYLOAD_CRC,
    EntryInfo,
    Layout,
    decode_header,
    encode_header,
    fixed_fields,
    layout_for,
    matches,
    peek_header_size,
)

__all__ = ["FileStore"]

_TMP = ".tmp-"
_MAX_NAME = 200
_HEAD_READ = 4096
_OPEN_TRIES = 100
_PLAIN_NAME = re.compile(rb"[A-Za-z0-9_.~-]{0,199}").fullmatch


class FileStore(RemoteStore):
    """A store of one file per entry in ``directory``.

    Args:
        directory: where the entries live (created if missing, with its
            parents).  ``/dev/shm/...`` keeps them in memory.
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

    Raises:
        InvalidArgumentError: ``directory`` is not a path, or exists and
            is not a directory.
        RemoteStoreError: the directory cannot be created.

    Thread safety: all methods may run in several threads and processes
    at once; concurrent ``put`` of one key leaves one of the entries whole.
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
    ) -> None:
        checksum = check_bool("checksum", checksum)
        durable = check_bool("durable", durable)
        reuse_files = check_bool("reuse_files", reuse_files)
        if cleanup_temp_age_s is not None:
            cleanup_temp_age_s = check_seconds(
                "cleanup_temp_age_s", cleanup_temp_age_s, allow_none=True, allow_zero=True
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
        try:
            os.makedirs(path, exist_ok=True)
        except FileExistsError:
            raise InvalidArgumentError(f"{path!r} exists and is not a directory") from None
        except OSError as exc:
            raise RemoteStoreError(
                exc.errno, f"cannot create the store directory {path!r}: {exc.strerror}"
            ) from exc
        if not os.path.isdir(path):
            raise InvalidArgumentError(f"{path!r} exists and is not a directory")
        self.directory = os.path.abspath(path)
        self._prefix = self.directory + os.sep
        self._checksum = checksum
        self._durable = durable
        self._seq = itertools.count()
        # Spare files: replaced entries kept to be overwritten by later puts.
        self._reuse = reuse_files and not self._durable and renameat2 is not None
        self._spares: list[str] = []
        self._spares_pid = current_pid()
        self._spares_lock = threading.Lock()
        self._max_spares = io_threads + 1
        if cleanup_temp_age_s is not None:
            self.cleanup_temp(cleanup_temp_age_s)

    # -- names -------------------------------------------------------

    def path(self, key: Key) -> str:
        """The file that holds (or would hold) the entry ``key``.

        Raises:
            InvalidArgumentError: bad key.
        """
        return self._path(key_bytes(key))

    def _path(self, kb: bytes) -> str:
        if _PLAIN_NAME(kb) is not None:  # what quote_from_bytes leaves as it is
            return self._prefix + "k" + kb.decode("ascii")
        name = quote_from_bytes(kb, safe="")
        if len(name) < _MAX_NAME:
            return self._prefix + "k" + name
        return self._prefix + "h" + hashlib.sha256(kb).hexdigest()

    def _where(self, action: str, kb: bytes) -> str:
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
        hold(memory_obj, "put")
        try:
            layout, fmt, view = describe(memory_obj)
            crc = zlib.crc32(view) if self._checksum else None
            header = encode_header(layout, fmt, view.nbytes, crc)
            self._write(self._path(kb), header, view, kb)
        finally:
            release(memory_obj)

    def _write(self, path: str, header: bytes, view: memoryview, kb: bytes) -> None:
        if self._reuse:
            spare = self._take_spare()
            if spare is not None and self._overwrite_spare(spare, path, header, view, kb):
                return
        tmp = f"{self._prefix}{_TMP}{current_pid()}-{next(self._seq)}"
        try:
            fd = os.open(tmp, WRITE_FLAGS, 0o644)
        except OSError as exc:
            raise self._os_error(exc, "put", kb) from exc
        try:
            try:
                write_all(fd, header, view)
                if self._durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if self._reuse:
                try:
                    replaced = _exchange(tmp, path)
                except OSError as exc:
                    if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
                        raise
                    self._reuse = False  # this file system cannot exchange
                    replaced = False
                if replaced:
                    self._give_spare(tmp)  # tmp now names the replaced entry
                    return
            os.rename(tmp, path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError) and not isinstance(exc, KVPoolError):
                raise self._os_error(exc, "put", kb) from exc
            raise
        if self._durable:
            self._sync_directory(kb)

    def _overwrite_spare(
        self, spare: str, path: str, header: bytes, view: memoryview, kb: bytes
    ) -> bool:
        """Write the entry into a spare file and swap it in; False: use a new file.

        The spare is locked (``LOCK_EX``) while it is rewritten; a reader that
        still has it open from when it was an entry holds ``LOCK_SH``, and
        then the spare is dropped instead.
        """
        try:
            fd = os.open(spare, SPARE_FLAGS)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(spare)
            return False
        keep = False
        try:
            st = os.fstat(fd)
            if unsafe_file(st) is not None:
                return False  # not ours to write: the name is unlinked below
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a reader is still on it
            total = write_all(fd, header, view, at=0)
            if st.st_size != total:
                os.ftruncate(fd, total)
            if _exchange(spare, path):
                keep = True  # the spare now names the entry this put replaced
            else:
                os.rename(spare, path)  # the entry was deleted meanwhile
            return True
        except BaseException as exc:
            if isinstance(exc, OSError) and not isinstance(exc, KVPoolError):
                raise self._os_error(exc, "put", kb) from exc
            raise
        finally:
            os.close(fd)  # also drops the lock
            if keep:
                self._give_spare(spare)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(spare)

    def _take_spare(self) -> str | None:
        with self._spares_lock:
            if self._spares_pid != current_pid():  # forked: those are the parent's
                self._spares = []
                self._spares_pid = current_pid()
            return self._spares.pop() if self._spares else None

    def _give_spare(self, name: str) -> None:
        with self._spares_lock:
            if (
                self._spares_pid == current_pid()
                and len(self._spares) < self._max_spares
                and not self._closed
            ):
                self._spares.append(name)
                return
        with contextlib.suppress(OSError):
            os.unlink(name)

    def _close(self) -> None:
        with self._spares_lock:
            spares, self._spares = self._spares, []
            mine = self._spares_pid == current_pid()
        for name in spares if mine else ():
            with contextlib.suppress(OSError):
                os.unlink(name)

    def _sync_directory(self, kb: bytes) -> None:
        try:
            dfd = os.open(self.directory, os.O_RDONLY | CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            raise self._os_error(exc, "put (directory fsync)", kb) from exc

    # -- get ---------------------------------------------------------

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
        fd = self._open_entry(kb, "get")
        if fd is None:
            return None
        obj = None
        try:
            if layout is not None and fmt is not None:
                obj, view = destination(allocator, layout, fmt, lambda: self._where("get", kb))
                header = bytearray(layout.header_size)
                n = os.preadv(fd, (header, view, bytearray(1)), 0)
                if n == layout.header_size + layout.nbytes:
                    if header == layout.plain_header(fmt):
                        return obj
                    if matches(header, layout):
                        flags, size, crc, fmt_value = fixed_fields(header)
                        if (
                            size == layout.nbytes
                            and fmt_value == fmt.value
                            and (not flags & FLAG_PAYLOAD_CRC or zlib.crc32(view) == crc)
                        ):
                            return obj
                # Something differs: find out what (or accept a narrowed entry).
                info = self._diagnose(fd, n, layout, fmt, kb)
                self._finish(obj, view, info, kb)
                return obj
            info = self._read_header(fd, kb)
            check_stored(info, layout, fmt, self._where("get", kb))
            if layout is None:
                layout = layout_for(info.shapes, info.dtypes)
            obj, view = destination(allocator, layout, fmt or info.fmt, self._where("get", kb))
            n = os.preadv(fd, (view[: info.size], bytearray(1)), info.header_size)
            if n != info.size:
                raise CorruptEntryError(
                    f"{self._where('get', kb)}: "
                    + (
                        f"truncated: {n} of {info.size} payload bytes"
                        if n < info.size
                        else "trailing bytes after the payload"
                    )
                )
            self._finish(obj, view, info, kb)
            return obj
        except BaseException as exc:
            discard(obj)
            if isinstance(exc, OSError) and not isinstance(exc, KVPoolError):
                raise self._os_error(exc, "get", kb) from exc
            raise
        finally:
            os.close(fd)

    def _open_entry(self, kb: bytes, action: str) -> int | None:
        """Open the entry's file for reading, safe against file reuse.

        Takes ``LOCK_SH`` on the file (a writer rewrites a reused file only
        under ``LOCK_EX``), then checks the file is still the one at the
        entry's name: if it was swapped out meanwhile (and maybe rewritten
        for another entry), it opens the name again.

        Returns:
            The descriptor (the caller closes it), or None: no entry.
        """
        path = self._path(kb)
        try:
            for _ in range(_OPEN_TRIES):
                try:
                    fd = os.open(path, READ_FLAGS)
                except FileNotFoundError:
                    return None
                except OSError as exc:
                    what = NOT_A_FILE.get(exc.errno)  # type: ignore[arg-type]
                    if what is not None:
                        raise CorruptEntryError(
                            exc.errno,
                            f"{self._where(action, kb)}: is {what}, not a regular file; "
                            "not an entry, delete it",
                        ) from None
                    raise
                try:
                    st = os.fstat(fd)
                    if st.st_nlink == 0 and stat.S_ISREG(st.st_mode):
                        continue  # unlinked since the open (replaced or deleted): again
                    why = unsafe_file(st)
                    if why is not None:
                        raise CorruptEntryError(
                            f"{self._where(action, kb)}: {why}; not an entry, delete it"
                        )
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    now = os.stat(path, follow_symlinks=False)
                    if now.st_ino == st.st_ino and now.st_dev == st.st_dev:
                        fd, keep = -1, fd
                        return keep
                except FileNotFoundError:
                    return None
                finally:
                    if fd >= 0:
                        os.close(fd)
        except OSError as exc:
            if isinstance(exc, KVPoolError):
                raise
            raise self._os_error(exc, action, kb) from exc
        raise RemoteStoreError(
            errno.EBUSY,
            f"{self._where(action, kb)}: the entry was replaced {_OPEN_TRIES} times "
            "while being opened",
        )

    def _finish(self, obj: MemoryObj, view: memoryview, info: EntryInfo, kb: bytes) -> None:
        """Check the payload CRC and narrow a partial entry; raise on a mismatch."""
        if info.payload_crc is not None and zlib.crc32(view[: info.size]) != info.payload_crc:
            raise CorruptEntryError(f"{self._where('get', kb)}: payload CRC mismatch")
        if info.size != info.layout_size:
            obj.set_used_size(info.size)

    def _read_header(self, fd: int, kb: bytes) -> EntryInfo:
        head = os.pread(fd, _HEAD_READ, 0)
        where = self._where("get", kb)
        header_size = peek_header_size(head, where)
        if header_size > len(head) and len(head) == _HEAD_READ:
            head += os.pread(fd, header_size - len(head), len(head))
        return decode_header(head, where)

    def _diagnose(self, fd: int, n: int, layout: Layout, fmt: MemoryFormat, kb: bytes) -> EntryInfo:
        """Explain why the fast read did not match, or accept a narrowed entry.

        Returns:
            The header of a valid entry whose payload is shorter than its
            layout (``set_used_size``), fully read by the fast ``preadv``.

        Raises:
            CorruptEntryError / InvalidArgumentError: what is wrong.
        """
        where = self._where("get", kb)
        file_size = os.fstat(fd).st_size
        info = self._read_header(fd, kb)
        check_stored(info, layout, fmt, where)
        expected = info.header_size + info.size
        if file_size < expected:
            raise CorruptEntryError(
                f"{where}: truncated: the file has {file_size} bytes, its header "
                f"announces {expected}"
            )
        if file_size > expected:
            raise CorruptEntryError(
                f"{where}: {file_size - expected} trailing bytes after the payload"
            )
        if n != expected:
            raise CorruptEntryError(f"{where}: read {n} of {expected} bytes")
        return info

    # -- the rest ----------------------------------------------------

    def exists(self, key: Key) -> bool:
        """True when a file for ``key`` exists (see :meth:`RemoteStore.exists`)."""
        kb = key_bytes(key)
        self._check_open()
        try:
            os.stat(self._path(kb), follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._os_error(exc, "exists", kb) from exc
        return True

    def delete(self, key: Key) -> bool:
        """Remove the file of ``key`` (see :meth:`RemoteStore.delete`).

        A reader that already opened the file still reads the whole entry.
        """
        kb = key_bytes(key)
        self._check_open()
        try:
            os.unlink(self._path(kb))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._os_error(exc, "delete", kb) from exc
        return True

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
            info = self._read_header(fd, kb)
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
        now = time.time()
        me = current_pid()
        removed = 0
        try:
            entries = list(os.scandir(self.directory))
        except OSError as exc:
            raise RemoteStoreError(
                exc.errno, f"cannot list {self.directory!r}: {exc.strerror}"
            ) from exc
        for entry in entries:
            name = entry.name
            if not name.startswith(_TMP):
                continue
            try:
                pid = int(name[len(_TMP) :].split("-", 1)[0])
            except ValueError:
                continue
            if pid == me or pid_alive(pid):
                continue
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime < min_age_s:
                    continue
                os.unlink(entry.path)
            except FileNotFoundError:
                continue
            removed += 1
        return removed

    def __repr__(self) -> str:
        return f"<FileStore {self.directory!r}{' closed' if self._closed else ''}>"
