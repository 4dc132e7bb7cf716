"""vLLM's native KV offloading on kvpool's stores: a secondary tier vLLM loads by configuration.

vLLM (0.33) offloads KV chunks to a CPU primary tier in ``/dev/shm`` and, with
``TieringOffloadingSpec``, on to secondary tiers it loads by module path.
:class:`KVPoolTier` is such a tier over any store kvpool opens - a directory
(bounded with ``max_bytes``), Redis/Valkey, a Redis Cluster, Mooncake::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "OffloadingConnector",
        "kv_role": "kv_both", "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 17179869184,
            "secondary_tiers": [{"type": "KVPoolTier",
                                 "module_path": "kvpool.integrations.vllm",
                                 "url": "redis://127.0.0.1:6379/0"}]}}'

``url`` is any store :func:`kvpool.remote.open_store` takes; the entry's other
keys are the tier's options and the store's
(:mod:`~kvpool.integrations.vllm.config`).  Rows move between vLLM's primary
tier and the store with no staging copy; every call from vLLM returns without
waiting, the I/O runs on the tier's threads
(:mod:`~kvpool.integrations.vllm.tier`).  Engines of the same model and layout
share chunks; another layout never sees them
(:mod:`~kvpool.integrations.vllm.keys`).

Importing this package needs vLLM; ``import kvpool`` never does.
"""

from __future__ import annotations

from kvpool.integrations.vllm.config import TierConfigError
from kvpool.integrations.vllm.tier import KVPoolTier

__all__ = ["KVPoolTier", "TierConfigError"]
