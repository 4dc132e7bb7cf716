"""RedisClusterStore: entries spread over a Redis or Valkey Cluster by key slot.

    python examples/redis_cluster_store.py [URL]
    # default redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002

Any masters serve as seeds; the slot map is read from them.  Batched calls
group their keys per master and pipeline each group.
"""

import sys

from _chunks import DTYPE, FMT, SHAPE, check_chunks, free, make_chunks

import kvpool
from kvpool.remote import open_store

DEFAULT = "redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002"


def main(url: str) -> None:
    with (
        kvpool.MixedMemoryAllocator(64 << 20) as pool,
        open_store(url, prefix="kvpool-example:") as store,  # a RedisClusterStore
    ):
        print("masters:", len(store.masters))
        chunks = make_chunks(pool, 16)
        keys = [f"chunk-{i}" for i in range(len(chunks))]
        store.batched_put(keys, chunks)
        free(chunks)

        back = store.batched_get(keys, pool, SHAPE, DTYPE, FMT)
        check_chunks(back)
        free(back)
        print("deleted:", store.batched_delete(keys))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT)
    print("redis cluster store round trip ok")
