"""Session fixtures of real servers the engine compatibility suites share: a cluster, Mooncake.

Imported by the conftests of tests/compat_sglang and tests/compat_vllm (importing a
fixture into a conftest registers it there); the servers are tests/remote's starters,
on loopback, stopped after the session.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["mooncake", "redis_cluster"]


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Any]:
    """A real three-master Redis Cluster (tests/remote's ``start_cluster``)."""
    from remote.cluster_servers import start_cluster

    cluster = start_cluster()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def mooncake() -> Iterator[Any]:
    """A real Mooncake master and storage node (tests/remote's ``start_mooncake``)."""
    from remote.mooncake_servers import start_mooncake

    with pytest.MonkeyPatch.context() as env:
        env.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        env.setenv("MC_LOG_LEVEL", os.environ.get("MC_LOG_LEVEL", "ERROR"))
        deployment = start_mooncake()
        yield deployment
        deployment.stop()
