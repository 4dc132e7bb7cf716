"""Quickstart: a KV chunk from a pool to a store and back, verified, then freed.

Run it from anywhere: ``python examples/quickstart.py``.  It needs nothing
but kvpool (the store is a FileStore in a temporary directory).
"""

import tempfile

import torch

import kvpool
from kvpool import MemoryFormat
from kvpool.remote import open_store

shape = torch.Size([2, 4, 256, 128])  # K and V x 4 layers x 256 tokens x 128 values
dtype = torch.float16  # so one chunk is 512 KiB

with kvpool.MixedMemoryAllocator(64 << 20) as pool:  # a 64 MiB pool, pinned if it can be
    with tempfile.TemporaryDirectory() as directory, open_store(directory) as store:
        chunk = pool.allocate(shape, dtype, MemoryFormat.KV_2LTD)  # None when full
        chunk.tensor.copy_(torch.randn(shape).to(dtype))  # fill it through a zero-copy view

        store.put("chunk-0", chunk)  # the bytes go straight from pool memory
        back = store.get("chunk-0", pool, shape, dtype, MemoryFormat.KV_2LTD)  # None if absent

        assert back is not None and torch.equal(back.tensor, chunk.tensor)
        print(f"round trip of {back.get_size()} bytes verified")

        chunk.ref_count_down()  # the last reference gives the memory back to the pool
        back.ref_count_down()
    print(pool.stats())  # used_bytes=0: everything went back
