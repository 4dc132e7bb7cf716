"""Bad input: each a typed exception with a useful message, never a crash."""

from __future__ import annotations

import pytest

from kvpool import errors, native
from kvpool.native.buffer import allocate_host, attach_shm


@pytest.mark.parametrize("size", [0, -1, -(1 << 40)])
def test_non_positive_sizes(size: int) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=f"positive number of bytes, got {size}"):
        allocate_host(size)


@pytest.mark.parametrize("size", [1.5, "4096", None, True])
def test_non_int_sizes(size: object) -> None:
    with pytest.raises(errors.InvalidArgumentError, match="size must be an int"):
        allocate_host(size)  # type: ignore[arg-type]


def test_absurd_size_is_out_of_memory() -> None:
    with pytest.raises(errors.OutOfMemoryError, match="beyond any address space") as info:
        allocate_host(1 << 62)
    assert isinstance(info.value, MemoryError)
    assert "EiB" in str(info.value)


def test_size_beyond_ram_when_populating() -> None:
    ram = native.probe()["mem_total"]
    with pytest.raises(errors.OutOfMemoryError, match="RAM"):
        allocate_host(ram + (1 << 30), pin="none")


def test_size_beyond_size_t() -> None:
    with pytest.raises(errors.InvalidArgumentError):
        allocate_host(1 << 70)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"pin": "sticky"}, "pin must be one of"),
        ({"pin": None}, "pin must be one of"),
        ({"hugepages": "always"}, "hugepages must be one of"),
        ({"threads": 0}, "threads must be 1..1024"),
        ({"threads": -2}, "threads must be 1..1024"),
        ({"threads": 5000}, "threads must be 1..1024"),
        ({"numa_node": "0"}, "numa_node must be an int"),
    ],
)
def test_bad_options(kwargs: dict, fragment: str) -> None:
    with pytest.raises(errors.InvalidArgumentError, match=fragment):
        allocate_host(4096, **kwargs)


def test_attach_bad_pin_and_size() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="cannot be used to attach"):
        attach_shm("/kvpool-test-nope", pin="cuda-alloc")
    with pytest.raises(errors.InvalidArgumentError, match="positive number of bytes"):
        attach_shm("/kvpool-test-nope", -5)


def test_unknown_options() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="option must be one of"):
        native.option_get("nope")
    with pytest.raises(errors.InvalidArgumentError, match=r"outside 0\.\.1"):
        native.option_set("use_populate_write", 5)


def test_address_arguments_are_checked() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="address"):
        native.free(-1)
    with pytest.raises(errors.InvalidArgumentError, match="address must be an int"):
        native.free("0x1000")  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidHandleError):
        native.shm_release_name(4096)
