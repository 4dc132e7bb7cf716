"""A pool per backing kind (pageable, pinned, NUMA, hugepage, shared) and the CPU-memory helpers."""

from __future__ import annotations

import gc
import os
import re
from pathlib import Path

import pytest
import torch
from hugepage_pool import reserve_hugepages
from pool_helpers import (
    KV_BYTES,
    KV_DTYPE,
    KV_FMT,
    KV_SHAPE,
    MIB,
    count_mappings,
    cuda_present,
    paged_kwargs,
    pattern,
)

import kvpool
import kvpool.native.machine as system


def expected_pinning() -> str:
    if cuda_present():
        pytest.skip("CUDA is present: pools are CUDA-pinned, not mlocked")
    if os.geteuid() != 0:
        pytest.skip("not root: mlock of a pool may be refused by RLIMIT_MEMLOCK")
    return "mlock"


# -- pageable ---------------------------------------------------------------------


def test_host_pool_is_pageable(no_auto_hugepages: None) -> None:
    with kvpool.HostMemoryAllocator(MIB) as pool:
        info = pool.describe()
        assert info["pinned"] == "none"
        assert info["kind"] == "anonymous"
        assert info["hugepages"] == "none"
        assert info["size"] == MIB
        assert info["policy"] == "extent"
        assert info["pool"] == "HostMemoryAllocator"
        assert pool.size == MIB and pool.buffer.numel() == MIB


# -- pinned -----------------------------------------------------------------------


@pytest.mark.parametrize("cls", [kvpool.PinMemoryAllocator, kvpool.MixedMemoryAllocator])
def test_pinned_pools_are_mlocked_as_root(cls, no_auto_hugepages: None) -> None:
    expected = expected_pinning()
    with cls(MIB) as pool:
        assert pool.describe()["pinned"] == expected
        assert pool.backing.buffer.pinned == expected


def test_paged_pinned_pool_describes_its_policy() -> None:
    with kvpool.PinMemoryAllocator(MIB, use_paging=True, **paged_kwargs()) as pool:
        info = pool.describe()
        assert info["policy"] == "paged"
        assert info["pinned"] in ("mlock", "cuda-alloc", "cuda-register", "none")
        assert pool.allocator.num_pages == MIB // KV_BYTES


# -- NUMA -------------------------------------------------------------------------


def _cpus_of_node(node: int) -> set[int]:
    text = Path(f"/sys/devices/system/node/node{node}/cpulist").read_text().strip()
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


@pytest.fixture
def on_node_zero():
    """Run the test's thread on the CPUs of NUMA node 0 (restored afterwards)."""
    try:
        cpus = _cpus_of_node(0) & os.sched_getaffinity(0)
    except OSError as exc:
        pytest.skip(f"cannot read node 0's CPUs: {exc}")
    if not cpus:
        pytest.skip("no usable CPU on NUMA node 0")
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    yield
    os.sched_setaffinity(0, saved)


def test_numa_mapping_binds_to_node_0(on_node_zero: None) -> None:
    # Without GPUs the calling CPU's node is used: the fixture makes it node 0,
    # which is also what the mapping says for GPU 0 where GPUs exist.
    with kvpool.MixedMemoryAllocator(MIB, numa_mapping=kvpool.NUMAMapping({0: 0})) as pool:
        info = pool.describe()
        assert info["numa_node"] == 0
        obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        obj.byte_array[:] = pattern(KV_BYTES, 1)
        assert bytes(obj.byte_array) == pattern(KV_BYTES, 1)
        if not info["numa_bound"]:
            pytest.skip("the kernel refused mbind (container?): memory kept, unbound")
        assert pool.backing.buffer.numa_bound


def test_numa_mapping_to_a_missing_node_lists_the_real_ones(mappings: int) -> None:
    real = system.numa_nodes()
    missing = max(real) + 7
    with pytest.raises(kvpool.NumaNodeError) as info:
        kvpool.MixedMemoryAllocator(MIB, numa_mapping=kvpool.NUMAMapping({0: missing}))
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert str(missing) in message
    assert str(real) in message
    assert count_mappings() == mappings


def test_numa_mapping_must_be_a_numa_mapping() -> None:
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool.MixedMemoryAllocator(MIB, numa_mapping={0: 0})


def test_numa_paged_cpu_pool(on_node_zero: None) -> None:
    alloc = kvpool.PagedCpuGpuMemoryAllocator()
    alloc.init_cpu_memory_allocator(
        MIB, [KV_SHAPE], [KV_DTYPE], KV_FMT, numa_mapping=kvpool.NUMAMapping({0: 0})
    )
    try:
        assert alloc.cpu_pool.describe()["numa_node"] == 0
    finally:
        alloc.close()


# -- hugepages --------------------------------------------------------------------


@pytest.mark.hugepages
def test_use_hugepages_with_the_pool_reserved(hugepages_reserved: int) -> None:
    with kvpool.MixedMemoryAllocator(3 * MIB, use_hugepages=True) as pool:
        info = pool.describe()
        assert info["hugepages"] == "hugetlb-2MiB"
        assert info["kind"] == "hugetlb"
        assert info["size"] == 3 * MIB
        assert pool.backing.buffer.mapped_size == 4 * MIB
        _, free_now, _ = kvpool._read_hugepage_info()
        assert hugepages_reserved - free_now == 2
        obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        obj.byte_array[:] = pattern(KV_BYTES, 2)
        assert bytes(obj.byte_array) == pattern(KV_BYTES, 2)
        obj.ref_count_down()
    gc.collect()
    free_after_close = kvpool._read_hugepage_info()[1]
    del pool, obj
    gc.collect()
    free_after_drop = kvpool._read_hugepage_info()[1]
    assert free_after_drop == hugepages_reserved
    assert free_after_close == hugepages_reserved, "close() kept the hugepages until the pool went"


@pytest.mark.hugepages
def test_use_hugepages_paged_and_numa(hugepages_reserved: int, on_node_zero: None) -> None:
    with kvpool.MixedMemoryAllocator(
        2 * MIB,
        use_paging=True,
        use_hugepages=True,
        numa_mapping=kvpool.NUMAMapping({0: 0}),
        **paged_kwargs(),
    ) as pool:
        info = pool.describe()
        assert info["hugepages"] == "hugetlb-2MiB"
        assert info["policy"] == "paged"
        assert info["numa_node"] == 0


def test_use_hugepages_with_the_pool_short_says_how_to_grow_it(mappings: int) -> None:
    info = kvpool._read_hugepage_info()
    if info is None:
        pytest.skip("this kernel has no 2 MiB hugepage pool")
    total, free, page_mib = info
    assert page_mib == 2
    need = free + 3
    with pytest.raises(kvpool.HugePagesExhaustedError) as exc:
        kvpool.MixedMemoryAllocator(need * 2 * MIB, use_hugepages=True)
    assert isinstance(exc.value, MemoryError)
    message = str(exc.value)
    assert f"needs {need} hugepages" in message
    assert f"{free} free" in message
    grow = re.search(r"echo (\d+) \| sudo tee /proc/sys/vm/nr_hugepages", message)
    assert grow is not None, message
    assert int(grow.group(1)) >= total + 3
    assert count_mappings() == mappings


def test_hugepages_with_shared_memory_is_a_clear_error(shm_name: str, mappings: int) -> None:
    with pytest.raises(kvpool.InvalidArgumentError) as info:
        kvpool.MixedMemoryAllocator(MIB, use_hugepages=True, shm_name=shm_name)
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "hugepages" in message and "shared memory" in message
    with pytest.raises(kvpool.SharedMemoryNotFoundError):
        kvpool.attach_pool(shm_name)
    assert count_mappings() == mappings


@pytest.mark.hugepages
def test_pools_that_did_not_ask_leave_the_hugepages_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KVPOOL_HUGEPAGES", raising=False)
    with reserve_hugepages(4):
        free_before = kvpool._read_hugepage_info()[1]
        with (
            kvpool.HostMemoryAllocator(2 * MIB) as pool,
            kvpool.MixedMemoryAllocator(2 * MIB) as mixed,
        ):
            assert pool.describe()["hugepages"] == "none"
            assert mixed.describe()["hugepages"] == "none"
            assert kvpool._read_hugepage_info()[1] == free_before
            # ... so a pool that asks still finds them.
            with kvpool.MixedMemoryAllocator(2 * MIB, use_hugepages=True) as wanted:
                assert wanted.describe()["hugepages"] == "hugetlb-2MiB"


@pytest.mark.hugepages
def test_auto_hugepages_are_used_when_free_and_never_turns_them_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with reserve_hugepages(4):
        monkeypatch.setenv("KVPOOL_HUGEPAGES", "auto")
        with kvpool.HostMemoryAllocator(2 * MIB) as pool:
            assert pool.describe()["hugepages"] == "hugetlb-2MiB"
        monkeypatch.setenv("KVPOOL_HUGEPAGES", "never")
        with kvpool.HostMemoryAllocator(2 * MIB) as pool:
            assert pool.describe()["hugepages"] == "none"


def test_bad_hugepage_policy_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPOOL_HUGEPAGES", "always")
    with pytest.raises(kvpool.InvalidArgumentError, match="KVPOOL_HUGEPAGES"):
        kvpool.HostMemoryAllocator(MIB)


# -- shared memory (in one process; across processes in test_pool_shm.py) ------------


def test_shared_memory_pool_describes_its_name(shm_name: str) -> None:
    with kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name) as pool:
        info = pool.describe()
        assert info["kind"] == "shm"
        assert info["shm_name"] == shm_name
        assert info["hugepages"] == "none"
        assert pool.shm_name == shm_name
    with pytest.raises(kvpool.SharedMemoryNotFoundError):
        kvpool.attach_pool(shm_name)  # the creator's close() unlinked it


def test_shared_memory_name_in_use_is_refused(shm_name: str) -> None:
    with (
        kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name),
        pytest.raises(kvpool.SharedMemoryExistsError),
    ):
        kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name)


def test_shared_memory_name_from_the_config(shm_name: str) -> None:
    class Config:
        def get_extra_config_value(self, key: str, default: object) -> object:
            return shm_name if key == "shm_name" else default

    with kvpool.MixedMemoryAllocator(MIB, config=Config()) as pool:
        assert pool.describe()["shm_name"] == shm_name


# -- _allocate_cpu_memory / _free_cpu_memory / _read_hugepage_info --------------------


def test_allocate_and_free_cpu_memory(mappings: int, no_auto_hugepages: None) -> None:
    tensor = kvpool._allocate_cpu_memory(MIB)
    assert tensor.dtype == torch.uint8 and tensor.numel() == MIB
    assert tensor.device.type == "cpu"
    tensor[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    assert count_mappings() == mappings + 1
    kvpool._free_cpu_memory(tensor, MIB)
    # The tensor stays valid until it is dropped.
    assert tensor[:4].tolist() == [1, 2, 3, 4]
    tensor[0] = 9
    assert count_mappings() == mappings + 1
    del tensor
    assert count_mappings() == mappings


def test_free_cpu_memory_twice_is_a_typed_error(mappings: int) -> None:
    tensor = kvpool._allocate_cpu_memory(MIB)
    kvpool._free_cpu_memory(tensor)
    with pytest.raises(kvpool.InvalidHandleError) as info:
        kvpool._free_cpu_memory(tensor)
    assert isinstance(info.value, ValueError)
    assert "already" in str(info.value)
    assert tensor.sum().item() == 0
    del tensor, info  # the traceback's frames hold the tensor too
    assert count_mappings() == mappings


def test_free_cpu_memory_of_a_foreign_tensor_is_a_typed_error() -> None:
    with pytest.raises(kvpool.InvalidHandleError):
        kvpool._free_cpu_memory(torch.zeros(16, dtype=torch.uint8))
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool._free_cpu_memory(bytearray(16))


def test_allocate_cpu_memory_of_zero_bytes_is_an_empty_tensor(mappings: int) -> None:
    tensor = kvpool._allocate_cpu_memory(0)
    assert tensor.numel() == 0 and tensor.dtype == torch.uint8
    kvpool._free_cpu_memory(tensor)  # as in the reference: nothing to free
    assert count_mappings() == mappings


def test_allocate_cpu_memory_numa_and_shm(shm_name: str, mappings: int) -> None:
    tensor = kvpool._allocate_cpu_memory(MIB, numa_mapping=kvpool.NUMAMapping({0: 0}))
    kvpool._free_cpu_memory(tensor, MIB, kvpool.NUMAMapping({0: 0}))
    shared = kvpool._allocate_cpu_memory(MIB, shm_name=shm_name)
    shared[:3] = torch.tensor([7, 8, 9], dtype=torch.uint8)
    peer = kvpool.attach_pool(shm_name)
    assert bytes(peer.view[:3]) == b"\x07\x08\x09"
    peer.close()
    kvpool._free_cpu_memory(shared, MIB, shm_name=shm_name)
    with pytest.raises(kvpool.SharedMemoryNotFoundError):
        kvpool.attach_pool(shm_name)
    del tensor, shared, peer
    assert count_mappings() == mappings


@pytest.mark.hugepages
def test_allocate_cpu_memory_on_hugepages(hugepages_reserved: int, mappings: int) -> None:
    tensor = kvpool._allocate_cpu_memory(3 * MIB, use_hugepages=True)
    assert kvpool._read_hugepage_info()[1] == hugepages_reserved - 2
    kvpool._free_cpu_memory(tensor, 3 * MIB, use_hugepages=True)
    del tensor
    assert count_mappings() == mappings
    assert kvpool._read_hugepage_info()[1] == hugepages_reserved


def test_allocate_cpu_memory_hugepages_short_or_with_shm(shm_name: str) -> None:
    info = kvpool._read_hugepage_info()
    if info is not None:
        with pytest.raises(kvpool.HugePagesExhaustedError, match="nr_hugepages"):
            kvpool._allocate_cpu_memory((info[1] + 2) * 2 * MIB, use_hugepages=True)
    with pytest.raises(kvpool.InvalidArgumentError, match="shared memory"):
        kvpool._allocate_cpu_memory(MIB, shm_name=shm_name, use_hugepages=True)


def test_read_hugepage_info_matches_sysfs() -> None:
    base = "/sys/kernel/mm/hugepages/hugepages-2048kB"
    info = kvpool._read_hugepage_info()
    if not os.path.isdir(base):
        assert info is None
        return
    with open(f"{base}/nr_hugepages") as f:
        total = int(f.read())
    assert info is not None
    assert info[0] == total
    assert 0 <= info[1] <= info[0]
    assert info[2] == 2


def test_read_hugepage_info_from_a_fake_sysfs(tmp_path) -> None:
    (tmp_path / "nr_hugepages").write_text("12\n")
    (tmp_path / "free_hugepages").write_text("5\n")
    assert system.read_hugepage_info(tmp_path) == (12, 5, 2)
    (tmp_path / "free_hugepages").write_text("garbage\n")
    assert system.read_hugepage_info(tmp_path) is None
    assert system.read_hugepage_info(tmp_path / "missing") is None
