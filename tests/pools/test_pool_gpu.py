"""Pools on a real GPU: run with ``pytest -m gpu`` on a CUDA machine; skipped elsewhere.

Every test starts with no CUDA error pending and fails if it leaves one
(the ``cuda_device`` fixture), so none depends on the tests before it.

``test_a_pool_larger_than_a_chunk_copies_every_object`` takes its size from
the environment, so ``.ci/gpu-check`` runs it on a pool of tens of GiB:

* ``KVPOOL_GPU_POOL_BYTES``   the pool (default 3 GiB);
* ``KVPOOL_GPU_POOL_CHUNK``   the ``register_chunk`` option, the largest
  registration (default 1 GiB; the pool registers in chunks of at most this);
* ``KVPOOL_GPU_POOL_SAMPLE``  copy every n-th object only (default 1: all).
"""

from __future__ import annotations

import os

import pytest
import torch

import kvpool
from kvpool import MemoryFormat, native
from kvpool.cli.args import parse_size
from kvpool.pool.barriers import boundaries

pytestmark = pytest.mark.gpu

SHAPE = torch.Size([2, 4, 64, 128])
DTYPE = torch.float16
MIB = 1 << 20
GIB = 1 << 30


@pytest.fixture(autouse=True)
def real_cuda(cuda_device):
    """A device, a clean CUDA error state before and after; options restored."""
    saved = {name: native.option_get(name) for name in native.OPTIONS}
    yield cuda_device
    for name, value in saved.items():
        native.option_set(name, value)


def test_gpu_pool_lives_on_the_device() -> None:
    with kvpool.GPUMemoryAllocator(16 << 20) as pool:
        assert pool.buffer.device.type == "cuda"
        obj = pool.allocate(SHAPE, DTYPE, MemoryFormat.KV_2LTD)
        obj.tensor.fill_(3)
        assert obj.tensor.device.type == "cuda"
        assert torch.all(obj.tensor.cpu() == 3)
        with pytest.raises(kvpool.FeatureUnavailableError):
            _ = obj.byte_array  # device memory has no host view
        obj.ref_count_down()
        assert pool.memcheck()


def test_paged_cpu_gpu_pools() -> None:
    paged = kvpool.PagedCpuGpuMemoryAllocator()
    nbytes = SHAPE.numel() * DTYPE.itemsize
    paged.init_gpu_memory_allocator(8 * nbytes, [SHAPE], [DTYPE])
    paged.init_cpu_memory_allocator(8 * nbytes, [SHAPE], [DTYPE])
    try:
        gpu = paged.allocate(SHAPE, DTYPE, MemoryFormat.KV_2LTD, allocator_type="gpu")
        cpu = paged.allocate(SHAPE, DTYPE, MemoryFormat.KV_2LTD, allocator_type="cpu")
        assert gpu.tensor.device.type == "cuda" and cpu.tensor.device.type == "cpu"
        cpu.tensor.normal_()
        gpu.tensor.copy_(cpu.tensor, non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(gpu.tensor.cpu(), cpu.tensor)
        paged.batched_free([gpu, cpu])
        assert paged.memcheck()
    finally:
        paged.close()


def test_mixed_pool_is_cuda_pinned_and_copies_asynchronously() -> None:
    with kvpool.MixedMemoryAllocator(16 << 20) as pool:
        # Below 1 GiB, plain memory: cudaHostAlloc (registered with KVPOOL_HUGEPAGES=auto).
        assert pool.describe()["pinned"] in ("cuda-alloc", "cuda-register")
        obj = pool.allocate(SHAPE, DTYPE, MemoryFormat.KV_2LTD)
        assert obj.tensor.is_pinned()
        obj.tensor.copy_(torch.randn(SHAPE).to(DTYPE))
        dev = obj.tensor.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(dev.cpu(), obj.tensor)
        obj.ref_count_down()


def _objects(pool, nbytes: int) -> list:
    objs = []
    while (
        obj := pool.allocate(torch.Size([nbytes]), torch.uint8, MemoryFormat.BINARY)
    ) is not None:
        objs.append(obj)
    return objs


def test_a_pool_larger_than_a_chunk_copies_every_object() -> None:
    size = parse_size(os.environ.get("KVPOOL_GPU_POOL_BYTES", "3G"))
    chunk = parse_size(os.environ.get("KVPOOL_GPU_POOL_CHUNK", "1G"))
    every = max(1, int(os.environ.get("KVPOOL_GPU_POOL_SAMPLE", 1)))
    native.option_set("register_chunk", chunk)
    # An odd object (a KV chunk of 3 x 11 MiB + 12 KiB): several straddle a
    # boundary wherever the placement ignored the registrations.
    nbytes = 33 * MIB + 12 * 1024
    with kvpool.MixedMemoryAllocator(size, pin="cuda-register") as pool:
        spans = pool.backing.registrations()
        assert pool.describe()["pinned"] == "cuda-register" and len(spans) > 1
        assert max(length for _, length in spans) <= chunk
        cuts = boundaries(spans, size)
        objs = _objects(pool, nbytes)
        # Each registration leaves less than one object unused at its end.
        phy = objs[0].get_physical_size()
        assert sum(o.get_physical_size() for o in objs) > size - len(spans) * phy
        base = pool.buffer.data_ptr()
        for obj in objs:
            start = obj.data_ptr - base
            assert not any(start < c < start + obj.get_physical_size() for c in cuts)
        sample = objs[::every]
        pattern = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")
        back = torch.empty_like(pattern)
        # Device to host, every sampled object, each with its own bytes ...
        for i, obj in enumerate(sample):
            obj.tensor.view(torch.uint8).copy_(pattern ^ (i % 251), non_blocking=True)
        torch.cuda.synchronize()
        # ... then host to device, each checked: no object lost another's bytes.
        for i, obj in enumerate(sample):
            back.copy_(obj.tensor.view(torch.uint8), non_blocking=True)
            offset = obj.data_ptr - base
            assert torch.equal(back, pattern ^ (i % 251)), f"object {i} at offset {offset}"
        print(
            f"\n{len(sample)} of {len(objs)} objects of {nbytes} bytes copied H2D and D2H, "
            f"verified, in a {size / GIB:.1f} GiB pool of {len(spans)} registrations"
        )
        for obj in objs:
            obj.ref_count_down()
        assert pool.memcheck()
