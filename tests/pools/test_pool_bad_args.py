"""Every bad argument is a typed error (also the builtin an ordinary except expects).

A refused construction leaves no native mapping and no shared-memory name.
"""

from __future__ import annotations

import pytest
import torch
from pool_helpers import KV_BYTES, KV_DTYPE, KV_FMT, KV_SHAPE, MIB, count_mappings, paged_kwargs

import kvpool

POOL_CLASSES = {
    "host": kvpool.HostMemoryAllocator,
    "pin": kvpool.PinMemoryAllocator,
    "mixed": kvpool.MixedMemoryAllocator,
    "gpu": kvpool.GPUMemoryAllocator,
}
BAD_SIZES = [0, -1, -MIB, 1.5, float(MIB), "1048576", None, True, [MIB]]
BAD_ALIGNS = [3, 0, -4096, 6000, 4096.0, "4096", True]


@pytest.fixture(params=sorted(POOL_CLASSES))
def cls(request: pytest.FixtureRequest):
    return POOL_CLASSES[request.param]


@pytest.mark.parametrize("size", BAD_SIZES, ids=repr)
def test_bad_size(cls, size: object, mappings: int) -> None:
    with pytest.raises(kvpool.InvalidArgumentError) as info:
        cls(size)
    assert isinstance(info.value, ValueError)
    assert repr(size) in str(info.value)
    del info
    assert count_mappings() == mappings


@pytest.mark.parametrize("align", BAD_ALIGNS, ids=repr)
def test_align_bytes_not_a_power_of_two(cls, align: object, mappings: int) -> None:
    with pytest.raises(kvpool.InvalidArgumentError) as info:
        cls(MIB, align_bytes=align)
    assert isinstance(info.value, ValueError)
    assert "power of two" in str(info.value)
    del info
    assert count_mappings() == mappings


def test_good_align_bytes_is_used(cls) -> None:
    with cls(MIB, align_bytes=512) as pool:
        obj = pool.allocate(torch.Size([100]), torch.uint8, KV_FMT)
        assert obj.get_physical_size() == 512
        assert pool.allocate(torch.Size([100]), torch.uint8, KV_FMT).shm_offset == 512


@pytest.mark.parametrize("missing", ["shapes", "dtypes", "fmt", "shapes+dtypes+fmt"])
def test_use_paging_without_its_layout(cls, missing: str, mappings: int) -> None:
    kwargs = {k: v for k, v in paged_kwargs().items() if k not in missing.split("+")}
    with pytest.raises(kvpool.InvalidArgumentError) as info:
        cls(MIB, use_paging=True, **kwargs)
    assert isinstance(info.value, ValueError)
    for name in missing.split("+"):
        assert name in str(info.value)
    del info
    assert count_mappings() == mappings


def test_paged_buffer_not_a_multiple_of_the_page_size(cls, mappings: int) -> None:
    size = MIB + KV_BYTES // 2
    with pytest.raises(kvpool.InvalidArgumentError) as info:
        cls(size, use_paging=True, **paged_kwargs())
    message = str(info.value)
    assert str(size) in message and str(KV_BYTES) in message
    # the message offers the two nearest sizes that work
    assert str(MIB) in message and str(MIB + KV_BYTES) in message
    del info
    assert count_mappings() == mappings


def test_paged_layout_of_zero_bytes(cls) -> None:
    with pytest.raises(kvpool.InvalidArgumentError):
        cls(MIB, use_paging=True, shapes=[torch.Size([0, 4])], dtypes=[KV_DTYPE], fmt=KV_FMT)


@pytest.mark.parametrize(
    "name",
    ["a/b", "/a/b", "/", "", "/" + "x" * 256, "//x"],
    ids=[
        "no-leading-inner-slash",
        "inner-slash",
        "bare-slash",
        "empty",
        "too-long",
        "double-slash",
    ],
)
def test_bad_shm_names(name: str, mappings: int) -> None:
    with pytest.raises(kvpool.InvalidArgumentError) as info:
        kvpool.MixedMemoryAllocator(MIB, shm_name=name)
    assert isinstance(info.value, ValueError)
    assert "name" in str(info.value)
    del info
    assert count_mappings() == mappings


@pytest.mark.parametrize("name", [5, b"/kvpool-bytes", ["/x"]], ids=["int", "bytes", "list"])
def test_shm_name_of_the_wrong_type(name: object) -> None:
    with pytest.raises(kvpool.InvalidArgumentError, match="shm_name"):
        kvpool.MixedMemoryAllocator(MIB, shm_name=name)


def test_attach_pool_bad_arguments(shm_name: str) -> None:
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool.attach_pool("no/inner-slash")
    with kvpool.MixedMemoryAllocator(MIB, shm_name=shm_name):
        for size in (0, -1, 1.5, True):
            with pytest.raises(kvpool.InvalidArgumentError):
                kvpool.attach_pool(shm_name, size)
        with pytest.raises(kvpool.InvalidArgumentError):
            kvpool.attach_pool(shm_name, 64 * MIB)  # larger than the segment


@pytest.mark.parametrize("size", [-1, -MIB, 1.5, 0.0, False, "0", "1048576", None, True])
def test_allocate_cpu_memory_bad_size(size: object, mappings: int) -> None:
    with pytest.raises(kvpool.InvalidArgumentError) as info:
        kvpool._allocate_cpu_memory(size)
    assert isinstance(info.value, ValueError)
    del info
    assert count_mappings() == mappings


# -- allocation arguments -------------------------------------------------------


@pytest.fixture(params=["extent", "paged"])
def pool(request: pytest.FixtureRequest):
    kwargs = paged_kwargs() if request.param == "paged" else {}
    p = kvpool.MixedMemoryAllocator(MIB, use_paging=request.param == "paged", **kwargs)
    yield p
    p.close()


@pytest.mark.parametrize(
    ("shapes", "dtypes"),
    [
        (torch.Size([0, 4]), KV_DTYPE),
        (torch.Size([-1]), KV_DTYPE),
        ([], KV_DTYPE),
        (KV_SHAPE, "float16"),
        (KV_SHAPE, []),
        ([KV_SHAPE, KV_SHAPE], [KV_DTYPE]),
        ("2,4,16,8", KV_DTYPE),
    ],
    ids=["zero-dim", "negative-dim", "no-shapes", "dtype-str", "no-dtypes", "mismatch", "str"],
)
def test_bad_layouts(pool, shapes: object, dtypes: object) -> None:
    with pytest.raises(kvpool.InvalidArgumentError):
        pool.allocate(shapes, dtypes, KV_FMT)
    with pytest.raises(kvpool.InvalidArgumentError):
        pool.batched_allocate(shapes, dtypes, 2, KV_FMT)
    assert pool.num_active_allocations == 0


@pytest.mark.parametrize("batch", [-1, 1.0, "2", None, True])
def test_bad_batch_size(pool, batch: object) -> None:
    with pytest.raises(kvpool.InvalidArgumentError):
        pool.batched_allocate(KV_SHAPE, KV_DTYPE, batch, KV_FMT)
    assert pool.num_active_allocations == 0


def test_batch_of_zero_is_empty(pool) -> None:
    assert pool.batched_allocate(KV_SHAPE, KV_DTYPE, 0, KV_FMT) == []


def test_layout_larger_than_a_page() -> None:
    pool = kvpool.MixedMemoryAllocator(MIB, use_paging=True, **paged_kwargs())
    with pool, pytest.raises(kvpool.InvalidArgumentError, match="page"):
        pool.allocate(torch.Size([2, 4, 17, 8]), KV_DTYPE, KV_FMT)


# -- PagedCpuGpuMemoryAllocator's allocator_type ----------------------------------------


@pytest.fixture
def cpu_gpu():
    alloc = kvpool.PagedCpuGpuMemoryAllocator()
    alloc.init_cpu_memory_allocator(MIB, [KV_SHAPE], [KV_DTYPE], KV_FMT)
    alloc.init_gpu_memory_allocator(MIB, [KV_SHAPE], [KV_DTYPE], KV_FMT)
    yield alloc
    alloc.close()


@pytest.mark.parametrize("kind", ["xpu", "CPU", "", None, 0])
def test_allocator_type_must_be_cpu_or_gpu(cpu_gpu, kind: object) -> None:
    obj = cpu_gpu.allocate(KV_SHAPE, KV_DTYPE, KV_FMT, allocator_type="cpu")
    for call in (
        lambda: cpu_gpu.allocate(KV_SHAPE, KV_DTYPE, KV_FMT, allocator_type=kind),
        lambda: cpu_gpu.batched_allocate(KV_SHAPE, KV_DTYPE, 2, KV_FMT, allocator_type=kind),
    ):
        with pytest.raises(kvpool.InvalidArgumentError) as info:
            call()
        assert isinstance(info.value, ValueError)
        assert "'cpu' or 'gpu'" in str(info.value)
    if kind is not None:  # batched_free and free take None as "the object's own pool"
        with pytest.raises(kvpool.InvalidArgumentError):
            cpu_gpu.free(obj, allocator_type=kind)
        with pytest.raises(kvpool.InvalidArgumentError):
            cpu_gpu.batched_free([obj], allocator_type=kind)
    assert obj.is_valid()
    assert cpu_gpu.cpu_pool.num_active_allocations == 1


def test_pool_not_set_up() -> None:
    alloc = kvpool.PagedCpuGpuMemoryAllocator()
    with pytest.raises(kvpool.InvalidArgumentError, match="init_cpu_memory_allocator"):
        alloc.allocate(KV_SHAPE, KV_DTYPE, KV_FMT, allocator_type="cpu")
    with pytest.raises(kvpool.InvalidArgumentError, match="init_gpu_memory_allocator"):
        alloc.batched_allocate(KV_SHAPE, KV_DTYPE, 2, KV_FMT)
    alloc.close()


@pytest.mark.parametrize("size", [0, -1, 1.5])
def test_paged_cpu_gpu_bad_sizes(size: object) -> None:
    alloc = kvpool.PagedCpuGpuMemoryAllocator()
    with pytest.raises(kvpool.InvalidArgumentError):
        alloc.init_cpu_memory_allocator(size, [KV_SHAPE], [KV_DTYPE], KV_FMT)
    with pytest.raises(kvpool.InvalidArgumentError):
        alloc.init_gpu_memory_allocator(size, [KV_SHAPE], [KV_DTYPE], KV_FMT)


# -- objects freed into the wrong pool -------------------------------------------------


def two_pools(kinds: str) -> tuple[kvpool.MemoryPool, kvpool.MemoryPool]:
    def make(kind: str) -> kvpool.MemoryPool:
        if kind == "paged":
            return kvpool.MixedMemoryAllocator(MIB, use_paging=True, **paged_kwargs())
        return kvpool.MixedMemoryAllocator(MIB)

    a, b = kinds.split("-")
    return make(a), make(b)


@pytest.mark.parametrize("kinds", ["extent-extent", "paged-paged", "extent-paged", "paged-extent"])
def test_free_into_the_wrong_pool(kinds: str) -> None:
    a, b = two_pools(kinds)
    try:
        mine = b.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        theirs = a.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        with pytest.raises(kvpool.InvalidHandleError) as info:
            b.free(theirs)
        assert isinstance(info.value, ValueError)
        # all or nothing: a list with one foreign object frees nothing
        with pytest.raises(kvpool.InvalidHandleError):
            b.batched_free([mine, theirs])
        with pytest.raises(kvpool.InvalidHandleError):
            b.batched_free([theirs, mine])
        assert mine.is_valid() and theirs.is_valid()
        assert a.num_active_allocations == 1 and b.num_active_allocations == 1
        assert a.memcheck() and b.memcheck()
        mine.ref_count_down()
        theirs.ref_count_down()
        assert a.num_active_allocations == 0 and b.num_active_allocations == 0
    finally:
        a.close()
        b.close()


def test_pinned_objects_in_a_refused_batched_free_stay_pinned() -> None:
    a, b = two_pools("paged-paged")
    try:
        mine = b.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        mine.pin()
        theirs = a.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        with pytest.raises(kvpool.InvalidHandleError):
            b.batched_free([mine, theirs])
        assert mine.is_valid() and mine.is_pinned
        assert b.stats().pinned_objects == 1
        assert b.memcheck()
        mine.unpin()
    finally:
        a.close()
        b.close()


def test_foreign_objects_into_any_pool() -> None:
    adhoc = kvpool.AdHocMemoryAllocator().allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    by_hand = kvpool.TensorMemoryObj(
        torch.zeros(KV_BYTES, dtype=torch.uint8),
        kvpool.MemoryObjMetadata(KV_SHAPE, KV_DTYPE, 0, KV_BYTES, 1, 0, KV_FMT),
    )
    pools = [
        kvpool.HostMemoryAllocator(MIB),
        kvpool.MixedMemoryAllocator(MIB, use_paging=True, **paged_kwargs()),
        kvpool.GPUMemoryAllocator(MIB),
    ]
    try:
        for pool in pools:
            for stray in (adhoc, by_hand):
                with pytest.raises(kvpool.InvalidHandleError):
                    pool.free(stray)
                with pytest.raises(kvpool.InvalidHandleError):
                    pool.batched_free([stray])
    finally:
        for pool in pools:
            pool.close()


def test_paged_cpu_gpu_refuses_foreign_objects(cpu_gpu) -> None:
    with kvpool.MixedMemoryAllocator(MIB) as other:
        stray = other.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        own = cpu_gpu.allocate(KV_SHAPE, KV_DTYPE, KV_FMT, allocator_type="cpu")
        with pytest.raises(kvpool.InvalidHandleError):
            cpu_gpu.free(stray, allocator_type="cpu")
        with pytest.raises(kvpool.InvalidHandleError):
            cpu_gpu.batched_free([own, stray])
        assert stray.is_valid() and own.is_valid()


def test_paged_cpu_gpu_frees_into_the_objects_own_pool(cpu_gpu) -> None:
    # allocator_type only validates: an object always goes back where it came from
    obj = cpu_gpu.allocate(KV_SHAPE, KV_DTYPE, KV_FMT, allocator_type="gpu")
    cpu_gpu.free(obj, allocator_type="cpu")
    assert not obj.is_valid()
    assert cpu_gpu.gpu_pool.num_active_allocations == 0
    assert cpu_gpu.cpu_pool.num_active_allocations == 0
    assert cpu_gpu.memcheck()


def test_double_free_is_reported_and_frees_nothing_else(pool, strict: None) -> None:
    a = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    pool.free(a)
    b = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)  # may reuse a's memory
    with pytest.raises(kvpool.InvalidHandleError):
        pool.free(a)
    with pytest.raises(kvpool.InvalidHandleError):
        pool.batched_free([a])
    with pytest.raises(kvpool.InvalidHandleError):
        a.ref_count_down()
    assert b.is_valid()
    assert pool.num_active_allocations == 1
    assert pool.memcheck()
    b.ref_count_down()
