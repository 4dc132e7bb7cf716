"""LMCache 0.5.6 and the packages its code imports: the list, its install, and a check.

``python -m kvpool install-lmcache`` (:mod:`kvpool.cli.lmcache`) runs
:func:`install`: pip, in the running Python's environment, installs every
line of :data:`REQUIREMENTS` with ``--no-deps`` (LMCache's declared
requirements would pull a multi-GB CUDA torch and cupy) under a constraint
that keeps the installed torch; then a child Python imports every LMCache
module kvpool works with (:data:`MODULES`) and the plugin, so a missing
package is named at once rather than when LMCache first needs it.

Importing this module imports neither torch nor LMCache.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import site
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["MODULES", "REQUIREMENTS", "check_command", "install", "pip_command", "requirements"]

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

# Run by the checking child: import each module; name the first that fails.
_CHECK = """
import importlib, os, sys
os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        sys.exit(f"importing {name} failed: {type(exc).__name__}: {exc}")
print(f"imported {len(sys.argv) - 1} LMCache modules")
"""


def requirements(path: Path = REQUIREMENTS) -> list[str]:
    """The requirement lines of ``path`` (``name==version``), comments left out."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def pip_command(python: str, constraints: Path, requirements: Path = REQUIREMENTS) -> list[str]:
    """The pip command that installs ``requirements`` into ``python``'s environment.

    Args:
        python: the interpreter whose environment receives the packages.
        constraints: a pip constraints file (:func:`install` writes one
            that pins the installed torch).
        requirements: the pinned list.

    Returns:
        ``python -m pip install --no-deps -c constraints -r requirements``.
    """
    return [
        python,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--disable-pip-version-check",
        "-c",
        str(constraints),
        "-r",
        str(requirements),
    ]


def check_command(python: str) -> list[str]:
    """The command that imports every module of :data:`MODULES` in ``python``."""
    return [python, "-c", _CHECK, *MODULES]


def _installed(name: str) -> str | None:
    importlib.invalidate_caches()  # pip may have just changed site-packages
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _hook_installed() -> bool:
    """True when this environment has ``kvpool-lmcache.pth`` (a regular kvpool install)."""
    return any((Path(d) / "kvpool-lmcache.pth").is_file() for d in site.getsitepackages())


def install(
    *,
    dry_run: bool = False,
    keep_installed: bool = False,
    say: Callable[[str], None] = print,
    run: Callable[[list[str]], int] = lambda cmd: subprocess.call(cmd),
) -> int:
    """Install :data:`REQUIREMENTS` into this Python's environment, then check the imports.

    Args:
        dry_run: say what would run, run nothing.
        keep_installed: leave a package of the list that is installed at
            any version as it is (LMCache itself excepted), for an
            environment whose versions another program pins (vLLM's).
        say: where the progress lines go.
        run: runs a command, returns its exit status.

    Returns:
        0 when the packages are installed and every module of
        :data:`MODULES` imports; 1 when pip or the check failed (its output
        says why); 2 when torch is not installed.
    """
    torch = _installed("torch")
    python = sys.executable
    if torch is None:
        say(
            f"install-lmcache: torch is not installed in {sys.prefix}; install it first "
            "(pip install torch==2.13.0, the build your machine needs), then kvpool, then "
            "run this again"
        )
        return 2
    names = requirements()
    kept = []
    if keep_installed:
        kept = [n for n in names[1:] if _installed(n.split("==")[0]) is not None]
        names = [n for n in names if n not in kept]
    say(
        f"install-lmcache: LMCache 0.5.6 and {len(names) - 1} packages its code imports into "
        f"{sys.prefix} ({python}), each with --no-deps; torch {torch} stays"
        + (f"; {len(kept)} already installed are kept" if kept else "")
    )
    with tempfile.TemporaryDirectory(prefix="kvpool-lmcache-") as folder:
        constraints = Path(folder) / "constraints.txt"
        # Were anything in the list to ask for torch, pip could only keep this one.
        constraints.write_text(f"torch=={torch}\n")
        listed = REQUIREMENTS
        if kept:
            listed = Path(folder) / "requirements.txt"
            listed.write_text("".join(f"{n}\n" for n in names))
        pip = pip_command(python, constraints, listed)
        check = check_command(python)
        if dry_run:
            say(" ".join(pip))
            say(f"{python} -c <import {len(MODULES)} modules: {', '.join(MODULES)}>")
            return 0
        if run(pip) != 0:
            say("install-lmcache: pip failed (its output is above)")
            return 1
    status = run(check)
    if status != 0:
        say(
            "install-lmcache: LMCache is installed but a module does not import (above); "
            "report it to kvpool with that line"
        )
        return 1
    if _installed("torch") != torch:
        say(f"install-lmcache: torch changed from {torch} to {_installed('torch')}")
        return 1
    say(f"install-lmcache: done: LMCache 0.5.6 is ready in {sys.prefix}")
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
