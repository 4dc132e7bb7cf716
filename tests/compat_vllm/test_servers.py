"""The servers a tier's tests use start beside vLLM and answer kvpool's stores there.

A redis-server, a three-master Redis Cluster and a Mooncake master with a
storage node (session fixtures, tests/remote's starters): each takes a
chunk from a kvpool pool and gives it back unchanged, in vLLM's
environment (its packages in front of kvpool's).
"""

from __future__ import annotations

import uuid

import pytest
import torch

import kvpool
from kvpool import MemoryFormat
from kvpool.remote import open_store

SHAPE = torch.Size([2, 2, 16, 8])  # K and V x 2 layers x 16 tokens x 8 values
FMT = MemoryFormat.KV_2LTD


@pytest.mark.parametrize("server", ["redis_server", "redis_cluster", "mooncake"])
def test_the_server_round_trips_a_chunk(request: pytest.FixtureRequest, server: str) -> None:
    url = request.getfixturevalue(server).url
    with kvpool.MixedMemoryAllocator(1 << 20) as pool, open_store(url) as store:
        chunk = pool.allocate(SHAPE, torch.float16, FMT)
        chunk.tensor.copy_(torch.randn(SHAPE).to(torch.float16))
        key = f"compat-vllm-{uuid.uuid4().hex}"
        store.put(key, chunk)
        back = store.get(key, pool, SHAPE, torch.float16, FMT)
        try:
            assert back is not None and torch.equal(back.tensor, chunk.tensor)
        finally:
            chunk.ref_count_down()
            if back is not None:
                back.ref_count_down()
