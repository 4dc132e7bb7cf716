"""SGLang's HiCache on a kvpool store: the backend loaded as SGLang loads it, pages round-tripped.

Needs SGLang 0.5.23 (``python -m kvpool install-sglang`` installs it).  It
builds SGLang's own host pool (MHA, ``page_first``, on CPU), has SGLang's
``StorageBackendFactory`` make the kvpool backend from the same extra
config a server takes on its command line, writes four pages to the store,
reads them back into other pages of the pool, in place, and removes them from the store::

    python examples/sglang_hicache_backend.py                        # a temporary directory
    python examples/sglang_hicache_backend.py redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import sys
import tempfile
import uuid

import torch
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.storage import StorageBackendFactory

LAYERS, HEADS, DIM, PAGE, TOKENS = 4, 8, 64, 16, 256


def host_pool() -> MHATokenToKVPoolHost:
    """SGLang's MHA host pool over a CPU "device" pool (pin_memory off: no GPU here)."""
    k = tuple(torch.zeros(TOKENS, HEADS, DIM, dtype=torch.bfloat16) for _ in range(LAYERS))
    v = tuple(torch.zeros(TOKENS, HEADS, DIM, dtype=torch.bfloat16) for _ in range(LAYERS))
    ptrs = [torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64) for ts in (k, v)]
    buffers = KVBuffers(
        k=k, v=v, k_data_ptrs=ptrs[0], v_data_ptrs=ptrs[1], layout=KVBufferLayout.NHD
    )
    info = MHABufferInfo(
        buffers=buffers, page_size=PAGE, head_num=HEADS, head_dim=DIM, v_head_dim=DIM,
        dtype=torch.bfloat16, device=torch.device("cpu"),
    )  # fmt: skip
    return MHATokenToKVPoolHost(
        info, 2.0, 0, PAGE, "page_first", pin_memory=False, device="cpu",
        device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS,
    )  # fmt: skip


def main(url: str) -> None:
    # What --hicache-storage-backend-extra-config carries on a server's command line.
    extra_config = {
        "backend_name": "kvpool",
        "module_path": "kvpool.integrations.sglang",
        "class_name": "KVPoolHiCacheStorage",
        "interface_v1": 1,
        "url": url,
    }
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="example/model", extra_config=extra_config,
    )  # fmt: skip
    pool = host_pool()
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)  # as SGLang's cache controller does
    print(f"backend: {type(backend).__name__} at {backend.settings.shown_url}")
    try:
        src = pool.alloc(4 * PAGE)
        pool.kv_buffer[:, src] = torch.randn(pool.kv_buffer[:, src].shape).to(torch.bfloat16)
        keys = [uuid.uuid4().hex for _ in range(4)]  # SGLang's page hashes
        print("stored:", backend.batch_set_v1(keys, src))
        print("leading pages found:", backend.batch_exists([*keys, "0" * 32]))
        dst = pool.alloc(4 * PAGE)
        print("read back:", backend.batch_get_v1(keys, dst))
        assert torch.equal(pool.kv_buffer[:, dst], pool.kv_buffer[:, src])
    finally:
        try:
            backend.clear()  # this configuration's pages only: nothing else in the store
        finally:
            backend.close()
    print("sglang hicache backend round trip ok")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as directory:
            main(directory)
