"""Make, or reuse, the virtual environment the LMCache compatibility suite runs in.

``python tests/compat/make_venv.py`` prints the path of a Python that sees
the packages of *the Python that runs it* - a virtual environment's when
run from one (its kvpool install and ``kvpool-lmcache.pth`` hook
included), not its base interpreter's - plus LMCache and the packages its
code imports.  Those are installed as ``kvpool install-lmcache`` installs
them (the same pinned list,
``kvpool/integrations/lmcache/requirements-lmc056.txt``, every package with
``--no-deps`` and torch held to the installed one), so no CUDA torch is
ever pulled in.  The new environment has no site packages of its own
beyond those: a ``.pth`` file adds this Python's site directories (with
:func:`site.addsitedir`, so their own ``.pth`` files run too) after its
own.

The environment is cached under ``$KVPOOL_COMPAT_CACHE`` (default
``~/.cache/kvpool``) in a folder named after a hash of the requirements
file, this Python (its environment and site directories) and its torch: a
run with the same inputs reuses it, any change makes a new one.  A
half-built environment (killed mid-install) is detected by its missing
completion stamp and rebuilt; a file lock keeps two concurrent runs from
building the same one.

Each requirements file makes its own environment, named after it
(``requirements-lmc056.txt``: ``lmc056-<hash>``; SGLang's
``kvpool/integrations/sglang/requirements-sgl0523.txt``, the list
``kvpool install-sglang`` installs, ``sgl0523-<hash>``; vLLM's
``tests/compat/requirements-vllm033.txt``, ``vllm033-<hash>``).  Files in a
``site-<name>/`` folder next to the requirements file (a ``.pth`` and the
module it loads: SGLang's torchvision stand-in) are copied into the
environment's site-packages, and are part of the hash.

Options: ``--cache DIR``, ``--requirements FILE``, ``--rebuild``, ``--all`` (every
environment ``make compat`` uses - LMCache's, SGLang's, then vLLM's - one after the other;
``make test`` builds them so in the background while pytest runs).
Exit status 0 on success; on failure the pip output is shown and the
status is non-zero.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))  # the checkout's kvpool: the recipe's list and pip command

from kvpool.cli.sglang import REQUIREMENTS as SGLANG_REQUIREMENTS  # noqa: E402
from kvpool.cli.vllm import REQUIREMENTS as VLLM_REQUIREMENTS  # noqa: E402
from kvpool.integrations.install import pip_command  # noqa: E402
from kvpool.integrations.lmcache.requirements import REQUIREMENTS  # noqa: E402

STAMP = ".kvpool-compat-complete"
#: The file in the new environment's site-packages that adds this Python's site directories.
BASE_PTH = "_kvpool_compat_base.pth"

# Run inside the new environment: LMCache is there, and torch is the given
# Python's (no torch distribution inside the environment).
CHECK = r"""
import importlib.metadata as md, pathlib, sys, sysconfig
import torch
first = sys.argv[1]
own = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
where = pathlib.Path(torch.__file__).resolve()
if own in where.parents:
    sys.exit(f"torch was installed into the compat environment ({where}), not taken from the base")
print(first, md.version(first), "over torch", torch.__version__, "from", where.parent)
"""


def cache_root(arg: str | None) -> Path:
    """The folder that holds the cached environments."""
    if arg:
        return Path(arg).expanduser()
    env = os.environ.get("KVPOOL_COMPAT_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kvpool"


def env_name(requirements: Path) -> str:
    """The environment's name: the requirements file's, less ``requirements-``."""
    return requirements.stem.removeprefix("requirements-")


def site_files(requirements: Path) -> list[Path]:
    """The files copied into the environment's site-packages (``site-<name>/``)."""
    folder = requirements.parent / f"site-{env_name(requirements)}"
    return sorted(p for p in folder.glob("*") if p.is_file()) if folder.is_dir() else []


def site_dirs() -> list[str]:
    """This Python's site directories (a venv's, its base's if it sees them, the user's).

    In the order its ``sys.path`` has them, so the new environment looks
    them up in the same order.
    """
    dirs = set(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    return [p for p in dict.fromkeys(sys.path) if p in dirs and os.path.isdir(p)]


def environment_key(requirements: Path) -> str:
    """A hash of everything the environment depends on."""
    import torch

    digest = hashlib.sha256()
    digest.update(requirements.read_bytes())
    for extra in site_files(requirements):
        digest.update(extra.name.encode() + extra.read_bytes())
    digest.update(os.path.realpath(sys.executable).encode())
    digest.update(sys.prefix.encode())  # a venv's python is a link to its base's
    digest.update("\n".join(site_dirs()).encode())
    digest.update(sys.version.encode())
    digest.update(torch.__version__.encode())
    return digest.hexdigest()[:16]


def run(cmd: list[str]) -> None:
    """Run ``cmd``; on failure show its output and exit non-zero."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        sys.exit(f"make_venv: {' '.join(cmd)} failed with status {proc.returncode}")


def build(venv: Path, requirements: Path) -> None:
    """Create the environment at ``venv`` over this Python's packages and install the list."""
    if venv.exists():
        shutil.rmtree(venv)
    run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Its own site-packages first (the list, and the site-<name>/ files), then
    # this Python's site directories as this Python orders them, each with its
    # .pth files.
    adds = "; ".join(f"site.addsitedir({d!r})" for d in site_dirs())
    (Path(purelib) / BASE_PTH).write_text(f"import site; {adds}\n")
    for extra in site_files(requirements):
        shutil.copy(extra, Path(purelib) / extra.name)
    import torch

    constraints = venv / "constraints.txt"
    constraints.write_text(f"torch=={torch.__version__}\n")
    run([*pip_command(python, constraints, requirements), "--quiet"])
    first = requirements.read_text().split("\n")
    name = next(s.split("==")[0] for s in first if s.strip() and not s.startswith("#"))
    run([python, "-c", CHECK, name])
    (venv / STAMP).write_text("ok\n")


#: What ``--all`` builds: every environment ``make compat`` runs a suite in, each
#: from the list its installer uses (a new environment adds its list here).
ALL_REQUIREMENTS = (REQUIREMENTS, SGLANG_REQUIREMENTS, VLLM_REQUIREMENTS)


def ensure(requirements: Path, root: Path, rebuild: bool) -> Path:
    """The python of the environment of ``requirements`` under ``root``, built if needed."""
    venv = root / f"{env_name(requirements)}-{environment_key(requirements)}"
    with open(root / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if rebuild or not (venv / STAMP).is_file():
            print(f"make_venv: building {venv}", file=sys.stderr)
            build(venv, requirements)
    return venv / "bin" / "python"


def main(argv: list[str] | None = None) -> int:
    """Print the compat environment's python, building it first if needed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", help="folder of the cached environments")
    parser.add_argument("--requirements", default=str(REQUIREMENTS))
    parser.add_argument("--rebuild", action="store_true", help="rebuild even if cached")
    parser.add_argument(
        "--all",
        action="store_true",
        help="every environment make compat uses (ignores --requirements)",
    )
    args = parser.parse_args(argv)
    root = cache_root(args.cache)
    root.mkdir(parents=True, exist_ok=True)
    chosen = ALL_REQUIREMENTS if args.all else (Path(args.requirements),)
    for requirements in chosen:
        print(ensure(requirements.resolve(), root, args.rebuild))
    return 0


if __name__ == "__main__":
    sys.exit(main())
