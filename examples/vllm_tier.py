"""vLLM's native KV offloading with kvpool's tier: built from a user's JSON, chunks round-tripped.

Needs vLLM 0.33.0 (``python -m kvpool install-vllm`` installs its scheduler side on a CPU).
It takes the ``--kv-transfer-config`` JSON a server is started with (vLLM's
``KVTransferConfig`` checks it), builds vLLM's ``TieringOffloadingSpec`` and its
tiering manager from it - the CPU primary tier in ``/dev/shm`` and kvpool's tier behind
it - and plays vLLM's scheduler and GPU worker: four chunks are written into primary
rows and stored (vLLM cascades them to kvpool's tier), pushed out of the primary tier by
other chunks, looked up again (kvpool's tier has them: vLLM promotes them back) and
their bytes checked::

    python examples/vllm_tier.py                          # a directory in /dev/shm
    python examples/vllm_tier.py redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid

import numpy as np
from vllm.config import KVTransferConfig
from vllm.v1.kv_offload.base import (
    LookupResult,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

ROW_BYTES = 256 << 10  # one chunk of one worker: 4 layers x K/V x 16 tokens x 8 heads x 128 x fp16
PRIMARY_CHUNKS = 16


def user_json(url: str) -> dict:
    """What ``vllm serve --kv-transfer-config`` takes: vLLM's tiering with kvpool's tier."""
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "engine_id": f"kvpool-example-{uuid.uuid4().hex[:8]}",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": PRIMARY_CHUNKS * ROW_BYTES,
            "secondary_tiers": [
                {"type": "KVPoolTier", "module_path": "kvpool.integrations.vllm", "url": url}
            ],
        },
    }


def offloading_config(transfer: KVTransferConfig) -> OffloadingConfig:
    """What vLLM derives from the model and the engine config: here a small fixed layout."""
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(16, tuple(f"layers.{i}.attn" for i in range(4)), 0),),
        worker_kv_bytes_per_block=ROW_BYTES,
        enable_kv_cache_events=False,
        extra_config=transfer.kv_connector_extra_config,
        engine_id=str(transfer.engine_id),
        model=OffloadingModelConfig("example/model", "float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, False),
    )


def step(manager) -> None:
    """The end of one scheduler step."""
    with manager.lock:
        manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))


def store(manager, rows, keys, req) -> None:
    """GPU -> primary (the worker writes each row), then vLLM cascades to the tiers."""
    with manager.lock:
        out = manager.prepare_store(keys, req)
    for key, chunk in zip(out.keys_to_store, out.store_spec.chunk_ids, strict=True):
        rows[int(chunk)] = content(key)
    step(manager)
    with manager.lock:
        manager.complete_store(out.keys_to_store, req)


def settle(manager) -> None:
    """Step until no transfer is in flight."""
    while True:
        step(manager)
        with manager.lock:
            if not manager.has_pending_work():
                return
        time.sleep(0.002)


def content(key: bytes) -> np.ndarray:
    """The bytes a chunk holds (what the GPU would have written)."""
    seed = int.from_bytes(key[:8], "little")
    return np.random.default_rng(seed).integers(-128, 128, ROW_BYTES, dtype=np.int8)


def main(url: str) -> None:
    transfer = KVTransferConfig(**user_json(url))  # vLLM's own check of the JSON
    spec = TieringOffloadingSpec(offloading_config(transfer))
    manager = spec.get_manager()
    tier = manager.secondary_tiers[0]
    print(f"tier: {type(tier).__name__} at {tier.settings.shown_url}")
    rows = np.asarray(manager.primary_tier.get_kv_memoryview())
    req = ReqContext(req_id="example")
    with manager.lock:
        manager.on_new_request(req)

    keys = [make_offload_key(os.urandom(32), 0) for _ in range(4)]
    store(manager, rows, keys, req)
    settle(manager)
    print(f"stored: {len(keys)} chunks, cascaded to the tier")

    # Other prompts' chunks push the four out of the primary tier.
    for _ in range(PRIMARY_CHUNKS // 4 + 1):
        store(manager, rows, [make_offload_key(os.urandom(32), 0) for _ in range(4)], req)
        settle(manager)
    with manager.lock:
        gone = [manager.primary_tier.lookup(k, req) is LookupResult.MISS for k in keys]
    print(f"left the primary tier: {sum(gone)} of {len(keys)}")

    # The scheduler looks the prefix up step after step; the tier's hits are promoted.
    deadline = time.monotonic() + 30
    while True:
        with manager.lock:
            results = [manager.lookup(k, req) for k in keys]
        if all(r is LookupResult.HIT for r in results) or time.monotonic() > deadline:
            break
        step(manager)
        time.sleep(0.002)
    print(f"found again: {sum(r is LookupResult.HIT for r in results)} of {len(keys)}")
    with manager.lock:
        load = manager.prepare_load(keys, req)
    same = all(
        np.array_equal(rows[int(chunk)], content(key))
        for key, chunk in zip(keys, load.chunk_ids, strict=True)
    )
    with manager.lock:
        manager.complete_load(keys, req)
        manager.on_request_finished(req)
    print(f"bytes of every chunk as stored: {same}")
    del rows  # the primary region is unmapped at shutdown: hold no view of it
    manager.shutdown()
    if not (all(gone) and same and all(r is LookupResult.HIT for r in results)):
        sys.exit("vllm tier round trip FAILED")
    print("vllm tier round trip ok")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory(dir="/dev/shm") as directory:
            main(directory)
