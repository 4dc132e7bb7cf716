"""The GPU workers' side of vLLM's primary tier, simulated: each rank copies to and from its slot.

vLLM's ``CPUOffloadingWorker`` copies GPU blocks into the rows the
scheduler's manager hands out and needs CUDA; here each rank maps the
primary tier's region with vLLM's own ``SharedOffloadRegion(rank=r)`` and
takes its slot of every row with ``create_next_worker_view``, as
``TieringOffloadingSpec.create_worker`` does, and copies bytes instead.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

__all__ = ["Workers"]


class Workers:
    """Every rank's slot of every row of one engine's primary tier.

    Args:
        spec: the worker's offloading spec (``TieringOffloadingSpec``): its
            engine id, rows, row bytes and slot bytes.
        world_size: the ranks.
    """

    def __init__(self, spec: Any, world_size: int) -> None:
        self.slot = spec.cpu_page_size_per_worker
        self.regions: list[SharedOffloadRegion] = []
        self.views: list[torch.Tensor] = []
        try:
            for rank in range(world_size):
                # The arguments TieringOffloadingSpec.create_worker gives each rank.
                region = SharedOffloadRegion(
                    engine_id=spec.config.engine_id,
                    num_chunks=spec.num_chunks,
                    rank=0 if spec.replicated_layout else rank,
                    kv_bytes_per_chunk=spec.kv_bytes_per_chunk,
                    cpu_page_size=spec.cpu_page_size_per_worker,
                )
                self.regions.append(region)
                self.views.append(region.create_next_worker_view(self.slot))
        except BaseException:
            self.close()
            raise

    def write(self, chunk_id: int, content: bytes) -> None:
        """Write a whole chunk's bytes into row ``chunk_id``: rank r's part into its slot."""
        for rank, view in enumerate(self.views):
            part = content[rank * self.slot : (rank + 1) * self.slot]
            view[chunk_id].copy_(torch.frombuffer(bytearray(part), dtype=torch.int8))

    def read(self, chunk_id: int) -> bytes:
        """The bytes of row ``chunk_id``'s slots, rank 0's first (padding left out)."""
        return b"".join(view[chunk_id].numpy().tobytes() for view in self.views)

    def close(self) -> None:
        """Unmap every rank's view of the region (idempotent)."""
        self.views.clear()  # the regions' cleanup needs the last view gone
        while self.regions:
            self.regions.pop().cleanup()
