"""examples/lmcache_remote_plugin.py runs as a user runs it: its own process, LMCache's defaults.

The example builds LMCache's StorageManager with the kvpool plugin and
checks its own round trip (every byte and shape); here it must exit 0 with
its closing line, and LMCache's log (at its default INFO level) must show
the plugin's start-up line and no fault - on LMCache's memory and on
kvpool's (``--kvpool-memory``), on a directory and on a real redis-server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

import kvpool

EXAMPLE = REPO / "examples" / "lmcache_remote_plugin.py"
CLOSING = "lmcache remote plugin round trip ok"
FAULTS = ("Traceback", "Error", "freed while views", "reclaiming <", "LeakedHandleWarning")


def run_example(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LMCACHE_LOG_LEVEL": "INFO"}
    env.pop("KVPOOL_LMCACHE", None)
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=str(cwd),
    )


@pytest.mark.parametrize(
    "memory", [[], ["--kvpool-memory"]], ids=["lmcache-memory", "kvpool-memory"]
)
@pytest.mark.parametrize("where", ["directory", "redis"])
def test_the_example_round_trips(memory, where, tmp_path, request) -> None:
    url = []
    if where == "redis":
        url = [request.getfixturevalue("redis_server").url + "/0"]
    done = run_example(*url, *memory, cwd=tmp_path)
    report = f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    assert done.returncode == 0, report
    assert done.stdout.strip().splitlines()[-1] == CLOSING, report
    assert "read back 9 chunks, the last of 100 tokens" in done.stdout, report
    assert "removed: 9 of 9" in done.stdout, report
    # The checkout's kvpool (conftest puts it first for child processes).
    assert f"kvpool {kvpool.__version__} from {REPO / 'kvpool'}\n" in done.stdout, report
    kind = "kvpool.pool.handle" if memory else "lmcache.v1.memory_management"
    assert f"memory objects: {kind}.TensorMemoryObj" in done.stdout, report
    store = "AsyncRedisStore" if where == "redis" else "AsyncFileStore"
    assert f"kvpool plugin 'kvpool': {store} at " in done.stderr, report
    for fault in FAULTS:
        assert fault not in done.stderr, report
