"""Start-up hook: with ``KVPOOL_LMCACHE=1``, LMCache runs on kvpool memory.

``kvpool-lmcache.pth`` (installed next to kvpool in site-packages) calls
:func:`activate` at interpreter start-up when the variable is ``1``,
``true``, ``yes`` or ``on``.  :func:`activate` imports nothing of kvpool: it
puts a small finder on ``sys.meta_path`` that, the moment ``lmcache`` is
first imported, steps aside and calls
:func:`kvpool.integrations.lmcache.install`.  A failure there (LMCache's
version is not a tested one, say) surfaces as the ``ImportError`` of that
``import lmcache``.

This module sits outside the ``kvpool`` package so that loading it does not
import kvpool (and torch) in every Python process.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping, Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["ENV", "activate", "activate_from_env", "enabled"]

#: The environment variable that switches the hook on.
ENV = "KVPOOL_LMCACHE"

_lock = threading.Lock()


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """True when ``$KVPOOL_LMCACHE`` asks for the hook."""
    return environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


class _InstallOnFirstImport(MetaPathFinder):
    """Calls kvpool's LMCache ``install()`` when ``lmcache`` is first looked up."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname != "lmcache" and not fullname.startswith("lmcache."):
            return None
        with _lock:
            if self not in sys.meta_path:
                return None
            sys.meta_path.remove(self)
        from kvpool.integrations.lmcache import install

        install()
        return None  # the normal finders (and kvpool's, now first) go on


def activate() -> None:
    """Arrange for ``install()`` at the first ``import lmcache`` (idempotent)."""
    with _lock:
        if any(isinstance(f, _InstallOnFirstImport) for f in sys.meta_path):
            return
        sys.meta_path.insert(0, _InstallOnFirstImport())


def activate_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """:func:`activate` when :func:`enabled`; returns whether it did."""
    if not enabled(environ):
        return False
    activate()
    return True
