"""A directory store's own directory: made when its parent exists, its parents only when asked.

A store spec is a path, so a typo in it names a directory nobody meant;
creating every missing parent would turn ``/srv/kvcahce/x`` (or, as root,
``/nonexistent/dir/x``) into a new tree that quietly takes the puts.  So a
store creates its own directory, and its parents only with
``make_parents=True``; otherwise a missing parent is an error naming it.
"""

from __future__ import annotations

import errno
import os

from kvpool.errors import InvalidArgumentError, RemoteStoreError

__all__ = ["make_store_directory"]

# Errors that say the path is wrong for this process, whenever it is tried again.
_REFUSALS = frozenset(
    (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR, errno.ELOOP,
     errno.ENAMETOOLONG)
)  # fmt: skip


def make_store_directory(path: str, make_parents: bool) -> None:
    """Make sure the directory ``path`` exists, creating it (and its parents if asked).

    Args:
        path: the store's directory.
        make_parents: create missing parents too.

    Raises:
        InvalidArgumentError: ``path`` exists and is not a directory, or its
            parent is missing and ``make_parents`` is False.
        InvalidArgumentError: the directory cannot be created for good: no
            permission, a read-only file system, a parent that is not a directory.
        RemoteStoreError: the directory cannot be created for now (no space, an
            I/O error).
    """
    if os.path.isdir(path):
        return
    if os.path.lexists(path):
        raise InvalidArgumentError(f"{path!r} exists and is not a directory; give a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.lexists(parent) and not os.path.isdir(parent):
        raise InvalidArgumentError(
            f"the parent {parent!r} of the store directory {path!r} is not a directory; "
            "check the path for a typo"
        )
    if not make_parents and not os.path.isdir(parent):
        raise InvalidArgumentError(
            f"the parent {parent!r} of the store directory {path!r} does not exist; check the "
            "path for a typo, create the parent, or pass make_parents=True (in an "
            "integration's settings: make_parents: true) to create it"
        )
    try:
        if make_parents:
            os.makedirs(path, exist_ok=True)
        else:
            os.mkdir(path)
    except FileExistsError:
        if not os.path.isdir(path):
            raise InvalidArgumentError(
                f"{path!r} exists and is not a directory; give a directory"
            ) from None
    except OSError as exc:
        if exc.errno in _REFUSALS:
            # Retrying cannot help: the path is wrong for this process, which is a
            # configuration error that must stop start-up, not an outage to wait out.
            raise InvalidArgumentError(
                f"cannot create the store directory {path!r}: {exc.strerror}; give a directory "
                "this process may create and write (or create it first, with its owner set)"
            ) from None
        raise RemoteStoreError(
            exc.errno, f"cannot create the store directory {path!r}: {exc.strerror}"
        ) from exc
