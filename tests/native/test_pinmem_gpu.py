"""Real CUDA: run on a machine with a GPU (``pytest -m gpu``); skipped elsewhere.

Every test starts with no CUDA error pending and fails if it leaves one
(the ``cuda_device`` fixture), so none depends on the tests before it.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvpool import errors, native
from kvpool.native.buffer import allocate_host, attach_shm
from kvpool.native.machine import capabilities
from kvpool.native.registration import register_host

MIB = 1 << 20
GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def real_cuda(cuda_device, options):
    """The device's runtime (libpinmem's options restored after the test)."""
    return cuda_device


def round_trip(buf, offset: int = 0, length: int | None = None) -> None:
    """Copy ``[offset, offset + length)`` of a pinned buffer to the GPU and back, checked."""
    host = buf.tensor()[offset : offset + (length or buf.size - offset)]
    assert host.is_pinned()
    host.fill_(offset // MIB % 251)
    marks = torch.randint(0, host.numel(), (64,))
    host[marks] = torch.randint(0, 256, (64,), dtype=torch.uint8)
    device = host.to("cuda", non_blocking=True)
    back = torch.empty_like(host)
    back.copy_(device, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(back, host)


def test_auto_uses_cuda_host_alloc_below_the_threshold() -> None:
    assert native.option_get("register_threshold") == GIB
    with allocate_host(64 * MIB) as buf:
        assert buf.kind == "cuda-host"
        assert buf.pinned == "cuda-alloc"
        assert buf.registrations() == [(0, buf.mapped_size)]
        round_trip(buf)


def test_auto_registers_from_the_threshold() -> None:
    with allocate_host(GIB) as buf:
        assert buf.kind == "anonymous"
        assert buf.pinned == "cuda-register"
        assert buf.registrations() == [(0, GIB)]  # one call: the option allows 64 GiB
        round_trip(buf)


def test_register_in_chunks_on_a_real_driver() -> None:
    native.option_set("register_chunk", 64 * MIB)
    with allocate_host(200 * MIB, pin="cuda-register") as buf:
        assert buf.pinned == "cuda-register"
        spans = buf.registrations()
        assert buf.register_chunks == 4 and [s for s, _ in spans] == [
            i * 64 * MIB for i in range(4)
        ]
        for offset, length in spans:  # a copy may not span two of them
            round_trip(buf, offset, length)


def test_overlapped_population_registers_every_chunk() -> None:
    native.option_set("register_chunk", 64 * MIB)
    for overlap in (1, 0):
        native.option_set("register_overlap", overlap)
        with allocate_host(256 * MIB, pin="cuda-register") as buf:
            assert buf.register_chunks == 4
            for offset, length in buf.registrations():
                round_trip(buf, offset, length)


CROSS_COPY = """
import torch
from kvpool import native
from kvpool.native.buffer import allocate_host
torch.cuda.init()
native.cuda_reload(None)
native.option_set("register_chunk", 64 << 20)
buf = allocate_host(128 << 20, pin="cuda-register")
host = buf.tensor()[(60 << 20):(68 << 20)]
try:
    host.to("cuda")
    torch.cuda.synchronize()
    print("copied")
except RuntimeError as exc:
    print("refused:", exc)
"""


def test_cuda_refuses_a_copy_across_two_registrations(real_cuda) -> None:
    # In a child: the rule kvpool's placement exists for, seen on the driver.
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    done = subprocess.run(
        [sys.executable, "-c", CROSS_COPY], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused:") and "invalid argument" in done.stdout


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_LIBC.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PROT_NONE, PROT_RW, MAP_PRIVATE_ANONYMOUS = 0, 3, 0x22


def map_anonymous(length: int, prot: int) -> int:
    """Private anonymous memory kvpool did not map (libc's mmap), its address."""
    address = _LIBC.mmap(None, length, prot, MAP_PRIVATE_ANONYMOUS, -1, 0)
    assert address not in (None, (1 << 64) - 1), os.strerror(ctypes.get_errno())
    return int(address)


def test_a_refused_registration_leaves_no_cuda_error(real_cuda) -> None:
    # PROT_NONE pages cannot be pinned: the driver refuses, libpinmem clears
    # the error, and torch's next kernel launch in this thread works.
    address = map_anonymous(8 * MIB, PROT_NONE)
    try:
        with pytest.raises((errors.NativeError, errors.OutOfMemoryError)) as info:
            register_host(address, 8 * MIB)
        text = str(info.value)
        assert "cudaError" in text and "???" not in text
        assert real_cuda.peek() == 0
        assert (torch.ones(4, device="cuda") * 2).sum().item() == 8
    finally:
        _LIBC.munmap(address, 8 * MIB)
    # Refused part-way: the first chunk is unregistered again (it registers anew).
    base = map_anonymous(8 * MIB, PROT_RW)
    try:
        assert _LIBC.mprotect(base + 4 * MIB, 4 * MIB, PROT_NONE) == 0
        with pytest.raises((errors.NativeError, errors.OutOfMemoryError), match="unregistered 1"):
            register_host(base, 8 * MIB, chunk=4 * MIB)
        assert real_cuda.peek() == 0
        with register_host(base, 4 * MIB) as reg:
            assert reg.spans() == [(0, 4 * MIB)]
    finally:
        _LIBC.munmap(base, 8 * MIB)


def test_registered_hugepages_numa_and_shm() -> None:
    with allocate_host(64 * MIB, pin="cuda-register", hugepages="auto", numa_node=0) as buf:
        assert buf.pinned == "cuda-register"
        round_trip(buf)
    name = f"/kvpool-gpu-test-{os.getpid()}"
    with allocate_host(32 * MIB, shm_name=name) as owner:
        assert owner.pinned == "cuda-register"
        with attach_shm(name) as other:
            assert other.pinned == "cuda-register"
            round_trip(other)


def test_runtime_found_is_torchs(real_cuda) -> None:
    # One libcudart in the process: the error libpinmem clears is torch's.
    caps = capabilities()
    with open("/proc/self/maps") as f:
        mapped = {line.split()[-1] for line in f if "libcudart" in line}
    assert mapped == {os.path.realpath(caps.cuda_runtime_path)}
    assert caps.cuda_device_count == torch.cuda.device_count()
