"""``kvpool install-vllm``: one pinned list, shipped with kvpool, used by the compat environment.

Without network or vLLM: the list, what the command would run (``--dry-run``).
The list itself is exercised for real by ``make compat``, which builds the vLLM
compatibility environment from it and runs tests/compat_vllm there.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from kvpool.cli.vllm import MODULES, REQUIREMENTS
from kvpool.integrations.install import requirements

ROOT = Path(__file__).resolve().parents[2]


def test_the_list_is_shipped_beside_the_tier_pinned_and_never_torch() -> None:
    assert REQUIREMENTS == ROOT / "kvpool" / "integrations" / "vllm" / "requirements-vllm033.txt"
    lines = requirements(REQUIREMENTS)
    assert lines[0] == "vllm==0.33.0"
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][\w.]*", line) for line in lines), lines
    names = {line.split("==")[0].lower().replace("_", "-") for line in lines}
    assert not names & {"torch", "torchvision", "flashinfer-python"}
    assert MODULES[-1] == "kvpool.integrations.vllm"


def test_the_compat_environment_uses_the_same_list() -> None:
    spec = importlib.util.spec_from_file_location(
        "make_venv", ROOT / "tests" / "compat" / "make_venv.py"
    )
    make_venv = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(make_venv)  # type: ignore[union-attr]
    assert REQUIREMENTS in make_venv.ALL_REQUIREMENTS


def test_dry_run_names_the_no_deps_install_and_the_import_check(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVPOOL_LMCACHE")}
    run = subprocess.run(
        [sys.executable, "-m", "kvpool", "install-vllm", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert "--no-deps" in run.stdout and str(REQUIREMENTS) in run.stdout
    assert "torch" in run.stdout and "stays" in run.stdout
    assert "kvpool.integrations.vllm" in run.stdout
