"""A store in an existing Redis (or Valkey) Cluster, routed by slot on the Redis layers.

``slots`` maps keys to masters, ``nodes`` keeps a connection pool per
node, ``route`` reads MOVED/ASK redirects, ``common`` holds the ops and
the routing decisions both stores share, ``store`` is the blocking store,
``aio`` the asyncio one.
"""

from kvpool.remote.cluster.aio import AsyncRedisClusterStore
from kvpool.remote.cluster.store import RedisClusterStore

__all__ = ["AsyncRedisClusterStore", "RedisClusterStore"]
