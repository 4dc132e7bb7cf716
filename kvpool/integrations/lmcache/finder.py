"""The import hook that serves kvpool-backed modules under LMCache's names.

:class:`KvpoolModuleFinder` sits first on ``sys.meta_path``.  It answers
only for the modules in :data:`~kvpool.integrations.lmcache.names.SERVED`
(and refuses any other ``lmcache.v1.memory_allocators.*`` module, so no
LMCache allocator can run by accident); every other import goes on to the
normal finders, so the rest of LMCache stays LMCache's.

A served module is an ordinary module object registered under LMCache's
name: its classes *are* kvpool's (``lmcache.v1.memory_management.MemoryObj
is kvpool.MemoryObj``), so ``isinstance`` checks in LMCache's code and in
kvpool's agree.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import types
from collections.abc import Sequence

from kvpool.integrations.lmcache.names import (
    ALLOCATORS,
    CORE,
    LMCACHE_IMPORTS,
    MEMORY_MANAGEMENT,
    MEMORY_MANAGEMENT_ALL,
    SERVED,
)

__all__ = ["SERVED_MARKER", "KvpoolModuleFinder", "is_served", "is_served_name"]

#: Attribute set (to True) on every served module.
SERVED_MARKER = "__kvpool_served__"


def is_served_name(fullname: str) -> bool:
    """True for the module names the finder answers for (served or refused)."""
    return fullname == MEMORY_MANAGEMENT or fullname.startswith(ALLOCATORS + ".")


def is_served(module: object) -> bool:
    """True when ``module`` is a module this finder built."""
    return isinstance(module, types.ModuleType) and hasattr(module, SERVED_MARKER)


class KvpoolModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Meta-path finder and loader for LMCache's memory-management modules.

    Thread safety: the import system serializes imports of one module
    (per-module import locks); the finder keeps no mutable state.
    """

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec served by this loader for the replaced names, else None."""
        if not is_served_name(fullname):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin="kvpool")

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        """Use the default module object."""
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        """Fill ``module`` with kvpool's names, then LMCache's imports.

        kvpool's names go in first: an LMCache module imported while this
        one is being filled (an import cycle through LMCache) already finds
        them.

        Raises:
            ImportError: the module is not one kvpool serves, or kvpool
                lacks one of its names.
        """
        name = module.__name__
        own = SERVED.get(name)
        if own is None:
            raise ImportError(
                f"kvpool's LMCache bridge serves no module {name!r}: it replaces "
                f"{MEMORY_MANAGEMENT} and the {ALLOCATORS}.* modules of the tested "
                "LMCache versions only; this LMCache is newer than kvpool knows",
                name=name,
            )
        from kvpool.integrations.lmcache.exports import kvpool_names

        table = kvpool_names()
        missing = [attr for attr in (*CORE, *own) if attr not in table]
        if missing:
            raise ImportError(
                f"kvpool lacks {', '.join(missing)} needed to serve {name}", name=name
            )
        for attr in (*CORE, *own):
            setattr(module, attr, table[attr])
        setattr(module, SERVED_MARKER, True)
        if name == MEMORY_MANAGEMENT:
            module.__all__ = list(MEMORY_MANAGEMENT_ALL)
            module._CORE_EXPORTS = list(MEMORY_MANAGEMENT_ALL)
        for attr, (home, value_name) in LMCACHE_IMPORTS.items():
            try:
                setattr(module, attr, getattr(importlib.import_module(home), value_name))
            except (ImportError, AttributeError):
                # As in LMCache, a CLI-only install has no device_ops.
                continue
        init_logger = getattr(module, "init_logger", None)
        if init_logger is not None:
            module.logger = init_logger(name)
