"""Store keys of vLLM's chunks: the OffloadKey plus what makes a row's bytes mean the same thing.

vLLM names a chunk by an ``OffloadKey`` (a block hash and a 4-byte KV cache group
index).  The same key cached by another model, another KV dtype or another row
layout holds *different bytes*, so the tier's keys carry a tag of everything that
decides a row's bytes (:class:`~kvpool.integrations.shared.keys.KeySpace`):

* the model and its KV dtype;
* the row: bytes per row (vLLM's row stride, every rank's slot and the pad), bytes per
  block of one worker, blocks per chunk, tokens per block hash;
* the parallel layout: world size and the TP, PP, PCP and DCP sizes (a row holds every
  rank's slot, in rank order);
* the KV cache groups (tokens per block, the layers' names), whether the layout is
  replicated (one copy for every rank), and the KV cache layout (``LBHNC``, ``LBNHC``...)
  with whether rows are canonical or direct copies of the GPU pages: a direct row's
  bytes are in the order of the engine's layout, so engines of two layouts share
  no direct rows either.

Two engines with the same of all of these share chunks (across machines on Redis, a
cluster or Mooncake); an engine with another layout never sees them.  What is left out
on purpose: the engine id and the data-parallel rank (replicas share), the rank of the
scheduler (rows hold every rank).
"""

from __future__ import annotations

import hashlib
from typing import Any

from kvpool.integrations.shared.keys import KeySpace

__all__ = ["chunk_key_space", "offload_key_of"]


def chunk_key_space(config: Any, row_bytes: int) -> KeySpace:
    """The key space of one vLLM configuration.

    Args:
        config: ``offloading_spec.config`` (vLLM's ``OffloadingConfig``).
        row_bytes: the primary tier's row stride (``primary_kv_view.strides[0]``).

    Returns:
        The key space; its ``text`` names every part, for the start-up log line.
    """
    parallel = config.parallel
    groups = ";".join(
        f"{g.group_id}:{g.tokens_per_block}:{','.join(g.layer_names)}" for g in config.groups
    )
    rows = "canonical" if config.canonical_layout else "direct"
    return KeySpace(
        "vllm",
        model=config.model.name,
        dtype=config.model.dtype,
        row=row_bytes,
        worker_block=config.worker_kv_bytes_per_block,
        blocks_per_chunk=config.cache.blocks_per_chunk,
        tokens_per_hash=config.cache.tokens_per_hash,
        world=parallel.world_size,
        tp=parallel.tp_size,
        pp=parallel.pp_size,
        pcp=parallel.pcp_size,
        dcp=parallel.dcp_size,
        groups=hashlib.sha256(groups.encode("utf-8")).hexdigest()[:16],
        replicated=bool(config.replicated_layout),
        layout=f"{rows}:{config.kv_cache_layout}",
    )


def offload_key_of(name: str, space: KeySpace) -> bytes | None:
    """The ``OffloadKey`` a store key of ``space`` names, or None for another space's key.

    Args:
        name: a store key (as text).
        space: the tier's key space.
    """
    if not name.startswith(space.prefix):
        return None
    try:
        return bytes.fromhex(name[len(space.prefix) :])
    except ValueError:
        return None
