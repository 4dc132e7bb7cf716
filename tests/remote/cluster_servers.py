"""A real three-master Redis Cluster on loopback for the tests.

``start_cluster()`` starts it with
:func:`kvpool.cli.bench.localservers.start_cluster`: three
``redis-server --cluster-enabled yes`` nodes on free loopback ports (no
persistence), joined with ``redis-cli --cluster create ...
--cluster-replicas 0 --cluster-yes``, polled until every node reports
``cluster_state:ok`` with the 16384 slots assigned.  The returned
:class:`RedisCluster` can SIGKILL a node, start it again on the same port
with the same ``nodes-P.conf`` (it rejoins with its slots) and stop them all.

``cluster-require-full-coverage no``: when a master dies the others keep
serving their slots, as a cache wants (with the default ``yes`` the whole
cluster refuses every command once the dead master is marked failed).

Without ``redis-server``/``redis-cli`` (or ``valkey-*``) or the ``redis``
client the tests skip with the reason, unless ``KVPOOL_REQUIRE_REDIS=1``
(set by ``.ci/run``), which makes that a failure.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

from kvpool.cli.bench import localservers
from kvpool.cli.bench.localservers import RedisCluster

__all__ = ["RedisCluster", "need_cluster_binaries", "start_cluster"]

REQUIRE_REDIS = os.environ.get("KVPOOL_REQUIRE_REDIS", "").strip().lower() in ("1", "true", "yes")


def need_cluster_binaries() -> tuple[str, str]:
    """``(server, cli)`` binaries, or skip (fail when ``KVPOOL_REQUIRE_REDIS=1``)."""
    server = shutil.which("redis-server") or shutil.which("valkey-server")
    cli = shutil.which("redis-cli") or shutil.which("valkey-cli")
    if server is None or cli is None:
        reason = (
            "no redis-server/redis-cli (or valkey-*) on PATH "
            "(apt-get install redis-server redis-tools)"
        )
    elif importlib.util.find_spec("redis") is None:
        reason = "the redis client is not installed (pip install 'kvpool[redis]')"
    else:
        return server, cli
    if REQUIRE_REDIS:
        pytest.fail(f"KVPOOL_REQUIRE_REDIS is set but {reason}")
    pytest.skip(f"{reason}; KVPOOL_REQUIRE_REDIS=1 makes this a failure")


def start_cluster() -> RedisCluster:
    """Three joined masters for the tests (skips or fails without the binaries)."""
    return localservers.start_cluster(*need_cluster_binaries())
