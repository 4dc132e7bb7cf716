"""``kvpool install-lmcache``: LMCache 0.5.6 and what its code imports, into this environment.

The one way to set up LMCache for kvpool, from a fresh virtual environment
that has torch and kvpool::

    python -m kvpool install-lmcache

It runs :func:`kvpool.integrations.lmcache.requirements.install`: pip
installs the pinned list shipped with kvpool into the running Python's
environment, each package with ``--no-deps`` (never a CUDA torch, and the
installed torch stays), then a child Python imports every LMCache module
kvpool uses.  Exit status 0 when ready, 1 when pip or an import failed,
2 without torch.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvpool.cli.installer import KEEP_HELP, add_installer

__all__ = ["add_parser", "run_install"]

#: What ``kvpool install-lmcache --help`` says (plain words: argparse shows it as is).
DESCRIPTION = (
    "Install LMCache 0.5.6 and every package its code imports on the paths kvpool uses "
    "(storage manager, connectors, the remote storage plugin, the L1/L2 managers) into the "
    "environment of the Python that runs this command, each with pip --no-deps from a pinned "
    "list shipped with kvpool: torch stays the one installed (never a CUDA build pulled in), "
    "nothing outside the list changes, and a package of the list installed at another "
    "version is replaced by the pinned one (--keep-installed leaves it). Then every LMCache "
    "module kvpool uses is imported, so a missing package is named at once. Run it in the "
    "virtual environment where torch and kvpool are installed."
)


def run_install(args: argparse.Namespace) -> int:
    """Install the pinned list (or say what would run); return the exit status."""
    from kvpool.integrations.lmcache.requirements import install

    return install(dry_run=args.dry_run, keep_installed=args.keep_installed)


def add_parser(subparsers: Any) -> None:
    """Register ``kvpool install-lmcache`` on an argparse subparsers object."""
    add_installer(
        subparsers,
        "install-lmcache",
        "install LMCache 0.5.6 and what its code imports into this environment",
        DESCRIPTION,
        run_install,
        keep_help=KEEP_HELP + " (for an environment whose versions another program pins, e.g. "
        "vLLM's)",
    )
