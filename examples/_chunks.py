"""Helpers the store examples share: KV chunks with known bytes, and a check that they came back.

Not an example itself; the scripts beside it import it.
"""

from __future__ import annotations

import torch

import kvpool
from kvpool import MemoryFormat

#: One KV chunk: K and V x 4 layers x 256 tokens x 128 values, float16 (512 KiB).
SHAPE = torch.Size([2, 4, 256, 128])
DTYPE = torch.float16
FMT = MemoryFormat.KV_2LTD


def make_chunks(pool: kvpool.MemoryAllocatorInterface, count: int) -> list[kvpool.MemoryObj]:
    """``count`` chunks from ``pool``, chunk ``i`` filled with the value ``i``."""
    chunks = []
    for i in range(count):
        chunk = pool.allocate(SHAPE, DTYPE, FMT)
        if chunk is None:
            raise SystemExit(f"the pool is full after {i} chunks")
        chunk.tensor.fill_(float(i))
        chunks.append(chunk)
    return chunks


def check_chunks(chunks: list[kvpool.MemoryObj | None]) -> None:
    """Fail unless chunk ``i`` is present and holds the value ``i`` everywhere."""
    for i, chunk in enumerate(chunks):
        if chunk is None:
            raise SystemExit(f"chunk {i} did not come back")
        if not bool((chunk.tensor == float(i)).all()):
            raise SystemExit(f"chunk {i} came back with the wrong bytes")


def free(chunks: list[kvpool.MemoryObj | None]) -> None:
    """Give every chunk back to its pool."""
    for chunk in chunks:
        if chunk is not None:
            chunk.ref_count_down()
