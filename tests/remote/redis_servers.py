"""A real redis-server on loopback for the tests: find the binary, start one, stop it.

``need_redis()`` returns the ``redis-server`` (or ``valkey-server``) on
``PATH``, or skips with the reason when it or the ``redis`` client is
missing - a failure instead when ``KVPOOL_REQUIRE_REDIS=1`` (set by
``.ci/run``).  ``start_redis(binary)`` starts one on a free loopback port,
without persistence, and waits until it answers PING; the returned
:class:`RedisServer` stops or SIGKILLs it.  tests/remote's fixtures and
the compat suites' use these.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass

import pytest

__all__ = ["REQUIRE_REDIS", "RedisServer", "need_redis", "start_redis"]

REQUIRE_REDIS = os.environ.get("KVPOOL_REQUIRE_REDIS", "").strip().lower() in ("1", "true", "yes")


def _redis_binary() -> str | None:
    return shutil.which("redis-server") or shutil.which("valkey-server")


def need_redis() -> str:
    """The server binary, or skip (fail when KVPOOL_REQUIRE_REDIS=1)."""
    binary = _redis_binary()
    if binary is None:
        reason = (
            "no redis-server or valkey-server on PATH (apt-get install redis-server); "
            "KVPOOL_REQUIRE_REDIS=1 makes this a failure"
        )
    elif importlib.util.find_spec("redis") is None:
        reason = (
            "the redis client is not installed (pip install 'kvpool[redis]'); "
            "KVPOOL_REQUIRE_REDIS=1 makes this a failure"
        )
    else:
        return binary
    if REQUIRE_REDIS:
        pytest.fail(f"KVPOOL_REQUIRE_REDIS is set but {reason.split(';')[0]}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RedisServer:
    """A redis-server process started for the tests."""

    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """Terminate the server (idempotent)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def kill(self) -> None:
        """SIGKILL the server and wait for it."""
        self.proc.kill()
        self.proc.wait(5)


def start_redis(binary: str, *extra: str, port: int | None = None) -> RedisServer:
    """Start a server on a free loopback port (or ``port``) and wait until it answers PING.

    ``extra`` arguments go to the server (e.g. ``--requirepass``); with a
    password set, an ``-NOAUTH`` answer to the probe counts as ready.
    """
    last = ""
    chosen = port
    for _ in range(5 if chosen is None else 1):
        port = _free_port() if chosen is None else chosen
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning", *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith((b"+PONG", b"-NOAUTH")):
                        return RedisServer(proc, port)
            except OSError:
                time.sleep(0.02)
        proc.kill()
        _, err = proc.communicate(timeout=5)
        last = err.decode(errors="replace")[-500:]
    raise RuntimeError(f"could not start {binary}: {last}")
