"""The shape every ``kvpool install-*`` subcommand shares: its two options and how it runs a recipe.

``install-lmcache``, ``install-sglang`` and ``install-vllm`` each install an
engine's pinned list into the running environment
(:func:`kvpool.integrations.install.install`); they differ in the recipe,
the words of ``--help`` and the line printed when done.  :func:`add_installer`
registers one with ``--dry-run`` and ``--keep-installed``;
:func:`run_recipe` runs a :class:`~kvpool.integrations.install.Recipe` from them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from kvpool.integrations.install import Recipe, install

__all__ = ["add_installer", "run_recipe"]

#: ``--keep-installed``'s help, unless a command says more.
KEEP_HELP = "leave the packages of the list that are installed already, at any version, as they are"


def add_installer(
    subparsers: Any,
    command: str,
    summary: str,
    description: str,
    run: Callable[[argparse.Namespace], int],
    keep_help: str = KEEP_HELP,
) -> None:
    """Register ``kvpool <command>`` with ``--dry-run`` and ``--keep-installed``.

    Args:
        subparsers: argparse's subparsers object.
        command: the subcommand's name (``install-sglang``).
        summary: its one-line help.
        description: its ``--help`` text.
        run: runs it with the parsed arguments; returns the exit status.
        keep_help: ``--keep-installed``'s help.
    """
    p = subparsers.add_parser(command, help=summary, description=description)
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--keep-installed", action="store_true", help=keep_help)
    # An installer runs without the native layer (from an unbuilt source tree too).
    p.set_defaults(func=run, needs_native=False)


def run_recipe(recipe: Recipe, args: argparse.Namespace, done: str) -> int:
    """Install ``recipe`` as the arguments say; print ``done`` after a real install that worked.

    Returns:
        The exit status of :func:`kvpool.integrations.install.install`.
    """
    status = install(recipe, dry_run=args.dry_run, keep_installed=args.keep_installed)
    if status == 0 and not args.dry_run:
        print(f"{recipe.command}: {done}")
    return status
