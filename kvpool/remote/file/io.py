"""File-system helpers of FileStore's Python paths: read flags, hostile-file checks, pids.

The common put and get are one libpinmem call each
(:mod:`kvpool.native.entry`); what stays in Python - ``head``, a get whose
layout is not given, the careful get that names what is wrong with an
entry, ``cleanup_temp`` - uses these:

* :data:`READ_FLAGS`: entries are read with ``O_NOFOLLOW | O_NONBLOCK``
  (a symlink fails, a FIFO or device cannot block).
* :func:`unsafe_file` says why an opened file must not be used (anything
  but a regular file with one link, owned by this user).
* :func:`open_entry` opens an entry for reading under ``LOCK_SH``, safe
  against the file being swapped out (reused) meanwhile.
* :func:`current_pid` / :func:`pid_alive`: whose temporary files are whose.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable

from kvpool.errors import CorruptEntryError, RemoteStoreError

__all__ = [
    "CLOEXEC",
    "NOT_A_FILE",
    "OPEN_TRIES",
    "READ_FLAGS",
    "current_pid",
    "open_entry",
    "pid_alive",
    "unsafe_file",
]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
#: ``O_CLOEXEC`` where the platform has it.
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: Opening an entry to read it.
READ_FLAGS = os.O_RDONLY | CLOEXEC | _NOFOLLOW | _NONBLOCK
#: errno of an ``open`` that met something other than a regular file.
NOT_A_FILE = {
    errno.ELOOP: "a symbolic link",  # O_NOFOLLOW
    errno.ENXIO: "a socket or a device without a driver",
    errno.ENODEV: "a device",
}


def _fork_state() -> list[int]:
    state = [os.getpid(), os.geteuid()]

    def child() -> None:
        state[0] = os.getpid()

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=child)
    return state


# This process's pid (kept right across fork) and effective uid, read
# without a system call on every put and get.
_STATE = _fork_state()


def current_pid() -> int:
    """``os.getpid()``, without the system call (updated in forked children)."""
    return _STATE[0]


def unsafe_file(st: os.stat_result) -> str | None:
    """Why a file (by its ``fstat``) must not be used as an entry, or None when it may.

    Only a regular file with one link, owned by this process's user, is
    an entry: not a FIFO, device, socket or directory (which could block
    or mislead), not a hard link (which could be a file outside the
    store), not another user's file.
    """
    if st.st_nlink == 1 and st.st_uid == _STATE[1] and stat.S_ISREG(st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a directory"
            if stat.S_ISDIR(st.st_mode)
            else "a device or socket"
        )
        return f"is {kind}, not a regular file"
    if st.st_nlink != 1:
        return f"has {st.st_nlink} hard links (it may be a file outside the store)"
    if st.st_uid != _STATE[1]:
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    return None


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists here (or exists and is not ours to signal)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: Opens of one entry before :func:`open_entry` gives up (it kept being replaced).
OPEN_TRIES = 100


def open_entry(path: str, where: Callable[[], str]) -> int | None:
    """Open the entry at ``path`` for reading, safe against file reuse.

    Takes ``LOCK_SH`` on the file (a writer rewrites a reused file only
    under ``LOCK_EX``), then checks that the file is still the one at
    ``path``: if it was swapped out meanwhile (and maybe rewritten for
    another entry), it opens the name again, at most :data:`OPEN_TRIES`
    times.

    Args:
        path: the entry's file.
        where: names the operation and key, for error messages (called
            only when one is raised).

    Returns:
        The descriptor, under ``LOCK_SH`` (the caller closes it), or None:
        no entry.

    Raises:
        CorruptEntryError: something other than an entry is at ``path``
            (:func:`unsafe_file`, or a symlink, socket or device).
        RemoteStoreError: (EBUSY) the entry was replaced at every try.
        OSError: the file system refused.
    """
    for _ in range(OPEN_TRIES):
        try:
            fd = os.open(path, READ_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            what = NOT_A_FILE.get(exc.errno)  # type: ignore[arg-type]
            if what is not None:
                raise CorruptEntryError(
                    exc.errno,
                    f"{where()}: is {what}, not a regular file; not an entry, delete it",
                ) from None
            raise
        try:
            st = os.fstat(fd)
            if st.st_nlink == 0 and stat.S_ISREG(st.st_mode):
                continue  # unlinked since the open (replaced or deleted): again
            why = unsafe_file(st)
            if why is not None:
                raise CorruptEntryError(f"{where()}: {why}; not an entry, delete it")
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
    raise RemoteStoreError(
        errno.EBUSY, f"{where()}: the entry was replaced {OPEN_TRIES} times while being opened"
    )
