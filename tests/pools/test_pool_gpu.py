"""Pools on a real GPU: run with ``pytest -m gpu`` on a CUDA machine; skipped elsewhere."""

from __future__ import annotations

import pytest
import torch

import kvpool
from kvpool import MemoryFormat

pytestmark = pytest.mark.gpu

SHAPE = torch.Size([2, 4, 64, 128])
DTYPE = torch.float16


@pytest.fixture(autouse=True)
def real_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    torch.cuda.init()


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
    gpu = paged.allocate(SHAPE, DTYPE, MemoryFormat.KV_2LTD, allocator_type="gpu")
    cpu = paged.allocate(SHAPE, DTYPE, MemoryFormat.KV_2LTD, allocator_type="cpu")
    assert gpu.tensor.device.type == "cuda" and cpu.tensor.device.type == "cpu"
    cpu.tensor.normal_()
    gpu.tensor.copy_(cpu.tensor, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(gpu.tensor.cpu(), cpu.tensor)
    paged.batched_free([gpu, cpu])
    assert paged.memcheck()
    paged.close()


def test_mixed_pool_is_cuda_pinned_and_copies_asynchronously() -> None:
    with kvpool.MixedMemoryAllocator(16 << 20) as pool:
        assert pool.describe()["pinned"] in ("cuda-alloc", "cuda-register")
        obj = pool.allocate(SHAPE, DTYPE, MemoryFormat.KV_2LTD)
        assert obj.tensor.is_pinned()
        obj.tensor.copy_(torch.randn(SHAPE).to(DTYPE))
        dev = obj.tensor.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(dev.cpu(), obj.tensor)
        obj.ref_count_down()
