"""An asyncio store: many gets and puts in flight on one event loop.

    python examples/async_store.py [SPEC]
    # SPEC: a directory (AsyncFileStore; default a temporary one) or redis://host:port/db

``open_async_store`` picks the store from the spec.  Every call is a
coroutine; ``asyncio.gather`` runs them side by side (AsyncRedisStore gives
each its own connection).  A cancelled call frees what it allocated.
"""

import asyncio
import sys
import tempfile

from _chunks import DTYPE, FMT, SHAPE, check_chunks, free, make_chunks

import kvpool
from kvpool.remote import open_async_store


async def main(spec: str) -> None:
    with kvpool.MixedMemoryAllocator(64 << 20) as pool:
        async with open_async_store(spec) as store:
            chunks = make_chunks(pool, 8)
            keys = [f"kvpool-example:chunk-{i}" for i in range(len(chunks))]
            await asyncio.gather(*(store.put(k, c) for k, c in zip(keys, chunks, strict=True)))
            free(chunks)

            back = await asyncio.gather(*(store.get(k, pool, SHAPE, DTYPE, FMT) for k in keys))
            check_chunks(back)
            free(back)
            print("deleted:", await store.batched_delete(keys))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(main(tmp))
    print("async store round trip ok")
