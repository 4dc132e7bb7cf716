"""CUDA paths on a CPU machine: absent (faked away) and present (a fake libcudart).

The fake runtime (libpinmem/tests/fake_cudart.c) implements the runtime
calls libpinmem uses over mmap and keeps books, so the chunked register,
the rollback and the reported flags are checked for real.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fake_cuda import FakeCuda

from kvpool import errors, native
from kvpool.native.buffer import allocate_host, attach_shm, live_mappings
from kvpool.native.machine import capabilities

MIB = 1 << 20


@pytest.fixture
def fake(fake_cudart: Path, options, monkeypatch) -> FakeCuda:
    monkeypatch.delenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N", raising=False)
    monkeypatch.delenv("KVPOOL_FAKE_CUDA_MAX_REGISTER_BYTES", raising=False)
    monkeypatch.delenv("KVPOOL_FAKE_CUDA_DEVICES", raising=False)
    native.cuda_reload(str(fake_cudart))
    books = FakeCuda(fake_cudart)
    books.reset()
    return books


# ------------------------------------------------------------ CUDA absent


def test_absent_runtime_reported_and_auto_falls_back() -> None:
    native.cuda_reload("/nowhere/libcudart.so.12")
    caps = capabilities()
    assert caps.cuda_available is False
    assert "/nowhere/libcudart.so.12" in (caps.cuda_error or "")
    with allocate_host(4 * MIB) as buf:
        assert buf.pinned in ("mlock", "none")
        assert buf.kind == "anonymous"


def test_absent_runtime_refuses_explicit_cuda_pinning() -> None:
    native.cuda_reload("/nowhere/libcudart.so.12")
    for pin in ("cuda-alloc", "cuda-register"):
        with pytest.raises(errors.FeatureUnavailableError, match="needs CUDA") as info:
            allocate_host(MIB, pin=pin)
        assert "/nowhere/libcudart.so.12" in str(info.value)


def test_absent_via_environment_in_a_fresh_process(python, child_env) -> None:
    env = dict(child_env, KVPOOL_CUDART="/nowhere/libcudart.so.12")
    code = (
        "from kvpool.native.machine import capabilities\n"
        "from kvpool.native.buffer import allocate_host\n"
        "c = capabilities()\n"
        "b = allocate_host(1 << 20)\n"
        "print(c.cuda_available, b.pinned, c.cuda_error)\n"
    )
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    available, pinned, *error = out.stdout.split()
    assert available == "False"
    assert pinned in ("mlock", "none")
    assert "/nowhere/libcudart.so.12" in " ".join(error)


def test_runtime_without_devices_is_not_used(fake_cudart, monkeypatch) -> None:
    monkeypatch.setenv("KVPOOL_FAKE_CUDA_DEVICES", "0")
    native.cuda_reload(str(fake_cudart))
    caps = capabilities()
    assert caps.cuda_runtime_path is not None and caps.cuda_available is False
    assert caps.cuda_device_count == 0
    with allocate_host(MIB) as buf:
        assert buf.pinned in ("mlock", "none")


# ----------------------------------------------------------- CUDA present


def test_fake_runtime_is_reported(fake) -> None:
    caps = capabilities()
    assert caps.cuda_available is True
    assert caps.cuda_device_count == 1
    assert caps.cuda_runtime_version == 12040
    assert caps.cuda_runtime_path is not None and "libfakecudart" in caps.cuda_runtime_path


def test_register_in_chunks(fake) -> None:
    native.option_set("register_chunk", 4 * MIB)
    with allocate_host(10 * MIB, pin="cuda-register") as buf:
        assert buf.pinned == "cuda-register"
        assert buf.kind == "anonymous"
        assert buf.register_chunks == 3
        books = fake.stats()
        assert books["live_registrations"] == 3
        assert books["largest"] == 4 * MIB
        assert fake.registered(buf.address, 4 * MIB)
        assert fake.registered(buf.address + 8 * MIB, 2 * MIB)
        assert native.resident_bytes(buf.address, buf.mapped_size) == buf.mapped_size
    books = fake.stats()
    assert books["live_registrations"] == 0
    assert books["unregisters"] == 3


def test_failed_chunk_rolls_back_the_others(fake, monkeypatch) -> None:
    native.option_set("register_chunk", 4 * MIB)
    monkeypatch.setenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N", "3")
    before = live_mappings()
    with pytest.raises(errors.OutOfMemoryError, match="chunk 3 of 4") as info:
        allocate_host(16 * MIB, pin="cuda-register")
    assert "unregistered 2 of the 2" in str(info.value)
    books = fake.stats()
    assert books["registers"] == 3
    assert books["unregisters"] == 2
    assert books["live_registrations"] == 0
    assert live_mappings() == before


def test_first_chunk_failing_leaves_nothing(fake, monkeypatch) -> None:
    monkeypatch.setenv("KVPOOL_FAKE_CUDA_FAIL_REGISTER_N", "1")
    before = live_mappings()
    with pytest.raises(errors.OutOfMemoryError, match="chunk 1 of 1"):
        allocate_host(2 * MIB, pin="cuda-register")
    assert fake.stats()["live_registrations"] == 0
    assert live_mappings() == before


def test_chunk_limit_keeps_each_registration_under_the_driver_limit(fake, monkeypatch) -> None:
    # The fake refuses registrations above 6 MiB, as drivers refuse >= 512 GiB.
    monkeypatch.setenv("KVPOOL_FAKE_CUDA_MAX_REGISTER_BYTES", str(6 * MIB))
    with pytest.raises(errors.OutOfMemoryError):
        allocate_host(8 * MIB, pin="cuda-register")
    native.option_set("register_chunk", 4 * MIB)
    with allocate_host(8 * MIB, pin="cuda-register") as buf:
        assert buf.register_chunks == 2


def test_auto_uses_cuda_host_alloc_below_threshold(fake) -> None:
    with allocate_host(3 * MIB) as buf:
        assert buf.kind == "cuda-host"
        assert buf.pinned == "cuda-alloc"
        assert fake.stats()["live_allocations"] == 1
    assert fake.stats()["live_allocations"] == 0


def test_the_threshold_turns_auto_into_register(fake) -> None:
    native.option_set("register_threshold", 2 * MIB)
    native.option_set("register_chunk", 2 * MIB)
    with allocate_host(3 * MIB) as buf:
        assert buf.pinned == "cuda-register"
        assert buf.kind == "anonymous"
        assert buf.register_chunks == 2
    assert fake.stats()["live_allocations"] == 0
    # Asked for by name, cudaHostAlloc stays cudaHostAlloc.
    with allocate_host(3 * MIB, pin="cuda-alloc") as buf:
        assert (buf.pinned, buf.kind) == ("cuda-alloc", "cuda-host")


def test_auto_registers_from_one_gib_by_default(fake) -> None:
    assert native.option_get("register_threshold") == 1 << 30
    with allocate_host((1 << 30) - 4096) as buf:
        assert buf.pinned == "cuda-alloc"
    with allocate_host(1 << 30) as buf:
        assert (buf.pinned, buf.kind, buf.register_chunks) == ("cuda-register", "anonymous", 1)


def test_auto_registers_numa_thp_and_shm_memory(fake) -> None:
    with allocate_host(2 * MIB, numa_node=0) as buf:
        assert buf.pinned == "cuda-register"
    with allocate_host(2 * MIB, hugepages="thp") as buf:
        assert buf.pinned == "cuda-register"
    name = "/kvpool-test-fake-cuda-shm"
    with allocate_host(2 * MIB, shm_name=name, shm_reuse=True) as owner:
        assert owner.pinned == "cuda-register"
        with attach_shm(name) as other:
            assert other.pinned == "cuda-register"
    assert fake.stats()["live_registrations"] == 0


def test_cuda_alloc_refuses_what_it_cannot_give(fake) -> None:
    with pytest.raises(errors.InvalidArgumentError, match="cuda-register"):
        allocate_host(MIB, pin="cuda-alloc", numa_node=0)
    with pytest.raises(errors.InvalidArgumentError, match="cuda-register"):
        allocate_host(MIB, pin="cuda-alloc", hugepages="thp")


def test_host_alloc_failure_is_typed(fake, monkeypatch) -> None:
    monkeypatch.setenv("KVPOOL_FAKE_CUDA_FAIL_ALLOC", "1")
    with pytest.raises(errors.OutOfMemoryError, match="cudaHostAlloc"):
        allocate_host(MIB, pin="cuda-alloc")


def test_reload_refused_while_cuda_memory_is_live(fake) -> None:
    with (
        allocate_host(MIB, pin="cuda-register"),
        pytest.raises(errors.NativeError, match="CUDA-pinned"),
    ):
        native.cuda_reload("")
    native.cuda_reload("")


def test_views_keep_registered_memory_until_released(fake) -> None:
    buf = allocate_host(4 * MIB, pin="cuda-register")
    t = buf.tensor()
    buf.close()
    assert fake.stats()["live_registrations"] == 1
    t[0] = 3
    del t
    assert buf.unmapped
    assert fake.stats()["live_registrations"] == 0
