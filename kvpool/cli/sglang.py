"""``kvpool install-sglang``: SGLang 0.5.23 and what its code imports, into this environment.

The CPU-safe way to put SGLang next to kvpool, from a virtual environment
that has torch and kvpool::

    python -m kvpool install-sglang

It runs :func:`kvpool.integrations.install.install` with :data:`RECIPE`:
pip installs the pinned list shipped with kvpool
(``kvpool/integrations/sglang/requirements-sgl0523.txt``) into the running
Python's environment, each package with ``--no-deps`` (never a CUDA torch,
and the installed torch stays); where torchvision is not installed it
places kvpool's stand-in for SGLang's imports; then a child Python imports
every SGLang module kvpool uses and kvpool's backend.  Exit status 0 when
ready, 1 when pip or an import failed, 2 without torch.

On a GPU machine that serves models, install SGLang as SGLang documents it
(``pip install sglang==0.5.23``: its CUDA torch, torchvision and kernels),
then kvpool; this command is for a torch you keep.

The recipe is declared here rather than beside the backend because
importing :mod:`kvpool.integrations.sglang` needs SGLang: the list and the
stand-in are read from that folder by path.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvpool.cli.installer import add_installer, run_recipe
from kvpool.integrations.install import Recipe, StandIn

__all__ = ["MODULES", "RECIPE", "REQUIREMENTS", "add_parser", "run_install"]

_FOLDER = Path(__file__).resolve().parents[1] / "integrations" / "sglang"

#: The pinned list (shipped in the package, beside the backend).
REQUIREMENTS = _FOLDER / "requirements-sgl0523.txt"

#: The SGLang modules kvpool's backend, its example, benchmark and tests
#: use, then the backend itself.
MODULES = (
    "sglang.srt.mem_cache.hicache_storage",
    "sglang.srt.mem_cache.device_pool_info",
    "sglang.srt.mem_cache.pool_host.mha",
    "sglang.srt.mem_cache.pool_host.mla",
    "sglang.srt.mem_cache.storage",
    "sglang.srt.mem_cache.storage.mooncake_store.mooncake_store",
    "sglang.srt.observability.metrics_collector",
    "kvpool.integrations.sglang",
)

#: The torchvision stand-in: SGLang imports ``torchvision.transforms`` at start-up.
TORCHVISION = StandIn(
    module="torchvision",
    folder=_FOLDER / "site-sgl0523",
    note=(
        "It serves SGLang's imports, not image code (multimodal models); for that, install "
        "the torchvision built for your torch (with a CPU torch 2.13: pip install "
        "torchvision==0.28.0 --index-url https://download.pytorch.org/whl/cpu), which then "
        "takes precedence."
    ),
)

#: What ``install-sglang`` runs.
RECIPE = Recipe(
    command="install-sglang",
    title="SGLang 0.5.23",
    requirements=REQUIREMENTS,
    modules=MODULES,
    stand_in=TORCHVISION,
)

#: What ``kvpool install-sglang --help`` says (plain words: argparse shows it as is).
DESCRIPTION = (
    "Install SGLang 0.5.23 and every package its code imports on the paths kvpool uses "
    "(HiCache storage and its backend factory, the host pools, the config modules they reach) "
    "into the environment of the Python that runs this command, each with pip --no-deps from "
    "a pinned list shipped with kvpool: torch stays the one installed (pip install sglang "
    "would replace it with a CUDA torch 2.14.1 and about 60 NVIDIA packages, 11 GB), nothing "
    "outside the list changes, and a package of the list installed at another version is "
    "replaced by the pinned one (--keep-installed leaves it). Where torchvision is not "
    "installed, a stand-in that serves SGLang's imports is placed in site-packages. Then "
    "every SGLang module kvpool uses is imported, so a missing package is named at once. Run "
    "it in the virtual environment where torch and kvpool are installed; on a GPU machine "
    "that serves models, install SGLang as SGLang documents it instead."
)


#: What ``install-sglang`` prints once the environment is ready.
DONE = (
    "SGLang loads kvpool's HiCache backend by configuration "
    "(--hicache-storage-backend dynamic, docs/guide/sglang.md)"
)


def run_install(args: argparse.Namespace) -> int:
    """Install the pinned list (or say what would run); return the exit status."""
    return run_recipe(RECIPE, args, DONE)


def add_parser(subparsers: Any) -> None:
    """Register ``kvpool install-sglang`` on an argparse subparsers object."""
    add_installer(
        subparsers,
        "install-sglang",
        "install SGLang 0.5.23 and what its code imports into this environment",
        DESCRIPTION,
        run_install,
    )
