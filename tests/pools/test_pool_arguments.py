"""Pools check every argument and say what is wrong in the user's terms (issue 9, items 4 and 7).

* Byte buffers (``BINARY_BUFFER`` in a ``MixedMemoryAllocator``) are bounded
  by the pool's size: a 1 GiB buffer from a 1 MiB pool returns None (said
  once; an error in strict mode) instead of allocating 1 GiB beside it; a
  shape past int64 or an empty one is a typed error.
* Messages name the pool the user built (``MixedMemoryAllocator``), not
  the placement policy inside it; a format given as a str says which
  member to pass; a paged pool smaller than one page asks for one page.
* ``attach_pool`` takes ``pin`` ("none": nothing is locked).
* Flags take bools only; numbers and odd objects raise kvpool's errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pool_helpers import KV_BYTES, KV_DTYPE, KV_FMT, KV_SHAPE, MIB, paged_kwargs

import kvpool
from kvpool import MemoryFormat
from kvpool.errors import ArgumentTypeError, MemoryLimitError, RequestTooLargeError
from kvpool.pool.backing import TorchBacking
from kvpool.pool.policy import PlacementSpec

BUF = MemoryFormat.BINARY_BUFFER


@pytest.fixture
def mixed():
    pool = kvpool.MixedMemoryAllocator(1 * MIB, pin="none")
    yield pool
    pool.close()


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


# -- byte buffers ------------------------------------------------------------


def test_byte_buffers_are_bounded_by_the_pool(mixed, lenient, caplog) -> None:
    caplog.set_level("WARNING", logger="kvpool")
    small = mixed.allocate(torch.Size([100]), torch.uint8, BUF)
    assert isinstance(small, kvpool.BytesBufferMemoryObj) and small.get_size() == 100
    assert mixed.allocate(torch.Size([1 << 30]), torch.uint8, BUF) is None
    assert mixed.allocate(torch.Size([1 << 30]), torch.uint8, BUF) is None
    # A batch counts all its buffers (each at least 64 bytes): 2 MiB > 1 MiB.
    assert mixed.batched_allocate(torch.Size([0]), torch.uint8, 1 << 15, BUF) is None
    said = warnings_about(caplog, "can never succeed")
    assert len(said) == 1 and "MixedMemoryAllocator" in said[0] and "1048576" in said[0]
    assert len(mixed.batched_allocate(torch.Size([64]), torch.uint8, 16, BUF)) == 16


def test_byte_buffers_too_large_raise_in_strict_mode(mixed, strict) -> None:
    with pytest.raises(RequestTooLargeError, match="bound of 1048576 bytes"):
        mixed.allocate(torch.Size([1 << 30]), torch.uint8, BUF)


@pytest.mark.parametrize(
    "shapes",
    [torch.Size([2**62 + 1, 4]), [torch.Size([2**62 + 1, 4])], torch.Size([2**63 - 1, 2])],
    ids=str,
)
def test_byte_buffer_shapes_past_int64_are_typed_errors(mixed, shapes) -> None:
    alone = kvpool.BufferAllocator()
    for call in (
        lambda: mixed.allocate(shapes, torch.uint8, BUF),
        lambda: alone.allocate(shapes, torch.uint8),
        lambda: alone.batched_allocate(shapes, torch.uint8, 2),
    ):
        with pytest.raises(kvpool.InvalidArgumentError, match="int64 limit"):
            call()


@pytest.mark.parametrize("shapes", [[], torch.Size([]), None, {}, "8", torch.zeros(3)], ids=repr)
def test_byte_buffer_shapes_must_start_with_a_length(shapes) -> None:
    with pytest.raises(ArgumentTypeError, match="length in bytes"):
        kvpool.BufferAllocator().allocate(shapes, torch.uint8)


def test_a_standalone_buffer_allocator_takes_a_bound(lenient) -> None:
    alone = kvpool.BufferAllocator.bounded(4096)
    assert alone.allocate(torch.Size([4096]), torch.uint8).get_size() == 4096
    assert alone.allocate(torch.Size([4097]), torch.uint8) is None
    assert kvpool.BufferAllocator().max_bytes >= 1 << 20  # the machine's memory
    for bad in (0, -1, "4096", None):
        with pytest.raises(kvpool.InvalidArgumentError):
            kvpool.BufferAllocator.bounded(bad)


def test_a_buffer_larger_than_the_memory_left_is_refused_before_it_is_made() -> None:
    # All of RAM is within the standalone bound, but never available: the
    # request is refused by the limit check, not zeroed until the kernel kills us.
    alone = kvpool.BufferAllocator()
    ram = alone.max_bytes
    for call in (
        lambda: alone.allocate(torch.Size([ram]), torch.uint8),
        lambda: alone.batched_allocate(torch.Size([ram // 2]), torch.uint8, 2),
    ):
        with pytest.raises(MemoryLimitError, match=r"byte buffer.*left"):
            call()


# -- messages -------------------------------------------------------------------


def test_errors_name_the_pool_the_user_built(mixed) -> None:
    other = kvpool.HostMemoryAllocator(1 * MIB)
    try:
        foreign = other.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        with pytest.raises(kvpool.InvalidHandleError) as info:
            mixed.free(foreign)
        assert "this MixedMemoryAllocator" in str(info.value)
        assert "TensorMemoryAllocator" not in str(info.value)
        foreign.ref_count_down()
    finally:
        other.close()
    mixed.close()
    with pytest.raises(kvpool.PoolClosedError) as info:
        mixed.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
    assert "closed MixedMemoryAllocator" in str(info.value)


def test_too_large_names_the_pool(lenient, caplog) -> None:
    caplog.set_level("WARNING", logger="kvpool")
    with kvpool.HostMemoryAllocator(256 * 1024) as pool:
        assert pool.allocate(torch.Size([1 << 20]), torch.uint8, KV_FMT) is None
    said = warnings_about(caplog, "can never succeed")
    assert len(said) == 1 and "HostMemoryAllocator" in said[0]


@pytest.mark.parametrize("fmt", ["KV_2LTD", "BINARY_BUFFER"])
def test_a_format_given_as_a_str_names_the_member(mixed, fmt) -> None:
    with pytest.raises(ArgumentTypeError) as info:
        mixed.allocate(KV_SHAPE, KV_DTYPE, fmt)
    message = str(info.value)
    assert "is a str" in message and f"MemoryFormat.{fmt}" in message
    assert "MixedMemoryAllocator" in message


def test_a_paged_pool_smaller_than_a_page_asks_for_one_page() -> None:
    with pytest.raises(kvpool.InvalidArgumentError) as info:
        kvpool.MixedMemoryAllocator(KV_BYTES // 2, use_paging=True, pin="none", **paged_kwargs())
    message = str(info.value)
    assert f"at least {KV_BYTES} bytes" in message and "use 0 or" not in message


# -- attach_pool(pin=) ----------------------------------------------------------------


def test_attach_pool_can_leave_the_segment_unpinned(shm_name) -> None:
    with kvpool.MixedMemoryAllocator(1 * MIB, shm_name=shm_name, pin="none") as pool:
        obj = pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT)
        obj.byte_array[:4] = b"kvpl"
        attached = kvpool.attach_pool(shm_name, pin="none")
        try:
            assert attached.pinned == "none"
            off = obj.shm_offset
            assert bytes(attached.view[off : off + 4]) == b"kvpl"
        finally:
            attached.close()
        with pytest.raises(kvpool.InvalidArgumentError, match="pin"):
            kvpool.attach_pool(shm_name, pin="always")
        obj.ref_count_down()


# -- flags and odd arguments --------------------------------------------------------


def test_pool_flags_take_bools_only(shm_name) -> None:
    odd = torch.zeros(3)
    with pytest.raises(ArgumentTypeError):
        kvpool.LazyMemoryAllocator(MIB, 2 * MIB, step_size=MIB, start=odd)
    with pytest.raises(ArgumentTypeError):
        kvpool.MemoryPool(TorchBacking(4096), PlacementSpec("extent"), byte_buffers=odd)
    with pytest.raises(ArgumentTypeError):
        kvpool._allocate_cpu_memory(4096, use_hugepages=np.zeros(3))
    with kvpool.allocate_host(4096, pin="none", shm_name=shm_name):
        with pytest.raises(ArgumentTypeError):
            kvpool.attach_shm(shm_name, populate=odd)
        attached = kvpool.attach_shm(shm_name, pin="none", populate=np.True_)
        attached.close()
    pool = kvpool.LazyMemoryAllocator(MIB, 2 * MIB, step_size=MIB, start=np.False_)
    pool.close()


def test_lazy_pool_takes_numpy_sizes_and_checks_its_timeout(no_auto_hugepages) -> None:
    pool = kvpool.LazyMemoryAllocator(np.uint8(255), 2 * MIB, step_size=np.uint8(255), start=False)
    try:
        assert pool.usable_bytes == 4096  # rounded up to a page, not wrapped in uint8
        for timeout in (float("nan"), -1, "1", True):
            with pytest.raises(kvpool.InvalidArgumentError):
                pool.wait_ready(timeout)
    finally:
        pool.close()
    with kvpool.LazyMemoryAllocator(MIB, MIB) as grown:
        assert grown.wait_ready(2**63)  # longer than a wait can be: capped, not an OverflowError


def test_memory_pool_checks_what_it_is_built_from() -> None:
    with pytest.raises(ArgumentTypeError, match="Backing"):
        kvpool.MemoryPool(None, PlacementSpec("extent"))
    backing = TorchBacking(4096)
    with pytest.raises(ArgumentTypeError, match="PlacementSpec"):
        kvpool.MemoryPool(backing, None)
    assert backing.closed  # a refused construction closes what it was given
    with pytest.raises(kvpool.PoolClosedError):
        kvpool.MemoryPool(backing, PlacementSpec("extent"))


def test_shm_name_must_be_a_str() -> None:
    for name in (np.zeros(3), 5, b"/x"):
        with pytest.raises(ArgumentTypeError, match="shm_name"):
            kvpool.MixedMemoryAllocator(1 * MIB, shm_name=name)


def test_torch_out_of_memory_is_a_memory_error() -> None:
    with pytest.raises(kvpool.OutOfMemoryError):
        kvpool.GPUMemoryAllocator(1 << 50, "cpu")


def test_paged_cpu_gpu_checks_its_arguments() -> None:
    pool = kvpool.PagedCpuGpuMemoryAllocator()
    pool.init_cpu_memory_allocator(16 * KV_BYTES, [KV_SHAPE], [KV_DTYPE])
    try:
        with pytest.raises(kvpool.InvalidArgumentError):
            pool.batched_free(None)  # type: ignore[arg-type]
        with pytest.raises(kvpool.InvalidArgumentError):
            pool.allocate(KV_SHAPE, KV_DTYPE, KV_FMT, np.zeros(3))  # type: ignore[arg-type]
    finally:
        pool.close()


def test_ad_hoc_allocator_errors_are_typed() -> None:
    alloc = kvpool.AdHocMemoryAllocator()
    with pytest.raises(kvpool.InvalidArgumentError, match="int64 limit"):
        alloc.allocate(torch.Size([2**63 - 1, 2]), torch.float16)
    with pytest.raises(kvpool.FeatureUnavailableError, match="use allocate"):
        alloc.batched_allocate(KV_SHAPE, KV_DTYPE, 2)


# -- the LMCache helpers and Device-DAX pools -----------------------------------------


def test_torch_device_refusals_are_typed() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: torch allocates on 'cuda' here")
    with pytest.raises(kvpool.FeatureUnavailableError, match="cuda"):
        TorchBacking(4096, "cuda")  # torch itself raises AssertionError
    with pytest.raises(kvpool.FeatureUnavailableError):
        kvpool._allocate_gpu_memory(4096, "cuda:0")
    with pytest.raises(ArgumentTypeError):
        kvpool._allocate_gpu_memory(4096, True)  # type: ignore[arg-type]


def test_helpers_take_numpy_ints_and_check_the_rest() -> None:
    assert kvpool.align_to(np.int8(5), np.int64(4096)) == 4096
    with pytest.raises(kvpool.InvalidArgumentError):
        kvpool._get_cached_ubyte_array_type(2**64)
    with pytest.raises(ArgumentTypeError):
        kvpool._resolve_pinned_alloc_free(None, None, 4096, torch.zeros(3))
    pair = kvpool._resolve_pinned_alloc_free(None, None, 4096, False)
    ptr = pair.alloc()
    for bad in (None, 1.5, "x"):
        with pytest.raises(kvpool.InvalidArgumentError):
            pair.free(bad)  # type: ignore[arg-type]
    pair.free(ptr)


def test_devdax_arguments_are_typed(tmp_path) -> None:
    path = str(tmp_path / "dax0.0")
    with open(path, "wb") as f:
        f.truncate(4 * MIB)
    with pytest.raises(FileNotFoundError) as info:
        kvpool.DevDaxBacking(path + ".missing", MIB)
    assert isinstance(info.value, kvpool.KVPoolError)
    for enum, bad in ((kvpool.DevDaxArenaState, None), (kvpool.DevDaxRemoveMode, "wait")):
        with pytest.raises(kvpool.InvalidArgumentError, match="not a"):
            enum(bad)
    with kvpool.DevDaxMemoryAllocator(2 * MIB, path) as pool:
        with pytest.raises(ArgumentTypeError):
            pool.owns_device(2**70)  # type: ignore[arg-type]
        with pytest.raises(ArgumentTypeError):
            pool.is_devdax_obj(None)  # type: ignore[arg-type]
        with pytest.raises(ArgumentTypeError):
            pool.free(None)  # type: ignore[arg-type]
        with pytest.raises(ArgumentTypeError):
            pool.allocate(KV_SHAPE, KV_DTYPE, [KV_FMT])  # type: ignore[arg-type]
