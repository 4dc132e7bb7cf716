"""Install an engine's pinned list next to kvpool without touching torch, then check its imports.

The machinery of ``python -m kvpool install-lmcache`` and ``install-sglang``
(:mod:`kvpool.cli.lmcache`, :mod:`kvpool.cli.sglang`); each engine gives a
:class:`Recipe`: its pinned list, shipped in the package, and the modules
that must import afterwards.  :func:`install` then

1. refuses without torch (an engine's declared requirements would choose
   one, and from PyPI that is a multi-GB CUDA build);
2. runs pip in the running Python's environment on every line of the list
   with ``--no-deps``, under a constraint that holds torch to the
   installed version;
3. places the recipe's stand-in (:class:`StandIn`) when the module it
   stands for is not installed;
4. imports every module of the recipe in a child Python.

pip and the child run in a fresh temporary folder, so neither depends on
the current directory: from the root of a kvpool clone, ``python -m``
and ``python -c`` would otherwise import the clone's ``kvpool/`` folder,
which is not built, instead of the installed package.

Importing this module imports neither torch nor an engine.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "NO_KVPOOL",
    "TORCH_ADVICE",
    "Recipe",
    "StandIn",
    "check_command",
    "install",
    "installed_version",
    "pip_command",
    "requirements",
]

#: How to install torch first: the CPU build from PyTorch's own index (PyPI's
#: Linux x86-64 wheel is the CUDA build, with ~60 NVIDIA packages), or PyPI's
#: for an NVIDIA GPU.
TORCH_ADVICE = (
    "without an NVIDIA GPU, the CPU build: pip install torch==2.13.0 --index-url "
    "https://download.pytorch.org/whl/cpu; with one: pip install torch==2.13.0"
)

#: The checking child's exit status when kvpool itself is not installed there.
NO_KVPOOL = 3

# Run by the checking child: import each module, warnings off (an engine's
# "no CUDA here" warnings say nothing about the install); name the first that fails.
_CHECK = f"""
import importlib, os, sys, warnings
os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
warnings.simplefilter("ignore")
label = sys.argv[1]
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != "kvpool":
            sys.exit(f"importing {{name}} failed: ModuleNotFoundError: {{exc}}")
        sys.exit({NO_KVPOOL})
    except Exception as exc:
        sys.exit(f"importing {{name}} failed: {{type(exc).__name__}}: {{exc}}")
print(f"imported {{len(sys.argv) - 2}} {{label}} modules")
"""


@dataclass(frozen=True)
class StandIn:
    """Files that serve a module the engine imports but cannot have here.

    Attributes:
        module: the module they stand in for, also the name of its
            distribution (``torchvision``).
        folder: the files (a ``.pth`` and the module it loads), copied into
            site-packages when no distribution of ``module`` is installed.
        note: one sentence for the user: what the stand-in cannot do, and
            how to install the real module instead.
    """

    module: str
    folder: Path
    note: str

    def files(self) -> list[Path]:
        """The files of :attr:`folder`, sorted by name."""
        return sorted(p for p in self.folder.iterdir() if p.is_file() and p.suffix != ".pyc")


@dataclass(frozen=True)
class Recipe:
    """One engine's install: what :func:`install` needs to know.

    Attributes:
        command: the subcommand, for messages (``install-sglang``).
        title: the engine and version, for messages (``SGLang 0.5.23``).
        requirements: the pinned list, ``name==version`` a line, the
            engine first.
        modules: what must import afterwards (the engine's modules kvpool
            uses, and kvpool's own integration module).
        stand_in: files placed when a module the engine imports is missing.

    Raises:
        TypeError: ``requirements`` is not a :class:`~pathlib.Path`.
        ValueError: ``modules`` is empty or holds something other than names.
    """

    command: str
    title: str
    requirements: Path
    modules: tuple[str, ...]
    stand_in: StandIn | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.requirements, Path):
            raise TypeError(
                f"Recipe(requirements={self.requirements!r}): give the pinned list as a "
                "pathlib.Path"
            )
        if not self.modules or not all(isinstance(m, str) and m for m in self.modules):
            raise ValueError(
                f"Recipe(modules={self.modules!r}): give a tuple of one or more module names "
                "to import after the install"
            )


def requirements(path: Path) -> list[str]:
    """The requirement lines of ``path`` (``name==version``), comments left out."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def pip_command(python: str, constraints: Path, requirements: Path) -> list[str]:
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


def check_command(python: str, label: str, modules: tuple[str, ...]) -> list[str]:
    """The command that imports every one of ``modules`` in ``python``.

    Args:
        python: the interpreter to check.
        label: what the modules are, for its closing line
            (``imported 20 LMCache modules``).
        modules: the module names, imported in this order.
    """
    return [python, "-c", _CHECK, label, *modules]


def installed_version(name: str) -> str | None:
    """The installed version of distribution ``name`` in this environment, or None."""
    importlib.invalidate_caches()  # pip may have just changed site-packages
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(cmd: list[str], cwd: str) -> int:
    return subprocess.call(cmd, cwd=cwd)


def _place_stand_in(stand_in: StandIn, say: Callable[[str], None]) -> None:
    # By its distribution, not find_spec: a stand-in placed before answers
    # find_spec, and is copied again (so it is this kvpool's).
    if installed_version(stand_in.module) is not None:
        return
    site = Path(sysconfig.get_paths()["purelib"])
    for source in stand_in.files():
        shutil.copyfile(source, site / source.name)
    names = ", ".join(p.name for p in stand_in.files())
    say(f"{stand_in.module} is not installed: placed a stand-in in {site} ({names}). "
        f"{stand_in.note}")  # fmt: skip


def install(
    recipe: Recipe,
    *,
    dry_run: bool = False,
    keep_installed: bool = False,
    say: Callable[[str], None] = print,
    run: Callable[[list[str], str], int] = _run,
) -> int:
    """Install ``recipe``'s list into this Python's environment, then check its imports.

    Args:
        recipe: the engine's list, modules and stand-in.
        dry_run: say what would run, run nothing.
        keep_installed: leave a package of the list that is installed at
            any version as it is (the engine itself excepted), for an
            environment whose versions another program pins (vLLM's).
        say: where the progress lines go; each is prefixed with the
            recipe's command.
        run: runs a command in a folder, returns its exit status.

    Returns:
        0 when the packages are installed and every module imports; 1 when
        pip or the check failed (its output says why), or torch changed;
        2 when torch is not installed.

    Raises:
        TypeError: ``recipe`` is not a :class:`Recipe`.
        FileNotFoundError: the recipe's pinned list is missing.
    """
    if not isinstance(recipe, Recipe):
        raise TypeError(f"install(recipe={recipe!r}): give a kvpool.integrations.install.Recipe")
    if not recipe.requirements.is_file():
        raise FileNotFoundError(
            f"{recipe.command}: the pinned list {recipe.requirements} is missing from this "
            "kvpool; reinstall kvpool (pip install --force-reinstall kvpool)"
        )
    label = recipe.title.split()[0]

    def tell(line: str) -> None:
        say(f"{recipe.command}: {line}")

    torch = installed_version("torch")
    python = sys.executable
    if torch is None:
        tell(
            f"torch is not installed in {sys.prefix}; install it first ({TORCH_ADVICE}), "
            "then kvpool, then run this again"
        )
        return 2
    names = requirements(recipe.requirements)
    kept = []
    if keep_installed:
        kept = [n for n in names[1:] if installed_version(n.split("==")[0]) is not None]
        names = [n for n in names if n not in kept]
    tell(
        f"{recipe.title} and {len(names) - 1} packages its code imports into {sys.prefix} "
        f"({python}), each with --no-deps; torch {torch} stays"
        + (f"; {len(kept)} already installed are kept" if kept else "")
    )
    # A fresh folder to run in: a kvpool/ folder where the user stands (a
    # clone's root) must not be what the check imports.
    with tempfile.TemporaryDirectory(prefix="kvpool-install-") as folder:
        constraints = Path(folder) / "constraints.txt"
        # Were anything in the list to ask for torch, pip could only keep this one.
        constraints.write_text(f"torch=={torch}\n")
        listed = recipe.requirements
        if kept:
            listed = Path(folder) / "requirements.txt"
            listed.write_text("".join(f"{n}\n" for n in names))
        pip = pip_command(python, constraints, listed)
        check = check_command(python, label, recipe.modules)
        if dry_run:
            say(" ".join(pip))
            # The files it names are temporary: say what they hold, so it can be rerun.
            say(f"  ({constraints.name} is a temporary file holding: torch=={torch})")
            if kept:
                say(f"  ({listed.name} is a temporary file listing: {' '.join(names)})")
            if recipe.stand_in is not None:
                say(f"then, where {recipe.stand_in.module} is missing, a stand-in for it is placed")
            say(f"{python} -c <import {len(recipe.modules)} modules: {', '.join(recipe.modules)}>")
            return 0
        if run(pip, folder) != 0:
            tell("pip failed (its output is above)")
            return 1
        if recipe.stand_in is not None:
            _place_stand_in(recipe.stand_in, tell)
        status = run(check, folder)
        if status == NO_KVPOOL:
            tell(
                f"{label} is installed, but kvpool is not installed in {sys.prefix}; install it "
                "(pip install kvpool, or pip install . in a clone), then run this again"
            )
            return 1
        if status != 0:
            tell(
                f"{label} is installed but a module does not import (above); "
                "report it to kvpool with that line"
            )
            return 1
    if installed_version("torch") != torch:
        tell(f"torch changed from {torch} to {installed_version('torch')}")
        return 1
    tell(f"done: {recipe.title} is ready in {sys.prefix}")
    return 0
