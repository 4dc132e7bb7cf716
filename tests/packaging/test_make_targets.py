"""What the Makefile's user-facing targets would run (``make -n``), without running them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def dry_run(target: str, *args: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # Not the variables of a make that runs this test (make test PIP=...).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(
        ["make", "-n", target, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_demo_installs_only_what_the_demo_needs_and_says_where() -> None:
    out = dry_run("demo", "PYTHON=/opt/venv/bin/python")
    installs = [line for line in out.splitlines() if " pip install " in line]
    assert installs, out
    assert all("[test]" not in line and "[dev]" not in line for line in installs), installs
    assert any(line.rstrip().endswith("install -q -e .") for line in installs), installs
    assert "torch==2.13.0" in out  # the CPU build, never a range that pulls CUDA
    assert "installing kvpool into" in out and "/opt/venv/bin/python" in out


def test_lint_runs_ruff_check_and_format() -> None:
    out = dry_run("lint")
    assert "ruff check ." in out and "ruff format --check ." in out


def test_ci_lints_before_testing() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert script.index("make lint") < script.index("make test")
