"""DevDaxBacking and DevDaxMemoryAllocator: arenas over Device-DAX devices, files or memfds.

A regular file or a memfd stands in for ``/dev/daxX.Y`` (both map with
``MAP_SHARED`` as a DAX device does, and both show what was written through
the pool in the file itself).  A real device is used where the machine has
one; CUDA registration is checked on a GPU machine.
"""

from __future__ import annotations

import glob
import inspect
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from pool_helpers import KV_BYTES, KV_DTYPE, KV_SHAPE, MIB, pattern

import kvpool
from kvpool import DevDaxArenaState, DevDaxMemoryAllocator, DevDaxRemoveMode
from kvpool.pool.devdax import DevDaxBacking, device_identity


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def dax(tmp_path: Path):
    """Make files standing in for DAX devices: ``dax(size) -> path``."""
    made = []

    def make(size: int, name: str | None = None) -> str:
        path = tmp_path / (name or f"dax{len(made)}.0")
        with open(path, "wb") as f:
            f.truncate(size)
        made.append(path)
        return str(path)

    return make


@pytest.fixture
def memfd() -> Iterator[str]:
    """A 4 MiB memfd, as ``/proc/self/fd/N``."""
    fd = os.memfd_create("kvpool-dax")
    os.ftruncate(fd, 4 * MIB)
    yield f"/proc/self/fd/{fd}"
    os.close(fd)


def kv(alloc):
    obj = alloc.allocate(KV_SHAPE, KV_DTYPE)
    assert obj is not None
    return obj


def test_backing_maps_a_file_and_writes_land_in_it(dax) -> None:
    path = dax(MIB)
    fds = open_fds()
    backing = DevDaxBacking(path, MIB)
    assert backing.describe() == {
        "kind": "devdax",
        "size": MIB,
        "device_path": path,
        "pinned": "none" if not torch.cuda.is_available() else backing.pinned,
    }
    backing.tensor[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    with open(path, "rb") as f:
        assert f.read(4) == b"\x01\x02\x03\x04"
    assert backing.identity == device_identity(path)
    backing.close()
    backing.close()
    assert backing.closed and open_fds() == fds


def test_backing_checks_the_capacity_before_mapping(dax) -> None:
    path = dax(MIB)
    with pytest.raises(kvpool.InvalidArgumentError, match=f"holds {MIB} bytes"):
        DevDaxBacking(path, 2 * MIB)  # a touch beyond the file's end would SIGBUS
    for size in (0, -1, 1.5, True):
        with pytest.raises(kvpool.InvalidArgumentError):
            DevDaxBacking(path, size)  # type: ignore[arg-type]
    with pytest.raises(kvpool.InvalidArgumentError, match="non-empty path"):
        DevDaxBacking("", MIB)
    with pytest.raises(FileNotFoundError):
        DevDaxBacking(path + ".missing", MIB)
    with pytest.raises(OSError):
        DevDaxBacking(str(Path(path).parent), MIB)  # a directory


def test_views_keep_the_mapping_after_close(memfd: str) -> None:
    with DevDaxMemoryAllocator(4 * MIB, memfd) as alloc:
        obj = kv(alloc)
        obj.byte_array[:] = pattern(KV_BYTES, 7)
        view = obj.byte_array
        live = kv(alloc)
    # Closed with objects alive: they are dead, the view still reads the bytes.
    assert not live.is_valid()
    assert bytes(view) == pattern(KV_BYTES, 7)


def test_arena_objects_belong_to_the_allocator(memfd: str) -> None:
    with DevDaxMemoryAllocator(4 * MIB, memfd) as alloc:
        obj = kv(alloc)
        assert obj.parent() is alloc and alloc.is_devdax_obj(obj)
        assert alloc.buffer.data_ptr() <= obj.data_ptr < alloc.buffer.data_ptr() + 4 * MIB
        assert alloc.address_manager is alloc.devdax_allocator.address_manager
        obj.byte_array[:] = pattern(KV_BYTES, 1)
        fd = int(memfd.rsplit("/", 1)[1])
        assert os.pread(fd, KV_BYTES, obj.shm_offset) == pattern(KV_BYTES, 1)
        assert alloc.get_memory_usage() == (4096 * ((KV_BYTES + 4095) // 4096), 4 * MIB)
        obj.ref_count_down()
        assert alloc.get_memory_usage() == (0, 4 * MIB)
        assert alloc.memcheck()
        buf = alloc.allocate(
            torch.Size([10, 0, 0, 0]), torch.uint8, kvpool.MemoryFormat.BINARY_BUFFER
        )
        assert isinstance(buf, kvpool.BytesBufferMemoryObj)


def test_dram_first_then_arenas_all_or_nothing(dax) -> None:
    with DevDaxMemoryAllocator(MIB, dax(MIB), local_size=MIB) as alloc:
        per = MIB // 4096  # KV chunks of 2 KiB take one 4 KiB unit each
        objs = alloc.batched_allocate(KV_SHAPE, KV_DTYPE, per + 3)
        assert objs is not None
        local = [o for o in objs if not alloc.is_devdax_obj(o)]
        assert len(local) == per and all(o.parent() is alloc.local_allocator for o in local)
        assert alloc.memory_region_count() == 2
        assert alloc.batched_allocate(KV_SHAPE, KV_DTYPE, 2 * per) is None  # too many
        assert alloc.get_memory_usage() == ((per + 3) * 4096, 2 * MIB)  # nothing was kept
        alloc.batched_free(objs)
        assert alloc.get_memory_usage() == (0, 2 * MIB)
        assert alloc.memcheck()


def test_add_and_drain_devices(dax) -> None:
    primary, extra = dax(MIB), dax(MIB)
    with DevDaxMemoryAllocator(MIB, primary) as alloc:
        with pytest.raises(kvpool.InvalidArgumentError, match="primary"):
            alloc.remove_device(primary)
        status = alloc.add_device(extra, MIB)
        assert status.state is DevDaxArenaState.ACTIVE and not status.is_primary
        assert alloc.owns_device(extra) and alloc.owns_device(primary)
        with pytest.raises(kvpool.InvalidArgumentError, match="already mapped"):
            alloc.add_device(extra, MIB)
        link = Path(extra).with_suffix(".link")
        link.symlink_to(extra)
        with pytest.raises(kvpool.InvalidArgumentError, match="already mapped"):
            alloc.add_device(str(link), MIB)  # the same device under another name
        filler = alloc.batched_allocate(KV_SHAPE, KV_DTYPE, MIB // 4096)  # fills the primary
        spill = kv(alloc)
        assert alloc.arena_status(extra).active_allocations == 1
        draining = alloc.remove_device(extra)
        assert draining.state is DevDaxArenaState.DRAINING
        assert alloc.allocate(KV_SHAPE, KV_DTYPE) is None  # a draining arena takes nothing new
        spill.ref_count_down()
        assert [s.device_path for s in alloc.arena_statuses()] == [primary]  # reaped
        with pytest.raises(kvpool.DevDaxNotMappedError) as info:
            alloc.arena_status(extra)
        assert isinstance(info.value, ValueError)
        assert not alloc.owns_device(extra)
        alloc.batched_free(filler)
        assert inspect.signature(alloc.remove_device).parameters["mode"].default is (
            DevDaxRemoveMode.DRAIN
        )
        with pytest.raises(kvpool.InvalidArgumentError, match="remove mode"):
            alloc.remove_device(primary, "migrate")  # type: ignore[arg-type]
    with pytest.raises(kvpool.PoolClosedError):
        alloc.add_device(extra, MIB)


def test_bad_constructor_arguments(dax) -> None:
    path = dax(MIB)
    for kwargs in (
        {"size": 0, "device_path": path},
        {"size": MIB, "device_path": ""},
        {"size": MIB, "device_path": path, "local_size": -1},
        {"size": MIB, "device_path": path, "align_bytes": 3},
    ):
        with pytest.raises(kvpool.InvalidArgumentError):
            DevDaxMemoryAllocator(**kwargs)  # type: ignore[arg-type]
    with (
        kvpool.MixedMemoryAllocator(MIB) as local,
        pytest.raises(kvpool.InvalidArgumentError, match="not both"),
    ):
        DevDaxMemoryAllocator(MIB, path, local_allocator=local, local_size=MIB)


def test_objects_of_another_allocator_are_refused(memfd: str) -> None:
    with DevDaxMemoryAllocator(MIB, memfd) as alloc, kvpool.MixedMemoryAllocator(MIB) as other:
        foreign = kv(other)
        with pytest.raises(kvpool.InvalidArgumentError, match="does not belong"):
            alloc.free(foreign)
        with pytest.raises(kvpool.InvalidArgumentError, match="does not belong"):
            alloc.batched_free([foreign])
        assert foreign.is_valid()
        foreign.ref_count_down()


_DAX_DEVICES = sorted(glob.glob("/dev/dax*.*"))


@pytest.mark.skipif(not _DAX_DEVICES, reason="no Device-DAX device (/dev/daxX.Y) on this machine")
def test_a_real_device_dax() -> None:
    with DevDaxMemoryAllocator(2 * MIB, _DAX_DEVICES[0]) as alloc:
        obj = kv(alloc)
        obj.byte_array[:] = pattern(KV_BYTES, 3)
        assert bytes(obj.byte_array) == pattern(KV_BYTES, 3)
        obj.ref_count_down()


def _copies_through_the_gpu(backing: DevDaxBacking) -> None:
    host = backing.tensor[:MIB]
    host.fill_(5)
    device = host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert int(device.sum().item()) == 5 * MIB
    host.zero_()
    host.copy_(device, non_blocking=True)
    torch.cuda.synchronize()
    assert int(host.sum().item()) == 5 * MIB


@pytest.mark.gpu
def test_shared_memory_registers_with_cuda(cuda_device, memfd: str) -> None:
    # A memfd is shmem: the kernel lets the driver pin it long-term.
    backing = DevDaxBacking(memfd, 4 * MIB, pin="cuda-register", register_chunk=2 * MIB)
    try:
        assert backing.pinned == "cuda-register"
        assert backing.registrations() == [(0, 2 * MIB), (2 * MIB, 2 * MIB)]
        _copies_through_the_gpu(backing)
    finally:
        backing.close()
    assert cuda_device.peek() == 0


@pytest.mark.gpu
def test_a_file_on_disk_registers_or_is_refused_cleanly(cuda_device, dax, caplog) -> None:
    # A shared mapping of a file on ext4/xfs: since Linux 6.5 the kernel
    # refuses the driver's long-term writable pin (tmpfs files register).
    # Either way the arena works, and no CUDA error is left behind.
    path = dax(2 * MIB)
    with caplog.at_level("WARNING", logger="kvpool"):
        backing = DevDaxBacking(path, 2 * MIB)
    try:
        refusals = [r for r in caplog.records if "refused to register" in r.getMessage()]
        if backing.pinned == "cuda-register":
            assert refusals == []
        else:
            assert backing.pinned == "none" and len(refusals) == 1
            assert "cudaError" in refusals[0].getMessage()
            assert "???" not in refusals[0].getMessage()
        assert cuda_device.peek() == 0
        _copies_through_the_gpu(backing)  # pageable when not registered
        pinned = backing.pinned
    finally:
        backing.close()
    try:
        strict = DevDaxBacking(path, 2 * MIB, pin="cuda-register")
    except (kvpool.NativeError, kvpool.OutOfMemoryError) as exc:
        assert pinned == "none" and "cudaError" in str(exc)
    else:
        assert strict.pinned == "cuda-register"
        strict.close()
    assert cuda_device.peek() == 0
    assert (torch.ones(8, device="cuda") + 1).sum().item() == 16  # torch is not poisoned
