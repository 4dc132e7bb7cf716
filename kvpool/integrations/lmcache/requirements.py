"""LMCache 0.5.6 and the packages its code imports: the list, its install, and a check.

``python -m kvpool install-lmcache`` (:mod:`kvpool.cli.lmcache`) runs
:func:`install`: pip, in the running Python's environment, installs every
line of :data:`REQUIREMENTS` with ``--no-deps`` (LMCache's declared
requirements would pull a multi-GB CUDA torch and cupy) under a constraint
that keeps the installed torch; then a child Python, started in an empty
folder (so a clone's unbuilt ``kvpool/`` where the user stands is not what
it imports), imports every LMCache module kvpool works with
(:data:`MODULES`) and the plugin, so a missing package is named at once
rather than when LMCache first needs it.  The steps are
:mod:`kvpool.integrations.install`'s, shared with ``install-sglang``.

Importing this module imports neither torch nor LMCache.
"""

from __future__ import annotations

import site
from collections.abc import Callable
from pathlib import Path

from kvpool.integrations import install as _shared
from kvpool.integrations.install import Recipe

__all__ = [
    "MODULES",
    "RECIPE",
    "REQUIREMENTS",
    "install",
]

#: The pinned list (shipped in the package, next to this module).
REQUIREMENTS = Path(__file__).with_name("requirements-lmc056.txt")

#: The LMCache modules kvpool's integration and its tests use: memory
#: management, the storage manager and its backends, the connectors, the
#: remote storage plugin framework, the L1/L2 managers and the engine.
MODULES = (
    "lmcache.v1.memory_management",
    "lmcache.v1.memory_allocators.mixed_memory_allocator",
    "lmcache.v1.config",
    "lmcache.v1.metadata",
    "lmcache.v1.event_manager",
    "lmcache.v1.pin_monitor",
    "lmcache.observability",
    "lmcache.v1.storage_backend.storage_manager",
    "lmcache.v1.storage_backend.local_cpu_backend",
    "lmcache.v1.storage_backend.local_disk_backend",
    "lmcache.v1.storage_backend.remote_backend",
    "lmcache.v1.storage_backend.connector",
    "lmcache.v1.storage_backend.connector.fs_connector",
    "lmcache.v1.storage_backend.connector.redis_connector",
    "lmcache.v1.distributed.memory_manager",
    "lmcache.v1.distributed.l1_manager",
    "lmcache.v1.distributed.l2_adapters.fs_l2_adapter",
    "lmcache.v1.health_monitor.checks.remote_backend_check",
    "lmcache.v1.cache_engine",
    "kvpool.integrations.lmcache.remote",
)

#: The recipe :func:`kvpool.integrations.install.install` runs.
RECIPE = Recipe(
    command="install-lmcache",
    title="LMCache 0.5.6",
    requirements=REQUIREMENTS,
    modules=MODULES,
)


def _hook_installed() -> bool:
    """True when this environment has ``kvpool-lmcache.pth`` (a regular kvpool install)."""
    return any((Path(d) / "kvpool-lmcache.pth").is_file() for d in site.getsitepackages())


def install(
    *,
    dry_run: bool = False,
    keep_installed: bool = False,
    say: Callable[[str], None] = print,
    run: Callable[[list[str], str], int] | None = None,
) -> int:
    """Install :data:`REQUIREMENTS` into this Python's environment, then check the imports.

    :func:`kvpool.integrations.install.install` with :data:`RECIPE`, then a
    word on the ``KVPOOL_LMCACHE=1`` start-up hook.

    Args:
        dry_run: say what would run, run nothing.
        keep_installed: leave a package of the list that is installed at
            any version as it is (LMCache itself excepted), for an
            environment whose versions another program pins (vLLM's).
        say: where the progress lines go.
        run: runs a command in a folder, returns its exit status (the
            default runs it as a child process).

    Returns:
        0 when the packages are installed and every module of
        :data:`MODULES` imports; 1 when pip or the check failed (its output
        says why); 2 when torch is not installed.
    """
    extra = {} if run is None else {"run": run}
    status = _shared.install(
        RECIPE, dry_run=dry_run, keep_installed=keep_installed, say=say, **extra
    )
    if status != 0 or dry_run:
        return status
    if _hook_installed():
        say("install-lmcache: KVPOOL_LMCACHE=1 in a program's environment runs LMCache on kvpool")
    else:
        say(
            "install-lmcache: KVPOOL_LMCACHE=1 needs kvpool-lmcache.pth in site-packages, which "
            "a regular install (pip install .) puts there and this environment lacks (kvpool "
            "is installed editable, or not at all); call "
            "kvpool.integrations.lmcache.install() instead, or install kvpool with pip install ."
        )
    return 0
