"""A model and its KV-chunk geometry for the vLLM harness, and the offline cache that serves it.

:class:`Layout` is what makes two engines' chunks alike (model, dtype,
tensor-parallel size, block and chunk sizes); :class:`ModelStore` files a
tiny Llama ``config.json`` of that geometry in an offline Hugging Face
cache, so ``--model org/name`` resolves with no network and no weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["DTYPES", "VOCAB", "Layout", "ModelStore"]

#: The KV-cache dtypes a layout may name.
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
#: The tiny model's vocabulary: token ids are below it.
VOCAB = 32000
#: The commit every model folder of the offline cache is filed under.
_REVISION = "0" * 40


@dataclass(frozen=True)
class Layout:
    """A model and the geometry of its KV chunks: what makes two engines' chunks alike.

    Args:
        model: the model's name (a Hugging Face id, ``org/name``).
        dtype: the KV cache's dtype, ``float16``, ``bfloat16`` or ``float32``.
        world_size: tensor-parallel ranks; each row of the primary tier holds
            one slot per rank.
        block_tokens: tokens per GPU block (``--block-size``).
        blocks_per_chunk: GPU blocks per offloaded chunk.
        layers, kv_heads, head_dim: the model's attention geometry; with
            ``block_tokens`` and ``dtype`` they set the bytes of a block.
        primary_bytes: ``cpu_bytes_to_use``, the primary tier's size.
        gpu_blocks: the GPU blocks the workers report room for (by default
            twice what one request of ``max_model_len`` tokens needs).
        max_model_len: ``--max-model-len``.
        kv_cache_layout: the KV cache layout the engine core resolves (a
            ``KVCacheLayout`` name, e.g. ``LBNHC``), or None for vLLM's choice.

    Raises:
        ValueError: a size that is not positive, an unknown dtype, or
            ``kv_heads`` that ``world_size`` does not divide.
    """

    model: str = "kvpool-test/tiny-llama"
    dtype: str = "float16"
    world_size: int = 1
    block_tokens: int = 16
    blocks_per_chunk: int = 2
    layers: int = 2
    kv_heads: int = 2
    head_dim: int = 64
    primary_bytes: int = 2 << 20
    gpu_blocks: int | None = None
    max_model_len: int = 1024
    kv_cache_layout: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: give one of {sorted(DTYPES)}")
        for name in ("world_size", "block_tokens", "blocks_per_chunk", "layers", "kv_heads",
                     "head_dim", "primary_bytes", "max_model_len"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.gpu_blocks is not None and self.gpu_blocks < 1:
            raise ValueError(f"gpu_blocks={self.gpu_blocks} must be >= 1 (or None: the default)")
        if self.kv_heads % self.world_size:
            raise ValueError(
                f"kv_heads={self.kv_heads} is not divisible by world_size={self.world_size}: "
                "give kv_heads a multiple of world_size (each rank holds kv_heads/world_size)"
            )

    @property
    def block_bytes(self) -> int:
        """Bytes of one GPU block on one rank: K and V of every layer."""
        itemsize = DTYPES[self.dtype].itemsize
        heads = self.kv_heads // self.world_size
        return 2 * self.block_tokens * heads * self.head_dim * itemsize * self.layers

    @property
    def slot_bytes(self) -> int:
        """Bytes of one rank's slot of a chunk (``cpu_page_size`` in vLLM)."""
        return self.block_bytes * self.blocks_per_chunk

    @property
    def chunk_bytes(self) -> int:
        """Bytes of a whole chunk, every rank's slot (the same for any world size)."""
        return self.slot_bytes * self.world_size

    @property
    def gpu_block_count(self) -> int:
        """The GPU blocks the workers report: ``gpu_blocks``, or twice one longest request's."""
        return self.gpu_blocks or 2 * -(-self.max_model_len // self.block_tokens)

    @property
    def tokens_per_chunk(self) -> int:
        """Tokens one chunk covers."""
        return self.block_tokens * self.blocks_per_chunk

    def hf_config(self) -> dict[str, Any]:
        """A tiny Llama's ``config.json`` with this geometry."""
        heads = 2 * self.kv_heads
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": heads * self.head_dim,
            "head_dim": self.head_dim,
            "intermediate_size": 4 * heads * self.head_dim,
            "num_attention_heads": heads,
            "num_key_value_heads": self.kv_heads,
            "num_hidden_layers": self.layers,
            "vocab_size": VOCAB,
            "max_position_embeddings": self.max_model_len,
            "rms_norm_eps": 1e-5,
            "torch_dtype": self.dtype,
        }


class ModelStore:
    """Model folders in an offline Hugging Face cache, so ``--model org/name`` resolves here.

    Args:
        hub: the cache's ``hub`` folder (``huggingface_hub.constants.HF_HUB_CACHE``);
            the process must run with ``HF_HUB_OFFLINE=1``.
    """

    def __init__(self, hub: Path) -> None:
        self.hub = Path(hub)
        self._written: dict[str, dict[str, Any]] = {}

    def ensure(self, layout: Layout) -> None:
        """File ``layout.model``'s ``config.json`` in the cache (once per name).

        Raises:
            ValueError: the name was filed before with another geometry (a
                model has one; give the other layout another model name).
        """
        config = layout.hf_config()
        config.pop("torch_dtype")  # the engine's --dtype decides; one file serves every dtype
        known = self._written.get(layout.model)
        if known is not None:
            if known != config:
                raise ValueError(
                    f"model {layout.model!r} is already filed with another geometry "
                    f"({known}); give this layout another model name"
                )
            return
        if layout.model.count("/") != 1:
            raise ValueError(f"model={layout.model!r}: give a Hugging Face id, 'org/name'")
        folder = self.hub / f"models--{layout.model.replace('/', '--')}"
        snapshot = folder / "snapshots" / _REVISION
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps(config))
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / "main").write_text(_REVISION)
        self._written[layout.model] = config
