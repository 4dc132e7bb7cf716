"""The ``kvpool`` command line.

One parser with a subcommand per job: ``demo`` (a verified put/get round
trip, :mod:`kvpool.cli.demo`), ``info`` (the capability report with advice,
:mod:`kvpool.cli.info`), ``bench`` (the benchmark suite,
:mod:`kvpool.cli.bench`), ``install-lmcache``, ``install-sglang`` and
``install-vllm`` (LMCache, SGLang, vLLM's scheduler side, and what their code
imports, into this environment: :mod:`kvpool.cli.lmcache`,
:mod:`kvpool.cli.sglang`, :mod:`kvpool.cli.vllm`).
More are added by registering them in :data:`SUBCOMMANDS`::

    def add_demo(subparsers) -> None:
        p = subparsers.add_parser("demo", help="...")
        p.set_defaults(func=run_demo)

    SUBCOMMANDS.append(add_demo)

Each subcommand's function takes the parsed :class:`argparse.Namespace`
and returns the process exit status.  A subcommand that runs without the
native layer (an installer) sets ``needs_native=False`` among its defaults,
so ``python -m kvpool`` runs it from an unbuilt source tree too
(:mod:`kvpool.__main__`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["SUBCOMMANDS", "build_parser", "main", "version"]


def version() -> str:
    """kvpool's version, from the installed distribution's metadata.

    Read there rather than from ``kvpool.__version__``: the package facade
    sits above this layer.  The two agree, as ``pyproject.toml`` takes the
    distribution's version from ``kvpool.__version__``.
    """
    try:
        return importlib.metadata.version("kvpool")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed: pip install .)"


def _add_info(subparsers: Any) -> None:
    from kvpool.cli.info import add_parser

    add_parser(subparsers)


def _add_bench(subparsers: Any) -> None:
    from kvpool.cli.bench.cli import add_parser

    add_parser(subparsers)


def _add_demo(subparsers: Any) -> None:
    from kvpool.cli.demo import add_parser

    add_parser(subparsers)


def _add_install_lmcache(subparsers: Any) -> None:
    from kvpool.cli.lmcache import add_parser

    add_parser(subparsers)


def _add_install_sglang(subparsers: Any) -> None:
    from kvpool.cli.sglang import add_parser

    add_parser(subparsers)


def _add_install_vllm(subparsers: Any) -> None:
    from kvpool.cli.vllm import add_parser

    add_parser(subparsers)


#: Functions that each add one subcommand to the subparsers object.
SUBCOMMANDS: list[Callable[[Any], None]] = [
    _add_demo,
    _add_info,
    _add_bench,
    _add_install_lmcache,
    _add_install_sglang,
    _add_install_vllm,
]


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="kvpool",
        description="kvpool: host memory for LLM KV-cache offloading.",
        epilog="Run 'kvpool COMMAND --help' for the options of each command.",
    )
    parser.add_argument("--version", action="version", version=f"kvpool {version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # e.g. `kvpool info | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
