"""File-system primitives of FileStore: flags, atomic exchange, hostile-file checks, full writes.

* The ``open`` flags: entries are read with ``O_NOFOLLOW | O_NONBLOCK``
  (a symlink fails, a FIFO or device cannot block), temporary files are
  created with ``O_CREAT | O_EXCL | O_NOFOLLOW``.
* :func:`unsafe_file` says why an opened file must not be used (anything
  but a regular file with one link, owned by this user).
* :func:`exchange` swaps two names atomically (``renameat2(RENAME_EXCHANGE)``).
* :func:`write_all` writes a header and a payload view with one
  ``writev``/``pwritev``, completing short writes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

__all__ = [
    "CLOEXEC",
    "NOT_A_FILE",
    "READ_FLAGS",
    "SPARE_FLAGS",
    "WRITE_FLAGS",
    "current_pid",
    "exchange",
    "pid_alive",
    "renameat2",
    "unsafe_file",
    "write_all",
]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
#: ``O_CLOEXEC`` where the platform has it.
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: Opening an entry to read it.
READ_FLAGS = os.O_RDONLY | CLOEXEC | _NOFOLLOW | _NONBLOCK
#: Creating a temporary file.
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | CLOEXEC | _NOFOLLOW
#: errno of an ``open`` that met something other than a regular file.
NOT_A_FILE = {
    errno.ELOOP: "a symbolic link",  # O_NOFOLLOW
    errno.ENXIO: "a socket or a device without a driver",
    errno.ENODEV: "a device",
}
#: Opening a spare to rewrite it.
SPARE_FLAGS = os.O_RDWR | CLOEXEC | _NOFOLLOW | _NONBLOCK


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _load_renameat2() -> object | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # glibc < 2.28, or not glibc
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


#: ``renameat2`` of the C library, or None where it is missing.
renameat2 = _load_renameat2()


def exchange(a: str, b: str) -> bool:
    """Atomically swap the files at ``a`` and ``b`` (``renameat2(RENAME_EXCHANGE)``).

    Returns:
        False when ``b`` does not exist (nothing was done).

    Raises:
        OSError: the call failed otherwise (``EINVAL``/``ENOSYS``: the file
            system or kernel cannot exchange).
    """
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:  # type: ignore[operator]
        return True
    err = ctypes.get_errno()
    if err == errno.ENOENT and os.path.lexists(a):
        return False
    raise OSError(err, os.strerror(err))


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


def write_all(fd: int, header: bytes, view: memoryview, at: int | None = None) -> int:
    """Write header then bytes (one ``writev``/``pwritev``, more if it is short).

    Returns:
        The bytes written.
    """
    total = len(header) + view.nbytes
    parts = (header, view)
    done = os.writev(fd, parts) if at is None else os.pwritev(fd, parts, at)
    hsize = len(header)
    while done < total:
        rest = header[done:] if done < hsize else view[done - hsize :]
        n = os.write(fd, rest) if at is None else os.pwrite(fd, rest, at + done)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")
        done += n
    return total
