"""``kvpool demo --store`` on a real Redis Cluster and a real Mooncake Store."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .cluster_servers import RedisCluster
from .mooncake_servers import MooncakeDeployment


def _demo(store: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvpool", "demo", "--chunks", "8", "--store", store],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )


@pytest.mark.redis
def test_demo_on_a_redis_cluster(redis_cluster: RedisCluster) -> None:
    from kvpool.remote import RedisClusterStore

    run = _demo(redis_cluster.url)
    assert run.returncode == 0, run.stderr
    assert "verified: all 8 chunks" in run.stdout and "not all" not in run.stderr
    with RedisClusterStore(redis_cluster.url) as store:  # the demo's own default prefix
        assert store.batched_exists([f"demo-chunk-{i}" for i in range(8)]) == [False] * 8


@pytest.mark.mooncake
def test_demo_on_mooncake(mooncake: MooncakeDeployment) -> None:
    run = _demo(mooncake.url)
    assert run.returncode == 0, run.stderr
    assert "verified: all 8 chunks" in run.stdout
    assert "not all" not in run.stderr  # the test master's lease (0.3 s) ends within the timeout
