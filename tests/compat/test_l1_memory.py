"""LMCache's multiprocess-mode L1 memory on kvpool: its managers, kvpool's pools.

LMCache's ``L1MemoryManager`` builds the allocator itself (a
``MixedMemoryAllocator``, over a shared-memory segment it names
``lmcache_l1_pool_<pid>``, or a ``LazyMemoryAllocator``), so these tests
check that what it gets is kvpool's, that the bytes written through its
objects are where its descriptors say, and that LMCache's ``L1Manager`` state
machine (which tags objects with ``set_l1_manager``) runs to the end with
every byte accounted for.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kvpool
from kvpool import MemoryFormat

LAYOUT_SHAPE = torch.Size([2, 2, 16, 128])  # 16 KiB of float16
LAYOUT_BYTES = LAYOUT_SHAPE.numel() * 2
MIB = 1 << 20


def layout():
    from lmcache.v1.distributed.api import MemoryLayoutDesc

    return MemoryLayoutDesc([LAYOUT_SHAPE], [torch.float16])


def memory_config(**overrides):
    from lmcache.v1.distributed.config import L1MemoryManagerConfig

    values = {"size_in_bytes": 8 * MIB, "use_lazy": False, "shm_name": ""}
    values.update(overrides)
    return L1MemoryManagerConfig(**values)


def fill(objs) -> list[bytes]:
    out = []
    for i, obj in enumerate(objs):
        obj.tensor.copy_(torch.full(LAYOUT_SHAPE, float(i + 1), dtype=torch.float16))
        out.append(bytes(obj.byte_array))
    return out


def test_mixed_allocator_from_lmcaches_l1_memory_manager() -> None:
    from lmcache.v1.distributed.error import L1Error
    from lmcache.v1.distributed.memory_manager import L1MemoryManager

    manager = L1MemoryManager(memory_config())
    try:
        allocator = manager._allocator
        assert type(allocator) is kvpool.MixedMemoryAllocator
        err, objs = manager.allocate(layout(), 8)
        assert err == L1Error.SUCCESS and len(objs) == 8
        assert all(type(o) is kvpool.TensorMemoryObj and o.parent() is allocator for o in objs)
        fill(objs)
        used, total = manager.get_memory_usage()
        assert (used, total) == (8 * LAYOUT_BYTES, 8 * MIB)
        desc = manager.get_l1_memory_desc()
        assert desc.ptr == allocator.buffer.data_ptr() and desc.size == 8 * MIB
        for obj in objs:  # the bytes are where the descriptor says
            assert desc.ptr <= obj.data_ptr < desc.ptr + desc.size
        too_many = 8 * MIB // LAYOUT_BYTES
        assert manager.allocate(layout(), too_many)[0] == L1Error.OUT_OF_MEMORY
        assert manager.free(objs) == L1Error.SUCCESS
        assert manager.get_memory_usage() == (0, 8 * MIB)
        assert manager.memcheck()
    finally:
        manager.close()
    assert allocator.closed


def test_shared_memory_pool_named_by_lmcache_is_readable_from_another_process() -> None:
    from lmcache.v1.distributed.memory_manager import L1MemoryManager

    config = memory_config(shm_name=f"lmcache_l1_pool_kvpool_{os.getpid()}")
    manager = L1MemoryManager(config)
    name = manager._allocator.shm_name
    assert name == config.shm_name and not name.startswith("/")
    try:
        assert os.path.exists(f"/dev/shm/{name}")
        _, objs = manager.allocate(layout(), 3)
        expected = fill(objs)
        # LMCache's readers attach with Python's shared_memory by the bare name.
        child = textwrap.dedent(
            f"""
            from multiprocessing import shared_memory
            shm = shared_memory.SharedMemory(name={name!r}, create=False)
            for off, n in {[(o.shm_offset, o.shm_byte_length) for o in objs]!r}:
                print(bytes(shm.buf[off:off + n]).hex())
            shm.close()
            """
        )
        proc = subprocess.run(
            [sys.executable, "-c", child], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        assert [bytes.fromhex(line) for line in proc.stdout.split()] == expected
        manager.free(objs)
    finally:
        manager.close()
    assert not os.path.exists(f"/dev/shm/{name}")  # the creator's close unlinks it


def test_lazy_allocator_from_lmcaches_l1_memory_manager(deadline) -> None:
    from lmcache.v1.distributed.error import L1Error
    from lmcache.v1.distributed.memory_manager import L1MemoryManager

    config = memory_config(use_lazy=True, init_size_in_bytes=2 * MIB)
    # LMCache's config turns use_lazy off where the device cannot pin (its
    # own lazy allocator needs pinning); kvpool's works there, so turn it on.
    config.use_lazy = True
    manager = L1MemoryManager(config)
    try:
        allocator = manager._allocator
        assert type(allocator) is kvpool.LazyMemoryAllocator  # works without a GPU
        err, objs = manager.allocate(layout(), 4)
        assert err == L1Error.SUCCESS
        assert {o.get_memory_format() for o in objs} == {MemoryFormat.UNDEFINED}
        assert all(isinstance(o.parent(), kvpool.LazyMemoryAllocator) for o in objs)
        fill(objs)
        desc = manager.get_l1_memory_desc()
        assert desc.ptr == allocator.get_underlying_buffer().data_ptr()
        assert 2 * MIB <= desc.stable_registration_size <= 8 * MIB
        deadline(lambda: manager.get_memory_usage()[1] == 8 * MIB, "the lazy pool to grow")
        err, more = manager.allocate(layout(), 8 * MIB // LAYOUT_BYTES - 4)
        assert err == L1Error.SUCCESS  # all of it is usable once grown
        assert manager.get_memory_usage() == (8 * MIB, 8 * MIB)
        manager.free(objs + more)
        assert manager.get_memory_usage() == (0, 8 * MIB)
        assert manager.memcheck()
    finally:
        manager.close()


def keys(n: int, model: str = "kvpool-compat"):
    from lmcache.v1.distributed.api import ObjectKey

    return [
        ObjectKey(chunk_hash=i.to_bytes(8, "little"), model_name=model, kv_rank=0) for i in range(n)
    ]


def test_lmcaches_l1_manager_state_machine_runs_on_kvpool_objects() -> None:
    from lmcache.v1.distributed.config import L1ManagerConfig
    from lmcache.v1.distributed.error import L1Error
    from lmcache.v1.distributed.l1_manager import L1Manager

    manager = L1Manager(L1ManagerConfig(memory_config=memory_config()))
    try:
        ks = keys(4)
        reserved = manager.reserve_write(ks, [False] * 4, layout(), tag="writer")
        assert {err for err, _ in reserved.values()} == {L1Error.SUCCESS}
        objs = [reserved[k][1] for k in ks]
        assert all(o.get_l1_manager() == manager.l1_manager_id for o in objs)
        expected = fill(objs)
        assert set(manager.finish_write(ks, tag="writer").values()) == {L1Error.SUCCESS}
        read = manager.reserve_read(ks)
        assert [bytes(read[k][1].byte_array) for k in ks] == expected
        assert set(manager.finish_read(ks).values()) == {L1Error.SUCCESS}
        assert manager.get_memory_usage()[0] == 4 * LAYOUT_BYTES
        assert set(manager.delete(ks).values()) == {L1Error.SUCCESS}
        assert manager.get_memory_usage()[0] == 0
        assert manager.memcheck()
    finally:
        manager.close()


def test_an_object_of_one_l1_manager_cannot_join_another() -> None:
    with kvpool.MixedMemoryAllocator(MIB) as pool:
        obj = pool.allocate(LAYOUT_SHAPE, torch.float16)
        obj.set_l1_manager(1)
        obj.set_l1_manager(1)  # the same owner again is fine
        with pytest.raises(ValueError, match="belongs to L1 manager 1"):
            obj.set_l1_manager(2)
        obj.reset_l1_manager()
        obj.set_l1_manager(2)
        assert obj.get_l1_manager() == 2
        obj.ref_count_down()


def poll(deadline, query, what: str):
    """Call ``query`` until it returns something other than None (with a deadline)."""
    seen: list = []
    deadline(lambda: seen.append(query()) or seen[-1] is not None, f"the L2 {what}")
    return seen[-1]


def test_lmcaches_fs_l2_adapter_stores_and_loads_kvpool_objects(tmp_path, deadline) -> None:
    from lmcache.v1.distributed.l2_adapters import create_l2_adapter
    from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import FSL2AdapterConfig
    from lmcache.v1.distributed.memory_manager import L1MemoryManager

    manager = L1MemoryManager(memory_config())
    adapter = create_l2_adapter(FSL2AdapterConfig(str(tmp_path)), manager.get_l1_memory_desc())
    try:
        ks = keys(3)
        _, objs = manager.allocate(layout(), 3)
        expected = fill(objs)
        task = adapter.submit_store_task(ks, objs)
        done: dict = {}
        deadline(lambda: done.update(adapter.pop_completed_store_tasks()) or task in done, "store")
        assert done[task].is_successful()
        manager.free(objs)
        lookup = adapter.submit_lookup_and_lock_task(ks, {0: layout()})
        found = poll(deadline, lambda: adapter.query_lookup_and_lock_result(lookup), "lookup")
        assert found.popcount() == 3
        _, dest = manager.allocate(layout(), 3)
        load = adapter.submit_load_task(ks, dest)
        loaded = poll(deadline, lambda: adapter.query_load_result(load), "load")
        assert loaded.popcount() == 3
        assert [bytes(o.byte_array) for o in dest] == expected
        adapter.submit_unlock(ks)
        manager.free(dest)
        assert manager.get_memory_usage()[0] == 0
    finally:
        adapter.close()
        manager.close()


def devdax_file(tmp_path, size: int) -> str:
    path = tmp_path / "dax0.0"
    with open(path, "wb") as f:
        f.truncate(size)
    return str(path)


def test_lmcaches_devdax_l1_memory_manager_spills_to_a_file_standing_in_for_dax(tmp_path) -> None:
    from lmcache.v1.distributed.api import L1BackendType
    from lmcache.v1.distributed.error import L1Error
    from lmcache.v1.distributed.memory_manager import DevDaxL1MemoryManager
    from lmcache.v1.memory_allocators.devdax_memory_allocator import (
        DevDaxArenaState,
        DevDaxMemoryAllocator,
    )

    dax = devdax_file(tmp_path, 4 * MIB)
    config = memory_config(size_in_bytes=MIB, devdax_path=dax, devdax_size_in_bytes=4 * MIB)
    manager = DevDaxL1MemoryManager(config)
    try:
        assert type(manager._allocator) is DevDaxMemoryAllocator is kvpool.DevDaxMemoryAllocator
        count = MIB // LAYOUT_BYTES + 8  # more than the DRAM part holds
        err, objs = manager.allocate(layout(), count)
        assert err == L1Error.SUCCESS
        kinds = [manager.get_backend_type(o) for o in objs]
        assert kinds.count(L1BackendType.DRAM) == MIB // LAYOUT_BYTES
        assert kinds.count(L1BackendType.DEVDAX) == 8
        expected = fill(objs)
        on_dax = [o for o, k in zip(objs, kinds, strict=True) if k == L1BackendType.DEVDAX]
        with open(dax, "rb") as f:  # the DAX bytes are in the device (file), as mapped
            for obj in on_dax:
                f.seek(obj.shm_offset)
                assert f.read(LAYOUT_BYTES) == expected[objs.index(obj)]
        second = tmp_path / "dax1.0"
        second.write_bytes(b"")
        os.truncate(second, 2 * MIB)
        status = manager.add_device(str(second), 2 * MIB)
        assert status.state == DevDaxArenaState.ACTIVE and manager.memory_region_count() == 3
        assert manager.remove_device(str(second)).state == DevDaxArenaState.REMOVED
        manager.free(objs)
        assert manager.get_memory_usage() == (0, 5 * MIB)
        assert manager.memcheck()
    finally:
        manager.close()
