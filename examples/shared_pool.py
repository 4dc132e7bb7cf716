"""A pool shared between two processes: the creator writes, another process reads, no copy.

    python examples/shared_pool.py

The creator makes ``MixedMemoryAllocator(size, shm_name=...)`` (one POSIX
shared-memory segment with a small index of the objects placed in it),
fills a chunk and publishes it under a key.  A second process, started
here with ``subprocess``, attaches by name with ``kvpool.attach_pool`` and
gets a typed, zero-copy tensor of the chunk by that key (shape and dtype
come from the index).  The creator keeps the chunk alive until the reader
is done, then frees it; closing the pool removes the segment's name.
"""

import os
import subprocess
import sys

import torch

import kvpool
from kvpool import MemoryFormat

SHAPE = torch.Size([2, 4, 256, 128])


def reader(name: str) -> None:
    """The other process: attach by name, read the published chunk, check it."""
    with kvpool.attach_pool(name) as peer:
        kv = peer.tensor("layer-0")  # by the key the creator published
        print(f"reader: {tuple(kv.shape)} {kv.dtype}, sum {kv.float().sum().item():.0f}")
        if not bool((kv == 3).all()):
            raise SystemExit("reader: the chunk does not hold what the creator wrote")
        del kv  # a view keeps the mapping: drop it before the pool closes


def creator() -> None:
    name = f"/kvpool-example-{os.getpid()}"
    with kvpool.MixedMemoryAllocator(64 << 20, shm_name=name) as pool:
        chunk = pool.allocate(SHAPE, torch.float16, MemoryFormat.KV_2LTD)
        chunk.tensor.fill_(3)
        pool.publish("layer-0", chunk)
        # The reader: this same script, run as another Python process.
        subprocess.run([sys.executable, __file__, "--read", name], check=True)
        chunk.ref_count_down()  # only after the reader is done with it
    print("creator: the reader saw the chunk; pool closed, segment removed")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--read"]:
        reader(sys.argv[2])
    else:
        creator()
