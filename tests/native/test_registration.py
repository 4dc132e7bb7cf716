"""Registrations of memory kvpool did not map (``register_host``) and the registration queries.

Against the fake CUDA runtime: chunked like libpinmem's own mappings,
boundaries reported, misuse refused, a refusal rolled back with no CUDA
error left behind, a forked child that only forgets.
"""

from __future__ import annotations

import mmap
import os

import pytest
import torch

from kvpool import errors, native
from kvpool.native.buffer import allocate_host
from kvpool.native.registration import register_host, register_plan, registrations

MIB = 1 << 20


@pytest.fixture
def memory():
    """10 MiB of shared anonymous memory kvpool did not map, and its address."""
    mapping = mmap.mmap(-1, 10 * MIB)
    view = memoryview(mapping)
    address = torch.frombuffer(view, dtype=torch.uint8).data_ptr()
    yield mapping, address
    view.release()
    mapping.close()


def test_register_in_chunks_and_release(fake_cuda, memory) -> None:
    mapping, address = memory
    with register_host(address, 10 * MIB, chunk=4 * MIB, keep_alive=mapping) as reg:
        assert reg.register_chunks == 3 and reg.size == 10 * MIB
        assert reg.spans() == [(0, 4 * MIB), (4 * MIB, 4 * MIB), (8 * MIB, 2 * MIB)]
        assert registrations(address) == reg.spans()
        assert fake_cuda.stats()["live_registrations"] == 3
        assert fake_cuda.check_copy(address + 3 * MIB, MIB) == 0
        assert fake_cuda.check_copy(address + 3 * MIB, 2 * MIB) != 0  # across two
        assert native.query(address).kind == "external"
        with pytest.raises(errors.InvalidArgumentError, match="overlaps"):
            register_host(address + MIB, MIB)
        with pytest.raises(errors.InvalidArgumentError, match="pinmem_unregister"):
            native.free(address)
    assert reg.closed and fake_cuda.stats()["live_registrations"] == 0
    reg.close()  # idempotent
    with pytest.raises(errors.PoolClosedError):
        reg.spans()


def test_flags_reach_the_driver(fake_cuda, memory) -> None:
    _, address = memory
    with register_host(address, MIB, read_only=True, populate=True):
        assert fake_cuda.register_flags() == 1 | 8  # Portable | ReadOnly
    with register_host(address, MIB, io_memory=True):
        assert fake_cuda.register_flags() == 1 | 4  # Portable | IoMemory


def test_a_refusal_part_way_rolls_back_and_clears_the_error(fake_cuda, memory, monkeypatch) -> None:
    _, address = memory
    monkeypatch.setenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N", "2")
    with pytest.raises(errors.OutOfMemoryError) as info:
        register_host(address, 10 * MIB, chunk=4 * MIB)
    text = str(info.value)
    assert "cudaErrorMemoryAllocation" in text and "unregistered 1 of the 1" in text
    assert fake_cuda.last_error() == 0
    assert fake_cuda.stats()["live_registrations"] == 0
    with pytest.raises(errors.InvalidHandleError):
        registrations(address)


def test_without_cuda_it_says_so(memory) -> None:
    _, address = memory
    native.cuda_reload("")
    with pytest.raises(errors.FeatureUnavailableError, match="needs CUDA"):
        register_host(address, MIB)


def test_bad_arguments_are_typed(fake_cuda, memory) -> None:
    _, address = memory
    for bad in ({"length": 0}, {"length": -1}, {"chunk": 0}, {"read_only": "yes"}):
        args = {"address": address, "length": MIB, **bad}
        with pytest.raises(errors.InvalidArgumentError):
            register_host(**args)
    with pytest.raises(errors.InvalidArgumentError, match="page-aligned"):
        register_host(address + 8, MIB, populate=True)


def test_a_forked_child_only_forgets(fake_cuda, memory) -> None:
    _, address = memory
    reg = register_host(address, 4 * MIB)
    pid = os.fork()
    if pid == 0:  # the child: no CUDA call, nothing raised
        try:
            reg.close()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert fake_cuda.stats()["live_registrations"] == 1
    reg.close()
    assert fake_cuda.stats()["live_registrations"] == 0


def test_host_buffers_report_their_registrations(fake_cuda) -> None:
    native.option_set("register_chunk", 4 * MIB)
    with allocate_host(10 * MIB, pin="cuda-register", register_chunk=2 * MIB) as buf:
        assert buf.register_chunks == 5
        assert buf.registrations() == [(i * 2 * MIB, 2 * MIB) for i in range(5)]
    with allocate_host(MIB, pin="cuda-alloc") as buf:
        assert buf.registrations() == [(0, buf.mapped_size)]  # cudaHostAlloc: one
    native.cuda_reload("")
    with allocate_host(MIB, pin="none") as buf:
        assert buf.registrations() == []


def test_the_plan_follows_the_unit() -> None:
    assert register_plan(64 << 30) == 4 << 30
    chunk = register_plan(64 << 30, 3 * MIB)
    assert chunk % (3 * MIB) == 0 and chunk % (2 * MIB) == 0 and chunk <= 4 << 30
    with pytest.raises(errors.InvalidArgumentError):
        register_plan(-1)
