"""MooncakeStore: entries in a Mooncake Store (pip install 'kvpool[mooncake]').

    python examples/mooncake_store.py [URL]
    # default mooncake://127.0.0.1:50051?metadata=http://127.0.0.1:8080/metadata&protocol=tcp

A deployment is a ``mooncake_master`` and one or more storage nodes
(``mooncake_client``); see the Mooncake guide.  The pool's memory is
registered with Mooncake's transfer engine on first use, so bytes move
straight between pool memory and the storage nodes.
"""

import sys

from _chunks import DTYPE, FMT, SHAPE, check_chunks, free, make_chunks

import kvpool
from kvpool.remote import open_store

DEFAULT = "mooncake://127.0.0.1:50051?metadata=http://127.0.0.1:8080/metadata&protocol=tcp"


def main(url: str) -> None:
    with (
        kvpool.MixedMemoryAllocator(64 << 20) as pool,
        open_store(url, prefix="kvpool-example:") as store,  # a MooncakeStore
    ):
        chunks = make_chunks(pool, 8)
        keys = [f"chunk-{i}" for i in range(len(chunks))]
        store.batched_put(keys, chunks)
        free(chunks)

        back = store.batched_get(keys, pool, SHAPE, DTYPE, FMT)
        check_chunks(back)
        free(back)
        print("stored:", store.batched_exists(keys).count(True), "of", len(keys))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT)
    print("mooncake store round trip ok")
