"""examples/sglang_hicache_backend.py runs as a user runs it: its own process, another directory."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from compat_gate import run_example as run_checkout_example

from .conftest import RedisServer

FAULTS = ("Traceback", "Error", "freed while views", "LeakedHandleWarning")


def run_example(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The example (see :func:`compat_gate.run_example`)."""
    return run_checkout_example("sglang_hicache_backend.py", args, cwd)


def dbsize(port: int) -> int:
    """How many keys the Redis server on ``port`` holds (one DBSIZE on a raw socket)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"DBSIZE\r\n")
        reply = s.recv(64)
    assert reply.startswith(b":"), reply
    return int(reply[1:].strip())


@pytest.mark.parametrize("where", ["directory", "redis"])
def test_the_example_round_trips(where: str, tmp_path: Path, request) -> None:
    args = [request.getfixturevalue("redis_server").url] if where == "redis" else []
    done = run_example(args, tmp_path)
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


def test_the_example_leaves_nothing_in_the_users_store(tmp_path: Path) -> None:
    # A server of its own: the session's is shared with tests that leave keys.
    server = RedisServer()
    try:
        done = run_example([server.url], tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr[-4000:]
        assert dbsize(server.port) == 0
    finally:
        server.stop()
    folder = tmp_path / "store"
    folder.mkdir()
    done = run_example([str(folder)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert not [p for p in folder.rglob("*") if p.is_file()], sorted(folder.rglob("*"))
