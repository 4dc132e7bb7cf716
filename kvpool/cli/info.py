"""``kvpool info``: the capability report of this machine, with advice (or JSON)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser", "run_info"]


def run_info(args: argparse.Namespace) -> int:
    """Print the capability report (or JSON with ``--json``); return 0.

    Returns 1, with the reason on stderr, when libpinmem cannot be loaded.
    """
    try:
        from kvpool.native.machine import capabilities

        caps = capabilities(probe_populate=True)
    except ImportError as exc:
        print(f"kvpool info: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(caps.to_dict(), indent=2))
    else:
        print(caps.report())
    return 0


def add_parser(subparsers: Any) -> None:
    """Add the ``info`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "info",
        help="what this machine offers: CUDA, hugepages, NUMA, memlock, with advice",
        description="Probe the machine and print what kvpool can use, with advice.",
    )
    p.add_argument("--json", action="store_true", help="print the probe as JSON")
    p.set_defaults(func=run_info)
