"""Servers for the example scripts: the store tests' own fixtures (tests/remote/conftest.py).

``redis_server``, ``redis_cluster`` and ``mooncake`` start a real
redis-server, a three-master Redis Cluster and a Mooncake master + storage
node on loopback for the session, and skip (or fail, with
``KVPOOL_REQUIRE_REDIS=1`` / ``KVPOOL_REQUIRE_MOONCAKE=1``) where the
binaries are missing.
"""

from remote.conftest import mooncake, redis_cluster, redis_server

__all__ = ["mooncake", "redis_cluster", "redis_server"]
