"""FileStore's file names: a key's name, and removing the entries of a key prefix.

A key's file is ``"k"`` + the key percent-encoded (every byte but
``A-Z a-z 0-9 _ . - ~``), or ``"h"`` + the SHA-256 of the key when that
name would be 200 characters or more (:func:`entry_name`).  Names never
contain ``/``, never start with ``.`` and cannot be ``.``/``..``: no key
can reach outside the directory; temporary files start with ``.tmp-``.

Percent-encoding works byte by byte, so a key starts with a prefix exactly
when its ``k`` name starts with the prefix's: :func:`remove_prefix`
removes a prefix's entries by listing the directory once.  A ``h`` name
keeps nothing of its key, so an entry stored under a digest (a key over
about 199 characters once encoded) is not found by a prefix.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from urllib.parse import quote_from_bytes

from kvpool.errors import RemoteStoreError

__all__ = ["MAX_NAME", "entry_name", "plain_name", "remove_prefix"]

#: A name this long or longer is replaced by the key's digest.
MAX_NAME = 200
_PLAIN_NAME = re.compile(rb"[A-Za-z0-9_.~-]{0,199}").fullmatch


def entry_name(kb: bytes) -> str:
    """The file name of the entry ``kb`` (see the module)."""
    if _PLAIN_NAME(kb) is not None:  # what quote_from_bytes leaves as it is
        return "k" + kb.decode("ascii")
    name = quote_from_bytes(kb, safe="")
    if len(name) < MAX_NAME:
        return "k" + name
    return "h" + hashlib.sha256(kb).hexdigest()


def plain_name(kb: bytes) -> bool:
    """True when ``kb`` is its own file name after the ``k`` (no encoding needed)."""
    return _PLAIN_NAME(kb) is not None


def remove_prefix(
    directory: str, pb: bytes, unlink: Callable[[str, str], None] | None = None
) -> int:
    """Unlink every entry of ``directory`` whose key starts with ``pb``; how many.

    One pass over the directory's names (O(files), no file is opened).
    Only ``k`` names are matched (see the module); something other than a
    file at a matching name (a directory) is left alone, as is a name that
    vanished meanwhile.  ``unlink(path, name)``, when given, removes each
    file instead of ``os.unlink(path)`` (a bounded store's, which also
    updates its index), raising as ``os.unlink`` does.

    Raises:
        RemoteStoreError: the directory cannot be listed, or a file cannot
            be unlinked (permissions, a read-only file system).
    """
    start = "k" + quote_from_bytes(pb, safe="")
    if len(start) > MAX_NAME:
        return 0  # every key this long has a digest name
    removed = 0
    try:
        with os.scandir(directory) as found:
            for entry in found:
                if not entry.name.startswith(start):
                    continue
                try:
                    if unlink is None:
                        os.unlink(entry.path)
                    else:
                        unlink(entry.path, entry.name)
                except (FileNotFoundError, IsADirectoryError):
                    continue
                removed += 1
    except OSError as exc:
        raise RemoteStoreError(
            exc.errno,
            f"delete_prefix {pb!r} in {directory!r}: {exc.strerror or exc} "
            f"({type(exc).__name__}); {removed} entries were removed by then",
        ) from exc
    return removed
