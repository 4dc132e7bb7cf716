"""The SGLang recipe of docs/guide/sglang.md, run verbatim in a fresh virtual environment.

A newcomer on a CPU machine: a fresh, never-built clone (a copy of this
checkout's files), a virtual environment that sees nothing of this
machine's packages, torch (this interpreter's version, the CPU build:
never a CUDA download), kvpool installed from the clone as getting-started
says, then every line of the guide's CPU block under "Installing SGLang",
as written, at the clone's root in a shell where that environment is
active: ``python -m kvpool install-sglang``, then the backend example.
torch must be the one installed before, and torchvision the stand-in.

Downloads come from pip's cache after the first run (SGLang's compat
environment of ``make compat`` fetches the same wheels).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from newcomer import CPU_TORCH
from test_lmcache_recipe import clean_env, sh

from kvpool.cli.sglang import MODULES

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide" / "sglang.md"

pytestmark = pytest.mark.slow


def recipe() -> list[str]:
    """The command lines of the guide's CPU block (its second) under "Installing SGLang"."""
    section = GUIDE.read_text().split("## Installing SGLang\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "docs/guide/sglang.md: a GPU block and a CPU block"
    lines = [line.split("  #", 1)[0].strip() for line in blocks[1].splitlines()]
    return [line for line in lines if line]


def test_the_cpu_recipe_works_in_a_fresh_venv_and_keeps_torch(
    fresh_clone: Path, newcomer_venv: Path, tmp_path: Path
) -> None:
    clone, venv = fresh_clone, newcomer_venv
    python = venv / "bin" / "python"
    base = clean_env()
    active = clean_env(venv)
    lines = recipe()
    assert lines == [
        "python -m kvpool install-sglang",
        "python examples/sglang_hicache_backend.py",
    ], lines
    installed = sh(lines[0], active, clone).stdout
    assert f"imported {len(MODULES)} SGLang modules" in installed, installed
    assert "install-sglang: torchvision is not installed: placed a stand-in" in installed
    assert f"install-sglang: done: SGLang 0.5.23 is ready in {venv}" in installed, installed
    example = sh(lines[1], active, clone).stdout
    assert example.strip().splitlines()[-1] == "sglang hicache backend round trip ok", example

    versions = "import importlib.metadata as m; print(m.version('sglang'), m.version('torch'))"
    version = subprocess.run(
        [str(python), "-c", versions], capture_output=True, text=True, env=base, cwd=tmp_path
    )
    assert version.stdout.split() == ["0.5.23", CPU_TORCH], version.stdout + version.stderr
