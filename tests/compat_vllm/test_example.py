"""examples/vllm_tier.py runs as a user runs it: its own process, another directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from compat_gate import run_example as run_checkout_example


def run_example(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The example on vLLM's CPU platform (see :func:`compat_gate.run_example`)."""
    return run_checkout_example("vllm_tier.py", args, cwd, {"VLLM_TARGET_DEVICE": "cpu"})


@pytest.mark.parametrize("where", ["directory", "redis"])
def test_the_example_round_trips(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    args = [request.getfixturevalue("redis_server").url] if where == "redis" else []
    done = run_example(args, tmp_path)
    report = f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    assert done.returncode == 0, report
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "vllm tier round trip ok", report
    assert "left the primary tier: 4 of 4" in lines, report
    assert "found again: 4 of 4" in lines, report
    assert "bytes of every chunk as stored: True" in lines, report
    shown = "redis://127.0.0.1:" if where == "redis" else "/dev/shm/"
    assert f"tier: KVPoolTier at {shown}" in done.stdout, report
    assert "Traceback" not in done.stderr, report
    assert list(tmp_path.iterdir()) == []  # nothing left in the user's directory
