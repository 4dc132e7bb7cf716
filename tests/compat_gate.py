"""An engine compatibility suite and this checkout: whether it runs here, and its examples' runs.

Each compat folder (tests/compat_sglang, tests/compat_vllm) runs only in an
environment that has its engine; elsewhere it is not collected, unless its
``KVPOOL_REQUIRE_*`` variable (set by ``make compat``) makes a missing engine
an error.  Where it runs, the kvpool imported must be this checkout's, or the
suite would test another copy; an example it runs (:func:`run_example`) runs
on this checkout's kvpool too, in a process of its own.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

__all__ = ["REPO", "engine_here", "env_flag", "run_example"]

#: The checkout under test.
REPO = Path(__file__).resolve().parents[1]


def env_flag(name: str) -> bool:
    """True when the environment variable ``name`` says yes (1, true, yes)."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def engine_here(module: str, required_by: str) -> bool:
    """Whether ``module`` (the engine) is importable, and kvpool is this checkout's.

    Args:
        module: the engine's top-level module (``"sglang"``, ``"vllm"``).
        required_by: the variable that makes a missing engine an error.

    Returns:
        False where the engine is missing and not required (the caller then
        collects nothing); True where it is there.

    Raises:
        pytest.UsageError: the engine is required but missing, or kvpool is
            imported from elsewhere than this checkout.
    """
    if importlib.util.find_spec(module) is None:
        if env_flag(required_by):
            raise pytest.UsageError(
                f"{required_by} is set but {module} is not installed in this interpreter; "
                "run `make compat`"
            )
        return False
    import kvpool

    if REPO not in Path(kvpool.__file__).resolve().parents:
        raise pytest.UsageError(
            f"kvpool was imported from {kvpool.__file__}, not from the checkout under test "
            f"({REPO}); run pytest from the repository root with `python -m pytest`"
        )
    return True


def run_example(
    example: str, args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``examples/<example>`` with ``args`` in a process of its own, in ``cwd``, on this checkout.

    Its environment is only this checkout on ``PYTHONPATH``, a plain ``PATH`` and
    ``env``: what a user's shell would not add either.
    """
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / example), *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=str(cwd),
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", **(env or {})},
    )
