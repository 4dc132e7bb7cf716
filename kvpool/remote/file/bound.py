"""A bounded FileStore's index: its entries, their sizes and recency, and which to evict.

A :class:`~kvpool.remote.file.store.FileStore` opened with ``max_bytes``
keeps one :class:`Bound`: the entries it knows of, least recently used
first, each with the :class:`~kvpool.native.entry.Stamp` (inode, mtime,
size) of the file it knows.  The store does the I/O; the bound decides:

* :func:`scan` lists the entries a directory holds at open, oldest first
  by their files' times (the later of access and modification), and
  :meth:`Bound.load` takes them in;
* :meth:`Bound.stored` records a put's file (replacing the key's earlier
  record: an entry is never counted twice) and hands back the least
  recently used entries to evict until the total fits ``max_bytes``;
* :meth:`Bound.touch` (the hits of get, batched_get, exists,
  batched_exists) makes entries the most recently used; :meth:`Bound.forget`
  (a delete) drops them.  A miss changes nothing: an entry removed behind
  the store's back stays counted until its eviction finds it gone (the
  bound errs on the safe side);
* :meth:`Bound.protect` / :meth:`Bound.release` bracket a batched put:
  the entries it writes are not evicted until it has ended, whatever
  other threads put meanwhile;
* :meth:`Bound.lock_for` gives the lock a store holds across an I/O on
  one entry's file and the index change that follows it (a put's write
  and :meth:`Bound.stored`, a delete's unlink and :meth:`Bound.forget`,
  an eviction): so calls on one key in several threads change the file
  and the index in the same order, and the index never drifts from the
  directory.  One of 64 re-entrant locks, by the name's hash.

Every operation is O(1) under the bound's lock (an eviction is O(1) per
entry evicted, plus one step per protected entry it passes over); only
:func:`scan` and :meth:`Bound.problems` walk the entries.  ``used`` counts
the bytes of the files recorded (header included); a put in flight is
counted once its file has its name.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from kvpool.errors import RemoteStoreError
from kvpool.native.entry import Stamp

__all__ = ["Bound", "Found", "Record", "scan"]

# Per-name locks (a power of two): enough that distinct keys rarely share one.
_STRIPES = 64


@dataclass(frozen=True, slots=True)
class Record:
    """What a bound knows of one entry.

    Attributes:
        key: the entry's key, or None when its name does not hold it (a
            digest name found at open: see :mod:`kvpool.remote.file.names`).
        stamp: the file the store wrote or found (what an eviction removes).
    """

    key: bytes | None
    stamp: Stamp


@dataclass(frozen=True, slots=True)
class Found:
    """An entry :func:`scan` found: its file name, key, stamp and time (ns)."""

    name: bytes
    key: bytes | None
    stamp: Stamp
    used_ns: int


def scan(directory: str) -> list[Found]:
    """The entries in ``directory``, least recently used first.

    Entries are the regular files whose names are entry names (``k...``,
    ``h...``); temporary files, other files and directories are skipped.
    Recency is the later of a file's access and modification times (access
    times are coarse under ``relatime``, so a file's last put usually decides).

    Raises:
        RemoteStoreError: the directory cannot be listed.
    """
    found: list[Found] = []
    try:
        with os.scandir(os.fsencode(directory)) as listing:
            for item in listing:
                name = item.name
                if name[:1] not in (b"k", b"h"):
                    continue
                try:
                    st = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not item.is_file(follow_symlinks=False) or st.st_nlink != 1:
                    continue
                key = unquote_to_bytes(name[1:]) if name[:1] == b"k" else None
                stamp = Stamp(st.st_ino, st.st_mtime_ns, st.st_size)
                found.append(Found(name, key, stamp, max(st.st_atime_ns, st.st_mtime_ns)))
    except OSError as exc:
        raise RemoteStoreError(
            exc.errno, f"cannot list the store directory {directory!r}: {exc.strerror or exc}"
        ) from exc
    found.sort(key=lambda f: f.used_ns)
    return found


class Bound:
    """The LRU index of one bounded store (see the module notes).

    Args:
        max_bytes: the bound on the bytes of the entries recorded.

    Attributes:
        max_bytes: as given.

    Thread safety: every method takes the bound's lock; none does I/O.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        # Least recently used first.
        self._order: OrderedDict[bytes, Record] = OrderedDict()
        self._used = 0
        # Names a batched put in flight writes (with the number of such puts).
        self._busy: dict[bytes, int] = {}
        # False until the first put: a directory found over the bound at
        # open is brought under it by the next put, not at open (a process
        # that only reads never removes anything).
        self._settled = False
        self._stripes = [threading.RLock() for _ in range(_STRIPES)]

    @property
    def used(self) -> int:
        """Bytes of the entries recorded."""
        return self._used

    def __len__(self) -> int:
        return len(self._order)

    def load(self, found: Iterable[Found]) -> None:
        """Record entries found at open, given least recently used first."""
        with self._lock:
            for item in found:
                old = self._order.pop(item.name, None)
                if old is not None:
                    self._used -= old.stamp.size
                self._order[item.name] = Record(item.key, item.stamp)
                self._used += item.stamp.size

    def stored(self, name: bytes, key: bytes, stamp: Stamp) -> list[tuple[bytes, Record]]:
        """Record the file a put gave ``name``; the entries to evict now.

        The put's entry becomes the most recently used; the earlier
        record of ``name``, if any, is replaced.  The entries returned
        have left the index: the caller removes their files.  The put's own
        entry is not among them (it fits the bound alone: the caller
        refuses larger ones).
        """
        with self._lock:
            old = self._order.pop(name, None)
            if old is not None:
                self._used -= old.stamp.size
            self._order[name] = Record(key, stamp)
            self._used += stamp.size
            self._settled = True
            return self._victims(name)

    def protect(self, names: Iterable[bytes]) -> None:
        """Keep ``names`` from eviction until :meth:`release` (a batched put's keys).

        Each recorded one becomes the most recently used: it is being
        written again now.
        """
        with self._lock:
            busy = self._busy
            order = self._order
            for name in names:
                busy[name] = busy.get(name, 0) + 1
                if name in order:
                    order.move_to_end(name)

    def release(self, names: Iterable[bytes]) -> list[tuple[bytes, Record]]:
        """End a :meth:`protect`; the entries to evict now (see :meth:`stored`)."""
        with self._lock:
            busy = self._busy
            for name in names:
                left = busy.get(name, 0) - 1
                if left > 0:
                    busy[name] = left
                else:
                    busy.pop(name, None)
            return self._victims() if self._settled else []

    def touch(self, names: Iterable[bytes], hits: Iterable[bool]) -> None:
        """Lookups: each name found (``hits``) becomes the most recently used, in order."""
        with self._lock:
            order = self._order
            for name, hit in zip(names, hits, strict=True):
                if hit and name in order:
                    order.move_to_end(name)

    def restore(self, name: bytes, record: Record) -> None:
        """Put back a victim whose file could not be removed, as the least recently used.

        The next eviction tries it again.  Nothing changes when ``name`` was
        recorded again meanwhile (a put of its key).
        """
        with self._lock:
            if name in self._order:
                return
            self._order[name] = record
            self._order.move_to_end(name, last=False)
            self._used += record.stamp.size

    def lock_for(self, name: bytes) -> threading.RLock:
        """The lock held across an I/O on ``name``'s file and its index change (see the module)."""
        return self._stripes[hash(name) & (_STRIPES - 1)]

    def forget(self, names: Iterable[bytes]) -> None:
        """Drop ``names``' records (deleted, or found missing)."""
        with self._lock:
            for name in names:
                old = self._order.pop(name, None)
                if old is not None:
                    self._used -= old.stamp.size

    def _victims(self, keep: bytes | None = None) -> list[tuple[bytes, Record]]:
        """Pop least recently used records, skipping protected ones, until the total fits.

        Called under the lock.  ``keep`` (a put's own entry) is passed over
        like a protected record; the records passed over go back to the
        front in their order.
        """
        out: list[tuple[bytes, Record]] = []
        if self._used <= self.max_bytes:
            return out
        order = self._order
        busy = self._busy
        passed: list[tuple[bytes, Record]] = []
        while self._used > self.max_bytes and order:
            name, record = order.popitem(last=False)
            if name in busy or name == keep:
                passed.append((name, record))
                continue
            self._used -= record.stamp.size
            out.append((name, record))
        for name, record in reversed(passed):
            order[name] = record
            order.move_to_end(name, last=False)
        return out

    def problems(self) -> list[str]:
        """Describe every broken invariant of the index; an empty list when all hold.

        * ``used`` is the sum of the recorded sizes, and no size is negative;
        * once a put has run, and no batched put is in flight, ``used`` is
          within ``max_bytes``;
        * each protected name is protected a positive number of times.

        Complexity: O(entries) under the lock (for tests and checks, not calls).
        """
        out: list[str] = []
        with self._lock:
            total = 0
            for name, record in self._order.items():
                if record.stamp.size < 0:
                    out.append(f"{name!r} is recorded with {record.stamp.size} bytes")
                total += record.stamp.size
            if total != self._used:
                out.append(f"used is {self._used} bytes, the records add up to {total}")
            low = {name: n for name, n in self._busy.items() if n < 1}
            if low:
                out.append(f"protection counts below 1: {low}")
            if self._settled and not self._busy and self._used > self.max_bytes:
                out.append(
                    f"{self._used} bytes recorded with no put in flight, over the bound of "
                    f"{self.max_bytes}"
                )
        return out

    def __repr__(self) -> str:
        return f"<Bound {len(self._order)} entries, {self._used} of {self.max_bytes} bytes>"
