"""FileStore's temporary files: spares kept for reuse, names for new files, dead writers' leftovers.

* :class:`Spares`: the files that puts swapped out of entries' names
  (``renameat2(RENAME_EXCHANGE)``), kept under their ``.tmp-`` names so
  that the next puts overwrite them instead of creating files (on tmpfs a
  new file allocates its pages, a replaced one frees them).  At most
  ``limit`` are kept; a forked child never reuses its parent's.
* :func:`temp_name`: a fresh ``.tmp-<pid>-<n>`` name for a new file.
* :func:`remove_dead_temp`: removes the temporary files of writers that
  died before their rename.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from kvpool.errors import RemoteStoreError
from kvpool.remote.file.io import current_pid, pid_alive

__all__ = ["TMP_PREFIX", "Spares", "remove_dead_temp", "temp_name"]

#: Every temporary file's name starts with this (readers never look at them).
TMP_PREFIX = ".tmp-"
_BTMP = TMP_PREFIX.encode()


def temp_name(prefix: bytes, seq: int) -> bytes:
    """A new temporary file's path: ``prefix`` (directory + separator) + ``.tmp-<pid>-<seq>``."""
    return b"%s%s%d-%d" % (prefix, _BTMP, current_pid(), seq)


class Spares:
    """The spare files of one store (thread-safe).

    Args:
        limit: most spares kept (more are unlinked when given back).
    """

    def __init__(self, limit: int) -> None:
        self._names: list[bytes] = []
        self._pid = current_pid()
        self._lock = threading.Lock()
        self._limit = limit
        self._closed = False

    def take(self) -> bytes | None:
        """A spare's path to overwrite (the caller owns it now), or None."""
        with self._lock:
            if self._pid != current_pid():  # forked: those are the parent's
                self._names = []
                self._pid = current_pid()
            return self._names.pop() if self._names else None

    def give(self, name: bytes) -> None:
        """Keep ``name`` as a spare, or unlink it (full, closed, or a forked child's)."""
        with self._lock:
            if self._pid == current_pid() and len(self._names) < self._limit and not self._closed:
                self._names.append(name)
                return
        with contextlib.suppress(OSError):
            os.unlink(name)

    def close(self) -> None:
        """Unlink every spare this process kept; later ones are unlinked when given."""
        with self._lock:
            names, self._names = self._names, []
            mine = self._pid == current_pid()
            self._closed = True
        for name in names if mine else ():
            with contextlib.suppress(OSError):
                os.unlink(name)


def remove_dead_temp(directory: str, min_age_s: float) -> int:
    """Remove the temporary files in ``directory`` of writers that are gone.

    A file is removed when the process that created it (its pid is in the
    name) no longer exists here and the file is at least ``min_age_s``
    seconds old (a writer in another pid namespace may still be working on
    a younger one).

    Returns:
        The number of files removed.

    Raises:
        RemoteStoreError: the directory cannot be listed.
    """
    now = time.time()
    me = current_pid()
    removed = 0
    try:
        found = list(os.scandir(directory))
    except OSError as exc:
        raise RemoteStoreError(exc.errno, f"cannot list {directory!r}: {exc.strerror}") from exc
    for item in found:
        name = item.name
        if not name.startswith(TMP_PREFIX):
            continue
        try:
            pid = int(name[len(TMP_PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        if pid == me or pid_alive(pid):
            continue
        try:
            if now - item.stat(follow_symlinks=False).st_mtime < min_age_s:
                continue
            os.unlink(item.path)
        except FileNotFoundError:
            continue
        removed += 1
    return removed
