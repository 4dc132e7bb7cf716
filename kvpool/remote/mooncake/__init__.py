"""A store in an existing Mooncake Store deployment, moving bytes straight from and into pools.

``client`` makes Mooncake's client (URL, loading, setup), ``codes`` names
its status codes, ``memory`` registers pool memory and header slots,
``ops`` does the calls, ``raw`` the headerless entries, ``segments``
mounts kvpool shared memory as this process's share of the store,
``store`` is the store, ``aio`` its asyncio form.
"""

from kvpool.remote.mooncake.aio import AsyncMooncakeStore
from kvpool.remote.mooncake.segments import MountedSegment
from kvpool.remote.mooncake.store import MooncakeStore

__all__ = ["AsyncMooncakeStore", "MooncakeStore", "MountedSegment"]
