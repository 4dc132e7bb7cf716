"""Run LMCache on kvpool memory: one call before LMCache is imported.

::

    import kvpool.integrations.lmcache as kv_lmcache
    kv_lmcache.install()          # before anything imports lmcache.v1.memory_management
    from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator
    assert MixedMemoryAllocator is kvpool.MixedMemoryAllocator

Without code changes: set ``KVPOOL_LMCACHE=1`` in the environment of a
Python that has kvpool installed.  A ``.pth`` file shipped with kvpool
(``kvpool-lmcache.pth``) reads the variable at interpreter start-up and,
when it is set, arranges for :func:`install` to run the moment ``lmcache``
is first imported (nothing of kvpool is imported before that; without the
variable the hook costs one ``os.environ`` lookup).

What :func:`install` changes, and what it leaves alone:

* ``lmcache.v1.memory_management`` and every
  ``lmcache.v1.memory_allocators.*`` module are served by kvpool (see
  :mod:`~kvpool.integrations.lmcache.names`): LMCache's allocators, memory
  objects and address manager are kvpool's.  Every other LMCache module
  (storage manager, backends, connectors, L1/L2 managers, monitors) is
  LMCache's own code, now running on kvpool memory.
* kvpool objects' pin and unpin events, forced unpins and pool usage go to
  LMCache's ``PinMonitor`` and ``LMCStatsMonitor``
  (:mod:`~kvpool.integrations.lmcache.bridge`), so LMCache's pin timeout and
  metrics cover them.  Inside LMCache its ``PinMonitor`` (made by its engine
  from the engine config) is the one that enforces pin timeouts; kvpool's
  own timeout thread is switched off.

Only the LMCache versions in :data:`TESTED_VERSIONS` are accepted (the
compatibility suite, ``make compat``, runs LMCache's own code against them);
``install(allow_untested=True)`` or ``KVPOOL_LMCACHE_ALLOW_UNTESTED=1`` lifts
the check at your own risk.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import threading

from kvpool.errors import KVPoolError
from kvpool.integrations.lmcache.finder import KvpoolModuleFinder, is_served, is_served_name

__all__ = [
    "ALLOW_UNTESTED_ENV",
    "INSTALL_COMMAND",
    "TESTED_VERSIONS",
    "LMCacheBridgeError",
    "install",
    "installed",
    "lmcache_version",
]

#: LMCache releases the compatibility suite runs against.
TESTED_VERSIONS: frozenset[str] = frozenset({"0.5.6"})

#: Environment variable that lifts the version check (``1``/``true``/``yes``/``on``).
ALLOW_UNTESTED_ENV = "KVPOOL_LMCACHE_ALLOW_UNTESTED"

#: The one recipe that installs the tested LMCache and what its code imports
#: into this Python's environment (:mod:`kvpool.cli.lmcache`).
INSTALL_COMMAND = "python -m kvpool install-lmcache"

_lock = threading.Lock()
_finder: KvpoolModuleFinder | None = None


class LMCacheBridgeError(KVPoolError, ImportError):
    """kvpool cannot take over LMCache's memory management in this process.

    Raised when LMCache is missing, its version is outside
    :data:`TESTED_VERSIONS`, or its memory-management modules were imported
    before :func:`install` (LMCache's code would hold its own classes).
    """


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def lmcache_version() -> str | None:
    """The installed LMCache version (read from its metadata, not imported), or None."""
    try:
        return importlib.metadata.version("lmcache")
    except importlib.metadata.PackageNotFoundError:
        return None


def installed() -> bool:
    """True once :func:`install` succeeded in this process."""
    return _finder is not None and _finder in sys.meta_path


def _imported_too_early() -> list[str]:
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if is_served_name(name) and module is not None and not is_served(module)
    )


def install(*, allow_untested: bool = False) -> None:
    """Make the installed LMCache use kvpool for its memory management.

    Call it before anything imports ``lmcache.v1.memory_management`` or a
    ``lmcache.v1.memory_allocators`` module (importing ``lmcache`` itself
    first is fine).  Idempotent: later calls do nothing.

    Args:
        allow_untested: accept an LMCache version outside
            :data:`TESTED_VERSIONS` (also ``KVPOOL_LMCACHE_ALLOW_UNTESTED=1``).

    Raises:
        LMCacheBridgeError: LMCache is not installed, its version is not a
            tested one, or its memory-management modules are already imported.
    """
    global _finder
    with _lock:
        if installed():
            return
        version = lmcache_version()
        if version is None:
            raise LMCacheBridgeError(
                f"LMCache is not installed in this environment ({sys.prefix}); install "
                f"LMCache {', '.join(sorted(TESTED_VERSIONS))} and the packages its code "
                f"imports with: {INSTALL_COMMAND}"
            )
        if version not in TESTED_VERSIONS and not (
            allow_untested or _truthy(os.environ.get(ALLOW_UNTESTED_ENV))
        ):
            raise LMCacheBridgeError(
                f"LMCache {version} is outside the versions kvpool is tested with "
                f"({', '.join(sorted(TESTED_VERSIONS))}); install that with "
                f"{INSTALL_COMMAND}, or pass install(allow_untested=True) / set "
                f"{ALLOW_UNTESTED_ENV}=1 to try anyway"
            )
        early = _imported_too_early()
        if early:
            raise LMCacheBridgeError(
                f"LMCache's memory management is already imported ({', '.join(early)}), so "
                "its code holds LMCache's own classes; call "
                "kvpool.integrations.lmcache.install() before importing it (or set "
                "KVPOOL_LMCACHE=1 in the environment before Python starts)"
            )
        finder = KvpoolModuleFinder()
        sys.meta_path.insert(0, finder)
        from kvpool.integrations.lmcache import bridge

        bridge.connect()
        _finder = finder
