"""examples/sglang_hicache_backend.py runs as a user runs it: its own process, another directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

EXAMPLE = REPO / "examples" / "sglang_hicache_backend.py"
FAULTS = ("Traceback", "Error", "freed while views", "LeakedHandleWarning")


@pytest.mark.parametrize("where", ["directory", "redis"])
def test_the_example_round_trips(where: str, tmp_path: Path, request) -> None:
    args = [request.getfixturevalue("redis_server").url] if where == "redis" else []
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=str(tmp_path),
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    report = f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    assert done.returncode == 0, report
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "sglang hicache backend round trip ok", report
    assert "stored: [True, True, True, True]" in lines, report
    assert "leading pages found: 4" in lines, report
    shown = "redis://127.0.0.1:" if where == "redis" else "/"
    assert f"backend: KVPoolHiCacheStorage at {shown}" in done.stdout, report
    for fault in FAULTS:
        assert fault not in done.stderr, report
