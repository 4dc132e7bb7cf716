"""Real CUDA: run on a machine with a GPU (``pytest -m gpu``); skipped elsewhere."""

from __future__ import annotations

import os

import pytest
import torch

from kvpool import native
from kvpool.native.buffer import allocate_host, attach_shm
from kvpool.native.machine import capabilities

MIB = 1 << 20

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def real_cuda(options):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    torch.cuda.init()  # load torch's libcudart so libpinmem finds it with RTLD_NOLOAD
    native.cuda_reload(None)
    caps = capabilities()
    if not caps.cuda_available:
        pytest.skip(f"libpinmem sees no usable CUDA runtime: {caps.cuda_error}")
    yield caps
    torch.cuda.synchronize()


def copy_roundtrip(buf) -> None:
    host = buf.tensor()
    host[:4096] = torch.arange(4096, dtype=torch.int64).to(torch.uint8)
    assert host.is_pinned()
    dev = host.to("cuda", non_blocking=True)
    back = torch.empty_like(host)
    back.copy_(dev, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(back[:4096], host[:4096])


def test_auto_uses_cuda_host_alloc() -> None:
    with allocate_host(64 * MIB) as buf:
        assert buf.kind == "cuda-host"
        assert buf.pinned == "cuda-alloc"
        copy_roundtrip(buf)


def test_register_in_chunks_on_a_real_driver() -> None:
    native.option_set("register_chunk", 64 * MIB)
    with allocate_host(200 * MIB, pin="cuda-register") as buf:
        assert buf.pinned == "cuda-register"
        assert buf.register_chunks == 4
        copy_roundtrip(buf)


def test_registered_hugepages_numa_and_shm() -> None:
    with allocate_host(64 * MIB, hugepages="auto", numa_node=0) as buf:
        assert buf.pinned == "cuda-register"
        copy_roundtrip(buf)
    name = f"/kvpool-gpu-test-{os.getpid()}"
    with allocate_host(32 * MIB, shm_name=name) as owner:
        assert owner.pinned == "cuda-register"
        with attach_shm(name) as other:
            assert other.pinned == "cuda-register"
            copy_roundtrip(other)


def test_runtime_found_is_torchs(real_cuda) -> None:
    assert real_cuda.cuda_runtime_path
    assert real_cuda.cuda_device_count == torch.cuda.device_count()
