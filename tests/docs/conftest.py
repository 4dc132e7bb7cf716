"""Servers for the docs' code blocks: the store tests' own fixtures (tests/remote/conftest.py).

They start real servers on loopback for the session and skip (or fail,
with ``KVPOOL_REQUIRE_REDIS=1`` / ``KVPOOL_REQUIRE_MOONCAKE=1``) where the
binaries are missing.
"""

from remote.conftest import mooncake, redis_cluster, redis_server

__all__ = ["mooncake", "redis_cluster", "redis_server"]
