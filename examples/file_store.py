"""FileStore: one file per entry in a local directory (/dev/shm keeps it in memory).

    python examples/file_store.py [DIRECTORY]

Without a directory it uses a fresh temporary one and removes it after.
"""

import sys
import tempfile

from _chunks import DTYPE, FMT, SHAPE, check_chunks, free, make_chunks

import kvpool
from kvpool.remote import FileStore


def main(directory: str) -> None:
    with kvpool.MixedMemoryAllocator(64 << 20) as pool, FileStore(directory) as store:
        chunks = make_chunks(pool, 8)
        keys = [f"chunk-{i}" for i in range(len(chunks))]
        store.batched_put(keys, chunks)  # each entry written atomically (temp file + rename)
        free(chunks)

        print("stored:", store.batched_exists(keys).count(True), "of", len(keys))
        print("layout of chunk-0:", store.head("chunk-0"))  # the header, without the bytes

        back = store.batched_get(keys, pool, SHAPE, DTYPE, FMT)
        check_chunks(back)
        free(back)

        print("deleted:", store.batched_delete(keys))
        print("pool after:", pool.stats().used_bytes, "bytes in use")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
    print("file store round trip ok")
