"""``kvpool install-vllm``: vLLM 0.33.0's scheduler side and what it imports, into this environment.

The CPU-safe way to try kvpool's vLLM tier, from a virtual environment that
has torch and kvpool::

    python -m kvpool install-vllm

It runs :func:`kvpool.integrations.install.install` with :data:`RECIPE`: pip
installs the pinned list shipped with kvpool
(``kvpool/integrations/vllm/requirements-vllm033.txt``) into the running
Python's environment, each package with ``--no-deps`` (vLLM's own
requirements would bring torch 2.14.0's CUDA build and the NVIDIA
libraries; the installed torch stays), then a child Python imports the vLLM
modules the tier runs on and the tier itself.  Exit status 0 when ready, 1
when pip or an import failed, 2 without torch.

The list covers vLLM's scheduler side - its configuration, ``vllm serve``'s
argument parser, the offloading connector and its tiering manager - which
is what runs the tier; a GPU machine that serves models installs vLLM as
vLLM documents it, then kvpool.

The recipe is declared here rather than beside the tier because importing
:mod:`kvpool.integrations.vllm` needs vLLM: the list is read from that folder
by path.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvpool.cli.installer import add_installer, run_recipe
from kvpool.integrations.install import Recipe

__all__ = ["MODULES", "RECIPE", "REQUIREMENTS", "add_parser", "run_install"]

_FOLDER = Path(__file__).resolve().parents[1] / "integrations" / "vllm"

#: The pinned list (shipped in the package, beside the tier).
REQUIREMENTS = _FOLDER / "requirements-vllm033.txt"

#: The vLLM modules the tier, its example and its tests use, then the tier itself.
MODULES = (
    "vllm.config",
    "vllm.v1.kv_offload.tiering.base",
    "vllm.v1.kv_offload.tiering.spec",
    "vllm.v1.kv_offload.tiering.async_lookup",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector",
    "kvpool.integrations.vllm",
)

#: What ``install-vllm`` runs.
RECIPE = Recipe(
    command="install-vllm",
    title="vLLM 0.33.0 (scheduler side)",
    requirements=REQUIREMENTS,
    modules=MODULES,
)

#: What ``kvpool install-vllm --help`` says (plain words: argparse shows it as is).
DESCRIPTION = (
    "Install vLLM 0.33.0 and every package its scheduler side imports (its configuration, "
    "vllm serve's argument parser, the offloading connector and its tiering manager, which "
    "loads kvpool's tier) into the environment of the Python that runs this command, each "
    "with pip --no-deps from a pinned list shipped with kvpool: torch stays the one installed "
    "(pip install vllm would replace it with a CUDA torch 2.14.0 and the NVIDIA libraries), "
    "nothing outside the list changes, and a package of the list installed at another version "
    "is replaced by the pinned one (--keep-installed leaves it). Then every vLLM module the "
    "tier uses is imported, so a missing package is named at once. Run it in the virtual "
    "environment where torch and kvpool are installed; on a GPU machine that serves models, "
    "install vLLM as vLLM documents it instead."
)


#: What ``install-vllm`` prints once the environment is ready.
DONE = (
    "vLLM loads kvpool's tier from a secondary_tiers entry of TieringOffloadingSpec "
    "(docs/guide/vllm.md)"
)


def run_install(args: argparse.Namespace) -> int:
    """Install the pinned list (or say what would run); return the exit status."""
    return run_recipe(RECIPE, args, DONE)


def add_parser(subparsers: Any) -> None:
    """Register ``kvpool install-vllm`` on an argparse subparsers object."""
    add_installer(
        subparsers,
        "install-vllm",
        "install vLLM 0.33.0's scheduler side and what it imports into this environment",
        DESCRIPTION,
        run_install,
    )
