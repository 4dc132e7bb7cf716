"""Stores in one Redis or Valkey server, blocking and asyncio, on kvpool's own RESP client.

From the bytes up: ``resp`` (the protocol, no I/O), ``connection`` (a
socket and a checked pool of them), ``config`` (where to connect, secrets
kept out of messages), ``wire`` (how an entry lives in a key), ``common``
(options and plans both stores share), then ``store`` and ``aio``.  The
cluster store (:mod:`kvpool.remote.cluster`) builds on these layers.
"""

from kvpool.remote.redis.aio import AsyncRedisStore
from kvpool.remote.redis.store import RedisStore

__all__ = ["AsyncRedisStore", "RedisStore"]
