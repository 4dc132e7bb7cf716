"""Fixtures of the packaging tests: a fresh, never-built clone, and a newcomer's venv beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from newcomer import CPU_TORCH, copy_checkout


@pytest.fixture(scope="session")
def fresh_clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A never-built copy of this checkout (:mod:`newcomer`), shared by the session."""
    return copy_checkout(tmp_path_factory.mktemp("fresh") / "kvpool-src")


@pytest.fixture(scope="session")
def newcomer_venv_base(fresh_clone: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment as getting-started makes it, once a session.

    It sees nothing of this machine's packages; torch (:data:`CPU_TORCH`)
    went in first, then kvpool from the fresh clone (``pip install .``,
    which leaves the clone unbuilt).  Tests take copies
    (:func:`newcomer_venv`), never this one.
    """
    venv = tmp_path_factory.mktemp("newcomer") / "venv"
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    for cmd in (
        [sys.executable, "-m", "venv", str(venv)],
        [python, "-m", "pip", "install", "-q", f"torch=={CPU_TORCH}"],
        [python, "-m", "pip", "install", "-q", str(fresh_clone)],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, f"{cmd}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    assert not (fresh_clone / "kvpool" / "native" / "_pinmem_ffi.py").exists()  # still unbuilt
    return venv


@pytest.fixture
def newcomer_venv(newcomer_venv_base: Path, tmp_path: Path) -> Path:
    """This test's copy of :func:`newcomer_venv_base`, to install into.

    Hard links, made in a moment: pip replaces or removes an installed
    file, never writes into it, so the base stays as it was.  A venv finds
    its prefix from where its ``pyvenv.cfg`` is, so the copy is a venv of
    its own (its scripts' first lines name the base: run ``python -m``).
    """
    venv = tmp_path / "venv"
    subprocess.run(["cp", "-al", str(newcomer_venv_base), str(venv)], check=True)
    return venv
