"""Sizes computed without wrap-around, flags that are bools, and only kvpool's errors.

Issue 9, items 4 and 7, for the pure-Python core (placement policies over
torch tensors, layouts, metadata, placeholders, checkers):

* a shape whose element count overflows torch's int64 ``numel`` (it wraps
  ``[2**62 + 1, 4]`` to 4) is refused with a typed error, never placed as a
  few bytes; a request larger than the whole pool returns None and is said
  so once (an error in strict mode);
* flags take bools (numpy's too) and nothing else;
* odd arguments (numpy integers, 0-d tensors, dicts where metadata goes, an
  unhashable format) raise kvpool's typed errors, not AttributeError,
  IndexError, RuntimeError or NotImplementedError;
* messages say what to do: a format given as a str, a paged pool smaller
  than one page.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from core_helpers import PAGED_BYTES, PAGED_DTYPE, PAGED_SHAPE

import kvpool
from kvpool import MemoryFormat, MemoryObjMetadata
from kvpool.checks import check_bool, check_int, check_seconds
from kvpool.errors import ArgumentTypeError, KVPoolError, RequestTooLargeError
from kvpool.formats import MAX_LAYOUT_BYTES, normalize_layout

WRAPS = torch.Size([2**62 + 1, 4])  # numel() wraps to 4
WRAPS_TO_ZERO = torch.Size([2**31, 2**31, 4])  # numel() wraps to 0
WRAPS_NEGATIVE = torch.Size([2**63 - 1, 2])  # numel() wraps to -2
F16 = torch.float16


def typed(exc: BaseException) -> bool:
    return isinstance(exc, KVPoolError) and isinstance(exc, (ValueError, TypeError))


# -- sizes ---------------------------------------------------------------


@pytest.mark.parametrize("shape", [WRAPS, WRAPS_TO_ZERO, WRAPS_NEGATIVE], ids=str)
def test_layout_sizes_do_not_wrap(shape: torch.Size) -> None:
    assert shape.numel() * F16.itemsize <= MAX_LAYOUT_BYTES  # what torch would use
    with pytest.raises(kvpool.InvalidArgumentError, match="int64 limit"):
        kvpool.get_size_bytes([shape], [F16])
    with pytest.raises(kvpool.InvalidArgumentError, match="int64 limit"):
        normalize_layout(shape, F16)
    with pytest.raises(kvpool.InvalidArgumentError, match="int64 limit"):
        MemoryObjMetadata(shape, F16, 0, 0, 1).get_size()


def test_layout_bytes_sum_past_int64_is_refused() -> None:
    half = torch.Size([2**61])  # 2**62 bytes of float16: fine alone, not three times
    assert kvpool.get_size_bytes([half], [F16]) == 2**62
    with pytest.raises(kvpool.InvalidArgumentError, match="int64 limit"):
        kvpool.get_size_bytes([half, half], [F16, F16])


@pytest.mark.parametrize("shape", [WRAPS, WRAPS_TO_ZERO, WRAPS_NEGATIVE], ids=str)
def test_extent_allocate_refuses_a_wrapping_shape(make_extent, shape: torch.Size) -> None:
    pool = make_extent()
    for call in (
        lambda: pool.allocate(shape, F16),
        lambda: pool.allocate([shape], [F16]),
        lambda: pool.batched_allocate(shape, F16, 2),
    ):
        with pytest.raises(kvpool.InvalidArgumentError, match="int64 limit"):
            call()
    assert pool.num_active_allocations == 0
    assert pool.memcheck()


@pytest.mark.parametrize("shape", [WRAPS, WRAPS_TO_ZERO, WRAPS_NEGATIVE], ids=str)
def test_paged_allocate_refuses_a_wrapping_shape(make_paged, shape: torch.Size) -> None:
    pool = make_paged()
    with pytest.raises(kvpool.InvalidArgumentError, match="int64 limit"):
        pool.allocate(shape, F16)
    with pytest.raises(kvpool.InvalidArgumentError, match="int64 limit"):
        pool.batched_allocate(shape, F16, 2)
    assert pool.num_active_allocations == 0


def test_a_request_larger_than_the_pool_is_said_once(make_extent, kvlog) -> None:
    pool = make_extent(16 * 4096)
    big = torch.Size([16 * 4096 + 1])
    assert pool.allocate(big, torch.uint8) is None
    assert pool.allocate(big, torch.uint8) is None
    assert pool.batched_allocate(torch.Size([4096]), torch.uint8, 17) is None
    said = [m for m in kvlog.messages() if "can never succeed" in m]
    assert len(said) == 1
    assert "65537 bytes" in said[0] and "65536 bytes" in said[0]


def test_full_now_is_not_too_large(make_extent, kvlog) -> None:
    pool = make_extent(4 * 4096)
    objs = pool.batched_allocate(torch.Size([4096]), torch.uint8, 4)
    assert pool.allocate(torch.Size([4096]), torch.uint8) is None  # full now: no hint
    assert not [m for m in kvlog.messages() if "can never succeed" in m]
    pool.batched_free(objs)


def test_too_large_raises_in_strict_mode(make_extent, make_paged, strict) -> None:
    pool = make_extent(16 * 4096)
    with pytest.raises(RequestTooLargeError, match="whole pool has 65536 bytes") as info:
        pool.allocate(torch.Size([1 << 20]), torch.uint8)
    assert isinstance(info.value, MemoryError) and isinstance(info.value, ValueError)
    paged = make_paged(pages=4)
    with pytest.raises(RequestTooLargeError, match="batched_allocate of 5 pages"):
        paged.batched_allocate(PAGED_SHAPE, PAGED_DTYPE, 5)
    assert pool.memcheck() and paged.memcheck()


# -- messages --------------------------------------------------------------


@pytest.mark.parametrize("text", ["KV_2LTD", "MemoryFormat.KV_2LTD", "kv_2ltd"])
def test_a_format_given_as_a_str_says_to_use_the_member(make_extent, make_paged, text) -> None:
    for pool in (make_extent(), make_paged()):
        with pytest.raises(ArgumentTypeError) as info:
            pool.allocate(PAGED_SHAPE, PAGED_DTYPE, text)
        message = str(info.value)
        assert "is a str" in message and "MemoryFormat.KV_2LTD" in message


def test_a_paged_pool_smaller_than_a_page_suggests_one_page() -> None:
    small = torch.zeros(PAGED_BYTES - 24, dtype=torch.uint8)
    with pytest.raises(kvpool.InvalidArgumentError) as info:
        kvpool.PagedTensorMemoryAllocator(small, [PAGED_SHAPE], [PAGED_DTYPE])
    message = str(info.value)
    assert f"at least {PAGED_BYTES} bytes" in message
    assert "use 0 or" not in message


def test_memory_format_lookup_errors_are_typed() -> None:
    assert MemoryFormat(1) is MemoryFormat.KV_2LTD
    for value in (99, None, "KV_2LTD", np.zeros(3)):
        with pytest.raises(kvpool.InvalidArgumentError, match="not a MemoryFormat value"):
            MemoryFormat(value)


# -- flags -------------------------------------------------------------------


def test_numpy_bools_are_flags() -> None:
    assert check_bool("flag", np.True_) is True
    assert check_bool("flag", np.bool_(False)) is False
    assert kvpool.set_strict_mode(np.False_) is False
    assert kvpool.strict_mode() is False


@pytest.mark.parametrize("value", [1, "yes", None, torch.tensor(True), torch.zeros(3)], ids=repr)
def test_only_bools_are_flags(value: object) -> None:
    with pytest.raises(ArgumentTypeError, match="True or False"):
        kvpool.set_strict_mode(value)
    monitor = kvpool.PinMonitor()
    with pytest.raises(ArgumentTypeError, match="True or False"):
        monitor.configure(force_unpin=value if value is not None else 1)
    with pytest.raises(ArgumentTypeError, match="True or False"):
        kvpool.PinMonitor(enabled=value)


def test_ints_refuse_bool_tensors_and_accept_numpy_ints() -> None:
    assert check_int("n", np.int64(7)) == 7
    assert type(check_int("n", np.uint64(7))) is int
    with pytest.raises(ArgumentTypeError):
        check_int("n", torch.tensor(True))


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "1", True, None])
def test_seconds_are_finite_and_positive(value: object) -> None:
    with pytest.raises(kvpool.InvalidArgumentError):
        check_seconds("timeout", value)
    assert check_seconds("timeout", 1e300) <= 1e10  # capped at what a wait can take


def test_pin_monitor_settings_raise_kvpool_errors() -> None:
    monitor = kvpool.PinMonitor()
    for kwargs in ({"timeout": -1.0}, {"interval": "x"}, {"on_timeout": 3}):
        with pytest.raises(kvpool.InvalidArgumentError):
            monitor.configure(**kwargs)
    with pytest.raises(kvpool.InvalidArgumentError):
        monitor.overdue(timeout=float("nan"))


# -- typed errors for odd arguments ------------------------------------------


def test_numpy_integers_are_plain_ints_everywhere() -> None:
    am = kvpool.AddressManager(np.int64(1 << 20), np.int64(4096))
    assert am.allocate(np.int32(100)) == (0, 4096)
    assert am.compute_aligned_size(5) == 4096
    pool = kvpool.TensorMemoryAllocator(torch.zeros(1 << 16, dtype=torch.uint8), np.int64(64))
    assert pool.allocate(torch.Size([10]), torch.uint8).get_physical_size() == 64


@pytest.mark.parametrize(
    "tensor",
    [
        torch.tensor(3),
        torch.empty(64, dtype=torch.uint8, device="meta"),
        torch.zeros(8, dtype=torch.uint8).to_sparse(),
    ],
    ids=["0-d int64", "meta", "sparse"],
)
def test_odd_tensors_as_pool_memory_are_typed_errors(tensor: torch.Tensor) -> None:
    for build in (
        lambda: kvpool.TensorMemoryAllocator(tensor),
        lambda: kvpool.PagedTensorMemoryAllocator(tensor, [PAGED_SHAPE], [PAGED_DTYPE]),
    ):
        try:
            build()
        except Exception as exc:
            assert typed(exc), repr(exc)


def test_unhashable_format_is_a_typed_error(make_extent) -> None:
    with pytest.raises(ArgumentTypeError):
        make_extent().allocate(PAGED_SHAPE, PAGED_DTYPE, [MemoryFormat.KV_2LTD])


@pytest.mark.parametrize(
    "serialized",
    [
        5,
        None,
        "x",
        np.int64(3),
        {"shape": [2], "dtype": type, "address": 0, "phy_size": 0, "ref_count": 1, "fmt": 1},
        {
            "shape": torch.zeros(2),
            "dtype": None,
            "address": 0,
            "phy_size": 0,
            "ref_count": 1,
            "fmt": 1,
        },
        {
            "shape": [2**62 + 1, 4],
            "dtype": "torch.float16",
            "address": 0,
            "phy_size": 0,
            "ref_count": 1,
            "fmt": 1,
        },
        {"shape": [2], "dtype": None, "address": "0", "phy_size": 0, "ref_count": 1, "fmt": 1},
    ],
    ids=["int", "None", "str", "numpy", "dtype type", "tensor shape", "wrapping", "str address"],
)
def test_metadata_from_dict_raises_only_typed_errors(serialized: object) -> None:
    with pytest.raises(kvpool.InvalidArgumentError):
        MemoryObjMetadata.from_dict(serialized)  # type: ignore[arg-type]


def test_pool_stats_build_checks_its_figures() -> None:
    assert kvpool.PoolStats.build(4096, 0, 0, 0, 4096).free_bytes == 4096
    for bad in ("x", None, -1, np.zeros(3)):
        with pytest.raises(kvpool.InvalidArgumentError):
            kvpool.PoolStats.build(bad, 0, 0, 0, 4096)  # type: ignore[arg-type]


def test_numa_detect_checks_its_device_source() -> None:
    assert kvpool.NUMAMapping.detect(devices=lambda: []) is None
    for devices in (None, print, type):
        with pytest.raises(ArgumentTypeError):
            kvpool.NUMAMapping.detect(devices=devices)  # type: ignore[arg-type]
