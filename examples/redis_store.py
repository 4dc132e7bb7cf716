"""RedisStore: entries in one Redis or Valkey server (pip install 'kvpool[redis]').

    python examples/redis_store.py [URL]          # default redis://127.0.0.1:6379/0

Each entry is one string key (``SET`` of header + bytes sent from pool
memory, ``GET`` received straight into the new chunk).  The example
writes under a prefix of its own and deletes what it wrote.
"""

import sys

from _chunks import DTYPE, FMT, SHAPE, check_chunks, free, make_chunks

import kvpool
from kvpool.remote import RedisStore


def main(url: str) -> None:
    with (
        kvpool.MixedMemoryAllocator(64 << 20) as pool,
        RedisStore(url, prefix="kvpool-example:", timeout=5.0, ttl=600) as store,
    ):
        chunks = make_chunks(pool, 8)
        keys = [f"chunk-{i}" for i in range(len(chunks))]
        store.put(keys[0], chunks[0])  # one SET
        store.batched_put(keys[1:], chunks[1:])  # pipelined
        free(chunks)

        back = [store.get(keys[0], pool, SHAPE, DTYPE, FMT)]  # one GET
        back += store.batched_get(keys[1:], pool, SHAPE, DTYPE, FMT)
        check_chunks(back)
        free(back)

        print("deleted:", store.batched_delete(keys))
        print(store.counters)  # calls, entries, bytes and misses per operation


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379/0")
    print("redis store round trip ok")
